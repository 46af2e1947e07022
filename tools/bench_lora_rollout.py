#!/usr/bin/env python
"""LoRA rollouts two ways: the adapters applied unmerged (what mindgrpo does) against merged into a rollout buffer.

The native rollout engine can decode a LoRA actor in two ways. **Unmerged**: every adapted product is ``W x + s B (A
x)``, read straight from the actor's Parameters, so the rollout needs no sync and no extra memory. **Merged**: after
each update, ``W + s B A`` is written into a buffer in the backbone's dtype and the engine decodes a plain model, so
each adapted product is one matmul again.

The cost of the merged variant is measured here, not guessed. Its decode runs an engine over the weights alone, without
the adapters' products, whose targeted weights hold ``W + s B A``: the graphs the merged variant would run (with the
actor's embedding and head tables, which a frozen bf16 LoRA backbone keeps in float32 on CPU). Its sync is the merge itself
(per targeted weight, ``B @ A`` in float32, added to ``W``, cast to the backbone's dtype and written into the
buffer), timed with MindSpore ops. Its memory is the buffer: every targeted weight once more in the backbone's dtype
(the actor keeps ``W``, which the reference policy and the training forward read). Its accuracy is the gap between
the two engines' log-probs of the same tokens (sampled by the unmerged engine; both engines score them with
``forced_logits``).

The adapters are those of a trained run, not PEFT's initial B = 0 (with which both ways are the backbone):
A as PEFT draws it, and B ~ N(0, ``--b-std``) (2e-3: AdamW moves an element by about its learning rate per step, so
this is ~200 steps at 1e-5).

Each dtype runs in its own process; the variants' rollouts alternate in it, and the best of ``--repeats`` is kept.
Model: a random-weight folder at Qwen2.5-0.5B's exact shape (tools/bench_real_shapes.py), or ``small``
(tools/benchlib.py). The extra memory is also printed for Qwen2.5-7B's shape (arithmetic on its config).

    python tools/bench_lora_rollout.py [--size 0.5b] [--dtypes float32 bfloat16] [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import numpy as np

from mindgrpo.choices import LORA_TARGET_MODULES
from mindgrpo.hf_config import qwen2_spec, weight_shapes

from bench_real_shapes import QWEN2_5, real_model
from benchlib import ASSETS_CACHE, SIZES, cpu_model, peak_rss_mib, write_model

RANK, ALPHA = 16, 32


def model_folder(size: str) -> Path:
    if size in QWEN2_5:
        return real_model(size, ASSETS_CACHE)
    folder = ASSETS_CACHE / f"lora-rollout-{size}"
    if not (folder / "config.json").exists():
        write_model(folder, SIZES[size])
    return folder


def targeted_cells(model) -> List:
    """The adapted weight Cells of a Qwen2Model, layer by layer."""
    cells = []
    for layer in model.model.layers:
        cells += [getattr(layer.attention, f) for f in ("wq", "wk", "wv", "wo")]
        cells += [getattr(layer.feed_forward, f) for f in ("w1", "w2", "w3")]
    return cells


def buffer_bytes(hf_config: Dict, itemsize: int) -> int:
    """Bytes of the merged buffer: every targeted weight of a Qwen2.5 config once, at ``itemsize`` (the shapes are
    the model's and the planner's, from config.json alone)."""
    targets = tuple(f".{module}.weight" for module in LORA_TARGET_MODULES)
    return itemsize * sum(math.prod(shape) for name, shape in weight_shapes(qwen2_spec(hf_config)).items()
                          if name.endswith(targets))


def child(args) -> dict:
    import mindgrpo  # noqa: F401  (configures MindSpore's logging first)
    import mindspore as ms
    from mindspore import Tensor, ops

    from mindgrpo.models import build_model
    from mindgrpo.models.lora import LoraSpec
    from mindgrpo.rollout.api import SamplingParams
    from mindgrpo.rollout.backends.native import NativeRolloutEngine

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    folder = model_folder(args.size)
    hf = json.loads((folder / "config.json").read_text())
    eos, pad = hf["eos_token_id"], hf.get("pad_token_id", hf["eos_token_id"])
    actor = build_model(folder, param_dtype=args.dtype, lora=LoraSpec(RANK, ALPHA))
    rng = np.random.default_rng(0)
    for cell in targeted_cells(actor):
        cell.lora_b.set_data(Tensor(rng.normal(0.0, args.b_std, cell.lora_b.shape).astype(np.float32)))
    rss_before_buffer = peak_rss_mib()
    # The merged model is built as a LoRA model too, so its embedding and head tables are what the actor's are (a
    # frozen bf16 LoRA backbone keeps them float32 on CPU); its engine reads it without adapters (below).
    merged = build_model(folder, role="inference", compute_dtype="float32", param_dtype=args.dtype,
                         lora=LoraSpec(RANK, ALPHA))
    pairs = list(zip(targeted_cells(actor), targeted_cells(merged)))
    scale = actor.lora.scale

    def merge() -> None:
        # the merged variant's sync: W + s B A in float32, cast to the backbone's dtype, into the buffer
        for source, target in pairs:
            update = ops.matmul(source.lora_b, source.lora_a) * scale
            target.weight.set_data(ops.cast(ops.cast(source.weight, ms.float32) + update, source.weight.dtype))

    merge()  # the buffer as of now; the timed merges below rewrite it with the same values
    rss_buffer = peak_rss_mib() - rss_before_buffer  # the second model (its embedding too) and the merge
    kwargs = dict(eos_token_id=eos, pad_token_id=pad, max_prompt_length=args.prompt_length,
                  max_batch_size=args.prompts * args.generations)
    engines = {"unmerged": NativeRolloutEngine(actor, **kwargs), "merged": NativeRolloutEngine(merged, **kwargs)}
    # the merged variant's graphs: the backbone's products alone, over W + s B A (buckets are built on first use)
    engines["merged"].weights = merged.decoder_weights(adapters=False)
    engines["merged"].spec = engines["merged"].weights.spec
    prompts = rng.integers(0, min(4000, hf["vocab_size"]), (args.prompts, args.prompt_length)).tolist()
    params = SamplingParams(max_tokens=args.new_tokens, min_tokens=args.new_tokens, temperature=1.0,
                            num_generations=args.generations, seed=0)
    first, times, merges = {}, {name: [] for name in engines}, []
    for name, engine in engines.items():  # compiles
        start = time.perf_counter()
        result = engine.generate(prompts, params)
        first[name] = time.perf_counter() - start
    for _ in range(args.repeats):
        for name, engine in engines.items():
            start = time.perf_counter()
            result = engine.generate(prompts, params)
            times[name].append(time.perf_counter() - start)
        start = time.perf_counter()
        merge()
        merges.append(time.perf_counter() - start)
    # the same tokens scored by both engines
    rows = [p for p in prompts for _ in range(args.generations)]
    completions = [list(map(int, ids)) for ids in result.completion_ids]
    logp = {}
    for name, engine in engines.items():
        scored = []
        for logits, tokens in zip(engine.forced_logits(rows, completions), completions):
            shifted = logits[:-1] - logits[:-1].max(-1, keepdims=True)
            log_softmax = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
            scored.append(log_softmax[np.arange(len(tokens)), tokens])
        logp[name] = np.concatenate(scored)
    gap = np.abs(logp["merged"] - logp["unmerged"])
    delta = [float(np.linalg.norm(ops.matmul(s.lora_b, s.lora_a).asnumpy() * scale)
                   / np.linalg.norm(ops.cast(s.weight, ms.float32).asnumpy())) for s, _ in pairs[:7]]
    tokens = args.prompts * args.generations * args.new_tokens
    itemsize = 2 if args.dtype == "bfloat16" else 4
    return {"size": args.size, "dtype": args.dtype, "fused_decode": engines["unmerged"].fused_decode,
            "tokens": tokens,
            "first_s": {k: round(v, 2) for k, v in first.items()},
            "rollout_s": {k: round(min(v), 3) for k, v in times.items()},
            "tokens_per_s": {k: round(tokens / min(v), 1) for k, v in times.items()},
            "merge_s": round(min(merges), 3),
            "buffer_gib": round(buffer_bytes(hf, itemsize) / 2 ** 30, 3),
            "rss_second_model_gib": round(rss_buffer / 1024, 2), "peak_rss_gib": round(peak_rss_mib() / 1024, 2),
            "logprob_gap_max": float(gap.max()), "logprob_gap_mean": float(gap.mean()),
            "update_rel_norm_layer0": round(float(np.mean(delta)), 5)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--size", default="0.5b", choices=[*QWEN2_5, *SIZES])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    parser.add_argument("--dtype", help=argparse.SUPPRESS)  # a child process's own
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--prompt-length", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--b-std", type=float, default=2e-3)
    args = parser.parse_args()
    if args.dtype:
        print(json.dumps(child(args)))
        return 0
    print(f"# {cpu_model()}; Qwen2.5-{args.size} shape, LoRA rank {RANK} alpha {ALPHA} on every decoder linear; "
          f"{args.prompts} prompts x {args.generations} x {args.new_tokens} new tokens", flush=True)
    rows = []
    for dtype in args.dtypes:
        command = [sys.executable, __file__, *sys.argv[1:], "--dtype", dtype]
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        row = json.loads(out.strip().splitlines()[-1])
        print(json.dumps(row), flush=True)
        rows.append(row)
    print(f"\n{'backbone':<10}{'unmerged tok/s':>16}{'merged tok/s':>14}{'merged/unmerged':>17}{'merge s':>9}"
          f"{'buffer GiB':>12}{'logprob gap max':>17}")
    for row in rows:
        tps = row["tokens_per_s"]
        print(f"{row['dtype']:<10}{tps['unmerged']:>16}{tps['merged']:>14}{tps['merged'] / tps['unmerged']:>16.2f}x"
              f"{row['merge_s']:>9}{row['buffer_gib']:>12}{row['logprob_gap_max']:>17.2e}")
    seven = QWEN2_5["7b"]
    print(f"\nQwen2.5-7B's merged buffer: {buffer_bytes(seven, 2) / 2 ** 30:.1f} GiB in bf16 "
          f"({buffer_bytes(seven, 4) / 2 ** 30:.1f} GiB in float32)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
