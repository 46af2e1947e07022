"""The typed GRPO configuration: one dataclass per key group of a MindRLHF-style ``grpo_config.yaml``.

The yaml has the key groups MindRLHF users know (``rl_config``, ``actor_config``, ``ref_config``,
``reward_config``, ``generate_config``, with ``parallel_config``, ``optimizer``, ``lr_schedule`` and
``sampling_config`` blocks inside). Each group is a dataclass below; the string under each field is its
documentation (``python -m mindgrpo config-help`` prints them all). Every default lives here and only here:
:mod:`mindgrpo.config.load` fills these dataclasses from yaml and the command line, :mod:`mindgrpo.config.validate`
checks them, :mod:`mindgrpo.config.derived` computes what follows from them.
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
import os
import textwrap
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from mindgrpo.choices import (CLIPPED_LOSS_TYPES, IMPORTANCE_SAMPLING_LEVELS, LORA_TARGET_MODULES,
                             LOSS_IMPLS, LOSS_REDUCTIONS, LOSS_TYPES, ROLLOUT_CORRECTIONS, canonical,
                             canonical_kl_estimator)

class ConfigError(ValueError):
    """A configuration problem, with the key and where it came from."""


# Path markers (field metadata): validate checks the paths of each kind, the loader resolves them.
INPUT_PATH = {"path": "input"}    # must exist before training starts
OUTPUT_PATH = {"path": "output"}  # created on demand; its parent must be writable

# Prompts are left-padded to multiples of this (rl_config.prompt_bucket's default): the native engine's buckets, and
# the grid the trainer and the evaluator size their prompt limits to (each distinct width is one more compiled graph).
PROMPT_LENGTH_BUCKET = 64


@dataclass
class ParallelConfig:
    data_parallel: int = 1
    """Data-parallel replicas. Each reads its own shard of prompts; gradients are averaged over them.
    data_parallel x model_parallel must equal the msrun worker count."""
    model_parallel: int = 1
    """Tensor-parallel degree (Megatron-style, explicit collectives; CPU and Ascend): each rank of a group of
    model_parallel consecutive ranks holds 1/model_parallel of the attention heads, the MLP and the vocabulary,
    read straight from the HF folder. It must divide the attention heads, the vocabulary and the MLP size, and
    divide the key/value heads or be a multiple of them (then KV heads are replicated). Actor, reference and the
    native rollout engine use the same degree."""
    pipeline_stage: int = 1
    """Pipeline stages. Only 1 is implemented (a larger value is refused): split a large model with
    model_parallel instead (`python -m mindgrpo plan` shows what fits)."""
    optimizer_shard: bool = True
    """ZeRO-1 across data-parallel ranks: each keeps the AdamW moments of only its 1/data_parallel share of the
    parameters, updates that share and sends it to the others (no effect with data_parallel 1)."""



@dataclass
class OptimizerConfig:
    type: str = "AdamW"
    """Optimizer. Only AdamW is supported (decoupled weight decay, as in MindRLHF and TRL)."""
    beta1: float = 0.9
    """AdamW first-moment decay."""
    beta2: float = 0.999
    """AdamW second-moment decay (MindRLHF's Qwen recipe uses 0.95)."""
    eps: float = 1.0e-8
    """AdamW denominator epsilon."""
    weight_decay: float = 0.0
    """Decoupled weight decay, applied to matrices only (not to norms or biases)."""
    max_grad_norm: float = 1.0
    """Global gradient-norm clip; 0 disables clipping (the norm is still logged as grad_norm)."""


@dataclass
class LRScheduleConfig:
    type: str = "constant"
    """``constant`` (after optional warmup), ``cosine`` (linear warmup, then cosine decay to lr_end) or ``linear``
    (linear warmup, then linear decay to lr_end; Hugging Face's and TRL's default).
    MindRLHF's ``CosineWithWarmUpLR`` is accepted as ``cosine``."""
    learning_rate: float = 1.0e-6
    """Peak learning rate."""
    lr_end: float = 0.0
    """Final learning rate of the cosine and linear schedules."""
    warmup_steps: int = 0
    """Optimizer steps of linear warmup from 0 to learning_rate."""
    total_steps: int = 0
    """Optimizer steps the decay spans; 0 means the whole run."""


@dataclass
class ActorConfig:
    load: str = field(default="", metadata=INPUT_PATH)
    """Hugging Face Qwen2.5 folder (config.json + *.safetensors) the policy starts from
    (command line: --actor_checkpoint_path)."""
    compute_dtype: str = "float32"
    """Matmul dtype: float32 on CPU; bfloat16 or float16 on Ascend. Weights in another dtype (param_dtype) are cast
    to it at every use, inside the graph."""
    param_dtype: str = "float32"
    """The actor's working weights: ``float32``, or ``bfloat16`` (Megatron's distributed-optimizer recipe): the
    model's weights and gradients are bf16, and the fp32 master weights and AdamW moments exist only in the
    optimizer, each parameter's on its ZeRO-1 owner rank (actor_config.parallel_config.optimizer_shard), which
    updates them and casts the new weights back to bf16 for every rank. 2 bytes a parameter for the weights, 2-4
    for the gradients (grad_reduce_dtype) and 12 / data_parallel for the optimizer, against 4 + 4 + 8 /
    data_parallel in float32. On CPU the matmuls still run in float32 (compute_dtype), from the bf16 weights.
    Checkpoints keep the fp32 master state (exact resume); exports are bf16."""
    grad_reduce_dtype: str = "float32"
    """The dtype gradients are accumulated over micro-batches and reduced over ranks in (Megatron's
    ``accumulate_allreduce_grads_in_fp32``): ``float32`` (default) or ``bfloat16`` (half the gradient memory,
    with bf16 rounding at every micro-batch). With param_dtype float32 it must be float32."""
    micro_batch_size: int = 8
    """Completions per forward/backward in the update; gradients are accumulated over micro-batches. With
    max_tokens_per_micro_batch it only sets bnpo's averaging groups (the loss stays the padded path's)."""
    max_tokens_per_micro_batch: int = 0
    """Pack the completions without their padding (verl's ``use_remove_padding`` with
    ``ppo_max_token_len_per_gpu``): every forward of the reference, old-log-prob and training passes then holds
    up to this many completion tokens, as rows of ``generate_config.sampling_config.max_tokens`` (so at least that;
    rounded down to whole rows) that each hold one group's completions end to end, instead of micro_batch_size
    (ref_config.ref_model_batch_size) completions each padded to the limit. Same log-probs, gradients and loss; a
    forward's memory is that of a padded micro-batch of as many rows. Set it for long, ragged completions: `small`
    model, 512 new tokens, median length 128, 16 rows of 512 (``tools/bench_packing.py``): the reference pass and
    the update take 0.5x and 0.6x the padded path's time; with every completion at the limit, the same time. 0
    (default): padded micro-batches. Not on by default because a packed forward computes up to min(rows, the
    rank's prompts) prompts where a padded one computes rows / num_generations: with few rows per forward, many
    prompts per rank and every completion at the limit, that costs more than the padding saved. Needs
    rl_config.share_prompt: true."""
    head_impl: str = "fused"
    """How the actor's and the reference's log-probs leave the last layer: ``fused`` (the vocabulary head, log-softmax
    and entropy as one chunked CPU kernel that never holds a [tokens, vocab] tensor, nor its gradient: at Qwen2.5's
    151,936-token vocabulary each such float32 tensor is 0.6 MB a token, and a compiled CPU graph keeps several;
    float32 heads on CPU without tensor parallelism or the entropy bonus, elsewhere the plain ops run) or ``plain``
    (logits, then log_softmax: the reference)."""
    recompute: bool = False
    """Recompute each decoder layer in the actor's backward (``Cell.recompute()`` on every layer of the
    shared-prompt forward): only each layer's input hidden state is kept, and one layer's activations are rebuilt
    at a time, for one more forward of the layers per update. Same gradients, much less activation memory (4 x 128
    prompt + 32 x 128 completion tokens, 8 small layers, CPU: 1027 -> 370 MiB, ``tools/bench_recompute.py``).
    Applies with ``rl_config.share_prompt: true``; reference and old-logprob scoring have no backward."""
    freeze_vision_tower: bool = True
    """Qwen2.5-VL: keep the vision tower frozen, as verl's and MindSpeed-MM's geo3k recipes do. It is then out of
    the optimizer, runs once per prompt per step (its features serve the rollout, the reference and every update
    pass) and the reference model shares it instead of holding a copy. ``false`` (training the tower) is not
    supported yet and refused. No effect on text models."""
    lora_rank: int = 0
    """LoRA (verl's name): train rank-``lora_rank`` adapters on a frozen backbone instead of every weight; 0
    (default) is off. The backbone stays in param_dtype, the adapters and their AdamW state are float32, and the
    reference policy is the backbone with the adapters off (no second copy of the weights; beta > 0 costs one more
    forward). A starts as PEFT's Kaiming-uniform and B at zero, so step 1's KL is exactly 0. Checkpoints hold the
    adapters as a PEFT folder (``peft.PeftModel.from_pretrained`` loads it onto actor_config.load). Needs the
    native rollout backend (it decodes with the adapters applied, unmerged: ``x W + s (x A) B``). Trains at any
    model_parallel: each adapter is split as its weight is (docs/lora.md)."""
    lora_alpha: float = 16.0
    """LoRA's scaling numerator: the adapters' product is scaled by lora_alpha / lora_rank (verl's default 16)."""
    lora_target_modules: List[str] = field(default_factory=lambda: list(LORA_TARGET_MODULES))
    """The linears that get adapters, by Hugging Face module name (default: every linear of the decoder,
    q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)."""
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    """Training layout of the actor."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """Optimizer settings."""
    lr_schedule: LRScheduleConfig = field(default_factory=LRScheduleConfig)
    """Learning-rate schedule."""


@dataclass
class RefConfig:
    load: str = field(default="", metadata=INPUT_PATH)
    """Reference-model folder; empty means the actor's starting weights (command line: --ref_checkpoint_path)."""
    compute_dtype: str = "float32"
    """Matmul dtype of the frozen reference model."""
    ref_model_batch_size: int = 8
    """Completions per reference forward."""
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    """Layout of the reference model: the actor's (the reference runs on the same ranks with the same slices).
    Left at the default it is the actor's; any other value that differs from the actor's is refused."""


@dataclass
class SamplingConfig:
    temperature: float = 1.0
    """Softmax temperature for rollouts (also applied to the training log-probs, as TRL does)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens with this total probability; 1 disables."""
    top_k: int = -1
    """Keep only the k most likely tokens; -1 (or 0) disables."""
    repetition_penalty: float = 1.0
    """CTRL-style penalty on tokens already in the prompt or completion; 1 disables."""
    max_tokens: int = 512
    """Maximum completion length in tokens."""
    min_tokens: int = 0
    """EOS is suppressed until a completion has this many tokens."""


@dataclass
class GenerateConfig:
    backend: str = "native"
    """Rollout engine: ``native`` (MindSpore KV-cache decoding over the actor's own weights, GRAPH mode; the fast
    CPU path), ``mindformers`` (MindFormers' generate on a separate inference cell), or ``vllm``
    (vllm-mindspore, Ascend only; install with ``pip install mindgrpo[ascend]``)."""
    load: str = field(default="", metadata=INPUT_PATH)
    """Folder of the inference weights; empty means the actor's (kept in sync after every update)
    (command line: --generate_checkpoint_path)."""
    infer_model_batch_size: int = 32
    """Sequences decoded together by the rollout engine."""
    decode_impl: str = "fused"
    """native only: ``fused`` (the decode step's attention with its KV-cache write, RMSNorm and SwiGLU as C++
    kernels: a quarter of the kernel launches; CPU, float32, Qwen2's q/k/v biases; elsewhere the plain ops are
    used) or ``plain`` (MindSpore ops; the reference)."""
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    """Layout of the inference model. ``native`` reads the actor's own slices, so it is the actor's layout (left at
    the default it is; another value that differs is refused); ``vllm`` may use another model_parallel (weights
    are resharded on sync, see mindgrpo.parallel.resharding)."""
    sampling_config: SamplingConfig = field(default_factory=SamplingConfig)
    """Sampling settings."""
    gpu_memory_utilization: float = 0.9
    """vllm only: share of device memory vllm may take for weights and KV cache."""
    block_size: int = 32
    """vllm only: KV-cache block size in tokens."""
    max_model_len: int = 0
    """vllm only: longest prompt + completion; 0 means rl_config.seq_length."""


@dataclass
class RewardConfig:
    verifier_function: List[str] = field(default_factory=lambda: ["accuracy_reward", "format_reward"])
    """Verifiers by registered name (see mindgrpo.rewards) or as ``package.module:function``
    (command line: --verifier_function)."""
    verifier_weight: List[float] = field(default_factory=lambda: [1.0, 1.0])
    """One weight per verifier; the reward is their weighted sum (command line: --verifier_weight)."""
    gate_accuracy_on_format: bool = False
    """Score accuracy only when the format verifier passes (reward = accuracy x format) instead of adding them."""
    fallback_last_number: bool = False
    """When a completion has no answer marker, take its last number as the answer."""
    aggregation: str = "sum_then_normalize"
    """How several verifiers make the reward the advantages are computed from (TRL's
    ``multi_objective_aggregation``): ``sum_then_normalize`` adds the weighted scores, and rl_config.scale_rewards
    normalises the sum; ``normalize_then_sum`` (GDPO) first normalises each verifier's scores within each group,
    ``(r - mean) / (std + 1e-4)``, adds them with their weights, and the advantages normalise that sum over the batch
    (so it needs rl_config.scale_rewards: batch, which is what TRL does). The logged reward is the weighted sum."""
    verifier_timeout: float = 0.0
    """Seconds one verifier call may take (one completion; a batch verifier's one call covers the whole batch, so one
    over it has scored nothing and stops the run). A call over it is cut (its worker process killed and replaced):
    that completion scores 0 and is counted in grpo/verifier_failures/<verifier> and grpo/verifier_timeouts/<verifier>.
    A hang in C code (a catastrophic regex) cannot be interrupted inside the trainer's process, so a limit runs the
    verifiers in worker processes (one when verifier_parallel is 0), which import them by name: each must be a
    top-level function of an importable module.
    0 (default): no limit, verifiers run in the trainer's process. Measured cost of the worker path on 32 completions
    x 2 verifiers, on 2 busy cores: about 0.1 ms per call, 5-8 ms per step (0.6 ms in-process; a tiny-model step
    takes about 600 ms), and 0.2-0.9 s to start a worker, once and after each cut call."""
    verifier_parallel: int = 0
    """Worker processes (per rank) that share the verifier calls, for slow verifiers; see verifier_timeout.
    0 (default): verifiers run in the trainer's process, or in one worker when verifier_timeout is set."""
    shuffle_rewards: bool = False
    """A control experiment, not a training setting: the rewards the advantages are computed from are randomly
    permuted across each batch's completions (the same values and mean, no relation to the completion), while the
    logged rewards stay the real ones. A run that still improves learned from something other than the reward
    (Qwen2.5 is known to gain from spurious rewards on MATH); docs/real_qwen.md runs it beside the real recipe.
    DAPO's overlong penalty (rl_config.overlong_buffer_length) is added after the permutation, to each completion's
    own length: a control of a run with that penalty keeps its length signal."""


@dataclass
class RunConfig:
    """Where a run reads and writes, and how it executes."""

    dataset_file: str = field(default="", metadata=INPUT_PATH)
    """MindRecord made by tools/rlhf_data.py (command line: --dataset_file)."""
    tokenizer_dir: str = field(default="", metadata=INPUT_PATH)
    """Folder with tokenizer.json (or vocab.json + merges.txt); empty means actor_config.load
    (command line: --tokenizer_dir)."""
    output_dir: str = field(default="output", metadata=OUTPUT_PATH)
    """Run folder: metrics.jsonl, tensorboard/, completions.jsonl."""
    seed: int = 0
    """Seed for data order, sampling and initialisation."""
    mode: str = "graph"
    """MindSpore execution mode: ``graph`` (compiled, fast) or ``pynative`` (eager, for debugging)."""
    device_target: str = "auto"
    """``auto`` (what MindSpore finds), ``CPU`` or ``Ascend``."""


@dataclass
class ScheduleConfig:
    """How many steps, of how many prompts, with how many passes each."""

    epochs: int = 1
    """Passes over the dataset; ignored when max_steps > 0."""
    max_steps: int = 0
    """Training steps (each: one batch of prompts); 0 means epochs x steps per epoch."""
    batch_size: int = 4
    """Prompts per step on each data-parallel rank."""
    num_iterations: int = 1
    """Optimizer passes over each batch of rollouts (the inner PPO epochs, mu in the GRPO paper). With more than
    one, log-probs of the sampling policy are computed once and the ratio is clipped against them."""
    steps_per_generation: int = 1
    """Optimizer steps fed by one generation round (TRL's ``steps_per_generation``): a round samples
    ``batch_size x steps_per_generation`` prompts, and the next steps_per_generation steps each train on
    ``batch_size`` of their groups, in order (each step with its num_iterations passes). The old policy's
    log-probs are computed once at generation, so the later steps' ratios are against the sampling policy.
    Advantages are computed over the whole generation (as TRL). With num_iterations = mu, one generation feeds
    steps_per_generation x mu optimizer updates, as in TRL, but ordered step by step (each step's mu passes over its
    own groups, then the next step's) where TRL makes each pass over all the generation's groups: here a step stays
    one batch of prompts with its metrics line and learning-rate schedule position. Checkpoints are saved only
    between generations: save_ckpt_interval and max_steps must be multiples of it."""


@dataclass
class GenerationConfig:
    """The groups of completions each step samples (TRL's generation parameters)."""

    num_generations: int = 8
    """Completions sampled per prompt (the GRPO group size)."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling (verl's ``algorithm.filter_groups``): drop the groups whose rewards are all equal
    (no learning signal) and generate from more prompts until ``batch_size`` groups are kept, up to
    ``max_generation_batches`` rounds. At the limit the step trains on what was kept (the empty slots are filled
    with dropped groups left out of the loss, so shapes stay static) and says so in ``grpo/generation_batches``
    and ``grpo/unfilled_groups``; the run never stops for it. Under data parallelism every rank does as many
    rounds as the rank that needs most. Every round reads a new batch of prompts, so with ``epochs`` a run reads
    more than ``epochs`` passes of the data (its step count is unchanged). See mindgrpo.train.generation."""
    max_generation_batches: int = 10
    """The most generation rounds of one step under dynamic_sampling (verl's ``max_num_gen_batches``; DAPO's recipe
    uses 10). Each round reads the next batch of prompts from the dataset."""


@dataclass
class ToolsConfig:
    """Multi-turn rollouts in which the model calls tools (TRL's ``tools``, verl's multi-turn): the prompt's system
    turn lists them in Qwen2.5's format, a turn that calls one is answered with its result, and the model goes on.
    The results are the model's context, never its samples: the loss leaves them out (see mindgrpo.tools)."""

    tools: List[str] = field(default_factory=list)
    """Tools the model may call: ``calculator`` (arithmetic), ``python`` (sandboxed; docs/sandbox.md), or your own as
    ``package.module:function`` (a top-level function whose type hints and Google-style docstring give its JSON
    signature, or decorated with ``mindgrpo.tools.tool_signature``). Empty (default): single-turn rollouts. The
    dataset must have been converted with the same ``--tools``, which puts them in every prompt."""
    max_tool_turns: int = 4
    """Tool-calling turns per completion; a turn that calls a tool after that ends the completion."""
    max_tool_response_tokens: int = 256
    """A tool's result is cut to this many tokens (and says so) before the model reads it."""
    tool_timeout: float = 30.0
    """Seconds a tool call may take; a slower one is stopped and answered with an error (counted in
    ``tools/timeouts``). The python tool also stops its code at its own limits (10 s, 5 CPU seconds)."""
    tool_parallel: int = 2
    """Worker processes (per rank) running tool calls; the calls of turns that end together run side by side."""
    tool_sandbox: str = "bwrap"
    """Where the python tool runs the model's code (docs/sandbox.md). ``bwrap``: in new user, PID, mount, network,
    IPC and UTS namespaces with a read-only file system, a scratch tmpfs and a seccomp filter (bubblewrap, installed
    with mindgrpo); where the kernel refuses namespaces the run stops before it builds anything and says how to allow
    them. ``remote``: posted to a SandboxFusion-compatible service at ``tool_sandbox_url``. ``process``: a plain
    child process with limits and an audit hook, which isolates nothing from code written to escape it (trusted
    models, or a machine that holds nothing else)."""
    tool_sandbox_url: str = ""
    """The SandboxFusion-compatible ``/run_code`` endpoint for ``tool_sandbox: remote``, e.g.
    ``http://sandbox:8080/run_code`` (checked to run ``6 * 7`` before the run starts)."""


@dataclass
class ShapesConfig:
    """The token shapes every graph is compiled for."""

    max_prompt_length: int = 512
    """Longest prompt in tokens (prompts were padded or rejected to this by the data tool)."""
    prompt_bucket: int = PROMPT_LENGTH_BUCKET
    """Prompts are left-padded to a multiple of this, in the native rollout engine and in the reference and
    training graphs. Each width a batch reaches is a few more compiled graphs, which keep memory for the life of the
    process (on CPU about 0.1 GB per width for the tiny model, 0.3 GB for a hidden-512, 8-layer one); a wider
    bucket means fewer widths but more padding, which every decode step and the prompt part of every forward pay
    for. GRPOTrainer.precompile() compiles only the widths the run's batches reach."""
    seq_length: int = 1024
    """Longest prompt + completion in tokens; max_prompt_length + sampling max_tokens must fit."""
    share_prompt: bool = True
    """Compute each prompt once per group in the reference, old-log-prob and training forwards: the prompt's
    completions attend to it (Prefix Grouper) instead of repeating it in every row. Same log-probs, far fewer
    tokens (prompts are ~60 % of GSM8K rows). Needs actor_config.micro_batch_size and
    ref_config.ref_model_batch_size to be multiples of num_generations. false: every row is
    ``[prompt | completion]`` (the model's ``completions`` pass)."""


@dataclass
class KLConfig:
    """The KL penalty to the reference model."""

    beta: float = 0.04
    """Weight of the KL penalty to the reference model; 0 skips the reference model entirely."""
    kl_estimator: str = "k3"
    """KL estimator: ``k1`` (log-ratio), ``k2`` (half squared log-ratio) or ``k3`` (low-variance, as
    DeepSeekMath and TRL). verl's names ``kl``, ``mse`` and ``low_var_kl`` are accepted for them."""
    use_bias_correction_kl: bool = False
    """Multiply the k3 KL by the importance ratio (DeepSeek-V3.2; on by default in TRL 1.16, off here as in
    MindRLHF's GRPO)."""


@dataclass
class LossConfig(KLConfig):
    """The policy loss: the clipped surrogate (or another, by ``loss_type``), its options, and the KL term.

    This group is what :func:`mindgrpo.algorithm.grpo_loss` reads (``cfg=``): a run passes the loss group of its
    ``rl_config`` (:meth:`of`); standalone calls build one, or start from TRL 1.16's defaults with :meth:`trl`.
    Constructing one checks it (a ValueError naming the field); the loader checks the yaml's with file and line.
    """

    loss_type: str = "grpo"
    """Loss aggregation: ``grpo`` (token mean per sequence, then batch mean; DeepSeekMath and MindRLHF),
    ``bnpo`` (token mean over the local batch), ``dr_grpo`` (token sum / (batch x max_tokens)), ``dapo`` (token
    mean over the global batch, across micro-batches and data-parallel ranks). Two other surrogates, as TRL 1.16:
    ``cispo`` (MiniMax-M1: the ratio capped at epsilon_high, which is then eps_max, not 1 + eps (ScaleRL uses 5.0),
    detached, times advantage x log-prob; reduced as dapo) and ``sapo`` (Soft Adaptive Policy Optimization:
    sigmoid(tau (r - 1)) x 4 / tau x advantage, tau from sapo_temperature_pos/neg; reduced as grpo). Both run the
    plain loss ops whatever loss_impl says."""
    epsilon_low: float = 0.2
    """Lower clip range: ratios below 1 - epsilon_low are clipped."""
    epsilon_high: float = 0.2
    """Upper clip range: ratios above 1 + epsilon_high are clipped (DAPO's clip-higher uses 0.28)."""
    importance_sampling_level: str = "token"
    """Where the importance ratio is taken (TRL 1.16's ``importance_sampling_level``): ``token`` (one ratio per
    token, GRPO) or ``sequence`` (GSPO, Zheng et al. 2025: the masked mean of each completion's log-ratios,
    exponentiated, is the ratio of all its tokens; clipped as usual, then reduced per ``loss_type``; TRL recommends
    ``loss_type: grpo`` with it). The fused loss kernel is per token: with ``sequence`` the loss runs the plain ops
    whatever ``loss_impl`` says. On-policy (``num_iterations: 1``) the ratio is 1 and only its gradient counts."""
    sapo_temperature_pos: float = 1.0
    """SAPO's gate temperature for tokens with a positive advantage (TRL's ``sapo_temperature_pos``)."""
    sapo_temperature_neg: float = 1.05
    """SAPO's gate temperature for tokens with a zero or negative advantage (TRL's ``sapo_temperature_neg``)."""
    top_entropy_quantile: float = 1.0
    """Keep in the policy term only the tokens whose entropy is in this top fraction of the micro-batch's (TRL's
    ``top_entropy_quantile``, "Beyond the 80/20 rule", which uses 0.2); the KL term keeps every token. 1.0 is off.
    Below 1 the loss runs the plain ops whatever loss_impl says."""
    entropy_coef: float = 0.0
    """Entropy bonus (verl's ``actor.entropy_coeff``): the loss minus entropy_coef x the per-token entropy,
    aggregated as loss_type aggregates the loss; the entropy is then differentiated (one more [tokens, vocab]
    activation in the backward). 0 is off. Not with tensor parallelism."""
    rollout_correction: str = "none"
    """Correct for the rollout engine's log-probs differing from the training forward's (TRL's
    ``vllm_importance_sampling_mode``): the policy term is weighted by exp(old - sampling), ``token_truncate``
    (per token, capped at rollout_correction_cap), ``token_mask`` (per token, 0 above the cap),
    ``sequence_truncate`` / ``sequence_mask`` (one weight per completion, exp of its summed differences); ``none``
    is off. Needs the engine's per-token log-probs. Not ``none``: the plain loss ops run whatever loss_impl says."""
    rollout_correction_cap: float = 3.0
    """The cap of the rollout-correction weight (TRL's ``vllm_importance_sampling_clip_max``)."""
    loss_impl: str = "fused"
    """``fused`` (one custom kernel for surrogate + KL + metrics) or ``plain`` (MindSpore ops; the reference). The
    kernel computes the clipped surrogate (loss_type grpo, bnpo, dr_grpo, dapo) at token level, with or without KL
    and entropy_coef; with importance_sampling_level sequence, loss_type cispo or sapo, top_entropy_quantile below
    1 or a rollout_correction, ``fused`` runs the plain ops (same numbers)."""


    def __post_init__(self) -> None:
        self.kl_estimator = canonical_kl_estimator(self.kl_estimator)
        for key, choices in (("loss_type", LOSS_TYPES), ("loss_impl", LOSS_IMPLS),
                             ("importance_sampling_level", IMPORTANCE_SAMPLING_LEVELS),
                             ("rollout_correction", ROLLOUT_CORRECTIONS)):
            canonical(key, getattr(self, key), choices)
        problems = self.range_problems()
        if problems:
            raise ValueError(problems[0])

    def range_problems(self, prefix: str = "") -> List[str]:
        """What is out of range, one message per field (``prefix`` names the group: ``rl_config.``)."""
        problems = [f"{prefix}{key} = {getattr(self, key)}: must not be negative"
                    for key in ("beta", "epsilon_high", "entropy_coef") if getattr(self, key) < 0]
        if not 0 <= self.epsilon_low < 1:
            problems.append(f"{prefix}epsilon_low = {self.epsilon_low}: must be in [0, 1)")
        problems += [f"{prefix}{key} = {getattr(self, key)}: must be > 0"
                     for key in ("sapo_temperature_pos", "sapo_temperature_neg", "rollout_correction_cap")
                     if not getattr(self, key) > 0]
        if not 0 <= self.top_entropy_quantile <= 1:
            problems.append(f"{prefix}top_entropy_quantile = {self.top_entropy_quantile}: must be in [0, 1] (1: off)")
        return problems

    @classmethod
    def of(cls, config: "LossConfig") -> "LossConfig":
        """The loss group of ``config`` (an ``RLConfig``, which is a LossConfig with the other groups), on its own:
        what the step graphs hold, rather than the whole run configuration."""
        return cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(cls)})

    @classmethod
    def trl(cls, **fields: Any) -> "LossConfig":
        """TRL 1.16's ``GRPOConfig`` defaults, with ``fields`` over them: ``loss_type`` dapo, ``beta`` 0, the KL bias
        correction on, ``epsilon_high`` equal to ``epsilon_low``. (A run's defaults above are MindRLHF's.)"""
        fields.setdefault("epsilon_high", fields.get("epsilon_low", 0.2))
        return cls(**{"loss_type": "dapo", "beta": 0.0, "use_bias_correction_kl": True, **fields})

    @property
    def runs_fused(self) -> bool:
        """Whether the fused op computes the per-token loss: for ``loss_impl`` fused with the clipped surrogate
        (grpo, bnpo, dr_grpo, dapo) at token level, without entropy mask or rollout correction, with or without KL
        and entropy bonus. Every other combination runs the plain ops: a sequence-level ratio needs each row's sum
        before any token's loss, which the one-pass kernel does not make; cispo and sapo are other surrogates, and
        the entropy mask and correction weights are extra per-token inputs the kernel does not take."""
        return (self.loss_impl == "fused" and self.importance_sampling_level == "token"
                and self.loss_type in CLIPPED_LOSS_TYPES and self.top_entropy_quantile == 1.0
                and self.rollout_correction == "none")

    @property
    def reduction(self) -> str:
        """The token reduction of ``loss_type``: itself for the four reductions, dapo for cispo, grpo for sapo."""
        return LOSS_REDUCTIONS.get(self.loss_type, self.loss_type)

    @property
    def needs_entropy(self) -> bool:
        """Whether the loss needs the per-token entropy (entropy mask or bonus)."""
        return self.top_entropy_quantile < 1.0 or self.entropy_coef > 0


@dataclass
class RewardShapingConfig:
    """What turns rewards into advantages, and which completions the loss sees."""

    scale_rewards: str = "group"
    """Advantage scaling: ``group`` (divide by the group's reward std), ``batch`` (by the batch std), ``none``
    (Dr. GRPO: no division)."""
    overlong_buffer_length: int = 0
    """DAPO's soft overlong punishment (verl's ``reward_model.overlong_buffer.len``): a completion longer than
    max_tokens - overlong_buffer_length loses overlong_penalty_factor x (its excess / overlong_buffer_length) of
    reward, rising linearly to the whole factor at max_tokens; its length counts the EOS token, as verl's
    ``valid_response_length``. Added to the reward before the advantages; 0 is off. See mindgrpo.rewards.overlong."""
    overlong_penalty_factor: float = 1.0
    """The penalty at max_tokens when overlong_buffer_length > 0 (verl's ``overlong_buffer.penalty_factor``)."""
    mask_truncated_completions: bool = False
    """Leave completions that reached max_tokens without EOS out of the loss (mask 0 on all their tokens), as
    TRL's ``mask_truncated_completions`` (DAPO's overlong filtering). They keep their rewards and still count in
    their group's mean and std, as in TRL."""


@dataclass
class CheckpointConfig:
    """Checkpoints, completion dumps and the run's tolerance of bad updates."""

    save_checkpoint_dir: str = field(default="", metadata=OUTPUT_PATH)
    """Checkpoint folder; empty means <output_dir>/checkpoints (command line: --save_checkpoint_dir)."""
    resume_training: bool = False
    """Continue from the newest complete checkpoint in save_checkpoint_dir (command line: --resume_training)."""
    save_ckpt_interval: int = 100
    """Save a checkpoint every this many steps (and at the end); 0 saves only at the end."""
    save_max_ckpt_num: int = 1
    """Checkpoints kept; older ones are deleted after a newer one is complete."""
    save_prompt_completions_data: bool = True
    """Write prompts, completions and rewards to completions.jsonl (to find the "aha moment")."""
    save_prompt_completions_interval: int = 1
    """Steps between completion dumps."""
    max_skipped_updates: int = 3
    """Consecutive optimizer updates skipped for a non-finite loss or gradient (the weights are kept; each is
    counted in ``grpo/skipped_updates``) before the run stops with an error. Formerly ``max_skipped_steps``."""
    max_rollout_logprob_gap: float = -1.0
    """Stop the run when ``rollout/logprob_diff_max`` (the largest |training forward log-prob - rollout engine's
    log-prob| over a step's sampled tokens) exceeds this: the rollout then sampled from other weights than the ones
    being trained (a weight or adapter sync that did not happen), which no loss curve shows. -1 (default): 1e-3
    where both compute the same float32 math of the same distribution (the native backend at compute_dtype float32,
    sampling without repetition_penalty, min_tokens, top_k or top_p, whose log-probs are of the filtered
    distribution; measured gap about 1e-5), off elsewhere (bf16 on Ascend, vLLM, MindFormers, where a gap is
    expected); 0: off."""

@dataclass
class RLConfig(CheckpointConfig, RewardShapingConfig, LossConfig, ShapesConfig, ToolsConfig, GenerationConfig,
               ScheduleConfig, RunConfig):
    """``rl_config``: one flat yaml group (MindRLHF's keys as they are), made of the concept groups above, as TRL's
    GRPOConfig sections its own. A dataclass lists inherited fields from the last base to the first, so the yaml
    and ``config-help`` read RunConfig's keys first; :meth:`groups` gives the groups in that order."""

    @classmethod
    def groups(cls) -> List[type]:
        """The concept groups, in reading order (each owns the fields it declares)."""
        return [base for base in reversed(cls.__mro__) if base not in (object, cls) and dataclasses.is_dataclass(base)]


@dataclass
class GRPOConfig:
    rl_config: RLConfig = field(default_factory=RLConfig)
    """Data, algorithm, checkpoints and logging."""
    actor_config: ActorConfig = field(default_factory=ActorConfig)
    """The policy being trained."""
    ref_config: RefConfig = field(default_factory=RefConfig)
    """The frozen reference model for the KL penalty."""
    reward_config: RewardConfig = field(default_factory=RewardConfig)
    """Rule-based verifiers and their weights."""
    generate_config: GenerateConfig = field(default_factory=GenerateConfig)
    """The rollout engine."""
    config_path: Optional[str] = field(default=None, repr=False, metadata={"internal": True})
    """The yaml this config was loaded from (set by load_config; not a yaml key)."""

    # Convenience views of the derived paths, so callers do not repeat the fallbacks.
    @property
    def tokenizer_dir(self) -> str:
        return self.rl_config.tokenizer_dir or self.actor_config.load

    @property
    def ref_load(self) -> str:
        return self.ref_config.load or self.actor_config.load

    @property
    def checkpoint_dir(self) -> str:
        return self.rl_config.save_checkpoint_dir or os.path.join(self.rl_config.output_dir, "checkpoints")

    @classmethod
    def from_yaml(cls, path: str | os.PathLike, overrides: Sequence[str] = ()) -> "GRPOConfig":
        from mindgrpo.config.load import load_config  # the loader builds on this module

        return load_config(path, overrides)

    def to_dict(self) -> Dict[str, Any]:
        """Plain nested dict in yaml layout (paths as resolved)."""
        out = dataclasses.asdict(self)
        out.pop("config_path")
        return out


# ----------------------------------------------------------------------------------------------------------------
# Field documentation (the strings under each field)

def field_docs(cls: type) -> Dict[str, str]:
    """Attribute docstrings of a dataclass, read from its source and its dataclass bases' (RLConfig's groups)."""
    docs: Dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            docs.update(_own_field_docs(klass))
    return docs


def _own_field_docs(cls: type) -> Dict[str, str]:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    docs: Dict[str, str] = {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    for node, nxt in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def describe(cls: type = GRPOConfig, prefix: str = "") -> List[str]:
    """One line per leaf key: ``group.key (type, default): documentation``; a group made of concept groups
    (``rl_config``) has a ``# group.Concept: documentation`` line before each concept's keys."""
    lines: List[str] = []
    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    concept = None
    for f in dataclasses.fields(cls):
        if f.metadata.get("internal"):
            continue
        owner = _declaring_class(cls, f.name)
        if owner is not cls and owner is not concept:
            concept = owner
            summary = " ".join((owner.__doc__ or "").split("\n\n")[0].split())  # the docstring's first paragraph
            lines.append(f"# {prefix}{owner.__name__}: {summary}")
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hints[f.name]):
            lines.extend(describe(hints[f.name], key + "."))
        else:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            lines.append(f"{key} ({_type_name(hints[f.name])}, default {default!r}): {docs.get(f.name, '')}")
    return lines


def _declaring_class(cls: type, name: str) -> type:
    return next(klass for klass in cls.__mro__ if name in vars(klass).get("__annotations__", {}))


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (list, List):
        return f"list[{_type_name(typing.get_args(tp)[0])}]"
    return getattr(tp, "__name__", str(tp))


# ----------------------------------------------------------------------------------------------------------------
# Keys by their dotted names

def get_key(config: Any, dotted: str) -> Any:
    """The value of ``dotted`` (``group.key``, e.g. ``rl_config.beta``) in ``config``."""
    obj = config
    for name in dotted.split("."):
        obj = getattr(obj, name)
    return obj


def path_keys(kind: str, cls: type = GRPOConfig, prefix: str = "") -> List[str]:
    """The dotted keys of the fields marked as ``kind`` paths (``input`` or ``output``, see INPUT_PATH)."""
    keys: List[str] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            keys += path_keys(kind, hints[f.name], f"{prefix}{f.name}.")
        elif f.metadata.get("path") == kind:
            keys.append(prefix + f.name)
    return keys
