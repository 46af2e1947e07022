"""examples/grpo/tutorial.ipynb runs headless from top to bottom (nbclient) and shows what it promises."""
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "examples" / "grpo" / "tutorial.ipynb"


def test_notebook_is_committed_without_outputs():
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)


def test_notebook_runs(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    pytest.importorskip("matplotlib")
    # The kernel is a fresh process: make it import this checkout, whatever copy of mindgrpo pip has installed.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()

    def text_of(cell) -> str:
        return "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in cell.outputs)

    code = [c for c in nb.cells if c.cell_type == "code"]
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]
    work = tmp_path / "tutorial_output"
    run = work / "run"
    assert "trained 8 steps" in "".join(map(text_of, code))
    assert (run / "metrics.jsonl").is_file() and sorted((run / "checkpoints").glob("step_*"))
    table = next(c for c in code if any("text/html" in o.get("data", {}) for o in c.outputs))
    html = next(o["data"]["text/html"] for o in table.outputs if "text/html" in o.get("data", {}))
    assert html.count("<tr>") == 9 and "####" in html  # header + 8 completions of the demo's answer format
    assert any("image/png" in o.get("data", {}) for c in code for o in c.outputs)
    assert (work / "plots" / "dashboard.png").stat().st_size > 10_000
    final = text_of(code[-1])
    assert "pass@1 (greedy)" in final and "maj@4" in final and "accuracy: " in final
    accuracy = float(final.rsplit("accuracy: ", 1)[1].split()[0])
    assert 0.0 < accuracy <= 1.0  # the warm-started demo model answers some of the 64 test problems
    assert len((work / "eval_test.jsonl").read_text(encoding="utf-8").splitlines()) == 64
