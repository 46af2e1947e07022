"""Per-token estimators of KL(pi || pi_ref) from log-probs, as in verl's ``kl_penalty`` (Schulman's k1/k2/k3)."""
from __future__ import annotations

import mindspore as ms
from mindspore import Tensor, ops

from mindgrpo.choices import canonical_kl_estimator

# verl's low_var_kl clamps: the log-ratio before exp (no overflow) and the estimate itself (bounded penalty).
K3_LOG_RATIO_CLAMP = 20.0
K3_VALUE_CLAMP = 10.0


def exact_exp(x: Tensor) -> Tensor:
    """``exp`` evaluated in float64 and rounded once to ``x``'s dtype. MindSpore 2.9's CPU float32 ``Exp`` is off by
    up to 4.3e-6 relative; the per-token tensors are small, so the plain-ops loss affords the exact one (and then
    agrees with the fused kernel, whose exp is within 8.2e-8, to 1e-6)."""
    return ops.cast(ops.exp(ops.cast(x, ms.float64)), x.dtype)



def kl_penalty(logp: Tensor, ref_logp: Tensor, estimator: str = "k3") -> Tensor:
    """Per-token KL estimate between the policy (``logp``) and the reference (``ref_logp``), same shape.

    * ``k1`` (verl ``kl``): ``logp - ref``. Unbiased, high variance, can be negative.
    * ``k2`` (verl ``mse``): ``0.5 * (logp - ref)^2``. Its gradient is the unbiased KL gradient.
    * ``k3`` (verl ``low_var_kl``, TRL's estimator): ``exp(ref - logp) - (ref - logp) - 1``, non-negative and
      low variance. As in verl the log-ratio is clamped to [-20, 20] and the result to [-10, 10]; a clamp that
      binds stops the gradient. (TRL does not clamp; the two agree whenever |ref - logp| < ~2.5.)
    """
    estimator = canonical_kl_estimator(estimator)
    if estimator == "k1":
        return logp - ref_logp
    if estimator == "k2":
        diff = logp - ref_logp
        return 0.5 * diff * diff
    log_ratio = ops.clamp(ref_logp - logp, -K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
    return ops.clamp(exact_exp(log_ratio) - log_ratio - 1.0, -K3_VALUE_CLAMP, K3_VALUE_CLAMP)
