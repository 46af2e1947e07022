"""The README's first command: the embedded demo converts its data, trains, checkpoints, and the reward rises."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mindgrpo.metrics import read_metrics

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


def test_short_demo_improves(tmp_path):
    """40 steps with the demo's fixed seed: the last 10 steps answer more problems than the first 10."""
    rows = run_demo(tmp_path, "rl_config.max_steps=40", "rl_config.save_ckpt_interval=0")
    assert [r["step"] for r in rows] == list(range(1, 41))
    before, after = accuracy(rows, slice(0, 10)), accuracy(rows, slice(30, 40))
    print(f"demo accuracy: first 10 steps {before:.3f}, last 10 steps {after:.3f}")
    assert after > before


@pytest.mark.slow
def test_full_demo_learns(tmp_path):
    """The README's demo as shipped (100 steps): mean accuracy of the last 20 steps clearly above the first 20."""
    rows = run_demo(tmp_path)
    before, after = accuracy(rows, slice(0, 20)), accuracy(rows, slice(80, 100))
    print(f"demo accuracy: first 20 steps {before:.3f}, last 20 steps {after:.3f}")
    assert after > before + 0.05
