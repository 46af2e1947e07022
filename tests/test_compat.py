"""tools/compat.py, which makes docs/versions.md's "Tested with" table and mindgrpo/compat.json: the table it prints
from its rows, the pairs it accepts, and the shipped table the doctor reads."""
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))

import compat  # noqa: E402


def test_table_marks_each_step_and_the_result():
    rows = [{"mindspore": "2.10.0", "mindformers": "1.9.0", "mindformers_no_deps": True, "passed": True,
             "subset": "148 passed", "steps": {"install pair": True, "pip install -e .": True,
                                               "demo, 3 steps": True, "suite subset": True}},
            {"mindspore": "2.8.0", "mindformers": "1.9.0", "passed": False,
             "steps": {"install pair": True, "pip install -e .": False}},
            {"mindspore": "2.10.0", "mindformers": "none", "passed": True,
             "steps": {"install pair": True, "pip install -e .": True, "demo, 3 steps": True}}]
    lines = compat.table(rows, "x86_64").splitlines()
    assert lines[2] == "| 2.10.0 | 1.9.0 (`--no-deps`) | ok | ok | 148 passed | passed |"
    assert lines[3] == "| 2.8.0 | 1.9.0 | FAILED | - | - | failed |"
    assert lines[4] == "| 2.10.0 | not installed (a fresh machine's `pip install -e .`) | ok | ok | - | passed |"


def test_a_run_replaces_its_pairs_rows_in_the_package_table_and_keeps_the_others():
    def row(ms, mf, passed, **extra):
        return {"mindspore": ms, "mindformers": mf, "passed": passed, "steps": {}, **extra}

    shipped = {"date": "2026-11-01", "pairs": [row("2.9.0", "1.9.0", True), row("2.8.0", "1.9.0", False),
                                                row("2.10.0", "1.9.0", True, mindformers_no_deps=True)]}
    record = {"date": "2026-11-29", "machine": "m", "pairs": [row("2.8.0", "1.9.0", True), row("2.10.0", "none", True)]}
    table = compat.merged(shipped, record)
    assert [(r["mindspore"], r["mindformers"], r["passed"], r["date"]) for r in table["pairs"]] == [
        ("2.9.0", "1.9.0", True, "2026-11-01"), ("2.8.0", "1.9.0", True, "2026-11-29"),
        ("2.10.0", "1.9.0", True, "2026-11-01"), ("2.10.0", "none", True, "2026-11-29")]
    assert table["date"] == "2026-11-29"


def test_a_malformed_pair_is_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        compat.main(["--pairs", "2.10:1.9"])
    assert "--pairs '2.10:1.9': write MINDSPORE:MINDFORMERS[:nodeps] or MINDSPORE:none" in capsys.readouterr().err


def test_the_shipped_table_has_the_pair_ci_installs_passing():
    record = json.loads((REPO / "mindgrpo" / "compat.json").read_text(encoding="utf-8"))
    passed = {(r["mindspore"], r["mindformers"]) for r in record["pairs"] if r["passed"]}
    assert ("2.9.0", "1.9.0") in passed and len({ms for ms, _ in passed}) >= 2
