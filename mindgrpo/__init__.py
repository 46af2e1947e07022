"""mindgrpo: GRPO fine-tuning of Qwen2.5 on MindSpore.

``from mindgrpo import GRPOConfig, GRPOTrainer`` is all a notebook needs, and ``mindgrpo.logprobs`` scores a model
folder's per-token log-probs; the heavy modules (MindSpore graphs, MindFormers models) load on first use, so
``import mindgrpo`` stays quick and quiet.
"""
from mindgrpo import _env
from mindgrpo._lazy import lazy_attributes

_env.configure()

__version__ = "0.1.0"

_LAZY = {
    "GRPOConfig": "mindgrpo.config",
    "load_config": "mindgrpo.config",
    "GRPOTrainer": "mindgrpo.train.trainer",
    "RewardScorer": "mindgrpo.rewards.scorer",
    "MetricsLogger": "mindgrpo.train.metrics",
    "read_metrics": "mindgrpo.train.metrics",
    "evaluate": "mindgrpo.apps.evaluation",
    "logprobs": "mindgrpo.models.scoring",
}
__all__ = sorted(_LAZY)

__getattr__ = lazy_attributes(__name__, _LAZY)
