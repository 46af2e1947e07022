"""The VL demo as shipped (`python examples/grpo_vl/main.py`): a tiny Qwen2.5-VL made locally, warm-started, then
trained with GRPO on picture-counting; for a fixed seed the sampled accuracy of the last steps beats the first."""
import re
import subprocess
import sys
from pathlib import Path

from mindgrpo.train.metrics import read_metrics

REPO = Path(__file__).resolve().parents[1]


def test_vl_demo_accuracy_rises(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "examples" / "grpo_vl" / "main.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=1200, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    accuracy = [r["grpo/rewards/accuracy_reward"] for r in rows]
    first, last = re.search(r"first \d+ steps ([0-9.]+), last \d+ steps ([0-9.]+)", done.stdout).groups()
    assert float(last) - float(first) >= MIN_RISE, (accuracy, done.stdout[-2000:])
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step_*"))
