#!/usr/bin/env python
"""Measure the activation memory ``actor_config.recompute`` saves in a training step of the shared-prompt forward.

Workload: a random Qwen2 (8 layers, 4 heads of 32, 2 KV heads, intermediate 512, vocabulary 1024, made with
``tests/tiny_qwen.py``) and one micro-batch of 4 prompts x 128 tokens, each with 8 completions x 128 tokens, so the
activations dwarf the 2 M parameters. The step is ``value_and_grad`` of the summed completion log-probs through
:class:`~mindgrpo.models.SharedPromptForward` with ``recompute`` off and on, each in its own process (RSS is per
process). A first step compiles (GRAPH) and warms the allocator; then the kernel's peak-RSS mark is reset
(``/proc/self/clear_refs``) and the figure is the peak RSS during a second step minus the RSS just before it: the
memory the step itself needs, i.e. mostly the activations kept for the backward. The same figure for the first
step is printed too: in PyNative MindSpore's memory pool keeps what the first step took, so only the first step
shows the activations there (in GRAPH the first also holds the compilation). The gradients of both runs are
compared too (max |difference| / max |gradient| over all Parameters).

    python tools/bench_recompute.py [--mode graph|pynative]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NG, G, P, T = 4, 8, 128, 128


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def child(folder: str, recompute: bool, mode: str, grads_out: str) -> None:
    import numpy as np

    import mindgrpo  # noqa: F401  (configures the environment before MindSpore is used)
    import mindspore as ms
    from mindspore import ParameterTuple, Tensor, nn

    from mindgrpo.algorithm import token_logprobs
    from mindgrpo.models import SharedPromptForward, build_model

    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    model = build_model(folder)

    class Loss(nn.Cell):
        def __init__(self):
            super().__init__(auto_prefix=False)
            self.forward = SharedPromptForward(model, G, P + T, recompute=recompute)

        def construct(self, prompt_ids, prompt_mask, completion_ids):
            return token_logprobs(self.forward(prompt_ids, prompt_mask, completion_ids), completion_ids).sum()

    rng = np.random.default_rng(0)
    inputs = (Tensor(rng.integers(0, 1000, (NG, P)).astype(np.int32)), Tensor(np.ones((NG, P), np.int32)),
              Tensor(rng.integers(0, 1000, (NG * G, T)).astype(np.int32)))
    params = ParameterTuple(model.trainable_params())
    step = ms.value_and_grad(Loss(), None, params)
    Path("/proc/self/clear_refs").write_text("5")
    first_before = _status_kib("VmRSS")
    _, grads = step(*inputs)  # compile (GRAPH) + the memory pool's first growth
    first = (_status_kib("VmHWM") - first_before) / 1024
    del grads
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak-RSS mark (VmHWM) to the current RSS
    before = _status_kib("VmRSS")
    loss, grads = step(*inputs)
    peak = _status_kib("VmHWM")
    np.savez(grads_out, *[g.asnumpy() for g in grads])
    print(json.dumps({"step_mib": (peak - before) / 1024, "first_mib": first, "loss": float(loss)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    parser.add_argument("--child", nargs=3, metavar=("FOLDER", "RECOMPUTE", "GRADS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1] == "on", args.mode, args.child[2])
        return
    import numpy as np

    sys.path.insert(0, str(REPO / "tests"))
    from tiny_qwen import make_tiny_qwen2

    with tempfile.TemporaryDirectory() as tmp:
        folder = make_tiny_qwen2(Path(tmp) / "model", layers=8, heads=4, kv_heads=2, head_dim=32,
                                 intermediate=512, vocab=1024)
        results, grads = {}, {}
        for setting in ("off", "on"):
            out = Path(tmp) / f"grads_{setting}.npz"
            run = subprocess.run([sys.executable, __file__, "--mode", args.mode, "--child", str(folder), setting,
                                  str(out)], capture_output=True, text=True, check=True, cwd=REPO)
            results[setting] = json.loads(run.stdout.strip().splitlines()[-1])
            with np.load(out) as data:
                grads[setting] = [data[k] for k in data.files]
    scale = max(np.abs(g).max() for g in grads["off"])
    error = max(np.abs(a - b).max() for a, b in zip(grads["on"], grads["off"])) / scale
    off, on = results["off"]["step_mib"], results["on"]["step_mib"]
    print(f"{args.mode}: {NG} prompts x {P} tokens, {G} completions x {T} tokens, 8 layers")
    print(f"step memory (peak RSS - RSS before): recompute off {off:.0f} MiB, on {on:.0f} MiB, "
          f"on/off {on / off:.2f}")
    first_off, first_on = results["off"]["first_mib"], results["on"]["first_mib"]
    print(f"first step (with compilation in GRAPH): off {first_off:.0f} MiB, on {first_on:.0f} MiB, "
          f"on/off {first_on / first_off:.2f}")
    print(f"gradients: max |on - off| / max |off| = {error:.1e}; loss off {results['off']['loss']:.6f}, "
          f"on {results['on']['loss']:.6f}")


if __name__ == "__main__":
    main()
