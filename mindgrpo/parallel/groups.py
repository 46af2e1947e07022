"""Process groups under msrun: the tensor-parallel × data-parallel layout, and host-side collectives.

``world = data_parallel × model_parallel``. Tensor-parallel groups are runs of consecutive ranks
(``[d*tp, (d+1)*tp)``, so on Ascend a group stays inside one server), and data-parallel groups take one rank from
each (``{t, t+tp, t+2*tp, ...}``). Ranks of one TP group hold different slices of one model replica and see the
same prompts; ranks of one DP group hold the same slice and read different prompts.

Every collective here is an ``AllReduce`` with SUM: that is the one MindSpore 2.9 runs on CPU on any group (CPU
refuses AllReduce MAX, ReduceScatter, AlltoAll, Send/Recv, and AllGather on anything but the world group), so the
same code runs under msrun on CPU and on Ascend (HCCL). A gather is an AllReduce of zero-padded rank slots.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

WORLD = "world"
TP = "tp"
DP = "dp"


@dataclass(frozen=True)
class DistInfo:
    """This process's place in the layout. Group names are MindSpore communication groups ("" when the group has
    one rank, where no collective is issued)."""
    rank: int = 0
    world_size: int = 1
    tp_size: int = 1
    world_group: str = ""
    tp_group: str = ""
    dp_group: str = ""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp_size

    @property
    def dp_rank(self) -> int:
        return self.rank // self.tp_size

    @property
    def dp_size(self) -> int:
        return self.world_size // self.tp_size

    def group(self, which: str) -> str:
        return {WORLD: self.world_group, TP: self.tp_group, DP: self.dp_group}[which]

    def size(self, which: str) -> int:
        return {WORLD: self.world_size, TP: self.tp_size, DP: self.dp_size}[which]

    def index(self, which: str) -> int:
        return {WORLD: self.rank, TP: self.tp_rank, DP: self.dp_rank}[which]


_INFO: DistInfo | None = None


def launched_by_msrun() -> bool:
    """msrun (and mpirun-style launchers) export the cluster role and worker count to every process."""
    return bool(os.environ.get("MS_ROLE")) and int(os.environ.get("MS_WORKER_NUM", "1")) > 1


def init_distributed(model_parallel: int = 1) -> DistInfo:
    """Start the process group once when running under msrun (a plain process is rank 0 of 1) and create the
    tensor- and data-parallel groups for ``model_parallel``. Calling it again with another degree is an error."""
    global _INFO
    if _INFO is not None:
        if _INFO.tp_size != model_parallel:
            raise RuntimeError(f"process groups already set up for model_parallel = {_INFO.tp_size}, not "
                               f"{model_parallel}: one process trains one layout")
        return _INFO
    if not launched_by_msrun():
        if model_parallel != 1:
            raise RuntimeError(f"model_parallel = {model_parallel} needs {model_parallel} (or a multiple) workers "
                               f"started by msrun, e.g. `msrun --worker_num={model_parallel} "
                               f"--local_worker_num={model_parallel} main.py --config ...`")
        _INFO = DistInfo()
        return _INFO
    from mindspore.communication import GlobalComm, create_group, get_group_size, get_rank, init

    init()
    rank, world = get_rank(), get_group_size()
    if model_parallel < 1 or world % model_parallel:
        raise RuntimeError(f"model_parallel = {model_parallel} does not divide the {world} msrun workers")
    world_group = GlobalComm.WORLD_COMM_GROUP

    def make(name: str, ranks: list) -> str:
        """The group of ``ranks`` (this rank among them): MindSpore refuses to create a group its caller is not
        in, so each rank creates only its own two groups, its TP group first, then its DP group. The members of
        any group reach its creation as the same (first or second) call, so the pairing matches on every rank."""
        if len(ranks) == 1:
            return ""
        if len(ranks) == world:
            return world_group
        create_group(name, ranks)
        return name

    d, t = rank // model_parallel, rank % model_parallel
    tp_group = make(f"mindgrpo_tp_{d}", list(range(d * model_parallel, (d + 1) * model_parallel)))
    dp_group = make(f"mindgrpo_dp_{t}", list(range(t, world, model_parallel)))
    _INFO = DistInfo(rank=rank, world_size=world, tp_size=model_parallel, world_group=world_group,
                     tp_group=tp_group, dp_group=dp_group)
    return _INFO


def _all_reduce(values: np.ndarray, info: DistInfo, over: str) -> np.ndarray:
    import mindspore as ms
    from mindspore import Tensor, ops

    out = ops.AllReduce(group=info.group(over))(Tensor(values.astype(np.float32), ms.float32))
    return out.asnumpy()


def all_reduce_sum(values: np.ndarray, info: DistInfo, over: str = DP) -> np.ndarray:
    """Sum a small host array over the ranks of one group (default: data parallel, which is where different
    prompts live: metrics, token counts); identity when the group has one rank. float32 on the wire (CPU
    collectives), float64 back for the caller's arithmetic."""
    values = np.asarray(values, dtype=np.float64)
    if info.size(over) == 1:
        return values
    return _all_reduce(values, info, over).astype(np.float64)


def all_gather(values: np.ndarray, info: DistInfo, over: str = TP) -> np.ndarray:
    """Stack equal-shaped arrays of the group's ranks: ``[group size, *shape]`` in rank order (an AllReduce of
    zero-padded slots, which CPU runs on every group). float32 on the wire and back; a group of one rank gets its
    values as they are, as from :func:`all_reduce_sum`."""
    values = np.asarray(values)
    size = info.size(over)
    if size == 1:
        return values[None]
    slots = np.zeros((size,) + values.shape, np.float32)
    slots[info.index(over)] = values
    return _all_reduce(slots, info, over)


def barrier(info: DistInfo) -> None:
    """Wait until every rank of the world reaches this point."""
    all_reduce_sum(np.zeros(1), info, over=WORLD)
