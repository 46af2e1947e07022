"""GRPO algorithm: group advantages, per-token log-probs and entropy, KL estimators, and the policy loss.

The names of its variants (loss types, KL estimators, reward scaling) are in :mod:`mindgrpo.choices`. Its modules load
MindSpore, so this package imports them on first use.
"""
from mindgrpo._lazy import lazy_attributes

_LAZY = {
    "group_advantages": "advantages", "generation_advantages": "advantages", "global_batch_std": "advantages",
    "zero_std_groups": "advantages", "kl_penalty": "kl", "token_entropy": "logprobs", "token_logprobs": "logprobs",
    "METRICS": "loss", "LossConfig": "loss", "grpo_loss": "loss", "plain_token_loss": "loss",
    "step_row_weights": "loss",
}
__all__ = sorted(_LAZY)

__getattr__ = lazy_attributes(__name__, {name: f"mindgrpo.algorithm.{module}" for name, module in _LAZY.items()})
