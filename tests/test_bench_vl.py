"""tools/bench_vl.py end to end (slow): both runs finish, the text twin's prompts are as long as the VL ones (within
a word), and the vision tower ran once per prompt per step."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_bench_vl_compares_like_with_like_and_counts_tower_calls():
    done = subprocess.run([sys.executable, str(REPO / "tools" / "bench_vl.py"), "--steps", "3"], capture_output=True,
                          text=True, timeout=1800, cwd=REPO)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    vl, text = map(int, re.search(r"prompt tokens: VL (\d+), text (\d+)", done.stdout).groups())
    assert 0 <= text - vl <= 3
    assert "24 prompts embedded for 24 prompt-steps (once per prompt per step)" in done.stdout
    assert re.search(r"seconds/step: VL [0-9.]+, text [0-9.]+, ratio [0-9.]+x", done.stdout)
