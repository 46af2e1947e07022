"""Tensor-parallel building blocks: the two region cells, vocabulary-parallel embedding lookup, log-probs and
entropy, and a gather made of AllReduce.

Megatron's scheme with explicit collectives (MindSpore's semi-auto ``shard()`` is refused on CPU, so nothing
written for it could be tested here; these run the same on CPU under msrun and on Ascend):

* :class:`CopyToTP` sits where a replicated activation enters a column-parallel product (q/k/v, gate/up,
  lm_head): identity forward, AllReduce of the gradient backward, because every rank's slice of the product
  contributes to the input's gradient.
* :class:`ReduceFromTP` sits after a row-parallel product (o_proj, down_proj) and after the vocabulary-parallel
  embedding lookup: AllReduce forward (the ranks hold partial sums), identity backward, because what follows is
  computed identically on every rank and each rank's partial sum gets the same gradient. MindSpore's own AllReduce
  bprop would all-reduce that gradient again and multiply it by the group size.

The log-prob of a target token under vocabulary-parallel logits ``z`` (rank r holds columns
``[r*V/tp, (r+1)*V/tp)``) never builds a ``[tokens, vocab]`` tensor: each rank reduces its own columns to per-row
numbers (its log-sum-exp, and the target logit when the target is its own), and AllReduce combines them::

    m        = max_r lse_r                      (rank slots summed by AllReduce, then a local max: no gradient)
    lse      = m + log(sum_r exp(lse_r - m))    (ReduceFromTP of exp(lse_r - m))
    log p(t) = ReduceFromTP(z_t on the owning rank, 0 elsewhere) - lse

Gradients follow from the region cells: ``d log p(t) / dz_j = [j == t] - softmax(z)_j`` on each rank's columns.
CPU's collectives are AllReduce SUM and (world group only) AllGather, so a gather across a sub-group is an AllReduce
of zero-padded rank slots (:func:`gather_slots`).
"""
from __future__ import annotations

import mindspore as ms
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


def _log_sum_exps(comm: TPComm, logits, local_logp, reduce):
    """(this rank's log-sum-exp, the whole vocabulary's) per row. The local one is read off the log-softmax
    kernel's output at the row's largest logit (the most precise column), so no [rows, vocab] temporary is made;
    ``reduce`` is the differentiable or the no-gradient sum over ranks."""
    top = ops.stop_gradient(ops.argmax(logits, -1)).reshape((-1, 1)).astype(ms.int32)
    local_lse = (ops.gather_elements(logits, 1, top) - ops.gather_elements(local_logp, 1, top)).reshape((-1,))
    m = comm.max_over_ranks(local_lse)
    return local_lse, m + ops.log(reduce(ops.exp(local_lse - m)))


def parallel_token_logprobs(comm: TPComm, logits, targets, vocab_start: int):
    """``log softmax(z)[target]`` for vocabulary-parallel float32 logits ``z`` [N, V/tp] and targets [N] (full-vocab
    ids); see the module docstring. Only per-row numbers cross ranks."""
    local_logp = ops.log_softmax(logits, -1)
    local_ids = targets - vocab_start
    mine = ops.logical_and(local_ids >= 0, local_ids < logits.shape[-1])
    safe_ids = ops.select(mine, local_ids, ops.zeros_like(local_ids)).reshape((-1, 1))
    target_logit = ops.gather_elements(logits, 1, safe_ids).reshape((-1,)) * ops.cast(mine, logits.dtype)
    _, lse = _log_sum_exps(comm, logits, local_logp, comm.reduce)
    return comm.reduce(target_logit) - lse


def parallel_token_entropy(comm: TPComm, logits):
    """Entropy of ``softmax(z)`` per row for vocabulary-parallel logits (no gradient): each rank's share is
    ``c_r * (H_r - (lse_r - lse))`` with ``c_r = exp(lse_r - lse)`` its probability mass and ``H_r`` the entropy
    of its own columns' softmax."""
    logits = ops.stop_gradient(logits)
    local_logp = ops.log_softmax(logits, -1)
    local_h = -(ops.exp(local_logp) * local_logp).sum(-1)
    local_lse, lse = _log_sum_exps(comm, logits, local_logp, comm.reduce_no_grad)
    return comm.reduce_no_grad(ops.exp(local_lse - lse) * (local_h - (local_lse - lse)))
