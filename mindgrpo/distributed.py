"""Data-parallel plumbing: process group start-up under msrun, rank/world size, and host-side reductions.

On CPU, mindgrpo's only parallelism is data parallel: every rank holds the whole model, reads its own shard of
prompts, and averages gradients with ``nn.DistributedGradReducer``. On Ascend the same entry point also sets up
semi-auto parallel from ``parallel_config`` (MindSpore refuses that mode on CPU).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


_INFO: DistInfo | None = None


def launched_by_msrun() -> bool:
    """msrun (and mpirun-style launchers) export the cluster role and worker count to every process."""
    return bool(os.environ.get("MS_ROLE")) and int(os.environ.get("MS_WORKER_NUM", "1")) > 1


def init_distributed() -> DistInfo:
    """Start the process group once when running under msrun; a plain process is rank 0 of 1."""
    global _INFO
    if _INFO is not None:
        return _INFO
    if not launched_by_msrun():
        _INFO = DistInfo()
        return _INFO
    from mindspore.communication import get_group_size, get_rank, init

    init()
    _INFO = DistInfo(rank=get_rank(), world_size=get_group_size())
    return _INFO


def all_reduce_sum(values: np.ndarray, info: DistInfo) -> np.ndarray:
    """Sum a small host array over ranks (metrics, token counts); identity on one process."""
    values = np.asarray(values, dtype=np.float64)
    if info.world_size == 1:
        return values
    import mindspore as ms
    from mindspore import Tensor, ops

    # float32 on the wire (CPU collectives), returned as float64 for the caller's arithmetic.
    out = ops.AllReduce()(Tensor(values.astype(np.float32), ms.float32))
    return out.asnumpy().astype(np.float64)


def all_gather(values: np.ndarray, info: DistInfo) -> np.ndarray:
    """Concatenate equal-shaped float arrays from all ranks along axis 0 (rank order)."""
    values = np.asarray(values, dtype=np.float32)
    if info.world_size == 1:
        return values
    import mindspore as ms
    from mindspore import Tensor, ops

    return ops.AllGather()(Tensor(values, ms.float32)).asnumpy()
