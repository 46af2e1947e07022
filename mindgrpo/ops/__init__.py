"""Custom MindSpore operators: the fused GRPO token loss (CPU AOT kernel, Ascend C twin), the native rollout's fused
decode step and its KV store, their build logic, and the Ascend boundary (:mod:`mindgrpo.ops.ascend`).

The loss and decode modules load MindSpore, so this package imports them on first use: ``build`` and ``ascend``
(what ``python -m mindgrpo doctor`` reads) stay free of MindSpore.
"""
from mindgrpo._lazy import lazy_attributes

_LAZY = {
    "KL_CODES": "token_loss", "ROW_STATS": "token_loss", "batch_means": "token_loss", "fused_token_loss": "token_loss",
    "hyper_params": "token_loss", "KernelBuildError": "build", "build_cpu_kernel": "build",
}
__all__ = sorted(_LAZY)

__getattr__ = lazy_attributes(__name__, {name: f"mindgrpo.ops.{module}" for name, module in _LAZY.items()})
