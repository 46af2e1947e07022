"""A benchmark's mindgrpo run on the user's path: `examples/grpo/main.py --config X.yaml [overrides]` in its own
process, as a user types it, measured from outside.

The benchmarks that compare mindgrpo with TRL at a real model's shape run this instead of a worker of their own, so
what they measure (speed, and above all memory) cannot drift from what a user's run holds: the same entry point,
config loading, trainer, graphs and checkpointing. The process is timed from its start to its exit and its peak RSS
is its own (``wait4``); the step figures are read back from the run's ``metrics.jsonl``.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
MAIN = REPO / "examples" / "grpo" / "main.py"


def run_measured(cmd: Sequence[str], log: Path, env: Optional[Dict[str, str]] = None) -> Dict:
    """Run ``cmd`` to its end, its output in ``log``: its wall seconds and its own peak RSS (``wait4``'s, not the
    largest of every child this process ever waited for)."""
    start = time.perf_counter()
    with open(log, "w") as out:
        child = subprocess.Popen(list(cmd), stdout=out, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {child.returncode}); see {log}")
    return {"wall_s": round(time.perf_counter() - start, 1), "peak_rss_mib": round(usage.ru_maxrss / 1024, 1)}


def run_user_path(config: Path, overrides: Sequence[str], output_dir: Path, log: Path, *, completions: int,
                  warmup: int = 1) -> Dict:
    """Train with ``config`` and ``overrides`` (``group.key=value``, flags) into ``output_dir``; the run's wall
    seconds, peak RSS, its metrics lines (``metrics``) and per-step figures (medians over the steps after the first
    ``warmup``; ``completions``: a step's completions, batch_size x num_generations)."""
    cmd = [sys.executable, str(MAIN), "--config", str(config), *overrides, f"rl_config.output_dir={output_dir}"]
    measured = run_measured(cmd, log)
    steps = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines() if line]
    return {**measured, "steps": len(steps), "metrics": steps, **step_figures(steps[warmup:] or steps, completions)}


def step_figures(steps: List[Dict], completions: int) -> Dict:
    """Seconds per step, tokens per second (prompt and completion tokens of the step's ``completions``) and where
    the time went, from the steps' metrics lines."""
    def tokens(step: Dict) -> float:
        return completions * (step["prompt_length/mean"] + step["response_length/mean"])

    seconds = [s["timing/all"] for s in steps]
    total = sum(seconds)
    phases = {"rollout": "timing/rollout", "reference": "timing/reference_model", "update": "timing/update"}
    shares = {f"share_{name}": round(sum(s[key] for s in steps) / total, 4) for name, key in phases.items()}
    return {"sec_per_step": round(statistics.median(seconds), 2),
            "tokens_per_sec": round(statistics.median(tokens(s) / s["timing/all"] for s in steps), 1),
            **shares, "share_other": round(1 - sum(shares.values()), 4),
            "rewards": [round(s["grpo/rewards/mean"], 4) for s in steps],
            "mean_response_length": round(statistics.mean(s["response_length/mean"] for s in steps), 1)}
