"""Custom MindSpore operators: the fused GRPO token loss (CPU AOT kernel, Ascend C twin) and its build logic."""
from mindgrpo.ops.build import KernelBuildError, build_cpu_kernel
from mindgrpo.ops.token_loss import KL_CODES, ROW_STATS, batch_means, fused_token_loss, hyper_params

__all__ = [
    "KL_CODES", "ROW_STATS", "KernelBuildError", "batch_means", "build_cpu_kernel", "fused_token_loss", "hyper_params",
]
