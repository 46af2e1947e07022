#!/usr/bin/env python
"""Measure how the AdamW update graph's compile time grows with the parameter count.

:class:`~mindgrpo.train.step_graphs.ApplyGradients` takes one AdamW step over every parameter and zeroes the
gradient accumulators. Two ways to order the zeroing, each compiled in its own process (GRAPH mode; MindSpore keeps
compiled graphs per process) over N float32 parameters of 4 x 4:

* ``per-parameter`` (shipped): each accumulator is zeroed right after its own parameter's step read it
  (:meth:`~mindgrpo.train.optim.AdamW.step_and_reset`);
* ``after-the-step`` (the baseline, the earlier code): the step over all parameters, then every accumulator zeroed
  once the whole step is done.

Reported: the first call (compile + run) per setting and N, and whether both leave the same weights and zeroed
accumulators. Qwen2.5-7B has 339 parameters, 32B 771.

    python tools/bench_update_compile.py [--counts 200 400 800]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def child(count: int, setting: str) -> None:
    import time

    import numpy as np

    import mindgrpo  # noqa: F401  (configures the environment before MindSpore is used)
    import mindspore as ms
    from mindspore import Parameter, ParameterTuple, Tensor, nn, ops

    from mindgrpo.config import OptimizerConfig
    from mindgrpo.train.optim import AdamW
    from mindgrpo.train.step_graphs import ApplyGradients

    ms.set_context(mode=ms.GRAPH_MODE)
    rng = np.random.default_rng(0)
    params = [Parameter(Tensor(rng.standard_normal((4, 4)).astype(np.float32)), name=f"p{i}") for i in range(count)]
    accumulators = ParameterTuple(params).clone(prefix="grad_accum", init="ones")
    optimizer = AdamW(params, OptimizerConfig(weight_decay=0.1))

    zero_after = ops.MultitypeFuncGraph("zero_after")

    @zero_after.register("Tensor", "Tensor")
    def _zero(step_size, accumulator):
        return ops.assign(accumulator, ops.depend(ops.zeros_like(accumulator), step_size))

    class AfterTheStep(nn.Cell):
        def __init__(self):
            super().__init__(auto_prefix=False)
            self.accumulators, self.optimizer, self.hyper_map = accumulators, optimizer, ops.HyperMap()

        def construct(self, step_size, eps, decay):
            step_size = self.optimizer(tuple(self.accumulators), step_size, eps, decay)
            return ops.depend(step_size, self.hyper_map(ops.partial(zero_after, step_size), self.accumulators))

    cell = ApplyGradients(accumulators, optimizer) if setting == "per-parameter" else AfterTheStep()
    start = time.perf_counter()
    cell(*optimizer.hyper_tensors(1e-3))
    seconds = time.perf_counter() - start
    weights = float(sum(np.abs(p.asnumpy()).sum() for p in params))
    zeroed = all(not a.asnumpy().any() for a in accumulators)
    print(json.dumps({"seconds": seconds, "weights": weights, "zeroed": zeroed}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[200, 400, 800])
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(int(args.child[0]), args.child[1])
        return
    sys.path.insert(0, str(REPO / "tools"))
    from benchlib import cpu_model

    print(f"CPU: {cpu_model()}")
    print(f"{'parameters':>10} {'after-the-step s':>17} {'per-parameter s':>16} {'ratio':>6}  same result")
    for count in args.counts:
        runs = {}
        for setting in ("after-the-step", "per-parameter"):
            done = subprocess.run([sys.executable, __file__, "--child", str(count), setting], capture_output=True,
                                  text=True, check=True)
            runs[setting] = json.loads(done.stdout.strip().splitlines()[-1])
        base, new = runs["after-the-step"], runs["per-parameter"]
        same = base["zeroed"] and new["zeroed"] and abs(base["weights"] - new["weights"]) <= 1e-6 * base["weights"]
        print(f"{count:>10} {base['seconds']:>17.2f} {new['seconds']:>16.2f} {base['seconds'] / new['seconds']:>5.1f}x"
              f"  {same}")


if __name__ == "__main__":
    main()
