"""Training tensor-parallel layout (TP=a) -> vLLM's per-rank weights (TP=b), as plain numpy over per-rank arrays.

Training ranks hold Hugging Face tensors sliced by :class:`~mindgrpo.parallel.layout.TPLayout` (Megatron's
split). vLLM's Qwen2 holds, per rank of its own tensor-parallel group, these parameters (``[out, in]`` like HF; its
``UnquantizedLinearMethod`` multiplies by the transposed weight)::

    layers.N.self_attn.qkv_proj.{weight,bias}   concat(q_r, k_r, v_r) on dim 0          QKVParallelLinear
    layers.N.self_attn.o_proj.weight             columns of rank r (input dim)            RowParallelLinear
    layers.N.mlp.gate_up_proj.weight             concat(gate_r, up_r) on dim 0            MergedColumnParallelLinear
    layers.N.mlp.down_proj.weight                columns of rank r (input dim)            RowParallelLinear
    embed_tokens.weight, lm_head.weight          vocabulary rows of rank r, zero-padded   VocabParallelEmbedding,
                                                                                          ParallelLMHead
    norms                                        replicated

(``model.`` in front of every name but ``lm_head.weight``, as in HF.)

where ``q_r`` is query heads ``[r*heads/b, (r+1)*heads/b)``, ``k_r``/``v_r`` the KV heads ``[r*kv/b, (r+1)*kv/b)``
when ``kv >= b``, else the single KV head ``r // (b/kv)`` replicated on ``b/kv`` ranks, and ``gate_r``/``up_r`` rows
``[r*I/b, (r+1)*I/b)``. This is what these loaders do, and what this module reproduces:

* vllm-mindspore (mindspore-ai/vllm-mindspore @ a7b56a4, ``vllm_mindspore/model_executor/``):
  ``models/qwen2.py`` ``Qwen2Model.load_weights`` (``stacked_params_mapping``: ``.q_proj/.k_proj/.v_proj`` ->
  ``.qkv_proj`` shards "q"/"k"/"v", ``.gate_proj/.up_proj`` -> ``.gate_up_proj`` shards 0/1; tied models reuse
  ``embed_tokens`` as ``lm_head``); ``layers/linear.py`` ``QKVParallelLinear.__init__`` (``num_kv_heads = 1``,
  ``num_kv_head_replicas = tp // total_kv`` when ``tp >= total_kv``) and ``weight_loader`` (q at offset 0 from
  ``tp_rank * shard_size``, k/v after it from ``(tp_rank // num_kv_head_replicas) * shard_size``),
  ``MergedColumnParallelLinear.weight_loader`` (shard ``i`` at ``sum(output_sizes[:i]) // tp``) and
  ``RowParallelLinear.weight_loader`` (``input_dim`` slice ``tp_rank * input_size_per_partition``);
  ``layers/vocab_parallel_embedding.py`` (vocabulary padded to a multiple of ``DEFAULT_VOCAB_PADDING_SIZE = 64``,
  ``padded / tp`` rows per rank, the real rows first and zeros after them).
* vLLM itself (vllm-project/vllm, ``vllm/model_executor/layers/linear.py``, ``QKVParallelLinear``): the same
  offsets and KV-head replication.

With Qwen2.5's vocabularies (multiples of 64, e.g. 152,064) and ``b`` dividing them, vLLM's vocabulary rows are
exactly Megatron's; the padding matters only for other sizes.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Callable, Dict, Iterator, List, Mapping, Sequence, Tuple

import numpy as np

from mindgrpo.parallel.layout import LayoutError, TPLayout

VOCAB_PADDING = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE
VOCAB_NAMES = ("model.embed_tokens.weight", "lm_head.weight")
# vLLM's merged parameters (by layer suffix) and the HF tensors they concatenate, in order.
MERGED = {
    "self_attn.qkv_proj.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    "self_attn.qkv_proj.bias": ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),
    "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
}
_MERGED_FROM = {part: merged for merged, parts in MERGED.items() for part in parts}
_KV = tuple(f"self_attn.{proj}_proj.{kind}" for proj in "kv" for kind in ("weight", "bias"))
_LAYER = re.compile(r"^(model\.layers\.\d+\.)(.+)$")


def vllm_groups(hf_names: Sequence[str]) -> Dict[str, Tuple[str, ...]]:
    """vLLM parameter name -> the HF names it is made of (in concatenation order), for a model's HF names.

    Raises ValueError when a merged parameter would miss one of its parts (e.g. a q_proj without its k_proj)."""
    groups: Dict[str, Tuple[str, ...]] = {}
    for name in hf_names:
        match = _LAYER.match(name)
        if match and match.group(2) in _MERGED_FROM:
            merged = _MERGED_FROM[match.group(2)]
            groups.setdefault(match.group(1) + merged, tuple(match.group(1) + p for p in MERGED[merged]))
        else:
            groups[name] = (name,)
    present = set(hf_names)
    missing = sorted(part for parts in groups.values() for part in parts if part not in present)
    if missing:
        raise ValueError(f"vLLM merges q/k/v and gate/up, but these parts are missing: {', '.join(missing[:8])}")
    return groups


def vocab_rows(vocab_size: int, tp: int, rank: int) -> Tuple[int, int, int]:
    """vLLM's vocabulary shard: (first real row, end of real rows, rows per rank including padding)."""
    padded = -(-vocab_size // VOCAB_PADDING) * VOCAB_PADDING
    if padded % tp:
        raise LayoutError(f"tensor_parallel_size = {tp} does not divide vLLM's padded vocabulary ({padded})")
    per_rank = padded // tp
    return min(rank * per_rank, vocab_size), min((rank + 1) * per_rank, vocab_size), per_rank


def full_shape(hf_name: str, piece_shape: Sequence[int], layout: TPLayout) -> Tuple[int, ...]:
    """The full shape of a tensor from one rank's piece under ``layout``."""
    shape = [int(n) for n in piece_shape]
    # Only the split axis is wanted here; a shape with every axis scaled by tp is divisible on any of them.
    shard = layout.shard(hf_name, [n * layout.tp for n in shape])
    if shard is not None:
        if TPLayout.suffix(hf_name) in _KV:  # a rank holds local_kv_heads of the num_kv_heads
            shape[shard.axis] = shape[shard.axis] // layout.local_kv_heads * layout.num_kv_heads
        else:
            shape[shard.axis] *= layout.tp
    return tuple(shape)


def vllm_piece(hf_names: Sequence[str], fulls: Sequence[np.ndarray], target: TPLayout) -> np.ndarray:
    """Rank ``target.rank``'s vLLM tensor made of the full HF tensors ``fulls`` (one vLLM parameter's parts)."""
    if hf_names[0] in VOCAB_NAMES:
        (full,) = fulls
        start, stop, per_rank = vocab_rows(full.shape[0], target.tp, target.rank)
        out = np.zeros((per_rank,) + full.shape[1:], dtype=full.dtype)
        out[:stop - start] = full[start:stop]
        return out
    pieces = [target.take(name, full) for name, full in zip(hf_names, fulls)]
    return np.ascontiguousarray(pieces[0] if len(pieces) == 1 else np.concatenate(pieces, axis=0))


def to_vllm(pieces: Mapping[str, Sequence[np.ndarray]], source: TPLayout,
            target_tp: int) -> List[Dict[str, np.ndarray]]:
    """Reshard a model from training TP=a to vLLM's TP=b.

    Args:
        pieces: for each HF weight name, the ``a`` training ranks' pieces in rank order (``source``'s slicing).
        source: the training layout (any rank; only its sizes and ``tp`` are used).
        target_tp: vLLM's ``tensor_parallel_size``.

    Returns:
        for each vLLM rank ``0..b-1``, ``{vLLM parameter name: array}`` in vLLM's layout (see the module doc).
    """
    target = dataclasses.replace(source, tp=target_tp, rank=0)
    target.validate()
    out: List[Dict[str, np.ndarray]] = [{} for _ in range(target_tp)]
    for vllm_name, parts in vllm_groups(list(pieces)).items():
        fulls = [source.assemble(name, pieces[name], full_shape(name, np.shape(pieces[name][0]), source))
                 for name in parts]
        for rank in range(target_tp):
            out[rank][vllm_name] = vllm_piece(parts, fulls, target.with_rank(rank))
    return out


def rank_to_vllm(local: Mapping[str, Callable[[], np.ndarray]],
                 gather: Callable[[str, np.ndarray], Sequence[np.ndarray]], source: TPLayout,
                 target: TPLayout) -> Iterator[Tuple[str, np.ndarray]]:
    """This process's share of :func:`to_vllm`, one vLLM parameter at a time (a generator of ``(name, array)``).

    ``local[hf_name]()`` returns this rank's training piece; ``gather(hf_name, piece)`` returns the ``source.tp``
    pieces of the training tensor-parallel group in rank order (a collective: the ranks of the group run the same
    gathers in the same order, which they do when they pass the same names in the same order). ``target`` is this
    process's vLLM rank. Only one vLLM parameter's full tensors are held at a time.
    """
    target.validate()
    for vllm_name, parts in vllm_groups(list(local)).items():
        fulls = []
        for name in parts:
            gathered = [np.asarray(p) for p in gather(name, local[name]())]
            fulls.append(source.assemble(name, gathered, full_shape(name, gathered[0].shape, source)))
        yield vllm_name, vllm_piece(parts, fulls, target)
