"""Benchmark the fused GRPO loss op against its plain-ops twin (forward + backward, GRAPH mode, CPU).

For each shape [B, T] it times ``value_and_grad`` of ``grpo_loss`` (d loss / d logp, plus the metrics) compiled
with ``ms.jit``, for ``impl="fused"`` and ``impl="plain"``, interleaving the two so machine noise hits both alike,
and prints the median time (and the fused step's best), the ratio plain / fused, and the fused step's achieved
bandwidth. The bandwidth bound is measured in the same run: the median time of a numpy copy of a 256 MiB array
(read + write). The fused loss moves 7 [B, T] float32 arrays: the forward reads logp, old, ref and mask and writes
each token's local derivative, the backward reads that and writes d logp. No forward/backward split can move less:
the backward needs the per-row upstream gradient, known only after the forward's reduction, so it must at least
read one stored array and write the gradient. "floor ms" is the median time of a jitted function that only touches
one element of each input: MindSpore's fixed cost of one graph call on this machine, included in every step.
A second table gives the same medians in process CPU time (all threads), which other jobs on a shared machine
disturb less than wall time.

Targets: fused >= 2x the plain twin, and its time within 2x of (bytes / copy bandwidth).

Usage:  python tools/bench_loss.py [--shapes 64x1024 256x2048] [--repeats 40]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from benchlib import copy_bandwidth
import mindgrpo  # noqa: F401  (must precede MindSpore: configures logging)
import mindspore as ms
from mindspore import Tensor

from mindgrpo.algorithm import LossConfig, grpo_loss

ARRAYS_MOVED = 7  # forward reads 4 [B, T] arrays and writes 1, backward reads 1 and writes 1


def make_inputs(batch: int, length: int, seed: int = 0) -> tuple[Tensor, ...]:
    """Log-probs with ~N(0, 0.3) log-ratios (some tokens clip), right-padded masks, per-sequence advantages."""
    rng = np.random.default_rng(seed)
    old = -(0.5 + 2.5 * rng.random((batch, length), dtype=np.float32))
    logp = old + 0.3 * rng.standard_normal((batch, length), dtype=np.float32)
    ref = old + 0.2 * rng.standard_normal((batch, length), dtype=np.float32)
    lengths = rng.integers(length // 4, length + 1, size=batch)
    mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.float32)
    adv = rng.standard_normal(batch).astype(np.float32)
    return tuple(Tensor(a) for a in (logp, old, ref, adv, mask, np.array(mask.sum(), np.float32)))


def make_step(impl: str):
    """The trainer's pattern: value_and_grad of the loss (metrics as aux) under ms.jit."""
    cfg = LossConfig(loss_type="dapo", beta=0.04, epsilon_low=0.2, epsilon_high=0.28, kl_estimator="k3",
                     use_bias_correction_kl=True, loss_impl=impl)

    def loss_fn(logp, old, ref, adv, mask, num_items):
        return grpo_loss(logp, old, ref, adv, mask, cfg=cfg, num_items_in_batch=num_items)

    return ms.jit(ms.value_and_grad(loss_fn, grad_position=0, has_aux=True))


def _finish(outputs) -> None:
    """Wait for a step: reading the loss to the host waits for the graph that also produced the gradient."""
    (loss, _metrics), _grad = outputs
    loss.asnumpy()


@ms.jit
def graph_call_floor(logp, old, ref, adv, mask, num_items):
    """A graph as cheap as a graph gets with these inputs: the framework's per-call cost."""
    return (logp[0, 0] + old[0, 0] + ref[0, 0] + adv[0] + mask[0, 0] + num_items, 0), 0


def time_impls(steps: dict, inputs: tuple[Tensor, ...], repeats: int) -> dict[str, dict[str, list[float]]]:
    """Wall and process-CPU seconds per call for each step function, calls interleaved."""
    for step in steps.values():  # compile and warm up
        for _ in range(3):
            _finish(step(*inputs))
    times = {clock: {name: [] for name in steps} for clock in ("wall", "cpu")}
    for _ in range(repeats):
        for name, step in steps.items():
            wall, cpu = time.perf_counter(), time.process_time()
            _finish(step(*inputs))
            times["cpu"][name].append(time.process_time() - cpu)
            times["wall"][name].append(time.perf_counter() - wall)
    return times


def parse_shape(text: str) -> tuple[int, int]:
    batch, length = text.lower().split("x")
    return int(batch), int(length)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", type=parse_shape, default=[(64, 1024), (256, 2048)])
    parser.add_argument("--repeats", type=int, default=40, help="timed calls per implementation and shape")
    args = parser.parse_args()

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    bandwidth = copy_bandwidth()
    print(f"memory-copy bandwidth (numpy, 256 MiB): {bandwidth / 1e9:.2f} GB/s")
    steps = {"fused": make_step("fused"), "plain": make_step("plain"), "floor": graph_call_floor}
    results = {(batch, length): time_impls(steps, make_inputs(batch, length), args.repeats)
               for batch, length in args.shapes}
    for clock in ("wall", "cpu"):
        print(f"\n{clock} time, medians over {args.repeats} calls ('best': the fused step's fastest call)")
        print(f"{'shape':>10} {'fused ms':>9} {'best ms':>8} {'plain ms':>9} {'plain/fused':>11} {'fused GB/s':>10} "
              f"{'bound ms':>9} {'fused/bound':>11} {'floor ms':>9}")
        for (batch, length), times in results.items():
            fused, plain, floor = (statistics.median(times[clock][name]) for name in ("fused", "plain", "floor"))
            nbytes = ARRAYS_MOVED * batch * length * 4
            bound = nbytes / bandwidth
            print(f"{batch:>4}x{length:<5} {fused * 1e3:9.3f} {min(times[clock]['fused']) * 1e3:8.3f} "
                  f"{plain * 1e3:9.3f} {plain / fused:11.2f} {nbytes / fused / 1e9:10.2f} {bound * 1e3:9.3f} "
                  f"{fused / bound:11.2f} {floor * 1e3:9.3f}")


if __name__ == "__main__":
    main()
