"""Custom MindSpore operators: the fused GRPO token loss (CPU AOT kernel, Ascend C twin), the native rollout's fused
decode step and its KV store, their build logic, and the Ascend boundary (:mod:`mindgrpo.ops.ascend`).

The loss and decode modules load MindSpore, so this package imports them on first use: ``build`` and ``ascend``
(what ``python -m mindgrpo doctor`` reads) stay free of MindSpore.
"""
import importlib

_LAZY = {
    "KL_CODES": "token_loss", "ROW_STATS": "token_loss", "batch_means": "token_loss", "fused_token_loss": "token_loss",
    "hyper_params": "token_loss", "KernelBuildError": "build", "build_cpu_kernel": "build",
}
__all__ = sorted(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        value = getattr(importlib.import_module(f"mindgrpo.ops.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mindgrpo.ops' has no attribute {name!r}")
