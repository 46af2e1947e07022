"""The lm_head projection, log-softmax, target log-prob and entropy of final hidden states, one chunk of rows at a
time, forward and backward: no ``[tokens, vocab]`` tensor is ever held whole.

At Qwen2.5's 151,936-token vocabulary a float32 logit row is 0.6 MB, so a training micro-batch of 1,024 tokens has
0.6 GB of logits; the log-softmax, its exponent and the backward's gradient are as large again, and in GRAPH mode
every compiled graph keeps its peak for the life of the process. Here the logits exist only ``chunk`` rows at a
time (Liger's fused linear cross-entropy, for GRPO's log-probs): the forward projects a chunk, reduces it to three
numbers per row (the target's log-prob, the entropy, the log-sum-exp) and drops it; the backward projects the chunk
again and turns it into the chunk's gradient of the hidden states and its share of the head's gradient. The cost is
one more vocabulary product per training forward (the backward's recompute), about a third of the head's matmuls.

For row ``i`` with logits ``z = h_i W^T / T`` (W: this rank's vocabulary rows), target ``t`` and global log-sum-exp
``L``, ``p = exp(z - L)``, ``log p(t) = z_t - L`` and ``H = -sum p log p``::

    d log p(t) / dz = onehot(t) - p
    d H / dz        = -p * (log p + H)

Under tensor parallelism each rank holds a vocabulary slice; ``L``, ``z_t`` and ``H`` are combined from per-row
numbers by AllReduce (``m = max_r L_r``, ``L = m + log sum_r exp(L_r - m)``, ``z_t`` from its owning rank,
``H = sum_r exp(L_r - L) (H_r - (L_r - L))`` with ``H_r`` the entropy of rank r's own columns), and the backward
needs no collective: ``L`` and ``H`` are outputs of the forward, and the hidden states' gradient is summed over the ranks by
the :class:`~mindgrpo.parallel.layers.CopyToTP` the caller put before this op. Row-scalars are widened with
``Tile`` rather than broadcast: MindSpore's CPU broadcasting kernels keep an index table of 8 bytes per output
element for the life of the graph (see :mod:`mindgrpo.algorithm.logprobs`).
"""
from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops

from mindgrpo.parallel.layers import TPComm

CHUNK_BYTES = 64 << 20  # float32 logits per chunk: 110 rows at Qwen2.5's vocabulary, every row of a small one


class HeadLogProbs(nn.Cell):
    """``(log p(target), entropy, log-sum-exp)`` per row of final hidden states ``rows`` [N, H] (after the final
    norm, in the compute dtype) under ``head`` [V_local, H], targets [N] (full-vocabulary ids), all float32 [N].

    ``entropy_gradient``: the entropy carries its gradient (the entropy bonus); otherwise it is a metric and its
    term is left out of the backward."""

    def __init__(self, comm: TPComm, vocab_start: int, temperature: float, *, entropy_gradient: bool = False,
                 chunk_bytes: int = CHUNK_BYTES):
        super().__init__(auto_prefix=False)
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.comm, self.vocab_start = comm, vocab_start
        self.inv_temperature = 1.0 / temperature
        self.entropy_gradient, self.chunk_bytes = entropy_gradient, chunk_bytes
        # Primitives, not mindspore.ops functions: GRAPH mode compiles a bprop's calls of the functional wrappers
        # (ops.argmax, ops.zeros_like, ...) and of Python's min/max into empty graphs ("The func graph is empty").
        self.matmul_t = ops.MatMul(transpose_b=True)
        self.matmul = ops.MatMul()
        self.matmul_ta = ops.MatMul(transpose_a=True)
        self.cast, self.exp, self.tile, self.slice = ops.Cast(), ops.Exp(), ops.Tile(), ops.Slice()
        self.log_softmax, self.argmax = ops.LogSoftmax(-1), ops.Argmax(-1, ms.int32)
        self.gather, self.select, self.both = ops.GatherD(), ops.Select(), ops.LogicalAnd()
        self.one_hot, self.concat = ops.OneHot(-1), ops.Concat(0)
        self.on, self.off = ms.Tensor(1.0, ms.float32), ms.Tensor(0.0, ms.float32)

    def _spans(self, n: int, vocab: int):
        """(first row, rows) of each chunk. Written without Python's min/max: GRAPH mode's parser of a bprop
        rejects those builtins."""
        step = self.chunk_bytes // (4 * vocab)
        step = step if step > 0 else 1
        return tuple((i * step, step if (i + 1) * step <= n else n - i * step) for i in range((n + step - 1) // step))

    def _logits(self, rows, head):
        z = self.cast(self.matmul_t(rows, head), ms.float32)
        return z if self.inv_temperature == 1.0 else z * self.inv_temperature

    def _local_ids(self, ids, vocab: int):
        """This rank's column of each target, 0 where another rank owns it, and a 0/1 float mask of ownership."""
        local = ids - self.vocab_start
        mine = self.both(local >= 0, local < vocab)
        return self.select(mine, local, local * 0), self.cast(mine, ms.float32)

    def _chunk_log_softmax(self, rows, head):
        """A chunk's logits, their log-softmax over this rank's columns and its log-sum-exp per row (read off the
        log-softmax at the row's largest logit, the most precise column: no broadcast [rows, vocab] temporary)."""
        z = self._logits(rows, head)
        logp = self.log_softmax(z)
        top = self.argmax(z).reshape((-1, 1))
        lse = (self.gather(z, 1, top) - self.gather(logp, 1, top)).reshape((-1,))
        return z, logp, lse

    def construct(self, rows, head, ids):
        n, vocab = rows.shape[0], head.shape[0]
        targets, lses, entropies = (), (), ()
        for start, size in self._spans(n, vocab):
            z, logp, lse = self._chunk_log_softmax(self.slice(rows, (start, 0), (size, rows.shape[1])), head)
            local, mine = self._local_ids(self.slice(ids, (start,), (size,)), vocab)
            targets += (self.gather(z, 1, local.reshape((-1, 1))).reshape((-1,)) * mine,)
            lses += (lse,)
            entropies += (-(self.exp(logp) * logp).sum(-1),)
        target, local_lse, local_h = self.concat(targets), self.concat(lses), self.concat(entropies)
        if self.comm.size == 1:
            return target - local_lse, local_h, local_lse
        m = self.comm.max_over_ranks(local_lse)
        lse = m + ops.log(self.comm.reduce_no_grad(ops.exp(local_lse - m)))
        share = ops.exp(local_lse - lse)  # this rank's probability mass
        entropy = self.comm.reduce_no_grad(share * (local_h - (local_lse - lse)))
        return self.comm.reduce_no_grad(target) - lse, entropy, lse

    def bprop(self, rows, head, ids, out, dout):
        _, entropy, lse = out
        spans = self._spans(rows.shape[0], head.shape[0])
        d_rows, d_head = self._chunk_backward(rows, head, ids, entropy, lse, dout[0], dout[1], spans[0])
        d_rows = (d_rows,)
        for span in spans[1:]:  # the head's gradient is summed chunk by chunk: one [vocab, hidden] partial at a time
            d_chunk, part = self._chunk_backward(rows, head, ids, entropy, lse, dout[0], dout[1], span)
            d_rows, d_head = d_rows + (d_chunk,), d_head + part
        return self.concat(d_rows), d_head, ids * 0

    def _chunk_backward(self, rows, head, ids, entropy, lse, d_logp, d_entropy, span):
        """One chunk's gradient of the hidden states and its share of the head's, from its logits projected again."""
        start, size = span
        vocab = head.shape[0]
        chunk = self.slice(rows, (start, 0), (size, rows.shape[1]))
        _, logp, local_lse = self._chunk_log_softmax(chunk, head)
        wide = (1, vocab)
        if self.comm.size > 1:  # the global log-softmax from the local one: + (local L - global L) per row
            logp = logp + self.tile((local_lse - self.slice(lse, (start,), (size,))).reshape((-1, 1)), wide)
        p = self.exp(logp)
        local, mine = self._local_ids(self.slice(ids, (start,), (size,)), vocab)
        onehot = self.one_hot(local, vocab, self.on, self.off) * self.tile(mine.reshape((-1, 1)), wide)
        dz = (onehot - p) * self.tile(self.slice(d_logp, (start,), (size,)).reshape((-1, 1)), wide)
        if self.entropy_gradient:
            h = self.tile(self.slice(entropy, (start,), (size,)).reshape((-1, 1)), wide)
            de = self.tile(self.slice(d_entropy, (start,), (size,)).reshape((-1, 1)), wide)
            dz = dz - p * (logp + h) * de
        if self.inv_temperature != 1.0:
            dz = dz * self.inv_temperature
        dz = self.cast(dz, rows.dtype)
        return self.matmul(dz, head), self.matmul_ta(dz, chunk)
