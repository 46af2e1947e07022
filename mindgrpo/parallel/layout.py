"""Which slice of each Hugging Face Qwen2 weight a tensor-parallel rank holds (pure numpy: no MindSpore).

Megatron's split, written once and used by everything that moves weights between layouts: the sliced loader (each
rank reads only its slices from the safetensors files), the HF export (gathers them back), the per-rank checkpoint
shards (resharded on load under another layout) and the vllm weight sync (training TP=a to inference TP=b).

HF shapes are ``[out, in]``. With ``tp`` ranks and rank ``r``::

    embed_tokens, lm_head [V, H]             rows     vocabulary-parallel: rank r holds ids [r*V/tp, (r+1)*V/tp)
    q_proj.weight/bias [heads*d, H]          rows     column-parallel by heads
    k_proj, v_proj [kv*d, H]                 rows     by KV heads; with fewer KV heads than ranks (tp % kv == 0),
                                                      KV head r // (tp/kv) is replicated on tp/kv ranks
    o_proj.weight [H, heads*d]               columns  row-parallel
    gate_proj, up_proj [I, H]                rows     column-parallel
    down_proj [H, I]                         columns  row-parallel
    norms                                    --       replicated
    LoRA lora_B [out, r] of a column-parallel weight   rows (as its weight, KV heads included); lora_A replicated
    LoRA lora_A [r, in] of a row-parallel weight       columns; lora_B replicated

A rank's query heads ``[r*heads/tp, (r+1)*heads/tp)`` then read only its own KV heads, so attention needs no
communication; the o_proj and down_proj products give partial sums that one AllReduce completes.

LoRA adds no collective to the forward: beside a column-parallel weight, ``s (x A^T) B_r^T`` is the rank's own
output rows; beside a row-parallel one, ``s (x_r A_r^T) B^T`` is a partial sum added before the existing AllReduce.
The replicated halves (that A, that B) receive on each rank only the gradient of its own rows or columns, so their
gradients are summed over the group (:meth:`TPLayout.sums_gradient_over_tp`), as a replicated KV head's are.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence, Tuple

import numpy as np

from mindgrpo.hf_config import Qwen2Spec, qwen2_spec

# HF name suffix -> the axis it is split on (None: replicated). Layer weights are matched by their suffix.
_SPLIT_AXIS = {
    "model.embed_tokens.weight": 0, "lm_head.weight": 0,
    "self_attn.q_proj.weight": 0, "self_attn.q_proj.bias": 0,
    "self_attn.k_proj.weight": 0, "self_attn.k_proj.bias": 0,
    "self_attn.v_proj.weight": 0, "self_attn.v_proj.bias": 0,
    "self_attn.o_proj.weight": 1,
    "mlp.gate_proj.weight": 0, "mlp.up_proj.weight": 0, "mlp.down_proj.weight": 1,
}
_COLUMN_PARALLEL = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
_ROW_PARALLEL = ("self_attn.o_proj", "mlp.down_proj")
# LoRA adapters, by PEFT's names: B beside a column-parallel weight is split as that weight, A beside a row-parallel
# one by its columns; the other half is replicated with a partial gradient on each rank
_SPLIT_AXIS.update({f"{m}.lora_B.weight": 0 for m in _COLUMN_PARALLEL})
_SPLIT_AXIS.update({f"{m}.lora_A.weight": 1 for m in _ROW_PARALLEL})
_PARTIAL_GRADIENT = frozenset([f"{m}.lora_A.weight" for m in _COLUMN_PARALLEL]
                              + [f"{m}.lora_B.weight" for m in _ROW_PARALLEL])
_KV = ("self_attn.k_proj.weight", "self_attn.k_proj.bias", "self_attn.v_proj.weight", "self_attn.v_proj.bias",
       "self_attn.k_proj.lora_B.weight", "self_attn.v_proj.lora_B.weight")


class LayoutError(ValueError):
    """The model's shape cannot be split over the requested tensor-parallel degree; the message says why."""


@dataclass(frozen=True)
class Shard:
    """Rank's part of a full tensor: ``full[start:stop]`` along ``axis``."""
    axis: int
    start: int
    stop: int

    def take(self, full: np.ndarray) -> np.ndarray:
        index = [slice(None)] * full.ndim
        index[self.axis] = slice(self.start, self.stop)
        return full[tuple(index)]


@dataclass(frozen=True)
class TPLayout:
    """Tensor-parallel degree ``tp`` and this rank's index ``rank`` for a Qwen2 model's head and vocabulary sizes."""
    tp: int
    rank: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    intermediate_size: int

    @classmethod
    def of(cls, spec: Qwen2Spec, tp: int, rank: int = 0) -> "TPLayout":
        """Rank ``rank``'s split of the model ``spec`` over ``tp`` ranks, the one way every caller builds it (the
        model, the config checks, the planner, the doctor). Unchecked: :meth:`problems` says whether the split
        works, :meth:`validate` raises if not."""
        return cls(tp=tp, rank=rank, num_heads=spec.num_attention_heads, num_kv_heads=spec.num_key_value_heads,
                   head_dim=spec.head_dim, vocab_size=spec.vocab_size, intermediate_size=spec.intermediate_size)

    @classmethod
    def for_hf_config(cls, hf_config: Mapping, tp: int, rank: int = 0) -> "TPLayout":
        """:meth:`of` a ``config.json`` dict (text or Qwen2.5-VL), checked: a LayoutError when it cannot split."""
        layout = cls.of(qwen2_spec(hf_config), tp, rank)
        layout.validate()
        return layout

    def problems(self) -> list:
        """What prevents this split, as sentences (empty when it works)."""
        tp, out = self.tp, []
        if tp < 1 or not 0 <= self.rank < tp:
            out.append(f"rank {self.rank} is not in [0, {tp})")
            return out
        if self.num_heads % tp:
            out.append(f"model_parallel = {tp} does not divide the {self.num_heads} attention heads")
        if self.num_kv_heads % tp and tp % self.num_kv_heads:
            out.append(f"model_parallel = {tp} neither divides the {self.num_kv_heads} key/value heads nor is a "
                       "multiple of them (replicated KV heads need model_parallel % kv_heads == 0)")
        if self.vocab_size % tp:
            out.append(f"model_parallel = {tp} does not divide vocab_size = {self.vocab_size} (the embedding and "
                       "lm_head are split by vocabulary)")
        if self.intermediate_size % tp:
            out.append(f"model_parallel = {tp} does not divide intermediate_size = {self.intermediate_size}")
        return out

    def validate(self) -> None:
        problems = self.problems()
        if problems:
            raise LayoutError("; ".join(problems))

    # -- per-rank sizes -----------------------------------------------------------------------------------------
    @property
    def local_heads(self) -> int:
        return self.num_heads // self.tp

    @property
    def local_kv_heads(self) -> int:
        return max(1, self.num_kv_heads // self.tp)

    @property
    def kv_replicas(self) -> int:
        """Ranks that hold the same KV head (1 unless there are fewer KV heads than ranks)."""
        return max(1, self.tp // self.num_kv_heads)

    @property
    def local_vocab(self) -> int:
        return self.vocab_size // self.tp

    @property
    def vocab_start(self) -> int:
        return self.rank * self.local_vocab

    # -- slices -------------------------------------------------------------------------------------------------
    @staticmethod
    def suffix(hf_name: str) -> str:
        """``model.layers.3.self_attn.q_proj.weight`` -> ``self_attn.q_proj.weight``; globals unchanged."""
        parts = hf_name.split(".")
        if len(parts) > 3 and parts[0] == "model" and parts[1] == "layers":
            return ".".join(parts[3:])
        return hf_name

    def shard(self, hf_name: str, full_shape: Sequence[int]) -> Optional[Shard]:
        """This rank's slice of the named full tensor, or None when every rank holds all of it."""
        suffix = self.suffix(hf_name)
        axis = _SPLIT_AXIS.get(suffix)
        if axis is None or self.tp == 1:
            return None
        size = int(full_shape[axis])
        if suffix in _KV:
            per_head = size // self.num_kv_heads
            first = (self.rank // self.kv_replicas) * self.local_kv_heads
            return Shard(axis, first * per_head, (first + self.local_kv_heads) * per_head)
        if size % self.tp:
            raise LayoutError(f"{hf_name} {tuple(full_shape)}: axis {axis} ({size}) is not divisible by "
                              f"model_parallel = {self.tp}")
        part = size // self.tp
        return Shard(axis, self.rank * part, (self.rank + 1) * part)

    def local_shape(self, hf_name: str, full_shape: Sequence[int]) -> Tuple[int, ...]:
        shard = self.shard(hf_name, full_shape)
        shape = [int(n) for n in full_shape]
        if shard is not None:
            shape[shard.axis] = shard.stop - shard.start
        return tuple(shape)

    def take(self, hf_name: str, full: np.ndarray) -> np.ndarray:
        """This rank's part of a full array (a view when possible)."""
        shard = self.shard(hf_name, full.shape)
        return full if shard is None else shard.take(full)

    def with_rank(self, rank: int) -> "TPLayout":
        return TPLayout(self.tp, rank, self.num_heads, self.num_kv_heads, self.head_dim, self.vocab_size,
                        self.intermediate_size)

    def is_replicated_kv(self, hf_name: str) -> bool:
        """Whether several ranks hold this tensor as the same KV head (its gradients must be summed over them)."""
        return self.kv_replicas > 1 and self.suffix(hf_name) in _KV

    def sums_gradient_over_tp(self, hf_name: str) -> bool:
        """Whether every rank holds this tensor whole but computes only part of its gradient, so the group's parts
        must be summed: a LoRA A beside a column-parallel weight (each rank's B slice sends back the gradient of its
        own output rows) and a LoRA B beside a row-parallel one (each rank's product saw its own input columns)."""
        return self.tp > 1 and self.suffix(hf_name) in _PARTIAL_GRADIENT

    def gradient_owners(self, hf_name: str) -> int:
        """How many ranks of the TP group hold an identical copy of this tensor (norms: all; replicated KV heads:
        ``kv_replicas``; split tensors: 1). A global gradient norm counts each copy once by dividing by this."""
        if self.tp == 1:
            return 1
        if self.suffix(hf_name) not in _SPLIT_AXIS:
            return self.tp
        return self.kv_replicas if self.suffix(hf_name) in _KV else 1

    def assemble(self, hf_name: str, pieces: Sequence[np.ndarray], full_shape: Sequence[int]) -> np.ndarray:
        """The full tensor from every rank's piece (rank order), the inverse of :meth:`take` over ranks."""
        if len(pieces) != self.tp:
            raise ValueError(f"{hf_name}: {len(pieces)} pieces for model_parallel = {self.tp}")
        if self.shard(hf_name, full_shape) is None:
            return np.asarray(pieces[0])
        full = np.empty(tuple(int(n) for n in full_shape), dtype=np.asarray(pieces[0]).dtype)
        for rank, piece in enumerate(pieces):
            shard = self.with_rank(rank).shard(hf_name, full_shape)
            index = [slice(None)] * full.ndim
            index[shard.axis] = slice(shard.start, shard.stop)
            full[tuple(index)] = piece  # replicated KV heads are written once per replica, with equal values
        return full


def reshard(hf_name: str, pieces: Sequence[np.ndarray], full_shape: Sequence[int], source: TPLayout,
            target: TPLayout) -> list:
    """Per-rank pieces of one tensor under ``source`` -> the per-rank pieces under ``target`` (rank order)."""
    full = source.assemble(hf_name, pieces, full_shape)
    return [np.ascontiguousarray(target.with_rank(r).take(hf_name, full)) for r in range(target.tp)]
