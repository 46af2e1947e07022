"""tools/bench_tp.py: how a layout is launched and how its ranks' results become one line (quick), and one real
(slow) 3-layout run."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[1] / "tools"
sys.path.insert(0, str(TOOLS))

import bench_tp  # noqa: E402
from conftest import msrun_group  # noqa: E402


def test_one_process_runs_plainly_and_two_under_msrun_with_the_threads_split(tmp_path):
    args = bench_tp.parse_args(["--steps", "3", "--threads", "4"])
    assert args.layouts == ["tp1", "tp2", "dp2"] and args.warmup == 1
    one = bench_tp.layout_command("tp1", tmp_path / "m", tmp_path, args)
    assert one[0] == sys.executable and one[one.index("--threads-per-process") + 1] == "4"
    two = bench_tp.layout_command("tp2", tmp_path / "m", tmp_path, args)
    assert two[0] == "msrun" and "--worker_num=2" in two and "--local_worker_num=2" in two
    assert two[two.index("--run-layout") + 1] == "tp2" and two[two.index("--threads-per-process") + 1] == "2"
    with pytest.raises(SystemExit):
        bench_tp.parse_args(["--layouts", "tp4"])


def _rank(rank, tp_rank, tokens, seconds, peak_mib, ok=True):
    check = {"predicted_mib": 1.0, "measured_mib": 1.0, "error": 0.0 if ok else 0.5, "ok": ok}
    return {"rank": rank, "tp_rank": tp_rank, "steps": [{"tokens": t, "seconds": s} for t, s in zip(tokens, seconds)],
            "peak_rss_mib": peak_mib, "plan": {"state": check, "peak": check},
            **{k: 2**20 for k in bench_tp.MARKS}}


def test_tensor_parallel_ranks_count_their_shared_batch_once_and_data_parallel_ranks_add_up():
    tp1 = bench_tp.summarize("tp1", [_rank(0, 0, [999, 100, 100], [9, 1, 1], 300.0)], warmup=1, threads=2)
    assert tp1["tokens_per_sec"] == 100 and tp1["counted_steps"] == 2
    tp2 = bench_tp.summarize("tp2", [_rank(1, 1, [0, 100, 100], [1, 2, 2], 180.0),
                                     _rank(0, 0, [0, 100, 100], [1, 1, 1], 200.0, ok=False)], warmup=1, threads=2)
    assert tp2["tokens_per_sec"] == 50  # rank 0's batch (rank 1 holds the same prompts) over the slower rank
    assert tp2["peak_rss_mib"] == [200.0, 180.0] and tp2["peak_rss_mib_max"] == 200.0 and not tp2["plan_ok"]
    dp2 = bench_tp.summarize("dp2", [_rank(0, 0, [0, 50, 50], [1, 1, 1], 250.0),
                                     _rank(1, 0, [0, 50, 50], [1, 1, 1], 250.0)], warmup=1, threads=2)
    assert dp2["tokens_per_sec"] == 100 and dp2["threads_per_process"] == 1
    line = bench_tp.compare({"tp1": tp1, "tp2": tp2, "dp2": dp2})
    assert line["tp2_tokens_per_sec_ratio"] == 0.5 and line["dp2_peak_rss_ratio"] == round(250 / 300, 3)
    assert not line["plan_ok"]


@pytest.mark.slow
@msrun_group
def test_three_layouts_print_their_lines_and_a_comparison():
    out = subprocess.run([sys.executable, str(TOOLS / "bench_tp.py"), "--steps", "2", "--warmup", "1"],
                         capture_output=True, text=True, check=True).stdout
    lines = [json.loads(line) for line in out.strip().splitlines()]
    assert [line.get("layout") for line in lines[:3]] == ["tp1", "tp2", "dp2"]
    assert all(line["tokens_per_sec"] > 0 and len(line["peak_rss_mib"]) == line["processes"] for line in lines[:3])
    assert lines[3]["compare"] == "layout / tp1" and lines[3]["tp2_tokens_per_sec_ratio"] > 0
