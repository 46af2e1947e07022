"""``python -m mindgrpo plan``: per-rank memory of every parallel layout of a run, and the one to use.

    python -m mindgrpo plan --config grpo.yaml --workers 8 --device-memory 64GB [--model HF_FOLDER] [--json]
                            [group.key=value ...]

For each layout ``data_parallel x model_parallel`` (``pipeline_stage`` 1) that multiplies to the worker count and
that the model's shape can be split over (:meth:`~mindgrpo.parallel.layout.TPLayout.problems`), the planner
adds up what one rank holds at its peak, in bytes:

* **weights**: the working weights of the rank's tensor-parallel slice (:class:`TPLayout`: heads, KV heads,
  vocabulary and intermediate size split by ``model_parallel``; norms replicated; KV heads replicated when there are
  fewer of them than ranks), in ``actor_config.param_dtype``. ``n`` below is that slice's parameter count:
  ``weights = 4 n`` in float32, ``2 n`` in bfloat16.
* **gradients**: one accumulator per parameter in ``actor_config.grad_reduce_dtype``: ``4 n`` (or ``2 n``).
* **optimizer**: AdamW's two float32 moments, ``8 n``, and with bfloat16 weights the float32 master weights,
  ``4 n`` more; with ZeRO-1 (``parallel_config.optimizer_shard``, on by default) each data-parallel rank keeps them
  for the whole parameters it owns (:func:`mindgrpo.train.optim_state.owner_ranks`, about ``n / dp``): ``8 x`` (or
  ``12 x``) the largest rank's share.
* **reference**: the frozen reference model (only when ``rl_config.beta > 0``), sliced the same way, in
  ``ref_config.compute_dtype``: ``bytes(dtype) n``.
* **kv_cache**: the native rollout engine's K and V per layer, kept between steps:
  ``2 L B kv_l (P + round_up(T, 32)) d c`` with ``B = infer_model_batch_size``, ``kv_l`` the rank's KV heads,
  ``c`` the actor's compute-dtype bytes. On ``cpu`` with ``generate_config.decode_impl: fused`` the cache is the
  fused kernels' store (:mod:`mindgrpo.ops.kv_store`): outside MindSpore, resident only as far as the live rows
  have grown and given back after each rollout chunk, so it is transient, alive only while training activations
  are not: that formula is its upper bound, and the total counts the larger of it and the training transient.
  With ``generate_config.backend: vllm`` it is vLLM's whole pool (its own
  weights and KV cache) of ``gpu_memory_utilization x device memory``: vLLM sizes it from the device, beside what
  the training side already holds (mindgrpo does not offload training state during rollouts).
* **activations**: the peak of one training micro-batch's forward + backward, or of a no-grad scoring forward
  (reference and old log-probs at ``ref_config.ref_model_batch_size``) when that is larger; both without and with
  recompute, see :func:`activation_bytes`. Packed micro-batches (``actor_config.max_tokens_per_micro_batch``):
  both are forwards of ``max_tokens_per_micro_batch // max_tokens`` rows and up to as many prompts.
* **update**: the optimizer step's temporaries, after the activations are gone: the data-parallel-reduced
  gradients and their clipped copy, alive together before they are written back: ``2 x gradients``.
* **runtime**: what the process holds beyond the model's tensors, a documented constant per ``--device``
  (:data:`RUNTIME_BYTES`, :func:`runtime_bytes`). ``ascend``: HCCL's send and receive buffers, ``2 x HCCL_BUFFSIZE``
  (CANN's default 200 MB) for each communication group the rank is in (the world, its tensor-parallel and its
  data-parallel group, when each has more than one rank and differs from the world), as CANN's ``HCCL_BUFFSIZE``
  reference states; nothing here measured Ascend's workspace or graph memory, which stay in the headroom.
  ``cpu``: measured with ``tools/bench_tp.py``'s run of ``small`` (MindSpore 2.9.0, one prompt width): the compiled
  rollout, scoring, training and gradient-norm graphs and the framework's allocations beside the modelled tensors.

``total`` is the resident parts (weights, gradients, optimizer, kv_cache, reference, runtime) plus the transient:
on ``ascend`` the larger of the activations (the figure of the config's ``actor_config.recompute``) and the update,
which reuse one device pool; on ``cpu`` their sum, with the scoring forward's activations added to the training
step's, because there every compiled graph keeps its own memory for the life of the process (measured: the
reference forward, the training micro-batch and the update each grew RSS in turn, none reused another's). A layout
**fits** when ``total <= HEADROOM x device memory``: the other 10 % is for what the sum does not model (on Ascend the
workspace and compiled graphs, and fragmentation). The
**recommended** layout is the fitting one with the smallest ``model_parallel`` (less communication per token), ties
to the most headroom. Device sizes are binary: ``64GB`` = ``64GiB`` = ``65536MB`` (an Ascend 910B's 64 GB of HBM
is 64 GiB; ``npu-smi`` reports 65536 MB).

Arithmetic on ``config.json`` and the config: no weights are read and nothing is built, so it plans a 7B run on a
laptop. :func:`plan_layouts` is the whole planner as a function; :func:`model_state_bytes`, :func:`activation_bytes`
and :func:`layout_bytes` are its parts, for checking against measured memory.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from typing import Dict, List, Mapping, Optional, Sequence

from mindgrpo.config import Derived
from mindgrpo.hf_config import qwen2_spec, weight_shapes
from mindgrpo.parallel.layout import TPLayout

HEADROOM = 0.9  # share of device memory the modelled parts may take; the rest is workspace, graphs, fragmentation
DEVICES = ("ascend", "cpu")
HCCL_BUFFSIZE = 200 * 2**20  # CANN's default HCCL_BUFFSIZE (200 MB); each communication group holds 2 of them
# CPU, per process, beyond the modelled tensors: bench_tp.py's `small` run (TP=1, MindSpore 2.9.0, one prompt
# width), stage by stage: RSS growth minus the planner's own figure for that stage (MiB).
CPU_RUNTIME_MIB = {"build": 86,         # ModelWorker(...): the rollout engine's buffers and framework objects
                   "rollout": 266,      # prefill + decode graphs and the prefill's pool, beside the KV cache
                   "scoring": 96,       # the reference log-prob graph (442 MiB), beside its activations (346)
                   "training": 92,      # the training micro-batch's graph (1067 MiB), beside its activations (975)
                   "drop": 96}          # precompile's host-side zeroing of the accumulators (one gradient copy)
RUNTIME_BYTES = {"ascend": 0, "cpu": sum(CPU_RUNTIME_MIB.values()) * 2**20}  # ascend: + HCCL, see runtime_bytes
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
LOGIT_COPIES_TRAIN = 4  # float32 [tokens, vocab/tp]: logits, log-softmax, softmax (entropy), their gradient
LOGIT_COPIES_SCORE = 3  # no backward: logits, log-softmax, softmax
HEAD_CHUNK_ROWS = 64  # the fused head's scratch: this many rows of float32 logits (kernels/head_logprobs_cpu.cc)
# float32 attention-score tensors a layer holds at once (Qwen2Blocks / SharedPromptForward): the concatenated
# prompt|own scores, the scaled and biased softmax input, the softmax output, and its prompt and own slices that
# feed the two context products. Measured on CPU (small, TP=1): the training micro-batch's RSS grew 486 MiB per 8
# completions where one copy predicted 320, i.e. three score copies per layer more than one.
SCORE_COPIES = 4
# What a recomputed layer still keeps on CPU beyond its input, measured on the user's path (Qwen2.5-Coder-0.5B, LoRA
# rank 16, micro-batches of 16 at 128 + 256 tokens, GRAPH mode, MindSpore 2.9.0): the peak RSS grew 213 MiB per
# layer between a 4-layer and the 24-layer model (3.73 and 9.39 GiB) where the input alone is 15 MiB. Two float32
# score tensors and the layer's float32 RoPE rows (cos and sin for q and k) come to 205 MiB of it at that shape:
# MindSpore's CPU backend keeps them for the backward although the layer is marked for recompute. Checked on a
# shape it was not fitted on (micro-batches of 8): 6.2 GiB planned, 7.24 GiB measured.
CPU_RECOMPUTE_SCORE_COPIES = 2
DECODE_STEP_ROUND = 32  # the native engine rounds max_tokens up to a multiple of this (rollout/backends/native.py)
UPDATE_GRADIENT_COPIES = 2  # reduced gradients + their clipped copy (step_graphs.ReduceAndClip), before the write-back
# The AdamW graph (step_graphs.ApplyGradients) on CPU keeps one copy of the trained parameters in its pool: the real
# 0.5B with full parameters grew 2.35 GiB (its 630 M float32 parameters) in its first optimizer step (MindSpore 2.9.0).
CPU_APPLY_COPIES = 1

PARTS = ("weights", "gradients", "optimizer", "activations", "activations_recompute", "update", "kv_cache",
         "reference", "runtime")
RESIDENT = ("weights", "gradients", "optimizer", "kv_cache", "reference", "runtime")
_UNITS = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


class PlanError(ValueError):
    """Bad planner input (a size, a missing model folder); the message says what to pass instead."""


# ----------------------------------------------------------------------------------------------------------------
# Sizes

def parse_bytes(text) -> int:
    """``"64GB"``, ``"64GiB"``, ``"65536MB"``, ``"64 g"``, ``"68719476736"`` -> bytes (binary units, see above)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(i?b)?\s*", str(text), re.IGNORECASE)
    if not match or (match.group(3) and match.group(3).lower() == "ib" and not match.group(2)):
        raise PlanError(f"device memory {text!r} is not a size: write it like 64GB, 64GiB, 65536MB or a number of "
                        "bytes (units are binary: 1GB = 1GiB = 1024 MB)")
    value = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if value < 1:
        raise PlanError(f"device memory {text!r} must be more than 0 bytes")
    return int(round(value))


def format_bytes(n: float) -> str:
    """Binary units with one decimal: ``61.0 GiB``, ``352.0 MiB``."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


# ----------------------------------------------------------------------------------------------------------------
# The model

def tp_layout(hf_config: Mapping, model_parallel: int) -> TPLayout:
    """Rank 0's :class:`TPLayout` (every rank holds equally many parameters), unvalidated: see ``.problems()``."""
    return TPLayout.of(qwen2_spec(hf_config), model_parallel)


def local_sizes(hf_config: Mapping, model_parallel: int = 1) -> List[int]:
    """Element count of each parameter one tensor-parallel rank holds, through the loader's own slicing rule."""
    layout, shapes = tp_layout(hf_config, model_parallel), weight_shapes(qwen2_spec(hf_config))
    return [math.prod(layout.local_shape(name, shape)) for name, shape in shapes.items()]


def local_parameters(hf_config: Mapping, model_parallel: int = 1) -> int:
    """Parameters one tensor-parallel rank holds."""
    return sum(local_sizes(hf_config, model_parallel))


def lora_sizes(hf_config: Mapping, rank: int, target_modules, model_parallel: int = 1) -> List[int]:
    """Element count of each LoRA adapter tensor one tensor-parallel rank holds (A [rank, in], B [out, rank], sliced
    by the loader's rule: B beside a column-parallel weight, A beside a row-parallel one); empty when ``rank`` is 0."""
    if rank <= 0:
        return []
    from mindgrpo.models.lora import LoraSpec, adapter_shapes

    spec = LoraSpec(rank=rank, alpha=1.0, target_modules=tuple(target_modules))
    shapes = adapter_shapes(spec, weight_shapes(qwen2_spec(hf_config)), int(hf_config["num_hidden_layers"]))
    layout = tp_layout(hf_config, model_parallel)
    return [math.prod(layout.local_shape(name, shape)) for name, shape in shapes.items()]


def lora_parameters(hf_config: Mapping, rank: int, target_modules, model_parallel: int = 1) -> int:
    """Adapter parameters one tensor-parallel rank holds: ``rank x (in + out)`` per adapted weight at
    ``model_parallel`` 1; 0 when ``rank`` is 0."""
    return sum(lora_sizes(hf_config, rank, target_modules, model_parallel))


def busiest_share(sizes: Sequence[int], *, data_parallel: int = 1, optimizer_shard: bool = True) -> int:
    """Elements of ``sizes`` whose AdamW moments the busiest data-parallel rank keeps: all of them, or under ZeRO-1
    the largest share :func:`~mindgrpo.train.optim_state.owner_ranks` gives one rank (whole tensors, about 1/dp)."""
    if not optimizer_shard or data_parallel == 1:
        return sum(sizes)
    from mindgrpo.train.optim_state import owner_ranks

    loads = [0] * data_parallel
    for size, owner in zip(sizes, owner_ranks(sizes, data_parallel)):
        loads[owner] += size
    return max(loads)


def moment_parameters(hf_config: Mapping, *, model_parallel: int = 1, data_parallel: int = 1,
                      optimizer_shard: bool = True) -> int:
    """Parameters whose AdamW moments the busiest rank keeps when the whole model trains (:func:`busiest_share`
    of this rank's slice)."""
    return busiest_share(local_sizes(hf_config, model_parallel), data_parallel=data_parallel,
                         optimizer_shard=optimizer_shard)


def model_state_bytes(hf_config: Mapping, *, model_parallel: int = 1, data_parallel: int = 1,
                      optimizer_shard: bool = True, reference_dtype: Optional[str] = None,
                      param_dtype: str = "float32", grad_dtype: str = "float32",
                      adapter_sizes: Sequence[int] = ()) -> Dict[str, int]:
    """Per-rank bytes of the training state: ``weights`` in ``param_dtype``, ``gradients`` (the accumulators) in
    ``grad_dtype``, the ``optimizer``'s float32 AdamW moments and, with 16-bit weights, float32 master weights
    (ZeRO-1 over ``data_parallel`` when ``optimizer_shard``), and the frozen ``reference`` copy in
    ``reference_dtype`` (None: no reference model), plus their ``total``. This is what one rank's resident memory
    grows by once the actor, reference, accumulators and optimizer are built.

    With LoRA (``adapter_sizes``: this rank's adapter tensors, :func:`lora_sizes`) the backbone is frozen in
    ``param_dtype`` and only the float32 adapters have gradients and AdamW moments (ZeRO-1 shares the moments out);
    the reference is the backbone itself (``reference_dtype`` None)."""
    n = local_parameters(hf_config, model_parallel)
    if adapter_sizes:
        adapters = sum(adapter_sizes)
        moments = busiest_share(adapter_sizes, data_parallel=data_parallel, optimizer_shard=optimizer_shard)
        state = {"weights": DTYPE_BYTES[param_dtype] * n + 4 * adapters, "gradients": 4 * adapters,
                 "optimizer": 8 * moments, "reference": 0}
        state["total"] = sum(state.values())
        return state
    per_owned = 8 + (4 if param_dtype != "float32" else 0)  # moments, and the master copy of 16-bit weights
    state = {"weights": DTYPE_BYTES[param_dtype] * n, "gradients": DTYPE_BYTES[grad_dtype] * n,
             "optimizer": per_owned * moment_parameters(hf_config, model_parallel=model_parallel,
                                                        data_parallel=data_parallel, optimizer_shard=optimizer_shard),
             "reference": DTYPE_BYTES[reference_dtype] * n if reference_dtype else 0}
    state["total"] = sum(state.values())
    return state


# ----------------------------------------------------------------------------------------------------------------
# Activations and the rollout cache

def _forward_sizes(hf_config: Mapping, model_parallel: int, completions: int, num_generations: int,
                   prompt_len: int, completion_len: int, share_prompt: bool, prompts: int = 0):
    """(tokens N through the decoder, attention score elements S per layer, completion tokens) of one forward of
    ``completions`` rows and ``prompts`` prompts (0: one per group of rows)."""
    layout = tp_layout(hf_config, model_parallel)
    m, p, t, heads = completions, prompt_len, completion_len, layout.local_heads
    if share_prompt:  # each group's prompt once (causal), its completions over [prompt | own causal part]
        prompts = prompts or max(1, m // num_generations)
        return prompts * p + m * t, heads * (prompts * p * p + m * t * (p + t)), m * t
    return m * (p + t), heads * m * (p + t) ** 2, m * t  # [prompt | completion] rows, full causal attention


def activation_bytes(hf_config: Mapping, *, model_parallel: int = 1, micro_batch_size: int, num_generations: int,
                     prompt_len: int, completion_len: int, compute_dtype: str = "float32", share_prompt: bool = True,
                     recompute: bool = False, scoring_batch_size: int = 0, separate_pools: bool = False,
                     prompts_per_forward: int = 0, fused_head_train: bool = False,
                     fused_head_score: bool = False, recompute_keeps: bool = False) -> int:
    """Peak activation bytes of one rank: one training micro-batch (forward + backward), or a no-grad scoring
    forward of ``scoring_batch_size`` completions when that is larger; with ``separate_pools`` (CPU, where each
    compiled graph keeps its memory) the two added. ``prompts_per_forward``: the prompts each forward computes
    instead of ``m/G`` (packed micro-batches of ``m`` rows: up to ``min(m, prompts of the rank)``).

    Per micro-batch of ``m`` completions (``G`` per prompt), prompt length ``P``, completion length ``T``, on a rank
    with ``h`` query heads, ``kv`` KV heads, head size ``d``, hidden size ``H``, intermediate ``I/tp``, vocabulary
    ``V/tp``, ``L`` layers, ``c`` the compute dtype's bytes::

        N  = tokens through the decoder   shared prompt: (m/G) P + m T        unshared: m (P + T)
        S  = attention score elements     shared: h ((m/G) P^2 + m T (P + T))  unshared: h m (P + T)^2
             (prompt-causal blocks, and each completion over [its prompt | itself])
        layer = 4 N H c                   hidden in, attention residual out, the two RMSNorm outputs
              + 3 N d (h + kv) c          q and k before and after RoPE, v, the attention context
              + S (4 x 4 + c)             SCORE_COPIES float32 score tensors (concatenated scores, softmax
                                          input, output, its slices) + a compute-dtype copy (none in float32)
              + 4 N (I/tp) c              SwiGLU: gate, silu(gate), up, their product
        masks  = 4 S / kv                 float32 additive biases, shared by the layers and KV heads
        logits = 4 x 4 m T (V/tp)         float32 over completion positions only: logits, log-softmax,
                                          softmax (entropy) and the logits' gradient
               fused_head_train:           4 m T H + 4 x 64 V (the kernel's chunk of logits; no [m T, V] tensor:
                                          the derivative of each log-prob by its hidden state, [m T, H])

        without recompute:  L layer + 2 N H c (embedding, final norm) + masks + logits
        with recompute:     L N H c (each layer's input) + layer (the one being recomputed) + masks + logits
                            (SharedPromptForward(recompute=True): each layer is a recomputed Cell whose output,
                            the next layer's input, is all it keeps; the backward rebuilds one layer at a time)
                            + recompute_keeps (CPU): L (2 x 4 S + 2 x 4 N d (h + kv)), what each layer keeps
                            there regardless (CPU_RECOMPUTE_SCORE_COPIES score tensors and its RoPE rows)
        not counted:        the float32 RoPE cos/sin rows, 2 x 4 N d (h + kv), built once and kept by every
                            layer in both cases (with recompute, about as much as 4-5 layer inputs at 7B bf16),
                            except on CPU with recompute (above)
        scoring (no grad):  layer + 2 N H c + masks + 3 x 4 m T (V/tp), at m = scoring_batch_size
                            (fused_head_score: 4 x 64 V instead of the logits)
    """
    hf = hf_config
    layout = tp_layout(hf, model_parallel)
    c = DTYPE_BYTES[compute_dtype]
    hidden, d, layers = int(hf["hidden_size"]), layout.head_dim, int(hf["num_hidden_layers"])
    h, kv, inter, vocab = (layout.local_heads, layout.local_kv_heads, layout.intermediate_size // model_parallel,
                           layout.local_vocab)

    def one_forward(completions: int, logit_copies: int, backward: bool):
        n, s, completion_tokens = _forward_sizes(hf, model_parallel, completions, num_generations, prompt_len,
                                                 completion_len, share_prompt, prompts_per_forward)
        layer = (4 * n * hidden * c + 3 * n * d * (h + kv) * c + s * (4 * SCORE_COPIES + (c if c != 4 else 0))
                 + 4 * n * inter * c)
        fused = fused_head_train if backward else fused_head_score
        head = (4 * HEAD_CHUNK_ROWS * vocab + (4 * completion_tokens * hidden if backward else 0) if fused
                else logit_copies * 4 * completion_tokens * vocab)
        # what a recomputed layer keeps: its input, and on CPU its score tensors and RoPE rows as well
        kept = n * hidden * c
        if recompute_keeps:
            kept += 4 * CPU_RECOMPUTE_SCORE_COPIES * s + 2 * 4 * n * d * (h + kv)
        return n, layer, 4 * s // kv + head, kept

    n, layer, shared, kept = one_forward(micro_batch_size, LOGIT_COPIES_TRAIN, True)
    train = (layers * kept + layer if recompute else layers * layer + 2 * n * hidden * c) + shared
    if scoring_batch_size < 1:
        return train
    n, layer, shared, _ = one_forward(scoring_batch_size, LOGIT_COPIES_SCORE, False)
    scoring = layer + 2 * n * hidden * c + shared
    return train + scoring if separate_pools else max(train, scoring)


def kv_cache_bytes(hf_config: Mapping, *, model_parallel: int = 1, batch: int, prompt_len: int, max_tokens: int,
                   compute_dtype: str = "float32") -> int:
    """The native rollout engine's K and V caches ``[batch, kv_l, P + round_up(T, 32), d]`` per layer."""
    layout = tp_layout(hf_config, model_parallel)
    steps = -(-max_tokens // DECODE_STEP_ROUND) * DECODE_STEP_ROUND
    return (2 * int(hf_config["num_hidden_layers"]) * batch * layout.local_kv_heads * (prompt_len + steps)
            * layout.head_dim * DTYPE_BYTES[compute_dtype])


def runtime_bytes(device: str, *, data_parallel: int, model_parallel: int) -> int:
    """What one process holds beyond the modelled tensors (see the module docstring): on ``cpu`` the measured
    :data:`CPU_RUNTIME_MIB`; on ``ascend`` ``2 x HCCL_BUFFSIZE`` per communication group the rank is in."""
    if device not in DEVICES:
        raise PlanError(f"device {device!r}: must be one of {', '.join(DEVICES)}")
    world = data_parallel * model_parallel
    groups = (world > 1) + (1 < model_parallel < world) + (1 < data_parallel < world)
    return RUNTIME_BYTES[device] + (2 * HCCL_BUFFSIZE * groups if device == "ascend" else 0)


# ----------------------------------------------------------------------------------------------------------------
# Layouts

def update_copies(device: str, data_parallel: int) -> int:
    """Gradient-sized temporaries of the update (step_graphs.ReduceAndClip, ApplyGradients). On ``cpu`` the clip
    scales the accumulators in place on the host, so only the data-parallel average makes reduce copies (its
    AllReduce's output and the averaged copy); the AdamW graph keeps one more, :data:`CPU_APPLY_COPIES`."""
    if device != "cpu":
        return UPDATE_GRADIENT_COPIES
    return CPU_APPLY_COPIES + (UPDATE_GRADIENT_COPIES if data_parallel > 1 else 0)


def layout_bytes(config, hf_config: Mapping, *, data_parallel: int, model_parallel: int,
                 device_memory: int = 0, device: str = "ascend") -> Dict[str, int]:
    """Per-rank bytes of each part (see the module docstring) and their ``total`` for one layout of ``config`` on
    ``device`` (``device_memory`` only sizes a vllm rollout pool)."""
    rl, actor, gen = config.rl_config, config.actor_config, config.generate_config
    sampling = gen.sampling_config
    state = model_state_bytes(hf_config, model_parallel=model_parallel, data_parallel=data_parallel,
                              optimizer_shard=actor.parallel_config.optimizer_shard,
                              reference_dtype=Derived(config).reference_dtype,
                              param_dtype=actor.param_dtype, grad_dtype=actor.grad_reduce_dtype,
                              adapter_sizes=lora_sizes(hf_config, actor.lora_rank, actor.lora_target_modules,
                                                       model_parallel))
    packed_rows = Derived(config).packed_rows  # per forward of both passes; 0: padded
    shape = dict(model_parallel=model_parallel, micro_batch_size=packed_rows or actor.micro_batch_size,
                 num_generations=rl.num_generations, prompt_len=rl.max_prompt_length,
                 completion_len=sampling.max_tokens, compute_dtype=actor.compute_dtype,
                 share_prompt=rl.share_prompt,
                 # a scoring forward runs for the KL's reference, or for the old log-probs of later passes
                 scoring_batch_size=(packed_rows or config.ref_config.ref_model_batch_size
                                     if rl.beta > 0 or not Derived(config).on_policy else 0),
                 separate_pools=device == "cpu", recompute_keeps=device == "cpu",
                 prompts_per_forward=min(packed_rows, rl.batch_size),
                 **{f"fused_head_{kind}": Derived(config).fused_head(
                     device, compute_dtype=actor.compute_dtype, head_dtype=Derived(config).actor_head_dtype(device),
                     model_parallel=model_parallel, backward=kind == "train") for kind in ("train", "score")})
    if gen.backend == "vllm":
        cache = int(gen.gpu_memory_utilization * device_memory)
    else:
        cache = kv_cache_bytes(hf_config, model_parallel=model_parallel, batch=gen.infer_model_batch_size,
                               prompt_len=rl.max_prompt_length, max_tokens=sampling.max_tokens,
                               compute_dtype=actor.compute_dtype)
    if device == "cpu" and actor.lora_rank and actor.param_dtype == "bfloat16":
        # a frozen bf16 LoRA backbone keeps its embedding table and head float32 on CPU (models/qwen2.py)
        tables = int(hf_config["vocab_size"]) * int(hf_config["hidden_size"]) // model_parallel
        state["weights"] += 2 * tables * (1 if hf_config.get("tie_word_embeddings", False) else 2)
    parts = {"weights": state["weights"], "gradients": state["gradients"], "optimizer": state["optimizer"],
             "activations": activation_bytes(hf_config, recompute=False, **shape),
             "activations_recompute": activation_bytes(hf_config, recompute=True, **shape),
             "update": update_copies(device, data_parallel) * state["gradients"], "kv_cache": cache,
             "reference": state["reference"],
             "runtime": runtime_bytes(device, data_parallel=data_parallel, model_parallel=model_parallel)}
    used = parts["activations_recompute" if actor.recompute else "activations"]
    transient = used + parts["update"] if device == "cpu" else max(used, parts["update"])
    if _kv_cache_is_transient(config, device):  # the rollout's store is given back before training runs
        parts["total"] = sum(parts[k] for k in RESIDENT if k != "kv_cache") + max(transient, parts["kv_cache"])
    else:
        parts["total"] = sum(parts[k] for k in RESIDENT) + transient
    return parts


def _kv_cache_is_transient(config, device: str) -> bool:
    """The fused CPU decode kernels' KV store is released after every rollout chunk (see the module docstring)."""
    gen = config.generate_config
    return device == "cpu" and gen.backend == "native" and gen.decode_impl == "fused"


def _why_not(parts: Mapping[str, int], budget: int, recompute: bool, model_parallel: int, device: str) -> str:
    """Why a layout does not fit: the training state alone when it is over the budget, else the largest parts
    that, added to it, are."""
    state = parts["weights"] + parts["gradients"] + parts["optimizer"]
    head = f"needs {format_bytes(parts['total'])} per rank, over the {format_bytes(budget)} budget: "
    detail = (f"weights {format_bytes(parts['weights'])} + gradients {format_bytes(parts['gradients'])} + "
              f"optimizer state {format_bytes(parts['optimizer'])}")
    if state > budget:
        return head + f"the training state alone, {detail} = {format_bytes(state)}, is over it" + (
            " (model_parallel 1: every rank holds the whole model)" if model_parallel == 1 else "")
    used = "activations_recompute" if recompute else "activations"
    transients = [("update", parts["update"]), ("activations", parts[used])]
    if device != "cpu":  # one device pool: only the larger of the two counts
        transients = [max(transients, key=lambda kv: kv[1])]
    others = sorted([("kv_cache", parts["kv_cache"]), ("reference", parts["reference"]),
                     ("runtime", parts["runtime"]), *transients], key=lambda kv: -kv[1])
    names, running = [f"training state {format_bytes(state)} ({detail})"], state
    for name, value in others:
        names.append(f"{name} {format_bytes(value)}")
        running += value
        if running > budget:
            break
    return head + " + ".join(names) + f" = {format_bytes(running)}"


def plan_layouts(config, workers: int, device_memory: int, hf_config: Mapping, device: str = "ascend") -> dict:
    """Every ``data_parallel x model_parallel = workers`` layout (pipeline_stage 1) with its per-rank bytes, whether
    it fits ``HEADROOM x device_memory`` of a ``device`` (``ascend`` or ``cpu``: its runtime part and transient
    rule), the recommended one (None when none fits) and advice.

    Returns ``{"layouts": [...], "skipped": [...], "recommended": layout or None, "device_memory", "headroom",
    "budget", "model": {...}, "settings": {...}, "advice": [...]}``; each layout is ``{"data_parallel",
    "model_parallel", "pipeline_stage", "fits", "bytes": {part: bytes, "total"}, "why_not"}``.
    """
    if workers < 1:
        raise PlanError(f"--workers {workers}: must be at least 1")
    if device_memory < 1:
        raise PlanError(f"device memory {device_memory}: must be more than 0 bytes")
    runtime_bytes(device, data_parallel=1, model_parallel=1)  # an unknown device fails here, with its message
    budget = int(HEADROOM * device_memory)
    recompute = config.actor_config.recompute
    layouts: List[dict] = []
    skipped: List[dict] = []
    for mp in (m for m in range(1, workers + 1) if workers % m == 0):
        problems = tp_layout(hf_config, mp).problems()
        if problems:
            skipped.append({"data_parallel": workers // mp, "model_parallel": mp, "pipeline_stage": 1,
                            "why": "; ".join(problems)})
            continue
        parts = layout_bytes(config, hf_config, data_parallel=workers // mp, model_parallel=mp,
                             device_memory=device_memory, device=device)
        fits = parts["total"] <= budget
        layouts.append({"data_parallel": workers // mp, "model_parallel": mp, "pipeline_stage": 1, "fits": fits,
                        "bytes": parts, "why_not": "" if fits else _why_not(parts, budget, recompute, mp, device)})
    fitting = [lay for lay in layouts if lay["fits"]]
    recommended = min(fitting, key=lambda lay: (lay["model_parallel"], lay["bytes"]["total"]), default=None)
    n = local_parameters(hf_config, 1)
    return {"layouts": layouts, "skipped": skipped, "recommended": recommended, "device": device,
            "device_memory": device_memory,
            "headroom": HEADROOM, "budget": budget, "workers": workers,
            "model": {"parameters": n, "unsharded_state_bytes": 16 * n,
                      **{k: hf_config.get(k) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                                       "num_key_value_heads", "intermediate_size", "vocab_size")},
                      "tie_word_embeddings": bool(hf_config.get("tie_word_embeddings", False))},
            "settings": _settings(config),
            "advice": [] if recommended else _advice(config, hf_config, layouts, budget, device_memory,
                                                             device)}


def _settings(config) -> dict:
    rl, actor, gen = config.rl_config, config.actor_config, config.generate_config
    return {"micro_batch_size": actor.micro_batch_size,
            "max_tokens_per_micro_batch": actor.max_tokens_per_micro_batch, "recompute": actor.recompute,
            "share_prompt": rl.share_prompt, "max_prompt_length": rl.max_prompt_length,
            "max_tokens": gen.sampling_config.max_tokens, "compute_dtype": actor.compute_dtype,
            "reference_dtype": Derived(config).reference_dtype, "lora_rank": actor.lora_rank,
            "ref_model_batch_size": config.ref_config.ref_model_batch_size,
            "optimizer_shard": actor.parallel_config.optimizer_shard,
            "backend": gen.backend, "infer_model_batch_size": gen.infer_model_batch_size,
            "gpu_memory_utilization": gen.gpu_memory_utilization if gen.backend == "vllm" else None}


def vllm_minimum_pool(config, hf_config: Mapping) -> int:
    """What vLLM's pool must hold at least: its weights at the rollout's tensor-parallel degree, in the compute
    dtype, and the KV cache of one batch of ``infer_model_batch_size`` sequences (same formula as the native cache)."""
    gen, rl = config.generate_config, config.rl_config
    mp = gen.parallel_config.model_parallel
    dtype = config.actor_config.compute_dtype
    return (DTYPE_BYTES[dtype] * local_parameters(hf_config, mp)
            + kv_cache_bytes(hf_config, model_parallel=mp, batch=gen.infer_model_batch_size,
                             prompt_len=rl.max_prompt_length, max_tokens=gen.sampling_config.max_tokens,
                             compute_dtype=dtype))


def _advice(config, hf_config: Mapping, layouts: Sequence[dict], budget: int, device_memory: int,
            device: str) -> List[str]:
    """What to change when no layout fits."""
    if not layouts:
        return ["no layout splits this model over these workers: change the worker count (see skipped)"]
    advice = []
    gen = config.generate_config
    if gen.backend == "vllm":
        need = vllm_minimum_pool(config, hf_config)
        options = []
        for lay in sorted(layouts, key=lambda lay: lay["model_parallel"]):
            room = budget - (lay["bytes"]["total"] - lay["bytes"]["kv_cache"])
            if room >= need:
                options.append(f"<= {math.floor(100 * room / device_memory) / 100:.2f} with data_parallel "
                               f"{lay['data_parallel']}, model_parallel {lay['model_parallel']}")
        if options:
            advice.append(f"the vllm pool (generate_config.gpu_memory_utilization {gen.gpu_memory_utilization} x the "
                          f"device = {format_bytes(int(gen.gpu_memory_utilization * device_memory))}) sits beside "
                          f"the training state: set generate_config.gpu_memory_utilization {'; '.join(options)} "
                          f"(vLLM needs about {format_bytes(need)} for its weights and one batch's KV cache), or "
                          "use generate_config.backend: native")
    best = min(layouts, key=lambda lay: lay["bytes"]["total"])
    parts, where = best["bytes"], f"data_parallel {best['data_parallel']}, model_parallel {best['model_parallel']}"
    saved = parts["activations"] - (parts["activations_recompute"] if device == "cpu" else
                                     max(parts["activations_recompute"], parts["update"]))
    if not config.actor_config.recompute and saved > 0:
        advice.append(f"actor_config.recompute: true lowers the peak by {format_bytes(saved)} with {where}")
    advice.append(f"more workers (a larger model_parallel), a smaller actor_config.micro_batch_size, or devices with "
                  f"more than {format_bytes(parts['total'] / HEADROOM)} also fit ({where})")
    return advice


# ----------------------------------------------------------------------------------------------------------------
# Output

def format_plan(plan: dict, source: str = "") -> str:
    """The plan as a table in binary units, the recommendation and why the other layouts do not fit."""
    model, settings = plan["model"], plan["settings"]
    n = model["parameters"]
    lines = [
        f"model{f' {source}' if source else ''}: {n / 1e9:.2f} B parameters (hidden {model['hidden_size']}, "
        f"{model['num_hidden_layers']} layers, {model['num_attention_heads']} heads, "
        f"{model['num_key_value_heads']} KV heads, intermediate {model['intermediate_size']}, vocab "
        f"{model['vocab_size']}, {'tied' if model['tie_word_embeddings'] else 'untied'} embeddings)",
        f"  float32 weights + gradients + 2 AdamW moments = 16 bytes/parameter = "
        f"{model['unsharded_state_bytes'] / 1e9:.1f} GB ({format_bytes(model['unsharded_state_bytes'])}) unsharded",
        f"devices: {plan['workers']} x {format_bytes(plan['device_memory'])} ({plan['device']}); budget per rank "
        f"{format_bytes(plan['budget'])} ({plan['headroom']:.0%}; the rest is for workspace, compiled graphs and "
        "fragmentation)",
        "run: {micro}, recompute {rc}, share_prompt {sp}, prompt {max_prompt_length} + "
        "completion {max_tokens} tokens, {compute_dtype} compute, reference {ref}, ZeRO-1 {zero}, rollout {rollout}"
        .format(**settings, rc="on" if settings["recompute"] else "off", sp="on" if settings["share_prompt"] else
                "off", ref=(f"the frozen backbone (LoRA rank {settings['lora_rank']})" if settings["lora_rank"]
                     else settings["reference_dtype"] or "none (beta 0)"),
                micro=(f"packed micro-batches of {settings['max_tokens_per_micro_batch']} tokens"
                       if settings["max_tokens_per_micro_batch"] else
                       f"micro_batch_size {settings['micro_batch_size']}"),
                zero="on" if settings["optimizer_shard"] else "off",
                rollout=(f"vllm (gpu_memory_utilization {settings['gpu_memory_utilization']})"
                         if settings["backend"] == "vllm" else
                         f"{settings['backend']} (batch {settings['infer_model_batch_size']})")),
        "",
    ]
    used = "activations_recompute" if settings["recompute"] else "activations"
    header = ["dp x mp x pp", "weights", "gradients", "optimizer", "activations", "act.recompute", "update",
              "kv_cache", "reference", "runtime", "total", "fits"]
    rows = [header]
    for lay in plan["layouts"]:
        b = lay["bytes"]
        transient = ({used, "update"} if plan["device"] == "cpu" else
                     {used if b[used] >= b["update"] else "update"})
        cells = [format_bytes(b[k]) + ("*" if k in transient else "") for k in PARTS]
        rows.append([f"{lay['data_parallel']} x {lay['model_parallel']} x {lay['pipeline_stage']}", *cells,
                     format_bytes(b["total"]), "yes" if lay["fits"] else "NO"])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines += ["  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths)))
              for row in rows]
    rule = "the sum" if plan["device"] == "cpu" else "the larger"
    lines.append(f"(* the transient in the total: {rule} of the update and the activations with "
                 f"actor_config.recompute {'true' if settings['recompute'] else 'false'}; runtime is "
                 f"{'HCCL buffers' if plan['device'] == 'ascend' else 'compiled graphs and framework, measured'}; "
                 "kv_cache is "
                 f"{'the whole vllm pool' if settings['backend'] == 'vllm' else 'the rollout KV cache'})")
    for skip in plan["skipped"]:
        lines.append(f"skipped {skip['data_parallel']} x {skip['model_parallel']} x {skip['pipeline_stage']}: "
                     f"{skip['why']}")
    lines.append("")
    rec = plan["recommended"]
    if rec:
        lines.append(f"recommended: data_parallel {rec['data_parallel']}, model_parallel {rec['model_parallel']}, "
                     f"pipeline_stage 1: {format_bytes(rec['bytes']['total'])} per rank, "
                     f"{format_bytes(plan['budget'] - rec['bytes']['total'])} under the budget (the smallest "
                     "model_parallel that fits)")
    else:
        lines.append("no layout fits:")
        lines += [f"  - {text}" for text in plan["advice"]]
    others = [lay for lay in plan["layouts"] if not lay["fits"]]
    if others:
        lines.append("does not fit:")
        lines += [f"  dp {lay['data_parallel']} x mp {lay['model_parallel']}: {lay['why_not']}" for lay in others]
    return "\n".join(lines)


def load_inputs(config_path: str, overrides: Sequence[str] = (), model: Optional[str] = None):
    """(config, hf_config, model folder) for the planner: ``model`` (else ``actor_config.load``) needs only
    config.json."""
    from mindgrpo.config import load_config
    from mindgrpo.hf_config import read_hf_config

    config = load_config(config_path, overrides)
    folder = model or config.actor_config.load
    if not folder:
        raise PlanError(f"{config_path}: actor_config.load is empty: pass --model /path/to/hf-folder (only its "
                        "config.json is read)")
    return config, read_hf_config(folder), folder


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mindgrpo plan", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="grpo_config.yaml of the run")
    parser.add_argument("--workers", type=int, help="msrun --worker_num (default: the product of "
                                                    "actor_config.parallel_config)")
    parser.add_argument("--device-memory", "--device_memory", dest="device_memory", required=True,
                        help="memory of one device: 64GB, 64GiB, 65536MB or bytes (binary units)")
    parser.add_argument("--device", choices=DEVICES, default="ascend",
                        help="what the ranks run on: its runtime part and how transients share memory "
                             "(default ascend)")
    parser.add_argument("--model", help="Hugging Face folder whose config.json to plan for (default: "
                                        "actor_config.load)")
    parser.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    parser.add_argument("overrides", nargs="*", metavar="group.key=value", help="config overrides, as main.py")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    from mindgrpo.config import ConfigError
    from mindgrpo.hf_config import ModelConfigError

    parser = build_parser()
    args = parser.parse_intermixed_args(argv)  # flags and overrides in any order
    try:
        device_memory = parse_bytes(args.device_memory)
        config, hf_config, folder = load_inputs(args.config, args.overrides, args.model)
        layout = config.actor_config.parallel_config
        workers = args.workers or layout.data_parallel * layout.model_parallel * layout.pipeline_stage
        if layout.pipeline_stage > 1:
            print(f"note: actor_config.parallel_config.pipeline_stage = {layout.pipeline_stage} is refused by the "
                  "trainer; planning pipeline_stage 1 layouts", file=sys.stderr)
        plan = plan_layouts(config, workers, device_memory, hf_config, args.device)
    except (PlanError, ConfigError, ModelConfigError, FileNotFoundError) as err:
        parser.exit(2, f"error: {err}\n")
    print(json.dumps(plan, indent=1) if args.json else format_plan(plan, source=f"{folder}/config.json"))
    return 0
