"""GRPO algorithm: group advantages, per-token log-probs and entropy, KL estimators, and the policy loss."""
from mindgrpo.algorithm.advantages import SCALE_REWARDS, group_advantages
from mindgrpo.algorithm.kl import KL_ESTIMATORS, canonical_kl_estimator, kl_penalty
from mindgrpo.algorithm.logprobs import token_entropy, token_logprobs
from mindgrpo.algorithm.loss import (IMPLS, LOSS_TYPES, METRICS, LossSettings, grpo_loss, metrics_dict,
                                     plain_token_loss, step_row_weights)

__all__ = [
    "IMPLS", "KL_ESTIMATORS", "LOSS_TYPES", "METRICS", "SCALE_REWARDS", "LossSettings", "canonical_kl_estimator",
    "grpo_loss", "group_advantages", "kl_penalty", "metrics_dict", "plain_token_loss", "step_row_weights",
    "token_entropy", "token_logprobs",
]
