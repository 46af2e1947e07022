#!/usr/bin/env python
"""Benchmark `convert_dataset` on GSM8K-format rows with the benchmarks' tokenizer (`benchlib.bench_assets`).

Prints rows/s and seconds for the full conversion (read, render, tokenise, write MindRecord, verify, publish),
next to two baselines timed in the same run on the same rows: JSON parsing alone and tokenisation alone (the
rendered prompts through `Tokenizer.encode_batch`). The ratios say what the MindRecord plumbing costs on top of
the unavoidable work, independent of how fast this machine is today. Target: GSM8K's 7,473 train rows in under
10 s. The rows default to the benchmarks' prompts: GSM8K's train split when `$MINDGRPO_GSM8K` names its train.jsonl,
else the demo's 2,000 one-digit problems.

    python tools/bench_data.py [--data gsm8k/train.jsonl] [--tokenizer TOKENIZER_DIR]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from benchlib import bench_assets  # first: it puts this checkout's mindgrpo on the path
import mindgrpo  # noqa: F401,E402  (before MindSpore: keeps its logs out of the way)
from mindgrpo.data import PromptDataset, convert_dataset, read_gsm8k, render_prompt
from mindgrpo.data.tokenizer import load_tokenizer

TARGET_SECONDS = 10.0


def best_of(repeats: int, fn: Callable[[], object]) -> float:
    """Fastest of `repeats` runs: the least disturbed by other processes on a shared machine."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="GSM8K-format jsonl (default: the benchmarks' prompts)")
    parser.add_argument("--tokenizer", help="tokenizer folder (default: the benchmarks' tokenizer)")
    parser.add_argument("--template", default="gsm8k_hash")
    parser.add_argument("--max_prompt_length", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if not (args.data and args.tokenizer):
        assets = bench_assets()
        args.data, args.tokenizer = args.data or str(assets.prompts), args.tokenizer or str(assets.tokenizer_dir)
    for path in (args.data, args.tokenizer):
        if not Path(path).exists():
            print(f"error: {path} not found; pass --data/--tokenizer", file=sys.stderr)
            return 1

    import mindspore.mindrecord  # noqa: F401  (import once, outside the timings: it is a one-off cost)

    tokenizer = load_tokenizer(args.tokenizer)
    lines = Path(args.data).read_text(encoding="utf-8").splitlines()
    prompts = [render_prompt(args.template, r.question) for r in read_gsm8k(args.data)]
    rows = len(lines)

    parse_s = best_of(args.repeats, lambda: [json.loads(line) for line in lines])
    tokenize_s = best_of(args.repeats, lambda: tokenizer.encode_batch(prompts))
    with tempfile.TemporaryDirectory(prefix="mindgrpo-bench-") as tmp:
        runs, summary = [], None
        for i in range(args.repeats):
            start = time.perf_counter()
            summary = convert_dataset(args.data, Path(tmp) / f"run{i}.mindrecord", tokenizer, dataset_type="gsm8k",
                                      prompt_template=args.template, max_prompt_length=args.max_prompt_length,
                                      progress=False)
            runs.append(time.perf_counter() - start)
        load_s = best_of(args.repeats, lambda: PromptDataset(Path(tmp) / "run0.mindrecord"))
    convert_s = min(runs)

    print(f"rows: {rows} ({summary.rows_written} written, {summary.rows_skipped} skipped), best of {args.repeats}")
    print(f"json parse only   {parse_s:7.3f} s  {rows / parse_s:10.0f} rows/s")
    print(f"tokenise only     {tokenize_s:7.3f} s  {rows / tokenize_s:10.0f} rows/s")
    print(f"convert_dataset   {convert_s:7.3f} s  {rows / convert_s:10.0f} rows/s  "
          f"(median {statistics.median(runs):.3f} s)")
    print(f"PromptDataset     {load_s:7.3f} s  {rows / load_s:10.0f} rows/s  (read back)")
    print(f"convert / tokenise = {convert_s / tokenize_s:.2f}x, convert / json parse = {convert_s / parse_s:.1f}x")
    verdict = "PASS" if convert_s < TARGET_SECONDS else "FAIL"
    print(f"target: {rows} rows in < {TARGET_SECONDS:.0f} s: {verdict} ({convert_s:.2f} s)")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
