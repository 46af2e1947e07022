#!/usr/bin/env python
"""GRPO at a real Qwen2.5's exact shape on this machine: mindgrpo in float32 and with bf16 weights, beside TRL.

The model is a random-weight folder at Qwen2.5-0.5B's exact config (24 layers, hidden 896, 14 heads, 2 KV heads,
intermediate 4,864, a tied 151,936-row vocabulary, rope theta 1e6; 494 M parameters), written once with the
benchmark tokenizer of tools/benchlib.py (a Qwen2-format BPE trained on the GSM8K prompts: its ids are the first
4,096 of the 151,936 rows) and cached. Each run is its own process and takes the settings of tools/bench_grpo.py
except these: `--prompts-per-step` prompts (2) x 8 completions x `--max-new-tokens` (128), `--steps` steps (3), the
first `--warmup` (1) excluded. A random model at this vocabulary samples EOS with a chance of about 1 in 150,000 a
token: every completion runs to the limit in both frameworks (the `lengths` of each JSON line show it).

Each mindgrpo run is the user's path: its config written as a yaml and trained by `examples/grpo/main.py` in its
own process (tools/user_path.py), timed from outside, its peak RSS its own; the first step (which compiles) is the
warm-up. So the figures are what a user's run holds, never a benchmark worker's.

    mindgrpo float32     actor_config.param_dtype float32 (weights, gradients and AdamW state float32)
    mindgrpo bfloat16    actor_config.param_dtype bfloat16: bf16 weights, fp32 gradients (bf16 gradient buffers
                         are Ascend-only) and fp32 master weights and moments in the optimizer; on CPU the
                         matmuls run in float32 from the bf16 weights
    TRL                  tools/trl_peer.py in TRL's interpreter (`--vs-trl`), float32

The runs alternate (`--repeats` rounds). The last lines are a table, one row per run kind: tokens/s, seconds per
step, peak RSS, what `mindgrpo plan --device cpu` predicts for the same config (it must be within 25 % of the
measured peak), and the targets (mindgrpo float32 at least 1.5x TRL's tokens/s with a peak RSS no higher than TRL's;
bf16 peak RSS at most 0.7x mindgrpo float32's). `--capacity` adds one mindgrpo float32 run at 4 prompts x 8 x 128,
which must finish on a 24 GiB machine; TRL was killed there by the OOM killer (peak 24.9 GB), so it runs that
setting only with `--capacity-trl`.

    python tools/bench_real_shapes.py --vs-trl trlenv/bin/python [--repeats 1] [--capacity]

Qwen2.5-1.5B (`--sizes 1.5b`) is in the table of shapes for larger machines: in float32 its weights, gradients and
AdamW moments alone take 24.7 GB.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List

from bench_grpo import bench_config, check_inputs, convert_prompts, peer_prompts, run_process, summary
from benchlib import ASSETS_CACHE, bench_assets, cpu_model, write_model, write_model_sharded
from user_path import run_user_path

# Qwen2.5's published configs (config.json of Qwen/Qwen2.5-0.5B and Qwen/Qwen2.5-1.5B)
QWEN2_5 = {
    "0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 intermediate_size=4864, vocab_size=151936, max_position_embeddings=32768),
    "1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                 intermediate_size=8960, vocab_size=151936, max_position_embeddings=32768),
    "3b": dict(hidden_size=2048, num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
               intermediate_size=11008, vocab_size=151936, max_position_embeddings=32768),
    "7b": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
               intermediate_size=18944, vocab_size=152064, max_position_embeddings=32768),
}
# Written in bf16, one shard per layer (tools/benchlib.write_model_sharded): too large to draw whole in float32 here.
# Qwen2.5-3B ties its embeddings, Qwen2.5-7B does not.
SHARDED_BF16 = {"3b": True, "7b": False}  # size -> tie_word_embeddings
TOKENS_TARGET, RSS_TARGET, BF16_RSS_TARGET, LORA_RSS_TARGET = 1.5, 1.0, 0.7, 0.5
PLANNER_TOLERANCE = 0.25  # the planner's prediction within 25 % of the measured peak RSS


def real_model(size: str, cache: Path) -> Path:
    """The random-weight folder at Qwen2.5-`size`'s shape with the benchmark tokenizer, written once (staged, then
    renamed) under `cache`."""
    assets = bench_assets(cache)
    out = Path(cache) / f"{assets.root.name}-qwen2.5-{size}"
    if (out / "config.json").exists():
        return out
    ids = json.loads((assets.root / "assets.json").read_text())["special_ids"]
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=cache))
    try:
        if size in SHARDED_BF16:
            write_model_sharded(staging, QWEN2_5[size], tied=SHARDED_BF16[size], pad=ids["<|endoftext|>"],
                                eos=ids["<|im_end|>"])
        else:
            write_model(staging, QWEN2_5[size], pad=ids["<|endoftext|>"], eos=ids["<|im_end|>"])
        for item in assets.tokenizer_dir.iterdir():
            shutil.copyfile(item, staging / item.name)
        staging.chmod(0o755)
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def commands(size: str, model: Path, work: Path, args: argparse.Namespace, prompts_per_step: int) -> Dict[str, object]:
    """What to run for each run kind at this batch: mindgrpo's as a config for the user's path
    (`examples/grpo/main.py`, tools/user_path.py), TRL's as the process to start."""
    from mindgrpo.config import dump_yaml

    assets = bench_assets(Path(args.model_cache))
    common = ["--steps", str(args.steps), "--warmup", str(args.warmup), "--prompts-per-step", str(prompts_per_step)]
    threads = ["--threads", str(args.threads)] if args.threads else []
    dataset = convert_prompts(assets.prompts, model, work / f"prompts_{model.name}.mindrecord")
    runs: Dict[str, object] = {}
    for dtype in args.dtypes:
        for rank in args.lora_ranks:
            name = run_name(dtype, rank)
            slug = name.replace(" ", "_")
            config = bench_config(model, dataset, work / slug, args.steps, True, args.micro_batch,
                                  new_tokens=args.max_new_tokens, packed_rows=args.packed_rows,
                                  prompts=prompts_per_step, param_dtype=dtype, generations=args.generations,
                                  lora_rank=rank, recompute=args.recompute)
            dump_yaml(config, work / f"{slug}.yaml")
            runs[name] = UserPathRun(work / f"{slug}.yaml", work / slug, prompts_per_step * args.generations,
                                     config)
    if args.vs_trl:
        runs["TRL float32"] = [
            args.vs_trl, str(Path(__file__).with_name("trl_peer.py")), "--model", str(model),
            "--prompts", str(peer_prompts(assets.prompts, work / f"peer_{assets.root.name}.jsonl")),
            "--max-completion-length", str(args.max_new_tokens), *common, *threads]
    return runs


def run_name(dtype: str, lora_rank: int) -> str:
    return f"mindgrpo {dtype}" + (f" LoRA r{lora_rank}" if lora_rank else "")


@dataclass(frozen=True)
class UserPathRun:
    """A mindgrpo run kind: its config, written as a user's yaml, run by `examples/grpo/main.py`."""
    config_file: Path
    output_dir: Path
    completions: int
    config: object

    def run(self, warmup: int) -> Dict:
        from mindgrpo.apps.plan import plan_layouts
        from mindgrpo.hf_config import read_hf_config

        shutil.rmtree(self.output_dir, ignore_errors=True)
        result = run_user_path(self.config_file, [], self.output_dir, self.output_dir.with_suffix(".log"),
                               completions=self.completions, warmup=warmup)
        result.pop("metrics")  # the table's figures are the medians beside it
        layout = plan_layouts(self.config, 1, 1 << 50, read_hf_config(self.config.actor_config.load),
                              device="cpu")["layouts"][0]
        return {**result, "framework": "mindgrpo", "planned_rss_mib": round(layout["bytes"]["total"] / 2 ** 20),
                "cpu": cpu_model()}


def run_rounds(runs: Dict[str, object], repeats: int, log, warmup: int = 1) -> Dict[str, List[Dict]]:
    """Every run kind `repeats` times, the order rotating each round; a failed run is reported and left out."""
    results: Dict[str, List[Dict]] = {name: [] for name in runs}
    names = list(runs)
    for turn in range(repeats):
        for name in names[turn % len(names):] + names[:turn % len(names)]:
            try:
                run = runs[name]
                result = run.run(warmup) if isinstance(run, UserPathRun) else run_process(run, name)
            except RuntimeError as err:
                log(json.dumps({"run": name, "failed": str(err)[-2000:]}))
                continue
            result["run"] = name
            results[name].append(result)
            log(json.dumps(result))
    return results


def table(size: str, prompts_per_step: int, results: Dict[str, List[Dict]], new_tokens: int,
          generations: int = 8) -> List[str]:
    """Markdown rows: one per run kind (the median of its runs), with its ratios and targets."""
    med = {name: summary(runs) for name, runs in results.items() if runs}
    fp32, trl = med.get("mindgrpo float32"), med.get("TRL float32")
    lines = [f"Qwen2.5-{size} shape, {prompts_per_step} prompts x {generations} x {new_tokens} new tokens "
             f"({cpu_model()})",
             "| run | tokens/s | s/step | peak RSS GiB | planner GiB | vs TRL tokens/s | vs TRL RSS | target |",
             "|---|---|---|---|---|---|---|---|"]
    for name in results:
        row = med.get(name)
        if row is None:
            lines.append(f"| {name} | failed | | | | | | |")
            continue
        rss = row["peak_rss_mib"] / 1024
        speed = f"{row['tokens_per_sec'] / trl['tokens_per_sec']:.2f}x" if trl and name != "TRL float32" else ""
        mem = f"{row['peak_rss_mib'] / trl['peak_rss_mib']:.2f}x" if trl and name != "TRL float32" else ""
        target, planned = "", ""
        if "planned_rss_mib" in row:  # mindgrpo's runs: `mindgrpo plan --device cpu`'s figure for the same config
            error = row["planned_rss_mib"] / row["peak_rss_mib"] - 1
            planned = (f"{row['planned_rss_mib'] / 1024:.2f} ({error:+.0%}: "
                       f"{'within' if abs(error) <= PLANNER_TOLERANCE else 'NOT within'} {PLANNER_TOLERANCE:.0%})")
        if name == "mindgrpo float32" and trl:
            met = (row["tokens_per_sec"] >= TOKENS_TARGET * trl["tokens_per_sec"]
                   and row["peak_rss_mib"] <= RSS_TARGET * trl["peak_rss_mib"])
            target = f"≥ {TOKENS_TARGET}x tokens/s, ≤ {RSS_TARGET}x RSS: {'met' if met else 'NOT met'}"
        if size == "7b" and "LoRA" in name:  # the headline model's exact shape on a 24 GiB machine
            target = f"one step within 24 GiB: {'met' if rss <= 24 else 'NOT met'}"
        if name.startswith("mindgrpo float32 LoRA") and fp32:
            ratio = row["peak_rss_mib"] / fp32["peak_rss_mib"]
            target = (f"RSS {ratio:.2f}x full float32's, ≤ {LORA_RSS_TARGET}x: "
                      f"{'met' if ratio <= LORA_RSS_TARGET else 'NOT met'}")
        if name == "mindgrpo bfloat16" and fp32:
            ratio = row["peak_rss_mib"] / fp32["peak_rss_mib"]
            target = (f"RSS {ratio:.2f}x float32's, ≤ {BF16_RSS_TARGET}x: "
                      f"{'met' if ratio <= BF16_RSS_TARGET else 'NOT met'}")
        lines.append(f"| {name} | {row['tokens_per_sec']:.1f} | {row['sec_per_step']:.1f} | {rss:.2f} | {planned} | "
                     f"{speed} | {mem} | {target} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["0.5b"], choices=sorted(QWEN2_5))
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"],
                        help="mindgrpo's actor_config.param_dtype runs")
    parser.add_argument("--lora-ranks", nargs="+", type=int, default=[0],
                        help="mindgrpo runs per dtype: full-parameter (0) and/or LoRA of these ranks (alpha 2 x rank)")
    parser.add_argument("--prompts-per-step", type=int, default=2)
    parser.add_argument("--generations", type=int, default=8, help="completions per prompt")
    parser.add_argument("--micro-batch", type=int, default=16, help="mindgrpo's actor_config.micro_batch_size")
    parser.add_argument("--recompute", action="store_true", help="mindgrpo's actor_config.recompute")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1, help="leading steps excluded from the statistics")
    parser.add_argument("--repeats", type=int, default=1, help="rounds of every run kind")
    parser.add_argument("--capacity", action="store_true",
                        help="also run mindgrpo float32 once at 4 prompts per step")
    parser.add_argument("--capacity-trl", action="store_true",
                        help="with --capacity, TRL too (on 24 GiB the OOM killer ends it)")
    parser.add_argument("--packed-rows", type=int, default=4,
                        help="mindgrpo's packed training and scoring forwards: rows of --max-new-tokens each "
                             "(default 4: 512 tokens, whose float32 logits at this vocabulary are 311 MB a copy, and "
                             "a compiled CPU graph keeps every copy it makes)")
    parser.add_argument("--vs-trl", metavar="PYTHON", help="TRL's interpreter (bash tools/make_trl_venv.sh trlenv)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for both frameworks")
    parser.add_argument("--model-cache", default=str(ASSETS_CACHE), help="where the model folder is cached")
    parser.add_argument("--out", help="also write the JSON lines and the table to this file")
    args = parser.parse_args()
    if args.warmup >= args.steps:
        parser.error(f"--warmup {args.warmup} must be below --steps {args.steps}: no step would be counted")
    if not check_inputs(args.vs_trl):
        return 2
    out = open(args.out, "w", encoding="utf-8") if args.out else None

    def log(line: str) -> None:
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    failed = False
    with tempfile.TemporaryDirectory(prefix="bench_real_") as tmp:
        for size in args.sizes:
            model = real_model(size, Path(args.model_cache))
            settings = [(args.prompts_per_step, args.repeats)] + ([(4, 1)] if args.capacity else [])
            for prompts, repeats in settings:
                runs = commands(size, model, Path(tmp), args, prompts)
                if prompts != args.prompts_per_step:  # the capacity run: float32 only
                    runs = {k: v for k, v in runs.items()
                            if k == "mindgrpo float32" or (k == "TRL float32" and args.capacity_trl)}
                results = run_rounds(runs, repeats, log, args.warmup)
                failed |= not all(results[k] for k in results if k.startswith("mindgrpo"))
                for line in table(size, prompts, results, args.max_new_tokens, args.generations):
                    log(line)
    if out:
        out.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
