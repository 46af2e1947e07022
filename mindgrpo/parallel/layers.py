"""Tensor-parallel building blocks: the two region cells, the vocabulary-parallel embedding lookup, and a gather
made of AllReduce.

Megatron's scheme with explicit collectives (MindSpore's semi-auto ``shard()`` is refused on CPU, so nothing
written for it could be tested here; these run the same on CPU under msrun and on Ascend):

* :class:`CopyToTP` sits where a replicated activation enters a column-parallel product (q/k/v, gate/up,
  lm_head): identity forward, AllReduce of the gradient backward, because every rank's slice of the product
  contributes to the input's gradient.
* :class:`ReduceFromTP` sits after a row-parallel product (o_proj, down_proj) and after the vocabulary-parallel
  embedding lookup: AllReduce forward (the ranks hold partial sums), identity backward, because what follows is
  computed identically on every rank and each rank's partial sum gets the same gradient. MindSpore's own AllReduce
  bprop would all-reduce that gradient again and multiply it by the group size.

The log-prob of a target token under vocabulary-parallel logits (rank r holds columns ``[r*V/tp, (r+1)*V/tp)``)
is combined from per-row numbers, never a ``[tokens, vocab]`` tensor: see
:class:`mindgrpo.models.head_logprobs.HeadLogProbs`.

CPU's collectives are AllReduce SUM and (world group only) AllGather, so a gather across a sub-group is an AllReduce
of zero-padded rank slots (:func:`gather_slots`).
"""
from __future__ import annotations

from mindspore import nn, ops


class CopyToTP(nn.Cell):
    """Identity forward, AllReduce (SUM over the tensor-parallel group) of the gradient backward."""

    def __init__(self, group: str):
        super().__init__()
        self.all_reduce = ops.AllReduce(group=group)

    def construct(self, x):
        return x

    def bprop(self, x, out, dout):
        return (self.all_reduce(dout),)


class ReduceFromTP(nn.Cell):
    """AllReduce (SUM over the tensor-parallel group) forward, identity backward."""

    def __init__(self, group: str):
        super().__init__()
        self.all_reduce = ops.AllReduce(group=group)

    def construct(self, x):
        return self.all_reduce(x)

    def bprop(self, x, out, dout):
        return (dout,)


class TPComm(nn.Cell):
    """The collectives of one tensor-parallel rank; with ``size == 1`` every method is the identity, so single-rank
    graphs contain no communication at all."""

    def __init__(self, group: str, size: int, rank: int):
        super().__init__()
        self.size, self.rank = size, rank
        if size > 1:
            self.copy_in = CopyToTP(group)
            self.reduce_out = ReduceFromTP(group)
            self.all_reduce = ops.AllReduce(group=group)

    def enter(self, x):
        """Before a column-parallel product."""
        return self.copy_in(x) if self.size > 1 else x

    def reduce(self, x):
        """After a row-parallel product (partial sums -> full), differentiable."""
        return self.reduce_out(x) if self.size > 1 else x

    def reduce_no_grad(self, x):
        """The same sum where no gradient is needed (rollout graphs)."""
        return self.all_reduce(x) if self.size > 1 else x

    def gather_slots(self, x, axis: int):
        """Concatenate every rank's ``x`` along ``axis`` (rank order) by an AllReduce of zero-padded slots; no
        gradient (rollout logits)."""
        if self.size == 1:
            return x
        pieces = []
        for r in range(self.size):
            pieces.append(x if r == self.rank else ops.zeros_like(x))
        return self.all_reduce(ops.concat(pieces, axis))

    def max_over_ranks(self, x):
        """Elementwise maximum over the ranks (no gradient): the rank slots summed, then a local max."""
        x = ops.stop_gradient(x)
        if self.size == 1:
            return x
        return ops.amax(self.gather_slots(ops.expand_dims(x, 0), 0), 0)


def embed_lookup(comm: TPComm, table, tokens, vocab_start: int):
    """Rows of a vocabulary-parallel embedding table (rank holds ids ``[vocab_start, vocab_start + rows)``):
    each rank looks up its own ids, zeros the others, and the ranks' rows are summed."""
    if comm.size == 1:
        return ops.gather(table, tokens, 0)
    local = tokens - vocab_start
    mine = ops.logical_and(local >= 0, local < table.shape[0])
    rows = ops.gather(table, ops.select(mine, local, ops.zeros_like(local)), 0)
    return comm.reduce(rows * ops.expand_dims(ops.cast(mine, rows.dtype), -1))
