"""mindgrpo: GRPO fine-tuning of Qwen2.5 on MindSpore.

``from mindgrpo import GRPOConfig, GRPOTrainer`` is all a notebook needs; the heavy modules (MindSpore graphs,
MindFormers models) load on first use, so ``import mindgrpo`` stays quick and quiet.
"""
from mindgrpo import _env

_env.configure()

__version__ = "0.1.0"

_LAZY = {
    "GRPOConfig": ("mindgrpo.config", "GRPOConfig"),
    "load_config": ("mindgrpo.config", "load_config"),
    "GRPOTrainer": ("mindgrpo.train.trainer", "GRPOTrainer"),
    "RewardScorer": ("mindgrpo.rewards.scorer", "RewardScorer"),
    "MetricsLogger": ("mindgrpo.train.metrics", "MetricsLogger"),
    "read_metrics": ("mindgrpo.train.metrics", "read_metrics"),
    "evaluate": ("mindgrpo.apps.evaluation", "evaluate"),
}
__all__ = sorted(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mindgrpo' has no attribute {name!r}")
