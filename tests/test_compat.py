"""tools/compat.py, which makes the README's "Tested with" table and mindgrpo/compat.json: the table it prints from
its rows, the pairs it accepts, and the shipped table the doctor reads."""
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
             "steps": {"install pair": True, "pip install -e .": False}}]
    lines = compat.table(rows, "x86_64").splitlines()
    assert lines[2] == "| 2.10.0 | 1.9.0 (`--no-deps`) | ok | ok | 148 passed | passed |"
    assert lines[3] == "| 2.8.0 | 1.9.0 | FAILED | - | - | failed |"


def test_a_malformed_pair_is_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        compat.main(["--pairs", "2.10:1.9"])
    assert "--pairs '2.10:1.9': write MINDSPORE:MINDFORMERS[:nodeps]" in capsys.readouterr().err


def test_the_shipped_table_has_the_pair_ci_installs_passing():
    record = json.loads((REPO / "mindgrpo" / "compat.json").read_text(encoding="utf-8"))
    passed = {(r["mindspore"], r["mindformers"]) for r in record["pairs"] if r["passed"]}
    assert ("2.9.0", "1.9.0") in passed and len({ms for ms, _ in passed}) >= 2
