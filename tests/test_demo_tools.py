"""The tool demo as shipped (`mindgrpo train --demo tools`, examples/grpo/tool_demo.yaml): the tiny model, warm-started
on 3-digit by 2-digit products in both answer formats, trained with GRPO with the calculator and, from the same
weights and for the same budget, without it (`rl_config.tools=[]`: prompts without the tool block). For each seed
the run with the tool ends clearly above the one without, and rises."""
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mindgrpo.train.metrics import read_metrics

REPO = Path(__file__).resolve().parents[1]
WINDOW = 10  # steps per window: the first and the last of the run
# Measured on an AMD EPYC (Zen 3), 2 cores, sampled accuracy of the first -> last 10 of the 40 steps: with the
# calculator seed 0 0.227 -> 0.659, seed 1 0.194 -> 0.573; without it 0.000 at every step for both
# (tools/demo_seeds.py --configs tools notools --seeds 0 1). MIN_MARGIN and MIN_RISE are about 0.15 under the
# smaller seed's margin (0.573) and rise (0.379): sampling differs between machines.
MIN_MARGIN = 0.4
MIN_RISE = 0.25


def run(tmp_path: Path, seed: int, *overrides: str):
    out = tmp_path / f"seed{seed}{'_notools' if overrides else ''}"
    done = subprocess.run([sys.executable, str(REPO / "examples" / "grpo" / "main.py"), "--demo", "tools",
                           f"rl_config.seed={seed}", f"rl_config.output_dir={out}", *overrides],
                          capture_output=True, text=True, timeout=1800, cwd=tmp_path, env=dict(os.environ))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(r"Accuracy of sampled answers: first \d+ steps", done.stdout)
    return read_metrics(out / "metrics.jsonl"), out


def window(rows, which: slice) -> float:
    return float(np.mean([r["grpo/rewards/accuracy_reward"] for r in rows[which]]))


def check_seed(tmp_path: Path, seed: int) -> None:
    with_tools, out = run(tmp_path, seed)
    without, _ = run(tmp_path, seed, "rl_config.tools=[]")
    last_with, last_without = window(with_tools, slice(-WINDOW, None)), window(without, slice(-WINDOW, None))
    assert last_with - last_without >= MIN_MARGIN, (seed, last_with, last_without)
    assert last_with - window(with_tools, slice(WINDOW)) >= MIN_RISE, (seed, with_tools)
    # the model called the calculator, and the run without it never did
    assert np.mean([r["tools/calls_per_completion"] for r in with_tools[-WINDOW:]]) >= 0.9
    assert all("tools/calls_per_completion" not in r for r in without)
    assert '"transcript"' in (out / "completions.jsonl").read_text(encoding="utf-8")


def test_tool_demo_beats_the_same_budget_without_tools(tmp_path):
    """Seed 0 as shipped, in the default suite: docs/tools.md's claim that the tool demo learns."""
    check_seed(tmp_path, 0)


@pytest.mark.slow
def test_tool_demo_beats_the_same_budget_without_tools_seed_1(tmp_path):
    """The second seed: the warm start (1.5 minutes here, then cached) and two runs per seed make the test one of the
    suite's longest, so only seed 0 runs by default."""
    check_seed(tmp_path, 1)


def test_tool_demo_folder_is_built_once_and_its_transcripts_are_rollouts(tmp_path):
    """The folder (no warm start here): built aside and stamped, found again without rebuilding, a foreign folder
    refused; each transcript is the tokens a rollout holds (the model's turns and the tool's response, each
    tokenised on its own), masked as the loss masks it; a tool prompt is whole words; the warm start's rows are the
    whole prompt's tokens."""
    from mindgrpo.apps import demo_tools
    from mindgrpo.apps.demo_tools.task import call_text, final_text, gold, transcript
    from mindgrpo.apps.demo_tools.warm_start import encode
    from mindgrpo.data import render_prompt
    from mindgrpo.data.templates import render_tool_prompt
    from mindgrpo.data.tokenizer import load_tokenizer
    from mindgrpo.tools import resolve_tools, responses_text
    from mindgrpo.data.tool_format import system_turn

    built = demo_tools.make_tool_demo(tmp_path / "demo", warm_start_steps=0)
    stamp = (built.root / demo_tools.STAMP).stat().st_mtime_ns
    again = demo_tools.make_tool_demo(tmp_path / "demo", warm_start_steps=0)
    assert again.facts == built.facts and (again.root / demo_tools.STAMP).stat().st_mtime_ns == stamp
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left behind
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(FileExistsError, match="not a mindgrpo tool demo"):
        demo_tools.make_tool_demo(tmp_path / "mine", warm_start_steps=0)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"

    tok = load_tokenizer(built.model_dir)
    row = {"question": "What is 347 * 82?", "answer": "347 * 82 = 28454\n#### 28454"}
    ids, mask = transcript(tok, row)
    model_text = tok.decode([t for t, m in zip(ids, mask) if m], skip_special_tokens=False)
    assert model_text == call_text(row) + "<|im_end|>" + final_text(row) + "<|im_end|>"
    assert tok.decode([t for t, m in zip(ids, mask) if not m], skip_special_tokens=False) == \
        responses_text([gold(row)])
    signatures = [t.signature for t in resolve_tools(demo_tools.TOOLS)]
    prompt = render_tool_prompt(demo_tools.PROMPT_TEMPLATE, row["question"], signatures)
    assert len(tok.encode(prompt)) < 240  # ~950 characters; byte-level pieces would be ~600 tokens

    # the warm start's tool rows (the system turn once, then each row's own tokens) are the whole prompt's tokens
    rows = [row, {"question": "Compute 120 * 15?", "answer": "120 * 15 = 1800\n#### 1800"}]
    prompts = [render_prompt(demo_tools.PROMPT_TEMPLATE, r["question"]) for r in rows]
    (system, ids, mask), _ = encode(tok, system_turn(signatures), prompts, rows, demo_tools.BUFFER_LENGTHS)
    for r, one in enumerate(rows):
        completion, model = transcript(tok, one)
        whole = tok.encode(render_tool_prompt(demo_tools.PROMPT_TEMPLATE, one["question"], signatures)) + completion
        assert list(system[0]) + list(ids[r, :len(whole) - system.shape[1]]) == whole
        assert mask[r].sum() == sum(model) and mask[r, len(whole) - system.shape[1] - 1] == 1
