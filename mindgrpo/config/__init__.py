"""Typed GRPO configuration, loaded from a MindRLHF-style ``grpo_config.yaml``.

The yaml has the key groups MindRLHF users know (``rl_config``, ``actor_config``, ``ref_config``,
``reward_config``, ``generate_config``, with ``parallel_config``, ``optimizer``, ``lr_schedule`` and
``sampling_config`` blocks inside). Each group is a dataclass below; the string under each field is its
documentation (``python -m mindgrpo config-help`` prints them all).

Rules that differ from the seeds on purpose:
- relative paths in the yaml resolve against the yaml's own folder (paths given on the command line resolve
  against the current directory), so a config folder can be moved or shared as a whole;
- unknown keys are errors that name the key, the file and line, and suggest the closest known key;
- every input path is checked by :func:`validate` before any work starts.
"""
from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import os
import textwrap
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import yaml

from mindgrpo.rewards import AGGREGATIONS
from mindgrpo.rollout.api import PROMPT_LENGTH_BUCKET


class ConfigError(ValueError):
    """A configuration problem, with the key and where it came from."""


# Field metadata flags.
INPUT_PATH = {"path": "input"}    # must exist before training starts
OUTPUT_PATH = {"path": "output"}  # created on demand; its parent must be writable


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

    @property
    def shards_model(self) -> bool:
        """Whether the layout splits the model itself (tensor or pipeline parallel), not only the data."""
        return self.model_parallel > 1 or self.pipeline_stage > 1


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
    """Matmul dtype: float32 on CPU; bfloat16 or float16 on Ascend. Parameters stay float32."""
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
    recompute: bool = False
    """Recompute each decoder layer in the actor's backward (``Cell.recompute()`` on every layer of the
    shared-prompt forward): only each layer's input hidden state is kept, and one layer's activations are rebuilt
    at a time, for one more forward of the layers per update. Same gradients, much less activation memory (4 x 128
    prompt + 32 x 128 completion tokens, 8 small layers, CPU: 1027 -> 370 MiB, ``tools/bench_recompute.py``).
    Applies with ``rl_config.share_prompt: true``; reference and old-logprob scoring have no backward."""
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
    are resharded on sync, see mindgrpo.rollout.resharding)."""
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


@dataclass
class RLConfig:
    dataset_file: str = field(default="", metadata=INPUT_PATH)
    """MindRecord made by tools/rlhf_data.py (command line: --dataset_file)."""
    tokenizer_dir: str = field(default="", metadata=INPUT_PATH)
    """Folder with tokenizer.json (or vocab.json + merges.txt); empty means actor_config.load
    (command line: --tokenizer_dir)."""
    output_dir: str = field(default="output", metadata=OUTPUT_PATH)
    """Run folder: metrics.jsonl, tensorboard/, completions.jsonl."""
    save_checkpoint_dir: str = field(default="", metadata=OUTPUT_PATH)
    """Checkpoint folder; empty means <output_dir>/checkpoints (command line: --save_checkpoint_dir)."""
    resume_training: bool = False
    """Continue from the newest complete checkpoint in save_checkpoint_dir (command line: --resume_training)."""
    seed: int = 0
    """Seed for data order, sampling and initialisation."""
    mode: str = "graph"
    """MindSpore execution mode: ``graph`` (compiled, fast) or ``pynative`` (eager, for debugging)."""
    device_target: str = "auto"
    """``auto`` (what MindSpore finds), ``CPU`` or ``Ascend``."""
    epochs: int = 1
    """Passes over the dataset; ignored when max_steps > 0."""
    max_steps: int = 0
    """Training steps (each: one batch of prompts); 0 means epochs x steps per epoch."""
    batch_size: int = 4
    """Prompts per step on each data-parallel rank."""
    num_generations: int = 8
    """Completions sampled per prompt (the GRPO group size)."""
    num_iterations: int = 1
    """Optimizer passes over each batch of rollouts (the inner PPO epochs, mu in the GRPO paper). With more than
    one, log-probs of the sampling policy are computed once and the ratio is clipped against them."""
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
    beta: float = 0.04
    """Weight of the KL penalty to the reference model; 0 skips the reference model entirely."""
    kl_estimator: str = "k3"
    """KL estimator: ``k1`` (log-ratio), ``k2`` (half squared log-ratio) or ``k3`` (low-variance, as
    DeepSeekMath and TRL)."""
    use_bias_correction_kl: bool = False
    """Multiply the k3 KL by the importance ratio (TRL's default; DeepSeek-V3.2)."""
    epsilon_low: float = 0.2
    """Lower clip range: ratios below 1 - epsilon_low are clipped."""
    epsilon_high: float = 0.2
    """Upper clip range: ratios above 1 + epsilon_high are clipped (DAPO's clip-higher uses 0.28)."""
    loss_type: str = "grpo"
    """Loss aggregation: ``grpo`` (token mean per sequence, then batch mean; DeepSeekMath and MindRLHF),
    ``bnpo`` (token mean over the local batch), ``dr_grpo`` (token sum / (batch x max_tokens)), ``dapo`` (token
    mean over the global batch, across micro-batches and data-parallel ranks)."""
    scale_rewards: str = "group"
    """Advantage scaling: ``group`` (divide by the group's reward std), ``batch`` (by the batch std), ``none``
    (Dr. GRPO: no division)."""
    loss_impl: str = "fused"
    """``fused`` (one custom kernel for surrogate + KL + metrics) or ``plain`` (MindSpore ops; the reference)."""
    share_prompt: bool = True
    """Compute each prompt once per group in the reference, old-log-prob and training forwards: the prompt's
    completions attend to it (Prefix Grouper) instead of repeating it in every row. Same log-probs, far fewer
    tokens (prompts are ~60 % of GSM8K rows). Needs actor_config.micro_batch_size and
    ref_config.ref_model_batch_size to be multiples of num_generations. Must be true with model_parallel > 1 (the
    unshared path is MindFormers' forward, which does not run on tensor-parallel slices)."""
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

    @property
    def prompt_widths(self) -> Tuple[int, ...]:
        """Every padded prompt width a step can meet: multiples of ``prompt_bucket`` up to ``max_prompt_length``
        (the native rollout engine's prompt-length buckets and the reference and training graphs' widths)."""
        step, cap = self.prompt_bucket, self.max_prompt_length
        return tuple(sorted({min(cap, width) for width in range(step, cap + step, step)}))

    def prompt_width(self, length: int) -> int:
        """The padded width of a batch whose longest prompt has ``length`` tokens: the smallest of
        :attr:`prompt_widths` that holds it (few distinct shapes: GRAPH mode compiles each once)."""
        widths = self.prompt_widths
        return next((width for width in widths if width >= length), widths[-1])


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
        return load_config(path, overrides)

    def to_dict(self) -> Dict[str, Any]:
        """Plain nested dict in yaml layout (paths as resolved)."""
        out = dataclasses.asdict(self)
        out.pop("config_path")
        return out


# ----------------------------------------------------------------------------------------------------------------
# Field documentation (the strings under each field)

def field_docs(cls: type) -> Dict[str, str]:
    """Attribute docstrings of a dataclass, read from its source."""
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
    """One line per leaf key: ``group.key (type, default): documentation``."""
    lines: List[str] = []
    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get("internal"):
            continue
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hints[f.name]):
            lines.extend(describe(hints[f.name], key + "."))
        else:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            lines.append(f"{key} ({_type_name(hints[f.name])}, default {default!r}): {docs.get(f.name, '')}")
    return lines


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (list, List):
        return f"list[{_type_name(typing.get_args(tp)[0])}]"
    return getattr(tp, "__name__", str(tp))


# ----------------------------------------------------------------------------------------------------------------
# Loading

# MindRLHF's command-line flags and where they land.
CLI_FLAGS: Dict[str, str] = {
    "dataset_file": "rl_config.dataset_file",
    "tokenizer_dir": "rl_config.tokenizer_dir",
    "actor_checkpoint_path": "actor_config.load",
    "ref_checkpoint_path": "ref_config.load",
    "generate_checkpoint_path": "generate_config.load",
    "verifier_function": "reward_config.verifier_function",
    "verifier_weight": "reward_config.verifier_weight",
    "save_checkpoint_dir": "rl_config.save_checkpoint_dir",
    "resume_training": "rl_config.resume_training",
}


class _Source:
    """Where values came from, for error messages and path resolution."""

    def __init__(self, file: Optional[Path], lines: Mapping[str, int]):
        self.file, self.lines = file, lines

    def where(self, key: str) -> str:
        if self.file is None:
            return "command line"
        line = self.lines.get(key)
        return f"{self.file}:{line}" if line else str(self.file)


def load_config(path: str | os.PathLike | None = None, overrides: Sequence[str] = (),
                flags: Optional[Mapping[str, Any]] = None) -> GRPOConfig:
    """Load a yaml config, then apply MindRLHF-style ``flags`` and ``key.path=value`` ``overrides``.

    Relative paths in the yaml resolve against the yaml's folder; relative paths in flags and overrides resolve
    against the current directory. Unknown keys raise :class:`ConfigError` with a suggestion.
    """
    config = GRPOConfig()
    if path is not None:
        yaml_path = Path(path).expanduser().resolve()
        if not yaml_path.is_file():
            raise ConfigError(f"config file not found: {yaml_path}")
        text = yaml_path.read_text(encoding="utf-8")
        try:
            node = yaml.compose(text)
            data = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ConfigError(f"{yaml_path}: not valid YAML: {err}") from None
        source = _Source(yaml_path, _key_lines(node))
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(f"{yaml_path}: the top level must be a mapping of key groups "
                              f"(rl_config, actor_config, ...), got {type(data).__name__}")
        _merge(config, data, "", source, base_dir=yaml_path.parent)
        config.config_path = str(yaml_path)
    cli = _Source(None, {})
    for name, value in (flags or {}).items():
        if value is None:
            continue
        if name not in CLI_FLAGS:
            raise ConfigError(f"unknown flag --{name}{_suggest(name, CLI_FLAGS)}")
        set_key(config, CLI_FLAGS[name], value, cli, base_dir=Path.cwd())
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} is not of the form key.path=value (e.g. rl_config.beta=0.0)")
        set_key(config, key.strip(), yaml.safe_load(raw) if raw.strip() else "", cli, base_dir=Path.cwd())
    return config


def _key_lines(node: Any, prefix: str = "") -> Dict[str, int]:
    """Map dotted key paths to 1-based yaml line numbers."""
    lines: Dict[str, int] = {}
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = f"{prefix}{key_node.value}"
            lines[key] = key_node.start_mark.line + 1
            lines.update(_key_lines(value_node, key + "."))
    return lines


def _merge(obj: Any, data: Mapping[str, Any], prefix: str, source: _Source, base_dir: Path) -> None:
    for key, value in data.items():
        set_key(obj, f"{prefix}{key}", value, source, base_dir, root_prefix=prefix)


RENAMED_KEYS = {"rl_config.max_skipped_steps": "rl_config.max_skipped_updates"}
"""Old key -> new key. An old key still works, with a warning naming where it was written and the new name."""


class ConfigWarning(UserWarning):
    """A config that works but should be changed (a renamed key)."""


def set_key(config: Any, dotted: str, value: Any, source: _Source, base_dir: Path, root_prefix: str = "") -> None:
    """Set ``dotted`` (relative to ``config``) to ``value``, checking the key and coercing the type."""
    if dotted in RENAMED_KEYS:
        warnings.warn(f"{source.where(dotted)}: '{dotted}' is now called '{RENAMED_KEYS[dotted]}'; "
                      "the old name still works but will be removed", ConfigWarning, stacklevel=2)
        dotted = RENAMED_KEYS[dotted]
    parts = dotted[len(root_prefix):].split(".") if root_prefix else dotted.split(".")
    obj = config
    for depth, name in enumerate(parts):
        known = {f.name: f for f in dataclasses.fields(obj) if not f.metadata.get("internal")}
        full = root_prefix + ".".join(parts[: depth + 1])
        if name not in known:
            raise ConfigError(f"{source.where(full)}: unknown key '{full}'{_suggest(name, known)}")
        f = known[name]
        hint = typing.get_type_hints(type(obj))[name]
        if depth < len(parts) - 1:
            if not dataclasses.is_dataclass(hint):
                raise ConfigError(f"{source.where(full)}: '{full}' is a value, not a group")
            obj = getattr(obj, name)
            continue
        if dataclasses.is_dataclass(hint):
            if not isinstance(value, dict):
                raise ConfigError(f"{source.where(full)}: '{full}' must be a mapping of its keys, "
                                  f"got {type(value).__name__}")
            _merge(getattr(obj, name), value, full + ".", source, base_dir)
            return
        coerced = _coerce(value, hint, full, source)
        if f.metadata.get("path") and coerced:
            coerced = str((base_dir / Path(coerced).expanduser()).resolve()) if not os.path.isabs(
                os.path.expanduser(coerced)) else os.path.normpath(os.path.expanduser(coerced))
        setattr(obj, name, coerced)


def _suggest(name: str, known: Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    if close:
        return f"; did you mean '{close[0]}'?"
    return f"; known keys: {', '.join(sorted(known))}"


def _coerce(value: Any, hint: Any, key: str, source: _Source) -> Any:
    def fail(expected: str) -> ConfigError:
        return ConfigError(f"{source.where(key)}: '{key}' must be {expected}, got {value!r}")

    if typing.get_origin(hint) in (list, List):
        inner = typing.get_args(hint)[0]
        if isinstance(value, str):  # "a,b" or "1.0 0.5" from the command line
            value = [v for v in value.replace(",", " ").split() if v]
        if not isinstance(value, (list, tuple)):
            raise fail("a list")
        return [_coerce(v, inner, key, source) for v in value]
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no", "on", "off"):
            return value.lower() in ("true", "1", "yes", "on")
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise fail("true or false")
    if hint is int:
        if isinstance(value, bool):
            raise fail("an integer")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                raise fail("an integer") from None
            if number.is_integer():
                return int(number)
        raise fail("an integer")
    if hint is float:
        if isinstance(value, bool):
            raise fail("a number")
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):  # PyYAML reads 1e-6 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                raise fail("a number") from None
        raise fail("a number")
    if hint is str:
        if value is None:
            return ""
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise fail("a string")
    raise ConfigError(f"{source.where(key)}: '{key}' has an unsupported type {hint!r}")


# ----------------------------------------------------------------------------------------------------------------
# Validation

CHOICES: Dict[str, Tuple[str, ...]] = {
    "rl_config.mode": ("graph", "pynative"),
    "rl_config.device_target": ("auto", "CPU", "Ascend"),
    "rl_config.kl_estimator": ("k1", "k2", "k3"),
    "rl_config.loss_type": ("grpo", "bnpo", "dr_grpo", "dapo"),
    "rl_config.scale_rewards": ("group", "batch", "none"),
    "rl_config.loss_impl": ("fused", "plain"),
    "actor_config.compute_dtype": ("float32", "bfloat16", "float16"),
    "ref_config.compute_dtype": ("float32", "bfloat16", "float16"),
    "actor_config.optimizer.type": ("AdamW",),
    "actor_config.lr_schedule.type": ("constant", "cosine", "linear"),
    "generate_config.backend": ("native", "mindformers", "vllm"),
    "generate_config.decode_impl": ("fused", "plain"),
    "reward_config.aggregation": AGGREGATIONS,
}
_LR_ALIASES = {"CosineWithWarmUpLR": "cosine", "cosine_with_warmup": "cosine", "ConstantWarmUpLR": "constant"}


def get_key(config: Any, dotted: str) -> Any:
    obj = config
    for name in dotted.split("."):
        obj = getattr(obj, name)
    return obj


def validate(config: GRPOConfig, *, check_paths: bool = True) -> GRPOConfig:
    """Check values and (optionally) that every input path exists; raise one ConfigError listing all problems."""
    sched = config.actor_config.lr_schedule
    sched.type = _LR_ALIASES.get(sched.type, sched.type)
    problems: List[str] = []
    for key, allowed in CHOICES.items():
        value = get_key(config, key)
        if value not in allowed:
            problems.append(f"{key} = {value!r}: choose one of {', '.join(allowed)}")
    rl, sampling = config.rl_config, config.generate_config.sampling_config
    positive = {
        "rl_config.batch_size": rl.batch_size, "rl_config.num_generations": rl.num_generations,
        "rl_config.num_iterations": rl.num_iterations, "rl_config.max_prompt_length": rl.max_prompt_length,
        "rl_config.seq_length": rl.seq_length, "generate_config.sampling_config.max_tokens": sampling.max_tokens,
        "rl_config.prompt_bucket": rl.prompt_bucket,
        "actor_config.micro_batch_size": config.actor_config.micro_batch_size,
        "ref_config.ref_model_batch_size": config.ref_config.ref_model_batch_size,
        "generate_config.infer_model_batch_size": config.generate_config.infer_model_batch_size,
        "rl_config.save_max_ckpt_num": rl.save_max_ckpt_num, "rl_config.epochs": rl.epochs,
    }
    problems += [f"{k} = {v}: must be at least 1" for k, v in positive.items() if v < 1]
    nonneg = {"rl_config.beta": rl.beta, "rl_config.epsilon_low": rl.epsilon_low,
              "rl_config.epsilon_high": rl.epsilon_high, "rl_config.max_steps": rl.max_steps,
              "rl_config.save_ckpt_interval": rl.save_ckpt_interval,
              "actor_config.lr_schedule.learning_rate": sched.learning_rate,
              "actor_config.lr_schedule.warmup_steps": sched.warmup_steps,
              "actor_config.optimizer.max_grad_norm": config.actor_config.optimizer.max_grad_norm,
              "generate_config.sampling_config.min_tokens": sampling.min_tokens}
    problems += [f"{k} = {v}: must not be negative" for k, v in nonneg.items() if v < 0]
    if not 0 <= rl.epsilon_low < 1:
        problems.append(f"rl_config.epsilon_low = {rl.epsilon_low}: must be in [0, 1)")
    if sampling.temperature <= 0:
        problems.append(f"generate_config.sampling_config.temperature = {sampling.temperature}: must be > 0 "
                        "(use top_k: 1 for greedy decoding)")
    if not 0 < sampling.top_p <= 1:
        problems.append(f"generate_config.sampling_config.top_p = {sampling.top_p}: must be in (0, 1]")
    if sampling.min_tokens > sampling.max_tokens:
        problems.append(f"generate_config.sampling_config.min_tokens = {sampling.min_tokens} exceeds "
                        f"max_tokens = {sampling.max_tokens}")
    if rl.max_prompt_length + sampling.max_tokens > rl.seq_length:
        problems.append(f"rl_config.max_prompt_length ({rl.max_prompt_length}) + "
                        f"generate_config.sampling_config.max_tokens ({sampling.max_tokens}) exceeds "
                        f"rl_config.seq_length ({rl.seq_length}): raise seq_length or shorten one of them")
    if rl.share_prompt:
        for key, size in (("actor_config.micro_batch_size", config.actor_config.micro_batch_size),
                          ("ref_config.ref_model_batch_size", config.ref_config.ref_model_batch_size)):
            if size % rl.num_generations:
                problems.append(f"{key} = {size} is not a multiple of rl_config.num_generations = "
                                f"{rl.num_generations}: rl_config.share_prompt needs whole groups per micro-batch "
                                "(change the size, or set rl_config.share_prompt: false)")
    problems += _packing_problems(config)
    problems += _layout_problems(config)
    rewards = config.reward_config
    if len(rewards.verifier_weight) != len(rewards.verifier_function):
        problems.append(f"reward_config.verifier_weight has {len(rewards.verifier_weight)} entries but "
                        f"reward_config.verifier_function has {len(rewards.verifier_function)}: give one weight "
                        "per verifier")
    if not rewards.verifier_function:
        problems.append("reward_config.verifier_function is empty: name at least one verifier")
    if not 0 <= rewards.verifier_timeout < float("inf"):  # also refuses NaN
        problems.append(f"reward_config.verifier_timeout = {rewards.verifier_timeout}: must be a finite number of "
                        "seconds >= 0 (0: no limit)")
    if rewards.verifier_parallel < 0:
        problems.append(f"reward_config.verifier_parallel = {rewards.verifier_parallel}: must not be negative "
                        "(0: verifiers run in the trainer's process)")
    if rewards.aggregation == "normalize_then_sum":
        if rl.scale_rewards != "batch":
            problems.append(f"reward_config.aggregation = normalize_then_sum normalises each verifier within its "
                            f"group, then the sum over the batch (TRL, GDPO), but rl_config.scale_rewards = "
                            f"{rl.scale_rewards!r}: set rl_config.scale_rewards: batch")
        if rewards.gate_accuracy_on_format:
            problems.append("reward_config.aggregation = normalize_then_sum normalises each verifier on its own, "
                            "and reward_config.gate_accuracy_on_format multiplies accuracy by format: choose one")
    if config.generate_config.backend == "vllm":
        problems += _vllm_layout_problems(config)
    if check_paths:
        problems += _path_problems(config)
    if problems:
        where = f" in {config.config_path}" if config.config_path else ""
        raise ConfigError(f"invalid configuration{where}:\n  - " + "\n  - ".join(problems))
    return config


def _packing_problems(config: GRPOConfig) -> List[str]:
    budget, key = config.actor_config.max_tokens_per_micro_batch, "actor_config.max_tokens_per_micro_batch"
    limit = config.generate_config.sampling_config.max_tokens
    if budget == 0:
        return []
    if budget < 0:
        return [f"{key} = {budget}: must not be negative (0: padded micro-batches)"]
    if budget < limit:
        return [f"{key} = {budget} is below generate_config.sampling_config.max_tokens = {limit}: a completion at "
                f"the limit must fit one micro-batch; raise it (or 0 for padded micro-batches)"]
    if not config.rl_config.share_prompt:
        return [f"{key} = {budget} packs completions for the shared-prompt forward; set rl_config.share_prompt: "
                "true (or the key to 0)"]
    return []


def _layout_problems(config: GRPOConfig) -> List[str]:
    """The layouts of actor, reference and rollout engine must agree (the model's shape is checked later, by
    check_parallel_layout, once config.json is read)."""
    actor = config.actor_config.parallel_config
    problems: List[str] = []
    tensor_parallel = actor.model_parallel > 1
    if tensor_parallel and not config.rl_config.share_prompt:
        problems.append(f"rl_config.share_prompt: false with actor_config.parallel_config.model_parallel = "
                        f"{actor.model_parallel}: the unshared forward is MindFormers', which does not run on "
                        "tensor-parallel slices; set rl_config.share_prompt: true")
    sections = [("ref_config", config.ref_config.parallel_config)]
    backend = config.generate_config.backend
    if backend != "vllm":  # vllm reshards to its own model_parallel (checked with the backend's settings)
        sections.append(("generate_config", config.generate_config.parallel_config))
    for name, layout in sections:
        if (layout.data_parallel, layout.model_parallel, layout.pipeline_stage) == (1, 1, 1):
            continue  # left at the default: the actor's layout is used
        for key in ("data_parallel", "model_parallel", "pipeline_stage"):
            if getattr(layout, key) != getattr(actor, key):
                problems.append(f"{name}.parallel_config.{key} = {getattr(layout, key)} differs from "
                                f"actor_config.parallel_config.{key} = {getattr(actor, key)}: the "
                                f"{'reference model' if name == 'ref_config' else backend + ' rollout engine'} "
                                "runs on the actor's ranks with the actor's slices; use the same value")
    if tensor_parallel and backend == "mindformers":
        problems.append("generate_config.backend: mindformers cannot run on tensor-parallel slices (its generate() "
                        "is MindFormers' forward); use generate_config.backend: native")
    return problems


def _vllm_layout_problems(config: GRPOConfig) -> List[str]:
    """vLLM's tensor_parallel_size is generate_config.parallel_config.model_parallel; the weight sync reshards the
    actor into it (mindgrpo.rollout.resharding), which needs it to split the heads, KV heads, MLP and vocabulary
    as mindgrpo.models.shard_layout.TPLayout does. Needs the actor's config.json: without a readable one there is
    nothing to check here (the path checks report a missing folder)."""
    key = "generate_config.parallel_config.model_parallel"
    tp = config.generate_config.parallel_config.model_parallel
    if tp < 1:
        return [f"{key} = {tp}: must be at least 1"]
    if not config.actor_config.load:
        return []
    from mindgrpo.models.hf_config import ModelConfigError, read_hf_config
    from mindgrpo.models.shard_layout import LayoutError, TPLayout

    try:
        hf_config = read_hf_config(config.actor_config.load)
    except (OSError, ModelConfigError):
        return []
    try:
        TPLayout.for_hf_config(hf_config, tp, 0)
    except LayoutError as err:
        return [f"{key} = {tp} is vLLM's tensor_parallel_size for generate_config.backend vllm, and it cannot split "
                f"the model in {config.actor_config.load}: {err}. Choose a divisor of the attention heads that also "
                "divides (or is a multiple of) the key/value heads and divides the MLP size and vocabulary"]
    return []


def _path_problems(config: GRPOConfig) -> List[str]:
    problems: List[str] = []
    hints = {
        "rl_config.dataset_file": "convert your data first: python tools/rlhf_data.py --help",
        "actor_config.load": "point it at a Hugging Face Qwen2.5 folder with config.json and *.safetensors",
    }
    required = {"rl_config.dataset_file", "actor_config.load"}
    for key in _path_keys(GRPOConfig, "", "input"):
        value = get_key(config, key)
        if not value:
            if key in required:
                problems.append(f"{key} is not set: {hints[key]}")
            continue
        if not os.path.exists(value):
            problems.append(f"{key} = {value}: no such file or folder" + (f"; {hints[key]}" if key in hints else ""))
    for key in _path_keys(GRPOConfig, "", "output"):
        value = get_key(config, key)
        if value and not _writable(value):
            problems.append(f"{key} = {value}: cannot create or write this folder")
    return problems


def _path_keys(cls: type, prefix: str, kind: str) -> List[str]:
    keys: List[str] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            keys += _path_keys(hints[f.name], f"{prefix}{f.name}.", kind)
        elif f.metadata.get("path") == kind:
            keys.append(prefix + f.name)
    return keys


def _writable(path: str) -> bool:
    probe = Path(path)
    while not probe.exists():
        if probe.parent == probe:
            return False
        probe = probe.parent
    return probe.is_dir() and os.access(probe, os.W_OK | os.X_OK)


def check_parallel_layout(parallel: ParallelConfig, *, world_size: int, num_heads: int, num_kv_heads: int,
                          num_layers: int, device_target: str, vocab_size: Optional[int] = None,
                          intermediate_size: Optional[int] = None, key: str = "actor_config.parallel_config") -> None:
    """Check a parallel layout against the worker count and the model shape (the same on CPU and Ascend: tensor
    parallelism is explicit collectives, see mindgrpo.models.tensor_parallel).

    ``vocab_size`` and ``intermediate_size`` are checked when given (the embedding, lm_head and MLP are split over
    model_parallel). Raises ConfigError naming the number that is wrong.
    """
    dp, mp, pp = parallel.data_parallel, parallel.model_parallel, parallel.pipeline_stage
    problems = [f"{key}.{name} = {value}: must be at least 1"
                for name, value in (("data_parallel", dp), ("model_parallel", mp), ("pipeline_stage", pp))
                if value < 1]
    if not problems:
        if dp * mp * pp != world_size:
            problems.append(f"{key}: data_parallel ({dp}) x model_parallel ({mp}) x pipeline_stage ({pp}) = "
                            f"{dp * mp * pp}, but {world_size} worker(s) are running: make the product equal the "
                            "msrun --worker_num")
        if pp > 1:
            problems.append(f"{key}.pipeline_stage = {pp}: pipeline parallelism is not implemented; use "
                            "model_parallel (tensor parallel) x data_parallel (see `python -m mindgrpo plan`)")
        # Deferred: the package import of mindgrpo.models loads MindFormers, which config itself never needs.
        from mindgrpo.models.shard_layout import TPLayout  # noqa: PLC0415

        layout = TPLayout(tp=mp, rank=0, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=1,
                          vocab_size=vocab_size or mp, intermediate_size=intermediate_size or mp)
        problems += [f"{key}.{p}" for p in layout.problems()]
    if problems:
        raise ConfigError("invalid parallel layout:\n  - " + "\n  - ".join(problems))


def dump_yaml(config: GRPOConfig, path: str | os.PathLike) -> None:
    """Write the resolved config (absolute paths) atomically, e.g. next to a run's metrics."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(yaml.safe_dump(config.to_dict(), sort_keys=False), encoding="utf-8")
    os.replace(tmp, path)
