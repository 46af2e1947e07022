"""The GRPO policy loss: clipped importance-weighted surrogate + beta * KL, reduced per ``loss_type``.

Per token (completion i, position t; m = completion mask, A = advantage):

    r   = exp(logp - old)                          # old = logp detached when on-policy (num_iterations = 1)
          [sequence level (GSPO): r_i = exp(sum_t m*(logp - old) / max(1, sum_t m)), the same for every t]
    pg  = -min(r * A, clamp(r, 1 - eps_low, 1 + eps_high) * A)       grpo, bnpo, dr_grpo, dapo
          -sg(min(r, eps_high)) * A * logp                           cispo (sg: stop_gradient; eps_high is eps_max)
          -sigmoid(tau * (r - 1)) * 4 / tau * A                      sapo (tau = tau_pos if A > 0 else tau_neg)
    pg *= w                                    w = entropy mask x rollout-correction weight, both without gradient
    kl  = estimator(logp, ref)  [* r  when use_bias_correction_kl]
    l   = pg + beta * kl

then one scalar, where G = ``grad_accum_steps`` and W = ``dp_size``:

    grpo     mean_i( sum_t m*l / max(1, sum_t m) ) / G
    bnpo     sum_{i,t} m*l / max(1, sum_{i,t} m) / G
    dr_grpo  sum_{i,t} m*l / (B_local * max_completion_length) / G
    dapo     sum_{i,t} m*l * W / max(1, num_items_in_batch)

(``cispo`` reduces as ``dapo`` and ``sapo`` as ``grpo``, as in TRL 1.16.) The options of TRL's ``_compute_loss``:

* **Entropy mask** (``top_entropy_quantile`` = rho < 1, "Beyond the 80/20 rule"): w is 1 only on the tokens whose
  entropy is at least the (1 - rho) quantile (torch.quantile's linear interpolation) of the active tokens' entropies
  of this micro-batch (TRL gathers that set over its data-parallel ranks; here it is each rank's micro-batch).
* **Rollout correction** (TRL's ``vllm_importance_sampling_mode`` with ``_clip_max`` = cap and no lower bound): the
  weight exp(old - sampling) of the training forward's log-probs (old, detached; logp itself on-policy) over the
  rollout engine's, per token (``token_*``) or as exp(sum_t m*(old - sampling)) per sequence (``sequence_*``);
  ``*_truncate`` uses min(weight, cap), ``*_mask`` zeroes weights above cap.
* **Entropy bonus** (``entropy_coef`` = c > 0; verl's ``entropy_coeff``, which TRL 1.16 also has but always
  token-means): loss -= c * (the per-token entropy H reduced exactly as l is, with the same mask and factors), as
  verl's ``policy_loss = pg_loss - entropy_coeff * agg_loss(entropy, loss_agg_mode)``. H carries its gradient.

**Gradient accumulation and data parallelism.** The trainer *sums* the gradients of its G micro-batches and the
data-parallel reducer *averages* over the W ranks (``nn.DistributedGradReducer``'s default). With the factors above:

* ``dapo`` gives exactly the gradient of one big batch whose token-mean loss is sum(m*l) / N, because the caller
  passes ``num_items_in_batch`` = N, the active completion tokens summed over all micro-batches of the optimizer
  step *and* all ranks (the x W undoes the reducer's mean). Short and long micro-batches weigh by their tokens.
* ``grpo`` and ``dr_grpo`` give the mean over micro-batches and ranks of per-micro-batch means, which is the big
  batch's value when micro-batches have the same number of sequences (dr_grpo's divisor is a constant).
* ``bnpo`` normalises by the local token count, so it averages micro-batch token means (TRL's behaviour); use
  ``dapo`` when that difference matters.

**Regrouped sequences.** Packed training (:mod:`mindgrpo.train.packing`) forms micro-batches of other sizes and members.
Every formula above is a weighted sum of per-sequence sums, so :func:`step_row_weights` gives each sequence its
weight in the step's loss as the consecutive micro-batches of ``micro_batch_size`` sequences define it, and
``grpo_loss(row_weights=...)`` sums with those weights: the same loss and gradient however the sequences are grouped.

With G = W = 1 these are TRL 1.16's formulas (``_compute_loss``); the test suite holds them to TRL's own numbers.
The per-token part runs either as one fused custom op (``loss_impl="fused"``, mindgrpo.ops) or as plain MindSpore ops
(``loss_impl="plain"``, the reference and fallback); both return the same per-sequence sums, reduced here. The fused
kernel computes the clipped surrogate at token level with w = 1; everything else (GSPO's sequence-level ratio,
cispo, sapo, the entropy mask, rollout correction) runs the plain ops, whatever ``loss_impl`` says
(``LossConfig.runs_fused``). The entropy bonus is added after the kernel and works with both.
"""
from __future__ import annotations

from typing import Callable, Dict

import numpy as np

import mindspore as ms
from mindspore import Tensor, ops

from mindgrpo.algorithm.kl import exact_exp, kl_penalty
from mindgrpo.choices import CLIPPED_LOSS_TYPES, LOSS_REDUCTIONS, LOSS_TYPES
from mindgrpo.config.schema import LossConfig
from mindgrpo.ops import batch_means, fused_token_loss, hyper_params

# Names of the entries of grpo_loss's metrics vector, in order: the masked token means of ROW_STATS[1:7] (see
# mindgrpo.ops.ROW_STATS and batch_means; the last column, the ratio, is left to callers of the row functions).
METRICS = ("pg_loss", "kl", "clipfrac_low", "clipfrac_high", "clipfrac", "ppo_kl")


# ----------------------------------------------------------------------------------------------------------------
# Surrogates, by loss_type (verl's ``register_policy_loss``): the per-token policy term pg of the module docstring
# and its low / high clip indicators (float32 [B, T]), from the ratio r, the advantages A ([B, 1] or [B, T]) and
# logp. A new surrogate registers here and names itself in mindgrpo.choices.LOSS_TYPES (the config's
# list); the check below the reductions keeps the two in step.

SURROGATES: Dict[str, Callable] = {}


def register_surrogate(*loss_types: str) -> Callable:
    def add(fn: Callable) -> Callable:
        for name in loss_types:
            SURROGATES[name] = fn
        return fn
    return add


@register_surrogate(*CLIPPED_LOSS_TYPES)
def clipped_surrogate(ratio: Tensor, adv: Tensor, logp: Tensor, cfg: LossConfig):
    """PPO's clip: -min(r A, clamp(r, 1 - eps_low, 1 + eps_high) A). Clipped: r below the range with A < 0 (low),
    above it with A > 0 (high): the tokens whose gradient the clip removed."""
    low_bound, high_bound = 1.0 - cfg.epsilon_low, 1.0 + cfg.epsilon_high
    pg = -ops.minimum(ratio * adv, ops.clamp(ratio, low_bound, high_bound) * adv)
    clip_low = ops.logical_and(ratio < low_bound, adv < 0).astype(ms.float32)
    clip_high = ops.logical_and(ratio > high_bound, adv > 0).astype(ms.float32)
    return pg, clip_low, clip_high


@register_surrogate("cispo")
def cispo_surrogate(ratio: Tensor, adv: Tensor, logp: Tensor, cfg: LossConfig):
    """CISPO (MiniMax-M1): -sg(min(r, eps_max)) A logp, REINFORCE weighted by the detached ratio capped at eps_max
    (``epsilon_high``): every token keeps a gradient (-w A). High clips: r above eps_max with A > 0 (TRL's
    ``cispo_clip_ratio``)."""
    pg = -ops.stop_gradient(ops.minimum(ratio, cfg.epsilon_high)) * adv * logp
    return pg, ops.zeros_like(logp), ops.logical_and(ratio > cfg.epsilon_high, adv > 0).astype(ms.float32)


@register_surrogate("sapo")
def sapo_surrogate(ratio: Tensor, adv: Tensor, logp: Tensor, cfg: LossConfig):
    """SAPO: -sigmoid(tau (r - 1)) 4 / tau A, tau = sapo_temperature_pos where A > 0, else _neg; clips nothing."""
    positive = (adv > 0).astype(ms.float32)
    tau = cfg.sapo_temperature_neg + (cfg.sapo_temperature_pos - cfg.sapo_temperature_neg) * positive
    pg = -ops.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau * adv
    no_clip = ops.zeros_like(logp)
    return pg, no_clip, no_clip


# ----------------------------------------------------------------------------------------------------------------
# Reductions, by LossConfig.reduction (verl's ``loss_agg_mode``): each gives every sequence its weight in the loss,
# so that the loss is sum_i w_i * sum_t m*l. The same function serves one micro-batch in the graph (Tensors:
# ``_reduce``) and a whole step on the host (numpy: ``step_row_weights``, for packed training): ``row_tokens`` are
# each sequence's active tokens, ``batch_tokens`` its micro-batch's, ``total_tokens`` the step's on all ranks
# (dapo's N; the micro-batch's when not given); the constants are B sequences per micro-batch (``rows``), G
# micro-batches per optimizer step (their gradients are summed), W data-parallel ranks (averaged by the reducer) and
# dr_grpo's max_completion_length.

REDUCTIONS: Dict[str, Callable] = {}


def register_reduction(name: str) -> Callable:
    def add(fn: Callable) -> Callable:
        REDUCTIONS[name] = fn
        return fn
    return add


def _check_divisor(cfg: LossConfig, max_completion_length: int | None) -> None:
    if cfg.reduction == "dr_grpo" and not (max_completion_length and max_completion_length > 0):
        raise ValueError("loss_type='dr_grpo' divides by max_completion_length: pass the generation limit")


def _at_least_one(tokens):
    """max(tokens, 1): of a Tensor in the graph, a numpy array on the host, or a number."""
    if isinstance(tokens, Tensor):
        return ops.clamp(tokens, min=1.0)
    if isinstance(tokens, np.ndarray):
        return np.maximum(tokens, 1.0)
    return max(float(tokens), 1.0)


@register_reduction("grpo")
def grpo_reduction(row_tokens, batch_tokens, total_tokens, rows, micro_batches, dp_size, max_completion_length):
    """mean_i( sum_t m*l / max(1, sum_t m) ) / G: each sequence's token mean, then the mean over sequences."""
    return 1.0 / (_at_least_one(row_tokens) * (rows * micro_batches))


@register_reduction("bnpo")
def bnpo_reduction(row_tokens, batch_tokens, total_tokens, rows, micro_batches, dp_size, max_completion_length):
    """sum_{i,t} m*l / max(1, sum_{i,t} m) / G: the micro-batch's token mean, then the mean over micro-batches."""
    return 1.0 / (_at_least_one(batch_tokens) * micro_batches)


@register_reduction("dr_grpo")
def dr_grpo_reduction(row_tokens, batch_tokens, total_tokens, rows, micro_batches, dp_size, max_completion_length):
    """sum_{i,t} m*l / (B * max_completion_length) / G: a constant divisor, no length bias."""
    return 1.0 / (rows * max_completion_length * micro_batches)


@register_reduction("dapo")
def dapo_reduction(row_tokens, batch_tokens, total_tokens, rows, micro_batches, dp_size, max_completion_length):
    """sum_{i,t} m*l * W / max(1, N): the token mean of the whole global batch (the x W undoes the reducer's mean)."""
    return dp_size / _at_least_one(total_tokens)


if set(SURROGATES) != set(LOSS_TYPES) or {LOSS_REDUCTIONS.get(t, t) for t in LOSS_TYPES} - set(REDUCTIONS):
    raise ImportError(f"mindgrpo.choices.LOSS_TYPES {LOSS_TYPES} and the surrogates {sorted(SURROGATES)} "
                      f"and reductions {sorted(REDUCTIONS)} registered in {__name__} differ: register every name")


def plain_token_loss(logp: Tensor, old_logp: Tensor, ref_logp: Tensor | None, advantages: Tensor, mask: Tensor,
                     cfg: LossConfig, token_weight: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """The per-token loss with plain MindSpore ops: the reference for the fused op, same outputs.

    ``token_weight`` [B, T] (no gradient) multiplies the policy term: w of the module docstring, None for 1.
    Returns ``row_loss`` [B] = sum_t m * (w * pg + beta * kl), ``row_stats`` [B, 8] (columns:
    mindgrpo.ops.ROW_STATS; the pg column is w * pg) and ``batch_means`` [8] (mindgrpo.ops.batch_means); the last
    two carry no gradient. For cispo the clip columns count ratios above eps_max with A > 0 (TRL's
    ``cispo_clip_ratio``) as high clips; sapo clips nothing.
    """
    adv = advantages.expand_dims(-1) if advantages.ndim == 1 else advantages
    log_ratio = logp - old_logp
    if cfg.importance_sampling_level == "sequence":
        # GSPO as TRL 1.16's _compute_loss: the masked mean log-ratio of each sequence, for all its tokens. It keeps
        # its gradient (each token receives 1/|y_i| of the sequence's), and is broadcast to [B, T] so the metric
        # columns below keep one shape.
        row_mean = (log_ratio * mask).sum(axis=-1, keepdims=True) / ops.clamp(mask.sum(axis=-1, keepdims=True),
                                                                              min=1.0)
        log_ratio = ops.broadcast_to(row_mean, logp.shape)
    ratio = exact_exp(log_ratio)
    pg, clip_low, clip_high = SURROGATES[cfg.loss_type](ratio, adv, logp, cfg)
    if token_weight is not None:
        pg = pg * token_weight
    if ref_logp is None:
        kl = ops.zeros_like(logp)
        token = pg
    else:
        kl = kl_penalty(logp, ref_logp, cfg.kl_estimator)
        if cfg.use_bias_correction_kl:
            kl = kl * ratio
        token = pg + cfg.beta * kl
    row_loss = (token * mask).sum(axis=-1)
    columns = (mask, pg, kl, clip_low, clip_high, clip_low + clip_high, old_logp - logp, ratio)
    row_stats = ops.stop_gradient(ops.stack([(column * mask).sum(axis=-1) for column in columns], axis=-1))
    return row_loss, row_stats, batch_means(row_stats)


def _reduce(row_loss: Tensor, row_stats: Tensor, means: Tensor, cfg: LossConfig,
            num_items_in_batch: int | float | Tensor | None, grad_accum_steps: int, dp_size: int,
            max_completion_length: int | None) -> Tensor:
    """One scalar from the per-sequence sums, per ``cfg.reduction`` (formulas in the module docstring).

    ``row_stats[:, 0]`` holds each sequence's active tokens and ``means[0]`` the micro-batch's.
    """
    if num_items_in_batch is None:
        total = means[0]
    elif isinstance(num_items_in_batch, Tensor):
        total = num_items_in_batch.astype(ms.float32)
    else:
        total = float(num_items_in_batch)
    weights = REDUCTIONS[cfg.reduction](row_stats[:, 0], means[0], total, row_loss.shape[0], grad_accum_steps, dp_size,
                                        max_completion_length)
    return (row_loss * weights).sum()


def step_row_weights(cfg: LossConfig, lengths: np.ndarray, micro_batch_size: int, *, dp_size: int = 1,
                     num_items_in_batch: float = 0.0, max_completion_length: int | None = None) -> np.ndarray:
    """float32 [N]: each of this rank's N sequences' weight in the optimizer step's loss, so that
    sum_i w_i * sum_t m*l is the sum of ``_reduce`` over consecutive micro-batches of ``micro_batch_size`` sequences
    (G = N / micro_batch_size of them): the same registered reduction, given every micro-batch at once.
    ``lengths`` [N]: each sequence's active tokens (sum_t m); ``num_items_in_batch``: ``dapo``'s active tokens of
    the step on all ranks; ``max_completion_length``: ``dr_grpo``'s divisor."""
    lengths = np.asarray(lengths, np.float64)
    n = len(lengths)
    if n % micro_batch_size:
        raise ValueError(f"micro_batch_size {micro_batch_size} must divide the {n} sequences of the step")
    _check_divisor(cfg, max_completion_length)
    batch_tokens = np.repeat(lengths.reshape(-1, micro_batch_size).sum(1), micro_batch_size)
    weights = REDUCTIONS[cfg.reduction](lengths, batch_tokens, float(num_items_in_batch), micro_batch_size,
                                        n // micro_batch_size, dp_size, max_completion_length)
    return np.broadcast_to(weights, (n,)).astype(np.float32)


def _metrics(means: Tensor) -> Tensor:
    """Masked token means over the micro-batch, whatever the loss_type (as TRL logs its clip ratios and KL)."""
    return means[1:1 + len(METRICS)]


def _float32(x: Tensor) -> Tensor:
    # Cast only when needed: PyNative would otherwise copy [B, T] tensors that are float32 already.
    return x if x.dtype == ms.float32 else x.astype(ms.float32)


def high_entropy_mask(entropy: Tensor, mask: Tensor, quantile: float) -> Tensor:
    """float32 [B, T]: 1 on the active tokens whose entropy is at least the ``1 - quantile`` quantile of the active
    tokens' entropies (TRL's ``get_high_entropy_mask``, with torch.quantile's linear interpolation), else 0.

    Static shapes for GRAPH mode: the masked-out entries sort below every entropy (which is >= 0), so the n active
    ones are the last n of the sorted row and the quantile's two neighbours are gathered at a computed index."""
    flat_mask = mask.reshape(-1)
    size = flat_mask.shape[0]
    keyed = ops.stop_gradient(entropy).reshape(-1) * flat_mask - (1.0 - flat_mask)  # padding sorts first, as -1
    ordered, _ = ops.sort(keyed)
    count = flat_mask.sum()
    position = (1.0 - quantile) * ops.clamp(count - 1.0, min=0.0)
    below = ops.floor(position)
    first = size - count  # index of the smallest active entropy
    low = ops.clamp(first + below, 0, size - 1).astype(ms.int32)
    high = ops.clamp(first + ops.minimum(below + 1.0, ops.clamp(count - 1.0, min=0.0)), 0, size - 1).astype(ms.int32)
    lower, upper = ops.gather(ordered, low.reshape(1), 0), ops.gather(ordered, high.reshape(1), 0)
    threshold = lower + (position - below) * (upper - lower)
    keep = (keyed.reshape(entropy.shape) >= threshold).astype(ms.float32) * mask
    return ops.stop_gradient(keep)


def rollout_correction_weight(old_logp: Tensor, sampling_logp: Tensor, mask: Tensor, mode: str,
                              cap: float) -> Tensor:
    """float32 [B, T] (no gradient): TRL 1.16's vLLM importance-sampling weight exp(old - sampling) for ``mode`` (see
    the module docstring), per token or broadcast from one per sequence. ``old_logp`` is detached."""
    log_weight = (old_logp - sampling_logp) * mask
    if mode.startswith("sequence"):
        log_weight = ops.broadcast_to(log_weight.sum(axis=-1, keepdims=True), old_logp.shape)
    weight = exact_exp(log_weight)
    if mode.endswith("truncate"):
        weight = ops.minimum(weight, cap)
    else:
        weight = weight * (weight <= cap).astype(ms.float32)
    return ops.stop_gradient(weight)


def grpo_loss(logp: Tensor, old_logp: Tensor | None, ref_logp: Tensor | None, advantages: Tensor, mask: Tensor, *,
              cfg: LossConfig, num_items_in_batch: int | float | Tensor | None = None, grad_accum_steps: int = 1,
              dp_size: int = 1, max_completion_length: int | None = None, row_weights: Tensor | None = None,
              entropy: Tensor | None = None,
              sampling_logp: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """GRPO loss of one micro-batch and its metrics; call it inside the differentiated function.

    Args:
        logp: [B, T] float32 log-probs of the completion tokens under the current policy (``token_logprobs``);
            the only input that receives a gradient.
        old_logp: [B, T] log-probs under the sampling policy, or None on-policy (num_iterations = 1), where the
            ratio is exp(logp - stop_gradient(logp)) = 1 but still carries the gradient, as in TRL.
        ref_logp: [B, T] reference-model log-probs, or None (allowed only when ``cfg.beta == 0``).
        advantages: [B] per sequence (``group_advantages``), [B, 1], or [B, T] per token.
        mask: [B, T] completion mask (bool, int or float), 1 for tokens that count. Masked positions must hold
            finite values (they are multiplied by 0).
        cfg: the loss settings.
        num_items_in_batch: ``dapo`` only: active completion tokens of the whole optimizer step, summed over
            micro-batches and data-parallel ranks (int or scalar tensor). None means this micro-batch is the whole
            batch (then G and W must be 1).
        grad_accum_steps: G, micro-batches per optimizer step whose gradients the trainer sums.
        dp_size: W, data-parallel ranks whose gradients the reducer averages.
        max_completion_length: the generation limit; ``dr_grpo``'s constant divisor (required for it).
        row_weights: [B] float32, each sequence's weight from :func:`step_row_weights`: the loss is then
            sum_i row_weights_i * sum_t m*l, and ``num_items_in_batch``, ``grad_accum_steps`` and ``dp_size`` are
            not used (the weights hold them).
        entropy: [B, T] per-token entropy of the current policy; needed when ``cfg.needs_entropy``. For the
            entropy bonus it must carry its gradient (the mask only reads it).
        sampling_logp: [B, T] the rollout engine's log-probs of the sampled tokens; needed when
            ``cfg.rollout_correction`` is not ``"none"`` (ignored otherwise).

    Returns:
        ``(loss, metrics)``: scalar loss, and a float32 vector without gradient whose entries are named by
        ``METRICS`` (in that order; a vector rather than a dict keeps GRAPH mode free of Python
        fallbacks and needs one all-reduce / one host copy). Each is a masked token mean over this micro-batch:
        ``pg_loss`` (surrogate term), ``kl`` (KL term as used in the loss, ratio-corrected
        if enabled; 0 without a reference), ``clipfrac_low`` (r < 1 - eps_low with A < 0), ``clipfrac_high``
        (r > 1 + eps_high with A > 0), ``clipfrac`` (either: tokens whose gradient the clip removed) and
        ``ppo_kl`` (old - logp, an estimate of KL(old || current)). At sequence level the clip fractions count
        the tokens of clipped sequences.
    """
    if ref_logp is None and cfg.beta != 0:
        raise ValueError(f"beta={cfg.beta} needs ref_logp (reference-model log-probs); pass them or set beta=0")
    if entropy is None and cfg.needs_entropy:
        raise ValueError("top_entropy_quantile < 1 or entropy_coef > 0 needs the per-token entropy: pass entropy")
    if sampling_logp is None and cfg.rollout_correction != "none":
        raise ValueError(f"rollout_correction={cfg.rollout_correction!r} needs the rollout engine's log-probs: "
                         "pass sampling_logp")
    if row_weights is None:
        _check_divisor(cfg, max_completion_length)
    if cfg.loss_type == "dapo" and num_items_in_batch is None and (grad_accum_steps != 1 or dp_size != 1):
        raise ValueError("loss_type='dapo' with gradient accumulation or data parallelism needs num_items_in_batch: "
                         "the active tokens summed over all micro-batches and ranks of the optimizer step")
    if logp.ndim != 2:
        raise ValueError(f"logp must be [B, T], got shape {tuple(logp.shape)}")
    for name, other in (("old_logp", old_logp), ("ref_logp", ref_logp), ("mask", mask), ("entropy", entropy),
                        ("sampling_logp", sampling_logp)):
        if other is not None and other.shape != logp.shape:
            raise ValueError(f"{name} must have logp's shape {tuple(logp.shape)}, got {tuple(other.shape)}")
    if advantages.ndim == 2 and advantages.shape[1] == 1 and logp.shape[1] != 1:
        advantages = advantages.reshape(-1)
    if advantages.shape not in ((logp.shape[0],), logp.shape):
        raise ValueError(f"advantages must be [B], [B, 1] or [B, T] for logp {tuple(logp.shape)}, "
                         f"got {tuple(advantages.shape)}")
    logp, mask = _float32(logp), _float32(mask)
    advantages = ops.stop_gradient(_float32(advantages))
    old_logp = ops.stop_gradient(logp if old_logp is None else _float32(old_logp))
    if ref_logp is not None:
        ref_logp = ops.stop_gradient(_float32(ref_logp))
    if cfg.runs_fused:
        hyper = hyper_params(cfg.beta, cfg.epsilon_low, cfg.epsilon_high, cfg.kl_estimator,
                             cfg.use_bias_correction_kl, ref_logp is not None)
        row_loss, row_stats, means = fused_token_loss(logp, old_logp, logp if ref_logp is None else ref_logp,
                                                      advantages, mask, hyper)
    else:
        token_weight = None
        if cfg.top_entropy_quantile < 1.0:
            token_weight = high_entropy_mask(_float32(entropy), mask, cfg.top_entropy_quantile)
        if cfg.rollout_correction != "none":
            correction = rollout_correction_weight(old_logp, ops.stop_gradient(_float32(sampling_logp)), mask,
                                                   cfg.rollout_correction, cfg.rollout_correction_cap)
            token_weight = correction if token_weight is None else token_weight * correction
        row_loss, row_stats, means = plain_token_loss(logp, old_logp, ref_logp, advantages, mask, cfg, token_weight)
    if cfg.entropy_coef > 0:
        # verl: the entropy is aggregated as the loss is, then subtracted; the same reduction does it here.
        row_loss = row_loss - cfg.entropy_coef * (_float32(entropy) * mask).sum(axis=-1)
    if row_weights is None:
        loss = _reduce(row_loss, row_stats, means, cfg, num_items_in_batch, grad_accum_steps, dp_size,
                       max_completion_length)
    else:
        loss = (row_loss * ops.stop_gradient(_float32(row_weights))).sum()
    return loss, ops.stop_gradient(_metrics(means))
