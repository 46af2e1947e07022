#!/usr/bin/env python
"""Measure what compiling each decoder layer once (``qwen2_blocks.reused_layer``) saves at a real model's depth.

Workload: a random model with Qwen2.5-7B's depth, heads and untied vocabulary (``tests/tiny_qwen.make_tiny_qwen2``:
28 layers, 28/4 heads, 152,064 tokens; hidden 4 per head, intermediate 32, so compiling is nearly all the time)
and one micro-batch of 2 prompts x 16 tokens with 4 completions x 8 tokens. GRAPH mode, each setting in its own
process (a compiled graph keeps its memory, and MindSpore caches graphs per process):

* ``reused``: the shipped :class:`~mindgrpo.models.SharedPromptForward`, its layers compiled once
  (``lazy_inline``);
* ``inlined``: the same Cells with the undecorated ``__init__``: every layer parsed and compiled on its own.
  (Before ``reused_layer``, each layer Cell also indexed the whole weight tuple, which compiled slower still.)

For each: the first call of the forward (compile + run), a second call (run), the first call of ``value_and_grad``
of the summed log-probs (compile + run) and a second; and the largest difference of the loss and the gradients
between the settings (they must agree to rounding).

    python tools/bench_compile.py [--layers 28] [--heads 28] [--kv-heads 4]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
G = 4


def child(folder: str, setting: str, grads_out: str) -> None:
    import numpy as np

    import mindgrpo  # noqa: F401  (configures the environment before MindSpore is used)
    import mindspore as ms
    from mindspore import ParameterTuple, Tensor, nn

    from mindgrpo.algorithm import token_logprobs
    from mindgrpo.models import SharedPromptForward, build_model
    from mindgrpo.models.shared_prompt import SharedPromptLayer

    if setting == "inlined":
        SharedPromptLayer.__init__ = SharedPromptLayer.__init__.__wrapped__
    ms.set_context(mode=ms.GRAPH_MODE)
    model = build_model(folder)
    forward = SharedPromptForward(model, G, 32)

    class Loss(nn.Cell):
        def __init__(self):
            super().__init__(auto_prefix=False)
            self.forward = forward

        def construct(self, prompt_ids, prompt_mask, completion_ids):
            return token_logprobs(self.forward(prompt_ids, prompt_mask, completion_ids), completion_ids).sum()

    rng = np.random.default_rng(0)
    inputs = (Tensor(rng.integers(0, 1000, (2, 16)).astype(np.int32)), Tensor(np.ones((2, 16), np.int32)),
              Tensor(rng.integers(0, 1000, (2 * G, 8)).astype(np.int32)))
    step = ms.jit(ms.value_and_grad(Loss(), None, ParameterTuple(model.trainable_params())))
    times = {}
    for name, call in (("forward", lambda: forward(*inputs)), ("grad", lambda: step(*inputs))):
        for attempt in ("first", "second"):
            start = time.perf_counter()
            out = call()
            times[f"{name}_{attempt}"] = time.perf_counter() - start
    loss, grads = out
    np.savez(grads_out, *[g.asnumpy() for g in grads])
    print(json.dumps({**times, "loss": float(loss)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--heads", type=int, default=28)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--child", nargs=3, metavar=("FOLDER", "SETTING", "GRADS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    import numpy as np

    sys.path.insert(0, str(REPO / "tests"))
    from tiny_qwen import make_tiny_qwen2

    from benchlib import cpu_model

    with tempfile.TemporaryDirectory() as tmp:
        folder = make_tiny_qwen2(Path(tmp) / "model", layers=args.layers, heads=args.heads, kv_heads=args.kv_heads,
                                 head_dim=4, intermediate=32, vocab=152_064, tied=False)
        results, grads = {}, {}
        for setting in ("inlined", "reused"):
            out = Path(tmp) / f"grads_{setting}.npz"
            run = subprocess.run([sys.executable, __file__, "--child", str(folder), setting, str(out)],
                                 capture_output=True, text=True, check=True, cwd=REPO)
            results[setting] = json.loads(run.stdout.strip().splitlines()[-1])
            with np.load(out) as data:
                grads[setting] = [data[k] for k in data.files]
    scale = max(np.abs(g).max() for g in grads["inlined"])
    error = max(np.abs(a - b).max() for a, b in zip(grads["reused"], grads["inlined"])) / scale
    print(f"CPU: {cpu_model()}; {args.layers} layers, {args.heads}/{args.kv_heads} "
          f"heads, vocabulary 152,064; 2 prompts x 16 tokens, {G} completions x 8 tokens; GRAPH")
    print("| setting | forward: first call | second | forward + backward: first call | second |")
    print("|---|---|---|---|---|")
    for setting, r in results.items():
        print(f"| {setting} | {r['forward_first']:.1f} s | {r['forward_second']:.3f} s | {r['grad_first']:.1f} s | "
              f"{r['grad_second']:.3f} s |")
    inlined, reused = results["inlined"], results["reused"]
    print(f"compile ratio inlined / reused: forward {inlined['forward_first'] / reused['forward_first']:.1f}x, "
          f"forward + backward {inlined['grad_first'] / reused['grad_first']:.1f}x")
    print(f"loss inlined {inlined['loss']:.6f}, reused {reused['loss']:.6f}; gradients: max |reused - inlined| / "
          f"max |inlined| = {error:.1e}")


if __name__ == "__main__":
    main()
