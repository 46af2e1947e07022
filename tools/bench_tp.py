#!/usr/bin/env python
"""Parallel layouts compared: tokens/s and per-rank peak RSS of TP=1, TP=2 and DP=2 on the `small` model, and the
memory planner (`mindgrpo/apps/plan.py`) checked against the measured per-rank memory of each.

Every layout trains the same global batch with bench_grpo.py's settings (4 GSM8K prompts x 8 completions per step,
64 new tokens, beta 0.04, fp32, GRAPH mode, micro-batches of 16 completions), except that, so the planner's shapes
are the run's shapes, every completion runs to its full 64 tokens (`min_tokens = max_tokens`) and every prompt is
padded to one width (`prompt_bucket = max_prompt_length = 256`):

    tp1   one process                                        model_parallel 1
    tp2   msrun, 2 workers: one tensor-parallel group        model_parallel 2 (each rank: half the model)
    dp2   msrun, 2 workers: 2 prompts per rank and step      data_parallel 2, optimizer_shard true (ZeRO-1)

Each run compiles its graphs (`GRPOTrainer.precompile`), then runs `--steps` steps; the first `--warmup` are not
counted. The `--threads` CPU threads are split evenly over a run's processes. It prints one JSON line per layout:

    tokens_per_sec   median over counted steps of the global batch's real tokens (prompts counted once per
                     completion, as bench_grpo counts them) / the step time of the slowest rank
    peak_rss_mib     per rank, peak resident memory of the process (and peak_rss_mib_max, the largest)
    plan             per rank, the planner against measured memory:
                       state:  model_state_bytes(...)["total"]  vs  RSS growth while `ModelWorker(...)` is built
                               (actor, reference, rollout engine, gradient accumulators, AdamW moments; the
                               last two written once first, as the first update would)
                       peak:   layout_bytes(..., device="cpu")["total"]  vs  peak RSS after the first step -
                               RSS before `ModelWorker(...)` (precompiled graphs included; the planner's cpu runtime
                               part and its rule that each graph keeps its own memory, see mindgrpo/apps/plan.py)
                     error = |predicted - measured| / measured, which must be <= 0.25 (`ok`)

and last one comparison line with every layout's tokens/s and largest per-rank peak RSS as ratios to TP=1's.
The RSS before and after `ModelWorker(...)` is read from outside the trainer: the worker wraps
`mindgrpo.train.model_worker.ModelWorker`, which `GRPOTrainer.__init__` builds after its imports and the
communication set-up.

    python tools/bench_tp.py [--layouts tp1 tp2 dp2] [--steps 4] [--warmup 1] [--threads 2]
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

from bench_grpo import GENERATIONS, MAX_PROMPT_LENGTH, NEW_TOKENS, PROMPTS, bench_config, convert_prompts
from benchlib import REPO, bench_assets

LAYOUTS = {"tp1": dict(data_parallel=1, model_parallel=1), "tp2": dict(data_parallel=1, model_parallel=2),
           "dp2": dict(data_parallel=2, model_parallel=1)}
PLAN_TOLERANCE = 0.25
# each rank's memory timeline (bytes), printed in MiB
MARKS = ("rss0", "rss1_untouched", "rss1", "rss_built", "peak_after_precompile", "peak_after_step1")


# ----------------------------------------------------------------------------------------------- one rank
def layout_config(layout: str, model_dir: Path, dataset: Path, out_dir: Path, steps: int):
    """bench_grpo's config for one layout: the same global batch, split over data-parallel ranks, full-length
    completions and one prompt width (see the module docstring)."""
    from mindgrpo.config import validate

    config = bench_config(model_dir, dataset, out_dir, steps, share_prompt=True, prompt_bucket=MAX_PROMPT_LENGTH)
    dp, mp = LAYOUTS[layout]["data_parallel"], LAYOUTS[layout]["model_parallel"]
    for section in (config.actor_config, config.ref_config, config.generate_config):
        section.parallel_config.model_parallel, section.parallel_config.data_parallel = mp, dp
    config.actor_config.parallel_config.optimizer_shard = True
    per_rank = PROMPTS // dp * GENERATIONS  # completions of one data-parallel rank per step
    config.rl_config.batch_size = PROMPTS // dp
    config.ref_config.ref_model_batch_size = config.generate_config.infer_model_batch_size = per_rank
    config.actor_config.micro_batch_size = min(config.actor_config.micro_batch_size, per_rank)
    config.generate_config.sampling_config.min_tokens = NEW_TOKENS
    return validate(config)


def current_rss() -> int:
    """Resident bytes of this process now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def plan_check(config, hf: dict, dp: int, tp: int, rss0: int, rss1: int, peak: int) -> Dict:
    """The planner's per-rank figures for this run against the measured ones."""
    from mindgrpo.apps.plan import layout_bytes, model_state_bytes

    rl = config.rl_config
    state = model_state_bytes(hf, model_parallel=tp, data_parallel=dp,
                              optimizer_shard=config.actor_config.parallel_config.optimizer_shard,
                              reference_dtype=config.ref_config.compute_dtype if rl.beta > 0 else None)["total"]
    total = layout_bytes(config, hf, data_parallel=dp, model_parallel=tp, device="cpu")["total"]
    out = {}
    for name, predicted, measured in (("state", state, rss1 - rss0), ("peak", total, peak - rss0)):
        error = abs(predicted - measured) / measured
        out[name] = {"predicted_mib": round(predicted / 2**20, 1), "measured_mib": round(measured / 2**20, 1),
                     "error": round(error, 3), "ok": error <= PLAN_TOLERANCE}
    return out


def run_rank(args: argparse.Namespace) -> Dict:
    """Train one layout on this rank; returns its per-step figures and the plan check."""
    import mindgrpo  # noqa: F401  (quiet logging before MindSpore loads)
    import mindgrpo.train.model_worker
    import mindspore as ms
    from mindgrpo.train.trainer import GRPOTrainer

    if args.threads_per_process:
        ms.device_context.cpu.op_tuning.threads_num(args.threads_per_process)
    work = Path(args.work_dir)
    config = layout_config(args.worker, Path(args.model_dir), work / "gsm8k_train.mindrecord",
                           work / f"run_{args.worker}", args.steps)
    marks: Dict[str, int] = {}
    build_policy = mindgrpo.train.model_worker.ModelWorker

    def measured_policy(*a, **k):  # GRPOTrainer.__init__ looks ModelWorker up in its module when it builds it
        gc.collect()
        marks["rss0"] = current_rss()
        policy = build_policy(*a, **k)
        gc.collect()
        marks["rss1_untouched"] = current_rss()
        # The accumulators and AdamW moments start as zero pages that only become resident when the first update
        # writes them; write their zeros now (asnumpy() is a view of a CPU tensor) so rss1 counts them.
        for state in (*policy._accumulators, *policy.optimizer.exp_avg, *policy.optimizer.exp_avg_sq):
            state.asnumpy().fill(0)
        marks["rss1"] = current_rss()
        return policy

    mindgrpo.train.model_worker.ModelWorker = measured_policy
    try:
        trainer = GRPOTrainer(config)
    finally:
        mindgrpo.train.model_worker.ModelWorker = build_policy
    marks["rss_built"] = current_rss()  # the trainer built (the zero-initialised state is not yet touched)
    trainer.precompile()
    marks["peak_after_precompile"] = peak_rss()  # every graph of the run compiled
    steps = []
    for i in range(args.steps):
        start = time.perf_counter()
        trainer.train_step()
        seconds = time.perf_counter() - start
        if i == 0:
            marks["peak_after_step1"] = peak_rss()
        data = trainer.last_rollouts
        steps.append({"seconds": seconds, "tokens": int(data.prompt_lengths.sum() + data.completion_mask.sum()),
                      "completion_tokens": int(data.completion_mask.sum())})
    trainer.metrics.close()
    dist = trainer.dist
    return {"rank": dist.rank, "tp_rank": dist.tp_rank, "dp_rank": dist.dp_rank, "steps": steps,
            "peak_rss_mib": round(peak_rss() / 2**20, 1), **marks,
            "plan": plan_check(trainer.config, trainer.worker.hf_config, dist.dp_size, dist.tp_size, marks["rss0"],
                               marks["rss1"], marks["peak_after_step1"])}


# ----------------------------------------------------------------------------------------------- driver
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def processes(layout: str) -> int:
    return LAYOUTS[layout]["data_parallel"] * LAYOUTS[layout]["model_parallel"]


def layout_command(layout: str, model_dir: Path, work: Path, args: argparse.Namespace) -> List[str]:
    """The command that runs one layout: this script as a worker, under msrun for more than one process."""
    n = processes(layout)
    worker = [str(Path(__file__).resolve()), "--run-layout", layout, "--model-dir", str(model_dir), "--work-dir",
              str(work), "--steps", str(args.steps), "--warmup", str(args.warmup),
              "--threads-per-process", str(max(1, args.threads // n))]
    if n == 1:
        return [sys.executable, *worker]
    return ["msrun", f"--worker_num={n}", f"--local_worker_num={n}", "--master_addr=127.0.0.1",
            f"--master_port={_free_port()}", f"--log_dir={work / f'msrun_{layout}'}", "--join=True", *worker]


def summarize(layout: str, ranks: List[Dict], warmup: int, threads: int) -> Dict:
    """One layout's line from its ranks' results: global tokens per step (one rank per tensor-parallel group, as
    those ranks share their prompts) over the slowest rank's time."""
    ranks = sorted(ranks, key=lambda r: r["rank"])
    counted = range(warmup, len(ranks[0]["steps"])) if len(ranks[0]["steps"]) > warmup else range(len(
        ranks[0]["steps"]))
    per_step = [(sum(r["steps"][i]["tokens"] for r in ranks if r["tp_rank"] == 0),
                 max(r["steps"][i]["seconds"] for r in ranks)) for i in counted]
    return {"layout": layout, "size": "small", **LAYOUTS[layout], "processes": len(ranks),
            "threads_per_process": max(1, threads // len(ranks)), "batch": PROMPTS * GENERATIONS,
            "new_tokens": NEW_TOKENS, "counted_steps": len(per_step),
            "mean_tokens_per_step": statistics.mean(t for t, _ in per_step),
            "sec_per_step": round(statistics.median(s for _, s in per_step), 3),
            "tokens_per_sec": round(statistics.median(t / s for t, s in per_step), 1),
            "peak_rss_mib": [r["peak_rss_mib"] for r in ranks],
            "peak_rss_mib_max": max(r["peak_rss_mib"] for r in ranks),
            "plan": [{"rank": r["rank"], **r["plan"]} for r in ranks],
            "rss_marks_mib": [{k: round(r[k] / 2**20, 1) for k in MARKS} for r in ranks],
            "plan_ok": all(r["plan"][k]["ok"] for r in ranks for k in ("state", "peak"))}


def compare(lines: Dict[str, Dict]) -> Dict:
    """Every layout's tokens/s and largest per-rank peak RSS as ratios to TP=1's."""
    base = lines.get("tp1")
    out: Dict = {"compare": "layout / tp1"}
    for name, line in lines.items():
        out[f"{name}_tokens_per_sec"] = line["tokens_per_sec"]
        out[f"{name}_peak_rss_mib_max"] = line["peak_rss_mib_max"]
        if base and name != "tp1":
            out[f"{name}_tokens_per_sec_ratio"] = round(line["tokens_per_sec"] / base["tokens_per_sec"], 3)
            out[f"{name}_peak_rss_ratio"] = round(line["peak_rss_mib_max"] / base["peak_rss_mib_max"], 3)
    out["plan_ok"] = all(line["plan_ok"] for line in lines.values())
    return out


def run_layout(layout: str, model_dir: Path, work: Path, args: argparse.Namespace) -> Dict:
    results = work / f"results_{layout}"
    shutil.rmtree(results, ignore_errors=True)
    results.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryFile("w+") as log:
        code = subprocess.run(layout_command(layout, model_dir, work, args), stdout=log, stderr=subprocess.STDOUT,
                              text=True, env=env).returncode
        log.seek(0)
        text = log.read()
    ranks = [json.loads(p.read_text()) for p in sorted(results.glob("rank*.json"))]
    if code or len(ranks) != processes(layout):
        workers = "".join(p.read_text(errors="replace")[-3000:] for p in sorted(work.glob(f"msrun_{layout}/*.log")))
        raise RuntimeError(f"{layout} run failed (exit {code}); its last output:\n{text[-3000:]}\n{workers}")
    return summarize(layout, ranks, args.warmup, args.threads)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1, help="leading steps excluded from the statistics")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="CPU threads of a whole run, split evenly over its processes")
    # msrun reads abbreviated options even after the script: no worker option may begin one of its own (--worker)
    parser.add_argument("--run-layout", dest="worker", choices=list(LAYOUTS), help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--work-dir", help=argparse.SUPPRESS)
    parser.add_argument("--threads-per-process", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or args.threads < 1:
        parser.error("--steps and --threads must be at least 1 and --warmup at least 0")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        result = run_rank(args)
        out = Path(args.work_dir) / f"results_{args.worker}" / f"rank{result['rank']}.json"
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(result))
        tmp.replace(out)
        return 0
    if shutil.which("msrun") is None and any(processes(name) > 1 for name in args.layouts):
        print("error: msrun (MindSpore's launcher) is not on PATH", file=sys.stderr)
        return 2
    lines: Dict[str, Dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench_tp_") as tmp:
        work = Path(tmp)
        assets = bench_assets()  # `small` with its tokenizer, and the prompts (see benchlib)
        model_dir = assets.model("small")
        convert_prompts(assets.prompts, model_dir, work / "gsm8k_train.mindrecord")
        for layout in args.layouts:
            try:
                lines[layout] = run_layout(layout, model_dir, work, args)
            except RuntimeError as err:
                print(err, file=sys.stderr)
                return 1
            lines[layout]["load_average"] = round(os.getloadavg()[0], 2)
            print(json.dumps(lines[layout]), flush=True)
    print(json.dumps(compare(lines)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
