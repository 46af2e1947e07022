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
The per-token part runs either as one fused custom op (``impl="fused"``, mindgrpo.ops) or as plain MindSpore ops
(``impl="plain"``, the reference and fallback); both return the same per-sequence sums, reduced here. The fused
kernel computes the clipped surrogate at token level with w = 1; everything else (GSPO's sequence-level ratio,
cispo, sapo, the entropy mask, rollout correction) runs the plain ops, whatever ``impl`` says
(``LossSettings.runs_fused``). The entropy bonus is added after the kernel and works with both.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import mindspore as ms
from mindspore import Tensor, ops

from mindgrpo.algorithm.kl import exact_exp, kl_penalty
from mindgrpo.algorithm.registry import (CLIPPED_LOSS_TYPES, IMPORTANCE_SAMPLING_LEVELS, LOSS_IMPLS, LOSS_REDUCTIONS, LOSS_TYPES,
                                         ROLLOUT_CORRECTIONS, canonical, canonical_kl_estimator)
from mindgrpo.ops import batch_means, fused_token_loss, hyper_params

# Names of the entries of grpo_loss's metrics vector, in order: the masked token means of ROW_STATS[1:7] (see
# mindgrpo.ops.ROW_STATS and batch_means; the last column, the ratio, is left to callers of the row functions).
METRICS = ("pg_loss", "kl", "clipfrac_low", "clipfrac_high", "clipfrac", "ppo_kl")


@dataclass(frozen=True)
class LossSettings:
    """How the GRPO loss is computed (names follow TRL's GRPOConfig and verl's actor config).

    The defaults are TRL 1.16's, for calling :func:`grpo_loss` on its own. A training run never uses them:
    :class:`mindgrpo.train.model_worker.ModelWorker` passes every field from ``rl_config``, whose defaults
    (:mod:`mindgrpo.config.schema`, MindRLHF's) differ: ``loss_type`` grpo, ``beta`` 0.04, no KL bias correction.

    Attributes:
        loss_type: token-loss reduction (see the module docstring). ``"grpo"``: mean over each sequence's tokens,
            then over sequences (DeepSeekMath; long completions weigh less per token). ``"bnpo"``: mean over all
            active tokens of the local batch. ``"dr_grpo"``: sum divided by the constant ``B *
            max_completion_length`` (Dr. GRPO, no length bias). ``"dapo"`` (TRL's default): sum divided by the
            active tokens of the whole global batch (DAPO's token-level loss, exact under accumulation / DP).
            ``"cispo"`` (MiniMax-M1, ScaleRL): REINFORCE with the importance weight clipped at ``epsilon_high``
            from above and detached, reduced as dapo. ``"sapo"`` (Soft Adaptive Policy Optimization): a
            sigmoid-gated soft clip with temperatures ``sapo_temperature_pos`` / ``_neg``, reduced as grpo.
        beta: KL coefficient (TRL ``beta``, verl ``kl_loss_coef``); 0 disables the KL term and the reference model.
        epsilon_low: lower clip, the ratio is clipped at ``1 - epsilon_low`` (TRL ``epsilon``, verl ``clip_ratio_low``).
        epsilon_high: upper clip at ``1 + epsilon_high`` (TRL/verl ``epsilon_high``/``clip_ratio_high``); DAPO's
            clip-higher uses 0.28 to keep exploration alive. Defaults to ``epsilon_low`` as in TRL. With ``cispo``
            it is the cap eps_max of the ratio itself (TRL's meaning; ScaleRL recommends 5.0).
        kl_estimator: ``"k1"``, ``"k2"`` or ``"k3"`` (verl ``kl_loss_type``: ``kl``, ``mse``, ``low_var_kl``; see
            mindgrpo.algorithm.kl). TRL always uses k3.
        use_bias_correction_kl: multiply the KL estimate by the importance ratio, not detached (TRL 1.16 default,
            from DeepSeek-V3.2: unbiased KL gradient when sampling off-policy). Only matters when ``beta > 0``.
        max_completion_length: the generation length limit; required by ``dr_grpo`` (its constant divisor).
        impl: ``"fused"`` (one custom op for the per-token work, CPU AOT kernel or Ascend C) or ``"plain"``
            (MindSpore element-wise ops; the reference). ``"fused"`` runs the plain ops for the settings the
            kernel does not compute (GSPO, cispo, sapo, the entropy mask, rollout correction: :attr:`runs_fused`).
        importance_sampling_level: ``"token"`` (one ratio per token, GRPO) or ``"sequence"`` (GSPO, TRL 1.16's
            ``importance_sampling_level="sequence"``: the masked mean of each sequence's log-ratios, exponentiated,
            is the ratio of all its tokens, in the clipped surrogate and in the KL bias correction; not detached).
            The fused kernel works token by token and has no per-sequence pre-pass, so ``"sequence"`` always runs
            the plain ops, whatever ``impl`` says. TRL recommends ``loss_type="grpo"`` with it (the token-summing
            reductions weigh each sequence by its length) but allows every type; so does this.
        sapo_temperature_pos: SAPO's temperature for tokens with positive advantage (TRL's default 1.0).
        sapo_temperature_neg: SAPO's temperature for the others (TRL's default 1.05).
        top_entropy_quantile: rho, the fraction of highest-entropy tokens kept in the policy term (TRL's
            ``top_entropy_quantile``; the paper uses 0.2); 1.0 keeps all. Needs ``grpo_loss(entropy=...)``.
        entropy_coef: weight of the entropy bonus (verl's ``entropy_coeff``); 0 is off. Needs the entropy with
            its gradient.
        rollout_correction: ``"none"`` or one of TRL's four ``vllm_importance_sampling_mode`` values (see the
            module docstring). Needs ``grpo_loss(sampling_logp=...)``.
        rollout_correction_cap: the cap C of the correction weight (TRL's ``vllm_importance_sampling_clip_max``,
            default 3.0).
    """

    loss_type: str = "dapo"
    beta: float = 0.0
    epsilon_low: float = 0.2
    epsilon_high: float | None = None
    kl_estimator: str = "k3"
    use_bias_correction_kl: bool = True
    max_completion_length: int | None = None
    impl: str = "fused"
    importance_sampling_level: str = "token"
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    top_entropy_quantile: float = 1.0
    entropy_coef: float = 0.0
    rollout_correction: str = "none"
    rollout_correction_cap: float = 3.0

    @classmethod
    def from_config(cls, config) -> "LossSettings":
        """The settings a run uses: every field from ``config.rl_config`` (a :class:`mindgrpo.config.GRPOConfig`),
        the generation limit for ``dr_grpo``. The trainer and the doctor both build them here."""
        rl = config.rl_config
        return cls(loss_type=rl.loss_type, beta=rl.beta, epsilon_low=rl.epsilon_low, epsilon_high=rl.epsilon_high,
                   kl_estimator=rl.kl_estimator, use_bias_correction_kl=rl.use_bias_correction_kl,
                   max_completion_length=config.generate_config.sampling_config.max_tokens, impl=rl.loss_impl,
                   importance_sampling_level=rl.importance_sampling_level,
                   sapo_temperature_pos=rl.sapo_temperature_pos, sapo_temperature_neg=rl.sapo_temperature_neg,
                   top_entropy_quantile=rl.top_entropy_quantile, entropy_coef=rl.entropy_coef,
                   rollout_correction=rl.rollout_correction, rollout_correction_cap=rl.rollout_correction_cap)

    def __post_init__(self) -> None:
        canonical("importance_sampling_level", self.importance_sampling_level, IMPORTANCE_SAMPLING_LEVELS)
        canonical("rollout_correction", self.rollout_correction, ROLLOUT_CORRECTIONS)
        if not 0.0 <= self.top_entropy_quantile <= 1.0:
            raise ValueError(f"top_entropy_quantile must be in [0, 1], got {self.top_entropy_quantile}")
        if self.entropy_coef < 0 or self.rollout_correction_cap <= 0:
            raise ValueError(f"need entropy_coef >= 0 and rollout_correction_cap > 0, got {self.entropy_coef} and "
                             f"{self.rollout_correction_cap}")
        if self.sapo_temperature_pos <= 0 or self.sapo_temperature_neg <= 0:
            raise ValueError(f"SAPO temperatures must be > 0, got {self.sapo_temperature_pos} and "
                             f"{self.sapo_temperature_neg}")
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {self.loss_type!r}")
        if self.impl not in LOSS_IMPLS:
            raise ValueError(f"impl must be one of {LOSS_IMPLS}, got {self.impl!r}")
        if self.beta < 0:
            raise ValueError(f"beta must be >= 0, got {self.beta}")
        if self.epsilon_high is None:
            object.__setattr__(self, "epsilon_high", self.epsilon_low)
        if not 0 <= self.epsilon_low < 1 or self.epsilon_high < 0:
            raise ValueError(f"need 0 <= epsilon_low < 1 and epsilon_high >= 0, got "
                             f"{self.epsilon_low} and {self.epsilon_high}")
        object.__setattr__(self, "kl_estimator", canonical_kl_estimator(self.kl_estimator))
        if self.loss_type == "dr_grpo" and not (self.max_completion_length and self.max_completion_length > 0):
            raise ValueError("loss_type='dr_grpo' divides by max_completion_length: set it to the generation limit")

    @property
    def runs_fused(self) -> bool:
        """Whether the fused op computes the per-token loss. It does for ``impl="fused"`` with the clipped
        surrogate (grpo, bnpo, dr_grpo, dapo) at token level, without entropy mask or rollout correction, with or
        without KL and entropy bonus. Every other combination runs the plain ops: a sequence-level ratio needs
        each row's sum before any token's loss, which the one-pass kernel does not make; cispo and sapo are other
        surrogates, and the entropy mask and correction weights are extra per-token inputs the kernel does not
        take."""
        return (self.impl == "fused" and self.importance_sampling_level == "token"
                and self.loss_type in CLIPPED_LOSS_TYPES and self.top_entropy_quantile == 1.0
                and self.rollout_correction == "none")

    @property
    def reduction(self) -> str:
        """The token reduction of ``loss_type``: itself for the four reductions, dapo for cispo, grpo for sapo."""
        return LOSS_REDUCTIONS.get(self.loss_type, self.loss_type)

    @property
    def needs_entropy(self) -> bool:
        """Whether :func:`grpo_loss` needs the per-token entropy (entropy mask or bonus)."""
        return self.top_entropy_quantile < 1.0 or self.entropy_coef > 0


def plain_token_loss(logp: Tensor, old_logp: Tensor, ref_logp: Tensor | None, advantages: Tensor, mask: Tensor,
                     cfg: LossSettings, token_weight: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
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
    no_clip = ops.zeros_like(logp)
    if cfg.loss_type == "cispo":
        # REINFORCE weighted by the detached ratio capped at eps_max: every token keeps a gradient (-w * A).
        pg = -ops.stop_gradient(ops.minimum(ratio, cfg.epsilon_high)) * adv * logp
        clip_low, clip_high = no_clip, ops.logical_and(ratio > cfg.epsilon_high, adv > 0).astype(ms.float32)
    elif cfg.loss_type == "sapo":
        positive = (adv > 0).astype(ms.float32)
        tau = cfg.sapo_temperature_neg + (cfg.sapo_temperature_pos - cfg.sapo_temperature_neg) * positive
        pg = -ops.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau * adv
        clip_low = clip_high = no_clip
    else:
        low_bound, high_bound = 1.0 - cfg.epsilon_low, 1.0 + cfg.epsilon_high
        pg = -ops.minimum(ratio * adv, ops.clamp(ratio, low_bound, high_bound) * adv)
        clip_low = ops.logical_and(ratio < low_bound, adv < 0).astype(ms.float32)
        clip_high = ops.logical_and(ratio > high_bound, adv > 0).astype(ms.float32)
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


def _reduce(row_loss: Tensor, row_stats: Tensor, means: Tensor, cfg: LossSettings,
            num_items_in_batch: int | float | Tensor | None, grad_accum_steps: int, dp_size: int) -> Tensor:
    """One scalar from the per-sequence sums, per ``cfg.loss_type`` (formulas in the module docstring).

    ``row_stats[:, 0]`` holds each sequence's active tokens and ``means[0]`` the micro-batch's.
    """
    batch = row_loss.shape[0]
    if cfg.reduction == "grpo":
        return (row_loss / ops.clamp(row_stats[:, 0], min=1.0)).sum() / (batch * grad_accum_steps)
    if cfg.reduction == "bnpo":
        return row_loss.sum() / ops.clamp(means[0], min=1.0) / grad_accum_steps
    if cfg.reduction == "dr_grpo":
        return row_loss.sum() / (batch * cfg.max_completion_length * grad_accum_steps)
    if num_items_in_batch is None:
        total = ops.clamp(means[0], min=1.0)
    elif isinstance(num_items_in_batch, Tensor):
        total = ops.clamp(num_items_in_batch.astype(ms.float32), min=1.0)
    else:
        total = max(1.0, float(num_items_in_batch))
    return row_loss.sum() * dp_size / total


def step_row_weights(cfg: LossSettings, lengths: np.ndarray, micro_batch_size: int, *, dp_size: int = 1,
                     num_items_in_batch: float = 0.0) -> np.ndarray:
    """float32 [N]: each of this rank's N sequences' weight in the optimizer step's loss, so that
    sum_i w_i * sum_t m*l is the sum of ``_reduce`` over consecutive micro-batches of ``micro_batch_size`` sequences
    (G = N / micro_batch_size of them). ``lengths`` [N]: each sequence's active tokens (sum_t m);
    ``num_items_in_batch``: ``dapo``'s active tokens of the step on all ranks."""
    lengths = np.asarray(lengths, np.float64)
    n = len(lengths)
    if n % micro_batch_size:
        raise ValueError(f"micro_batch_size {micro_batch_size} must divide the {n} sequences of the step")
    if cfg.reduction == "grpo":
        weights = 1.0 / (np.maximum(lengths, 1.0) * n)
    elif cfg.reduction == "bnpo":  # each micro-batch's token mean, then the mean over micro-batches
        tokens = lengths.reshape(-1, micro_batch_size).sum(1)
        weights = np.repeat(1.0 / (np.maximum(tokens, 1.0) * (n // micro_batch_size)), micro_batch_size)
    elif cfg.reduction == "dr_grpo":
        weights = np.full(n, 1.0 / (n * cfg.max_completion_length))
    else:
        weights = np.full(n, dp_size / max(1.0, float(num_items_in_batch)))
    return weights.astype(np.float32)


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
              cfg: LossSettings, num_items_in_batch: int | float | Tensor | None = None, grad_accum_steps: int = 1,
              dp_size: int = 1, row_weights: Tensor | None = None, entropy: Tensor | None = None,
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
        loss = _reduce(row_loss, row_stats, means, cfg, num_items_in_batch, grad_accum_steps, dp_size)
    else:
        loss = (row_loss * ops.stop_gradient(_float32(row_weights))).sum()
    return loss, ops.stop_gradient(_metrics(means))
