"""The fused GRPO per-token loss as one MindSpore custom op with its backward.

``fused_token_loss`` makes one pass over the per-token tensors and returns per-sequence sums, ``row_loss`` [B]
(differentiable with respect to ``logp`` only) and ``row_stats`` [B, 8] (masked counts and sums, columns named by
``ROW_STATS``), plus their batch totals as token means (``batch_means`` [8], the logged metrics). Per token it
computes ``pg + beta * kl`` exactly as the plain-ops twin in ``mindgrpo.algorithm.loss`` does; that module owns the
semantics and the loss_type normalisation.

The same pass stores each token's local derivative ``mask * d(pg + beta * kl) / d logp`` (an internal output), so
the backward kernel only multiplies it by the incoming per-row gradient: 4 arrays read and 1 written forward, 1 read
and 1 written backward, instead of re-reading all four inputs in the backward.

Routes (both are ``ops.Custom(func_type="aot")`` with a ``bprop`` that calls a second kernel):

* CPU (tested here): the C++ kernels in ``kernels/grpo_token_loss_cpu.cc``, compiled with g++ on first use or by
  ``build.sh`` (see ``mindgrpo.ops.build``).
* Ascend (selected only when the device target is ``Ascend``): the Ascend C operators ``GrpoTokenLoss`` /
  ``GrpoTokenLossGrad`` in ``kernels/ascend``, registered in :mod:`mindgrpo.ops.ascend` (the Ascend boundary: it
  says what is verified where); ``batch_means`` is then reduced from ``row_stats`` with MindSpore ops. **This route
  cannot be compiled or run on the CPU-only development machines and is untested**; on CPU nothing in it is
  loaded.
"""
from __future__ import annotations

import functools

import mindspore as ms
from mindspore import Tensor, ops

from mindgrpo.choices import KL_ESTIMATORS
from mindgrpo.ops import ascend, build

# Columns of row_stats: masked sums over each sequence (the kernels write them in this order).
ROW_STATS = ("active_tokens", "pg_loss", "kl", "clip_low", "clip_high", "clip", "ppo_kl", "ratio")
# KL estimator codes understood by the kernels: the index into the registry's KL_ESTIMATORS.
KL_CODES = {name: code for code, name in enumerate(KL_ESTIMATORS)}
_INPUTS = ("logp", "old_logp", "ref_logp", "advantages", "mask", "hyper")


def hyper_params(beta: float, epsilon_low: float, epsilon_high: float, kl_estimator: str,
                 use_bias_correction_kl: bool, has_ref: bool) -> Tensor:
    """Pack the loss settings into the small float32 tensor the kernels read (a constant under GRAPH mode)."""
    return Tensor([float(beta), float(epsilon_low), float(epsilon_high), float(KL_CODES[kl_estimator]),
                   float(bool(use_bias_correction_kl)), float(bool(has_ref))], ms.float32)


def batch_means(row_stats: Tensor) -> Tensor:
    """``row_stats`` [B, 8] -> [8]: total active tokens, then every other column's masked token mean."""
    sums = row_stats.sum(axis=0)
    return ops.cat((sums[:1], sums[1:] / ops.clamp(sums[0], min=1.0)))


def _cpu_forward_shapes(logp, old, ref, adv, mask, hyper):
    return [logp[0]], [logp[0], len(ROW_STATS)], [len(ROW_STATS)], logp


def _cpu_forward_dtypes(logp, old, ref, adv, mask, hyper):
    return logp, logp, logp, logp


def _grad_shape(token_grad, d_row_loss):
    return token_grad


def _grad_dtype(token_grad, d_row_loss):
    return token_grad


@functools.lru_cache(maxsize=None)
def _primitive() -> tuple[ops.Custom, bool]:
    """The forward primitive for the device target (compiling the CPU kernel if needed), once per process, and
    whether it also outputs ``batch_means``.

    Under GRAPH mode this runs in Python while the graph is compiled (MindSpore does not parse the lru_cache
    wrapper), which is also why the device target is read here and not in ``fused_token_loss``.
    """
    device_target = ms.get_context("device_target")
    if device_target == "Ascend":
        fwd_name, bwd_name, fwd_reg, bwd_reg, outputs, shapes, dtypes = ascend.token_loss_route(_INPUTS,
                                                                                                len(ROW_STATS))
    elif device_target == "CPU":
        outputs = ("row_loss", "row_stats", "batch_means", "token_grad")
        library = build.build_cpu_kernel()
        fwd_name, bwd_name = f"{library}:GrpoTokenLoss", f"{library}:GrpoTokenLossGrad"
        fwd_reg = bwd_reg = None
        shapes, dtypes = _cpu_forward_shapes, _cpu_forward_dtypes
    else:
        raise NotImplementedError(f"the fused GRPO loss has kernels for CPU and Ascend, not {device_target!r}; "
                                  "use LossConfig(loss_impl='plain')")
    token_grad_index = outputs.index("token_grad")
    grad_op = ops.Custom(bwd_name, out_shape=_grad_shape, out_dtype=_grad_dtype, func_type="aot",
                         reg_info=bwd_reg)

    def bprop(logp, old, ref, adv, mask, hyper, out, dout):
        # Only row_loss carries a gradient (dout[0]); the other outputs are counts/metrics and the stored local
        # derivative. old, ref, advantages and mask are constants of the GRPO loss (sampled or reference
        # log-probs, rewards), so they get zeros (which GRAPH mode prunes when nothing asks for them).
        d_logp = grad_op(out[token_grad_index], dout[0])
        return (d_logp, ops.zeros_like(old), ops.zeros_like(ref), ops.zeros_like(adv), ops.zeros_like(mask),
                ops.zeros_like(hyper))

    forward = ops.Custom(fwd_name, out_shape=shapes, out_dtype=dtypes, func_type="aot", bprop=bprop,
                         reg_info=fwd_reg)
    return forward, "batch_means" in outputs


def fused_token_loss(logp: Tensor, old_logp: Tensor, ref_logp: Tensor, advantages: Tensor, mask: Tensor,
                     hyper: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sequence sums of the GRPO token loss and of the metric counts, in one kernel call.

    Args:
        logp, old_logp, ref_logp: float32 [B, T] current, sampling and reference log-probs. Pass ``logp`` itself as
            ``ref_logp`` when there is no reference model (and set ``has_ref`` false in ``hyper``).
        advantages: float32 [B] (one per sequence) or [B, T] (per token).
        mask: float32 [B, T], 1 for completion tokens, 0 for padding.
        hyper: from ``hyper_params``.

    Returns:
        ``row_loss`` [B] = sum_t mask * (pg + beta * kl); ``row_stats`` [B, 8] (see ``ROW_STATS``) and
        ``batch_means`` [8] (see ``batch_means``), which have no gradient.
    """
    forward, has_means = _primitive()
    if has_means:
        row_loss, row_stats, means, _ = forward(logp, old_logp, ref_logp, advantages, mask, hyper)
        return row_loss, row_stats, means
    row_loss, row_stats, _ = forward(logp, old_logp, ref_logp, advantages, mask, hyper)
    return row_loss, row_stats, batch_means(row_stats)
