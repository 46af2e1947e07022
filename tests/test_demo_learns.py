"""The README's first command: the embedded demo converts its data, trains, checkpoints, and the reward rises."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from mindgrpo.train.metrics import read_metrics

REPO = Path(__file__).resolve().parents[1]


def run_demo(cwd: Path, *overrides: str) -> list:
    env = {**os.environ, "MINDGRPO_CACHE": os.environ.get("MINDGRPO_CACHE", "")}
    env = {k: v for k, v in env.items() if v}
    done = subprocess.run([sys.executable, str(REPO / "examples" / "grpo" / "main.py"), *overrides], cwd=cwd,
                          capture_output=True, text=True, timeout=1800, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Metrics:" in done.stdout and "checkpoints:" in done.stdout
    out = cwd / "output" / "demo"
    assert (out / "data" / "train.mindrecord").is_file()
    assert sorted(p.name for p in (out / "checkpoints").glob("step_*"))
    return read_metrics(out / "metrics.jsonl")


def accuracy(rows, first: slice) -> float:
    return float(np.mean([r["grpo/rewards/accuracy_reward"] for r in rows[first]]))


SEEDS = (0, 1, 2, 3, 4)
MIN_MEAN_RISE = 0.035


def test_demo_learns_across_seeds(tmp_path):
    """The README's demo as shipped (100 steps) for seeds 0-4 (rl_config.seed: data order and sampling; the
    warm-started model is the same): the sampled accuracy of the last 20 steps minus that of the first 20,
    averaged over the seeds, must reach MIN_MEAN_RISE, which a trainer that does not learn does not reach.

    Measured on this 2-core machine (rise = mean accuracy of the last 20 steps - mean of the first 20):
    - GRPO as shipped (learning rate 3e-4), seeds 0-8: 0.116, 0.058, 0.125, 0.085, 0.041, 0.068, 0.059, -0.016,
      0.072 (mean 0.068, sd 0.042). Seeds 0-4, the ones tested: mean 0.085.
    - No learning (actor_config.lr_schedule.learning_rate=0; the weights were checked unchanged), seeds 0-9:
      0.027, 0.029, 0.032, 0.004, 0.000, 0.007, -0.012, -0.020, -0.009, 0.000 (mean 0.006, sd 0.018). Seeds 0-4:
      mean 0.018.
    A single seed cannot tell them apart (seed 7 learned and fell by 0.016; seed 2 did not learn and rose by
    0.032), so the test averages five. Over five seeds a non-learner's mean has sd 0.008: MIN_MEAN_RISE is 3.6 sd
    above its mean (and 0.017 above what it scored on seeds 0-4), and 0.050 below the learner's score on them. A
    change that alters the numerics re-draws the five rises; with the spread measured, a learning trainer's mean
    falls below MIN_MEAN_RISE about once in 25 such draws.
    """
    rises = []
    for seed in SEEDS:
        run = tmp_path / f"seed{seed}"
        run.mkdir()
        rows = run_demo(run, f"rl_config.seed={seed}")
        assert [r["step"] for r in rows] == list(range(1, 101))
        before, after = accuracy(rows, slice(0, 20)), accuracy(rows, slice(80, 100))
        print(f"seed {seed}: demo accuracy first 20 steps {before:.3f}, last 20 steps {after:.3f}")
        rises.append(after - before)
    print(f"rises {np.round(rises, 3).tolist()}, mean {np.mean(rises):.3f}")
    assert np.mean(rises) >= MIN_MEAN_RISE, rises
