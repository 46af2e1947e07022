"""The vocabulary head, log-softmax and entropy as one custom op that never holds a ``[rows, vocab]`` tensor.

``head_logprobs(hidden, weight, ids, temperature)`` is ``token_logprobs(hidden @ weight.T, ids, temperature)`` and
``token_entropy`` of the same logits (:mod:`mindgrpo.algorithm.logprobs`, the plain-ops twin the tests hold it to),
computed in chunks of rows by ``kernels/head_logprobs_cpu.cc``: each chunk's logits live in a scratch buffer of the
kernel, and the backward recomputes them from the saved log-sum-exp. At Qwen2.5's 151,936-entry vocabulary the plain
path's logits, log-softmax, entropy temporaries and the logits' gradient are each 0.6 MB a row, and a compiled CPU
graph keeps every node's output for its lifetime; here what a graph keeps is a few floats a row (and the hidden
size, training). The price is one more GEMM for a trained head, none for a frozen one.

A row's log-prob depends on its own hidden state only, so the training forward also returns its derivative with
respect to that state (``[rows, hidden]``, from the buffer it already holds), and the backward to ``hidden`` is a
multiply. A trained head (full-parameter training: ``lm_head`` or the tied embedding table) recomputes each chunk's
logits in the backward for its own gradient; a frozen one (LoRA's backbone) needs nothing more. The entropy is a
metric here, without gradient (the entropy bonus, ``rl_config.entropy_coef``, takes the plain path).

CPU and float32 only (the kernel calls the oneDNN GEMM MindSpore's CPU build ships); ``Derived.fused_head`` says
where it runs, and ``actor_config.head_impl: plain`` turns it off.
"""
from __future__ import annotations

import functools

from mindspore import Tensor, ops

from mindgrpo.ops import build


def _scoring_shapes(hidden, weight, ids, inv_temp):
    return [hidden[0]], [hidden[0]], [hidden[0]]


def _training_shapes(hidden, weight, ids, inv_temp):
    return [hidden[0]], [hidden[0]], [hidden[0]], hidden


@functools.lru_cache(maxsize=None)
def _primitive(mode: str) -> ops.Custom:
    """The op for ``mode`` (:data:`MODES`), compiled once per process (under GRAPH mode this runs while the graph
    is compiled)."""
    library = build.build_cpu_kernel(build.HEAD_LOGPROBS_SOURCE)
    if mode == "score":
        return ops.Custom(f"{library}:HeadLogProbs", out_shape=_scoring_shapes,
                          out_dtype=lambda h, *_: (h, h, h), func_type="aot")
    weight_grad = ops.Custom(f"{library}:HeadLogProbsGradWeight", out_shape=lambda h, w, *_: w,
                             out_dtype=lambda h, w, *_: w, func_type="aot")

    def bprop(hidden, weight, ids, inv_temp, out, dout):
        # Only the log-probs carry a gradient (dout[0]); the entropy is a metric, lse and J are internal. A row's
        # log-prob depends on its own hidden state only: its gradient is g * J, J from the forward.
        d_hidden = dout[0].reshape((-1, 1)) * out[3]
        # A frozen head gets zeros, which GRAPH mode prunes (nothing asks for its gradient); PyNative makes them, a
        # [V, H] transient per backward, which is one reason real models train in GRAPH mode.
        d_weight = (weight_grad(hidden, weight, ids, inv_temp, out[2], dout[0]) if mode == "train_head"
                    else ops.zeros_like(weight))
        return d_hidden, d_weight, ops.zeros_like(ids), ops.zeros_like(inv_temp)

    return ops.Custom(f"{library}:HeadLogProbsTrain", out_shape=_training_shapes,
                      out_dtype=lambda h, *_: (h, h, h, h), func_type="aot", bprop=bprop)


MODES = ("score", "train", "train_head")
"""``score``: no backward (reference and old log-probs); ``train``: the backward reaches the hidden states only (a
frozen head: LoRA); ``train_head``: the head's weight too (full-parameter training)."""


def head_logprobs(hidden: Tensor, weight: Tensor, ids: Tensor, inv_temp: Tensor, mode: str) -> tuple[Tensor, Tensor]:
    """Per-row ``(log-prob of ids[r], entropy)`` of ``softmax((hidden @ weight.T) * inv_temp)``.

    Args:
        hidden: float32 ``[R, H]``, the final (normed) hidden states predicting ``ids``.
        weight: float32 ``[V, H]``, the head (``lm_head.weight``, or the embedding table of a tied model).
        ids: int32 ``[R]``, each in ``[0, V)``.
        inv_temp: float32 ``[1]``, 1 / the sampling temperature.
        mode: one of :data:`MODES`.
    """
    if mode not in MODES:  # another name would quietly give a frozen head's (zero) gradient
        raise ValueError(f"head_logprobs mode={mode!r}: expected one of {', '.join(MODES)}")
    outputs = _primitive(mode)(hidden, weight, ids, inv_temp)
    return outputs[0], outputs[1]
