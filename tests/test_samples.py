"""``mindgrpo samples``: a run's completions.jsonl filtered (step, reward, verifier, length, regex, each prompt's
first and last) and shown as text or one HTML page; bad input is one error line."""
import json

import pytest

from mindgrpo.apps.samples import Filters, SamplesError, format_html, format_text, read_samples, select
from mindgrpo.apps.samples_cli import main
from mindgrpo.train.metrics import MetricsLogger

PROMPT_A = "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
PROMPT_B = "<|im_start|>user\nWhat is 7 * 6?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture
def run(tmp_path):
    """A run folder whose completions.jsonl the trainer's own logger wrote: 3 steps x 2 prompts."""
    logger = MetricsLogger(tmp_path, rank=0, total_steps=3)
    texts = {1: ("2 + 3 = 6. #### 6", "7 * 6 = 40 #### 40"),
             2: ("2 + 3 = 6. Wait, let me check: 2 + 3 = 5. #### 5", "7 * 6 = 42 #### 42"),
             3: ("<think>2 + 3 = 5</think> #### 5", "Let me recheck: 7 * 6 = 42 #### 42")}
    for step, (a, b) in texts.items():
        logger.log_completions(step, [
            {"prompt": PROMPT_A, "completion": a, "gold": "5", "reward": float(a.endswith("5")),
             "rewards": {"accuracy_reward": float(a.endswith("5"))}},
            {"prompt": PROMPT_B, "completion": b, "gold": "42", "reward": float(b.endswith("42")),
             "rewards": {"accuracy_reward": float(b.endswith("42"))}}])
    logger.close()
    return tmp_path


def test_filters_find_the_aha_moment(run):
    records = list(read_samples(run / "completions.jsonl"))
    assert len(records) == 6
    aha = select(records, Filters(grep="wait|let me (re)?check"))
    assert [(r["step"], r["completion"][:5]) for r in aha] == [(2, "2 + 3"), (3, "Let m")]
    assert [r["step"] for r in select(records, Filters(steps=(2, 3), reward=(1, 1)))] == [2, 2, 3, 3]
    assert [r["step"] for r in select(records, Filters(verifier=("accuracy", 0, 0)))] == [1, 1]
    assert [r["step"] for r in select(records, Filters(length=(0, 20)))] == [1, 1, 2]
    early_late = select(records, Filters(), first=1, last=1)
    assert [(r["prompt"] == PROMPT_A, r["step"]) for r in early_late] == [(True, 1), (True, 3), (False, 1), (False, 3)]
    assert len(select(records, Filters(), limit=4)) == 4


def test_text_and_html_show_what_was_found(run, tmp_path, capsys):
    assert main([str(run), "--grep", "wait", "--limit", "0"]) == 0
    out = capsys.readouterr().out
    assert "step 2 | reward 1 | accuracy_reward=1 | gold 5" in out and "Q: What is 2 + 3?" in out
    assert "Wait, let me check" in out and "7 * 6" not in out
    page = tmp_path / "aha.html"
    assert main([str(run / "completions.jsonl"), "--grep", "recheck", "--html", str(page)]) == 0
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and "<mark>recheck</mark>" in text and "<script" not in text
    assert "1 completions" in text and "Let me <mark>recheck</mark>: 7 * 6 = 42" in text
    tool = {"step": 1, "prompt": PROMPT_A, "completion": "#### 5", "reward": 1.0, "rewards": {},
            "transcript": "<tool_call>{}</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n5\n"}
    assert "<tool_response>" in format_text([tool])  # a tool run shows the whole exchange
    assert "&lt;tool_response&gt;" in format_html([tool], title="t")


@pytest.mark.parametrize("args, message", [
    (["--grep", "(unclosed"], "--grep '(unclosed' is not a regular expression"),
    (["--verifier", "accuracy", "x", "1"], "LOW and HIGH must be numbers"),
    (["--first", "-1"], "must be >= 0"),
])
def test_bad_filters_are_one_error_line(run, capsys, args, message):
    assert main([str(run), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_a_missing_run_or_a_broken_line_names_the_file(tmp_path, run, capsys):
    assert main([str(tmp_path / "nowhere")]) == 2
    assert "does not exist" in capsys.readouterr().err
    path = run / "completions.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], "{broken", *lines[1:]]) + "\n")
    with pytest.raises(SamplesError, match=r"completions.jsonl, line 2: not a JSON record"):
        list(read_samples(path))
    path.write_text("\n".join(lines) + '\n{"step": 4, "prom')  # a killed run's last line
    assert len(list(read_samples(path))) == 6
