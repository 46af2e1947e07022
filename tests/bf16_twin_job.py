"""msrun job of the bf16 twin at tensor parallel 2 (tests/test_mixed_precision.py): each rank builds the
ModelWorker of :func:`bf16_twin.twin_config` on its slices, runs the three updates of tests/bf16_twin.py on the same
rollouts, and gathers the full fp32 masters and bf16 weights from the ranks' slices; rank 0 writes them with each
update's loss and gradient norm to OUT_DIR/MODE.npz.

Usage: msrun --worker_num=2 ... bf16_twin_job.py OUT_DIR MODEL_DIR REF_LOGP.npy MODE [MODE ...]: the modes in turn,
in one launch (the process group is set up once)."""
import sys
from pathlib import Path

import numpy as np

import mindgrpo  # noqa: F401
import mindspore as ms

from bf16_twin import TWIN_STEPS, TWIN_VOCAB, twin_config, twin_rollouts
from mindgrpo.parallel.groups import TP, all_gather, init_distributed


def main() -> None:
    out, folder, ref_logp = Path(sys.argv[1]), sys.argv[2], np.load(sys.argv[3])
    ms.set_context(device_target="CPU")
    dist = init_distributed(model_parallel=2)
    for mode in sys.argv[4:]:
        ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
        run(folder, mode, ref_logp, dist, out)


def run(folder: str, mode: str, ref_logp: np.ndarray, dist, out: Path) -> None:
    from mindgrpo.train.model_worker import ModelWorker

    worker = ModelWorker(twin_config(folder, mode, model_parallel=2), dist, eos_token_id=TWIN_VOCAB - 1,
                         pad_token_id=TWIN_VOCAB - 3)
    rollouts, advantages, _ = twin_rollouts(TWIN_VOCAB, TWIN_VOCAB - 3)
    steps = []
    for _ in range(TWIN_STEPS):
        metrics = worker.update(rollouts, advantages, None, ref_logp, total_steps=TWIN_STEPS)
        steps.append((metrics["actor/loss"], metrics["grad_norm"]))
    opt, arrays = worker.optimizer, {"steps": np.array(steps, np.float64)}
    assert not opt.sharded and len(opt.master) == len(opt.params)
    for name, param, slot in zip(opt.names, opt.params, opt.slots):
        for kind, piece in (("master", opt.master[slot].asnumpy()), ("weight", param.astype(ms.float32).asnumpy())):
            pieces = all_gather(piece, dist, over=TP)
            arrays[f"{kind}/{name}"] = worker.layout.assemble(name, list(pieces), worker.full_shapes[name])
        arrays[f"shard/{name}"] = np.array(param.shape)
    if dist.rank == 0:
        np.savez(out / f"{mode}.npz", **arrays)


if __name__ == "__main__":
    main()
