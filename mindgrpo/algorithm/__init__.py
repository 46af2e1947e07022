"""GRPO algorithm: group advantages, per-token log-probs and entropy, KL estimators, and the policy loss.

``registry`` names every variant the config accepts. The other modules load MindSpore, so this package imports them
on first use: ``from mindgrpo.algorithm.registry import ...`` (what the config does) stays free of MindSpore.
"""
from mindgrpo._lazy import lazy_attributes

_LAZY = {
    "group_advantages": "advantages", "global_batch_std": "advantages", "kl_penalty": "kl", "token_entropy": "logprobs", "token_logprobs": "logprobs",
    "METRICS": "loss", "LossConfig": "loss", "grpo_loss": "loss", "plain_token_loss": "loss",
    "step_row_weights": "loss",
    "LOSS_IMPLS": "registry", "KL_ESTIMATORS": "registry", "LOSS_TYPES": "registry", "CLIPPED_LOSS_TYPES": "registry",
    "SCALE_REWARDS": "registry",
    "canonical_kl_estimator": "registry",
}
__all__ = sorted(_LAZY)

__getattr__ = lazy_attributes(__name__, {name: f"mindgrpo.algorithm.{module}" for name, module in _LAZY.items()})
