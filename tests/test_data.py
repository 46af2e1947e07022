"""mindgrpo.data and tools/rlhf_data.py: templates, readers, MindRecord conversion, atomic output, PromptDataset."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, generated_fixture, gsm8k_path
from mindgrpo.data import mindrecord
from mindgrpo.data import (PROMPT_TEMPLATES, DataError, PromptDataset, Record, RowError, convert_dataset, index_path,
                           read_dataset, render_prompt)
from mindgrpo.rewards import normalize_number
from mindgrpo.data.tokenizer import load_tokenizer

TOOL = REPO / "tools" / "rlhf_data.py"
# SUFFIX in ../shared/peer/trl_grpo_bench.py, copied by hand: gsm8k_hash must reproduce the peer's prompt
PEER_SUFFIX = '\nLet\'s think step by step and output the final answer after "####".'


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(generated_fixture("tiny-qwen2.5"))


def write_jsonl(path: Path, rows) -> Path:
    """rows: dicts (dumped as JSON) or raw strings (written verbatim, to make broken lines)."""
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def small_gsm8k(path: Path, n: int) -> Path:
    return write_jsonl(path, [{"question": f"Tom has {i} apples and buys {i + 2} more. How many apples now?",
                               "answer": f"{i} + {i + 2} = {2 * i + 2}\n#### {2 * i + 2}"} for i in range(n)])


def leftovers(folder: Path) -> list:
    """Everything in `folder` except the given source files: outputs, indexes, staging folders."""
    return sorted(p.name for p in folder.iterdir() if p.suffix not in (".jsonl", ".json", ".parquet"))


def convert(tokenizer, src, out, **kw):
    kw = {"dataset_type": "gsm8k", "prompt_template": "gsm8k_hash", "max_prompt_length": 128, **kw}
    return convert_dataset(src, out, tokenizer, progress=False, **kw)


def tool_main(*args) -> int:
    """tools/rlhf_data.py's main() in this process (no second MindSpore import)."""
    import runpy
    return runpy.run_path(str(TOOL))["main"]([str(a) for a in args])


def run_tool(*args, cwd):
    return subprocess.run([sys.executable, str(TOOL), *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


# ---- templates ------------------------------------------------------------------------------------------------

def test_templates_render_documented_formats():
    q = "What is {x} + 1?"  # braces must survive
    assert render_prompt("gsm8k_hash", q) == f"<|im_start|>user\n{q}{PEER_SUFFIX}<|im_end|>\n<|im_start|>assistant\n"
    assert render_prompt("raw", q) == q
    assert render_prompt("chatml", q) == f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"
    r1 = render_prompt("r1_zero", q)
    assert r1.startswith(f"<|im_start|>user\n{q}\n") and r1.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert all(tag in r1 for tag in ("<think>", "</think>", "<answer>", "</answer>")) and "system" not in r1
    assert all(t.description for t in PROMPT_TEMPLATES.values())
    with pytest.raises(ValueError, match="r1_zero"):
        render_prompt("nope", q)


# ---- real GSM8K -----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def converted_gsm8k(tokenizer, tmp_path_factory):
    gsm8k = gsm8k_path()
    out = tmp_path_factory.mktemp("gsm8k")
    return {split: (gsm8k / f"{split}.jsonl",
                    convert(tokenizer, gsm8k / f"{split}.jsonl", out / split / f"{split}.mindrecord",
                            max_prompt_length=512))
            for split in ("train", "test")}


@pytest.mark.parametrize("split,rows", [("train", 7473), ("test", 1319)])
def test_real_gsm8k_converts_and_reads_back_exactly(tokenizer, converted_gsm8k, split, rows):
    src, summary = converted_gsm8k[split]
    assert (summary.rows_read, summary.rows_written, summary.rows_skipped) == (rows, rows, 0)
    ds = PromptDataset(summary.output_path)
    assert len(ds) == rows and ds.max_prompt_length == 512
    assert ds.metadata["prompt_template"] == "gsm8k_hash" and ds.pad_token_id == tokenizer.pad_token_id == 4093
    source = [json.loads(line) for line in src.read_text(encoding="utf-8").splitlines()]
    expected = tokenizer.encode_batch([render_prompt("gsm8k_hash", r["question"]) for r in source])
    padded = np.full((rows, 512), tokenizer.pad_token_id, dtype=np.int32)  # right-padded, fixed length
    for i, ids in enumerate(expected):
        padded[i, :len(ids)] = ids
    assert ds.line_nos.tolist() == list(range(1, rows + 1))
    assert ds.lengths.tolist() == [len(ids) for ids in expected]
    mismatch = np.flatnonzero((ds.input_ids != padded).any(axis=1))
    assert mismatch.size == 0, f"{src}:{mismatch[0] + 1}: ids differ"
    assert ds[5].prompt_ids.tolist() == expected[5]
    assert ds.questions == [r["question"] for r in source]
    assert ds.golds == [normalize_number(r["answer"].split("####")[-1]) for r in source]
    lengths = [len(ids) for ids in expected]
    stats = summary.prompt_length
    assert (stats.min, stats.max, stats.mean) == (min(lengths), max(lengths), pytest.approx(np.mean(lengths)))
    assert stats.p50 == np.percentile(lengths, 50) and stats.p95 == np.percentile(lengths, 95)


# ---- bad rows -------------------------------------------------------------------------------------------------

def test_each_bad_row_kind_is_reported_with_its_line(tokenizer, tmp_path, capfd):
    long_question = "How many apples " + "and pears " * 200 + "are there?"
    src = write_jsonl(tmp_path / "bad.jsonl", [
        {"question": "Tom has 3 apples and buys 2 more. How many?", "answer": "3 + 2 = 5\n#### 5"},  # 1 ok
        '{"question": "broken", "answer": ',  # 2 invalid JSON
        {"answer": "#### 4"},  # 3 missing question
        {"question": "No final answer?", "answer": "it is 4"},  # 4 no '####'
        {"question": "Not a number?", "answer": "#### four"},  # 5 final answer not numeric
        "",  # 6 blank line: ignored, not an error
        {"question": long_question, "answer": "#### 7"},  # 7 too long
        '["a", "list"]',  # 8 not an object
        {"question": "Sam has $1,000.50 and spends nothing. How much?", "answer": "#### $1,000.50"},  # 9 ok
        {"question": "", "answer": "#### 1"},  # 10 empty question
    ])
    seen = []
    summary = convert(tokenizer, src, tmp_path / "out.mindrecord", on_error=seen.append)
    got = [(e.line_no, e.kind) for e in summary.errors]
    assert got == [(2, "invalid_json"), (3, "missing_field"), (4, "no_answer"), (5, "no_answer"), (7, "too_long"),
                   (8, "invalid_json"), (10, "missing_field")]
    assert seen == summary.errors
    assert summary.skipped == {"invalid_json": 2, "missing_field": 2, "no_answer": 2, "too_long": 1}
    assert (summary.rows_read, summary.rows_written, summary.rows_skipped) == (9, 2, 7)
    assert all(str(e).startswith(f"{src}:{e.line_no}: ") for e in summary.errors)
    assert "'question'" in str(summary.errors[1]) and "128" in str(summary.errors[4])
    ds = PromptDataset(tmp_path / "out.mindrecord")
    assert [ds[i].line_no for i in range(len(ds))] == [1, 9] and [ds[0].gold, ds[1].gold] == ["5", "1000.5"]
    assert capfd.readouterr().err == ""  # no progress bar when stderr is not a tty, no MindSpore log noise

    # the command line prints the same lines on stderr and the summary on stdout
    result = run_tool("--tokenizer_dir", generated_fixture("tiny-qwen2.5"), "--file_path", src,
                      "--output_path", tmp_path / "cli.mindrecord", "--dataset_type", "gsm8k",
                      "--prompt_template", "gsm8k_hash", "--max_prompt_length", 128, "--seq_length", 256,
                      cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert [line for line in result.stderr.splitlines() if line] == [str(e) for e in summary.errors]
    assert "written 2, skipped 7" in result.stdout and "too_long 1" in result.stdout


def test_strict_aborts_and_leaves_nothing(tokenizer, tmp_path, capsys):
    src = write_jsonl(tmp_path / "bad.jsonl", [{"question": "Ok?", "answer": "#### 1"}] * 1500
                      + ['{"question": "Broken"'] + [{"question": "Ok?", "answer": "#### 1"}])
    out = tmp_path / "sub" / "out.mindrecord"
    with pytest.raises(DataError, match=rf"{src}:1501: invalid JSON.*nothing was written"):
        convert(tokenizer, src, out, strict=True)
    assert leftovers(out.parent) == []
    code = tool_main("--vocab_path", generated_fixture("tiny-qwen2.5") / "vocab.json",
                     "--merges_file_path", generated_fixture("tiny-qwen2.5") / "merges.txt",
                     "--file_path", src, "--output_path", out, "--dataset_type", "gsm8k", "--strict",
                     "--prompt_template", "gsm8k_hash", "--max_prompt_length", 128)
    captured = capsys.readouterr()
    assert code == 1 and f"{src}:1501:" in captured.err and captured.out == ""
    assert leftovers(out.parent) == []


def test_cli_validates_flags(tmp_path, capsys):
    src = small_gsm8k(tmp_path / "s.jsonl", 4)
    common = ["--file_path", src, "--output_path", tmp_path / "o.mindrecord", "--dataset_type", "gsm8k"]
    with pytest.raises(SystemExit) as exit_:
        tool_main(*common)
    assert exit_.value.code == 2 and "tokenizer" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        tool_main(*common, "--tokenizer_dir", generated_fixture("tiny-qwen2.5"), "--max_prompt_length", 512,
                  "--seq_length", 512)
    assert exit_.value.code == 2 and "--seq_length" in capsys.readouterr().err
    assert tool_main(*common, "--tokenizer_dir", tmp_path) == 1 and "tokenizer.json" in capsys.readouterr().err
    assert leftovers(tmp_path) == []


def test_a_file_of_the_other_form_is_refused_naming_the_type(tmp_path, capsys):
    """GSM8K rows converted as math would train on each whole solution as the gold answer; MATH-style rows converted
    as GSM8K would all be skipped for a missing 'question'. Either ends in one line naming the type, nothing
    written; the type then named (either spelling of the flag) converts the file."""
    gsm8k = small_gsm8k(tmp_path / "g.jsonl", 3)
    maths = write_jsonl(tmp_path / "m.jsonl", [{"problem": f"What is {i} + 1?", "answer": str(i + 1)}
                                               for i in range(3)])
    tok = ["--tokenizer_dir", generated_fixture("tiny-qwen2.5"), "--max_prompt_length", 128, "--no_progress"]
    for src, wrong, right in ((gsm8k, "math", "gsm8k"), (maths, "gsm8k", "math")):
        out = tmp_path / src.stem / "out.mindrecord"
        assert tool_main(*tok, "--file_path", src, "--output_path", out, "--dataset_type", wrong) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{src}:1: " in err and f"--dataset-type {right}" in err, err
        assert not out.parent.exists() or leftovers(out.parent) == []
        assert tool_main(*tok, "--file_path", src, "--output_path", out, "--dataset-type", right) == 0
        assert len(PromptDataset(out)) == 3
    assert [PromptDataset(tmp_path / "m" / "out.mindrecord")[i].gold for i in range(3)] == ["1", "2", "3"]


# ---- atomic output --------------------------------------------------------------------------------------------

def test_overwrite_is_refused_unless_asked(tokenizer, tmp_path):
    src = small_gsm8k(tmp_path / "s.jsonl", 6)
    out = tmp_path / "out.mindrecord"
    convert(tokenizer, src, out, prompt_template="raw")
    with pytest.raises(DataError) as err:
        convert(tokenizer, src, out)
    assert str(out) in str(err.value) and "--overwrite" in str(err.value)
    assert PromptDataset(out).metadata["prompt_template"] == "raw"  # untouched
    convert(tokenizer, src, out, prompt_template="r1_zero", overwrite=True)
    ds = PromptDataset(out)
    assert ds.metadata["prompt_template"] == "r1_zero"
    assert ds[0].prompt_ids.tolist() == tokenizer.encode(render_prompt("r1_zero", ds[0].question))
    assert leftovers(tmp_path) == ["out.mindrecord", "out.mindrecord.db"]


def test_exception_mid_conversion_leaves_nothing(tokenizer, tmp_path, monkeypatch):
    src = small_gsm8k(tmp_path / "s.jsonl", 2100)  # three chunks: the failure lands after rows were written

    class FailingTokenizer:
        def __init__(self):
            self.calls = 0
            self.pad_token_id, self.vocab_size = tokenizer.pad_token_id, tokenizer.vocab_size

        def encode_batch(self, texts):
            self.calls += 1
            if self.calls == 3:
                raise RuntimeError("injected failure")
            return tokenizer.encode_batch(texts)

    with pytest.raises(RuntimeError, match="injected"):
        convert(tokenizer=FailingTokenizer(), src=src, out=tmp_path / "out.mindrecord")
    assert leftovers(tmp_path) == []

    # an existing output survives a failed overwrite untouched
    convert(tokenizer, src, tmp_path / "out.mindrecord", prompt_template="raw")
    monkeypatch.setattr(mindrecord, "_check_row_count", lambda *a: (_ for _ in ()).throw(RuntimeError("injected")))
    with pytest.raises(RuntimeError, match="injected"):
        convert(tokenizer, src, tmp_path / "out.mindrecord", overwrite=True)
    assert leftovers(tmp_path) == ["out.mindrecord", "out.mindrecord.db"]
    assert len(PromptDataset(tmp_path / "out.mindrecord")) == 2100


def test_kill_between_the_two_renames_leaves_no_readable_pair(tokenizer, tmp_path, monkeypatch):
    src = small_gsm8k(tmp_path / "s.jsonl", 5)
    out = tmp_path / "out.mindrecord"
    convert(tokenizer, src, out)
    real_replace, calls = os.replace, []

    def replace_then_die(a, b):
        calls.append(b)
        if len(calls) == 2:  # after the index moved, before the data file: the worst moment to die
            raise KeyboardInterrupt
        real_replace(a, b)

    monkeypatch.setattr(mindrecord.os, "replace", replace_then_die)
    with pytest.raises(KeyboardInterrupt):
        convert(tokenizer, src, out, prompt_template="raw", overwrite=True)
    monkeypatch.setattr(mindrecord.os, "replace", real_replace)
    assert leftovers(tmp_path) == ["out.mindrecord.db"]  # inert: no data file, so nothing can read a mixed pair
    with pytest.raises(DataError, match="does not exist"):
        PromptDataset(out)
    convert(tokenizer, src, out, prompt_template="raw")  # the lone index is cleared; no --overwrite needed
    assert leftovers(tmp_path) == ["out.mindrecord", "out.mindrecord.db"] and len(PromptDataset(out)) == 5


def test_sigkill_mid_conversion_leaves_no_output(tokenizer, tmp_path):
    """On rows of GSM8K's form made here (no GSM8K file needed): enough of them to be killed mid-way."""
    big = write_jsonl(tmp_path / "big.jsonl", [  # ~90k rows of GSM8K's length: tens of seconds of work
        {"question": f"Natalia sold clips to {i} of her friends in April, and then she sold half as many clips in "
                     f"May. How many clips did Natalia sell altogether in April and May? (case {i})",
         "answer": f"Natalia sold {i}/2 = {i / 2} clips in May.\nNatalia sold {i}+{i / 2} = {1.5 * i} clips "
                   f"altogether in April and May.\n#### {1.5 * i}"} for i in range(90_000)])
    out = tmp_path / "out" / "big.mindrecord"
    proc = subprocess.Popen([sys.executable, str(TOOL), "--tokenizer_dir", generated_fixture("tiny-qwen2.5"),
                             "--file_path", big, "--output_path", out, "--dataset_type", "gsm8k"],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        staged = []
        while not staged and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)  # wait until rows are being written into the staging folder
            staged = list(out.parent.glob(".big.mindrecord.partial-*/big.mindrecord")) if out.parent.exists() else []
        assert staged and proc.poll() is None, f"conversion never got going: {proc.stderr.read()!r}"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
    assert not out.exists() and not index_path(out).exists()
    assert [p.name.split("-")[0] for p in out.parent.iterdir()] == [".big.mindrecord.partial"]  # hidden, inert

    # the next conversion to the same path removes the dead run's staging folder, but not those of runs that may
    # be alive: this process, or a process on another host sharing the filesystem
    alive = [out.parent / f".big.mindrecord.partial-{os.getpid()}@{socket.gethostname()}-0",
             out.parent / f".big.mindrecord.partial-{proc.pid}@other-host-0"]
    for folder in alive:
        folder.mkdir()
    summary = convert(tokenizer, small_gsm8k(tmp_path / "s.jsonl", 8), out)
    assert summary.rows_written == 8 and sorted(p.name for p in out.parent.iterdir()) == sorted(
        ["big.mindrecord", "big.mindrecord.db"] + [p.name for p in alive])


# ---- files as editors save them ------------------------------------------------------------------------------

WINDOWS_ROWS = [{"question": f"Tom has {i} apples and buys 2 more. How many apples does Tom have now?",
                 "answer": f"{i} + 2 = {i + 2}\n#### {i + 2}"} for i in range(1, 6)]


def windows_gsm8k(path: Path, *, bom: bool, crlf: bool, blank: bool, final_newline: bool) -> Path:
    """WINDOWS_ROWS as a jsonl with a UTF-8 byte-order mark, CRLF line ends, blank (and whitespace-only) lines
    between rows and/or no newline after the last row."""
    end = "\r\n" if crlf else "\n"
    lines = []
    for row in WINDOWS_ROWS:
        lines.append(json.dumps(row, ensure_ascii=False))
        if blank:
            lines += ["", "  \t"]
    text = end.join(lines) + (end if final_newline else "")
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8"))
    return path


@pytest.mark.parametrize("bom,crlf,blank,final_newline", [
    (True, True, False, True),    # Notepad's "UTF-8 with BOM", CRLF
    (True, False, False, False),  # BOM alone, no final newline
    (False, True, True, False),   # CRLF with blank lines, no final newline
    (True, True, True, True),     # everything at once
])
def test_gsm8k_saved_by_a_windows_editor_converts_every_row(demo_plain, tmp_path, capsys, bom, crlf, blank,
                                                            final_newline):
    """Every row is read by read_gsm8k and written by tools/rlhf_data.py (once the BOM row was invalid JSON)."""
    src = windows_gsm8k(tmp_path / "train.jsonl", bom=bom, crlf=crlf, blank=blank, final_newline=final_newline)
    rows = list(read_dataset(src, "gsm8k"))
    assert [type(r).__name__ for r in rows] == ["Record"] * len(WINDOWS_ROWS), rows
    assert [r.question for r in rows] == [r["question"] for r in WINDOWS_ROWS]
    assert [r.gold for r in rows] == [str(i + 2) for i in range(1, 6)]
    out = tmp_path / "train.mindrecord"
    code = tool_main("--tokenizer_dir", demo_plain.model_dir, "--file_path", src, "--output_path", out,
                     "--dataset_type", "gsm8k", "--prompt_template", "gsm8k_hash", "--max_prompt_length", 64,
                     "--no_progress", "--strict")
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert f"read {len(WINDOWS_ROWS)}, written {len(WINDOWS_ROWS)}, skipped 0" in captured.out
    ds = PromptDataset(out)
    assert ds.questions == [r["question"] for r in WINDOWS_ROWS]


def test_deepscaler_saved_by_a_windows_editor_and_non_utf8_files(tmp_path):
    items = [{"problem": r["question"], "answer": r["answer"].rsplit("#### ", 1)[1]} for r in WINDOWS_ROWS]
    src = tmp_path / "ds.json"
    src.write_bytes(b"\xef\xbb\xbf" + json.dumps(items, indent=1).replace("\n", "\r\n").encode("utf-8"))
    rows = list(read_dataset(src, "deepscaler"))
    assert [r.question for r in rows] == [r["question"] for r in WINDOWS_ROWS]
    # A file in a legacy code page (or UTF-16) stops with the file and line, not a UnicodeDecodeError traceback.
    legacy = tmp_path / "gbk.jsonl"
    legacy.write_bytes(json.dumps(WINDOWS_ROWS[0]).encode() + b"\r\n" + '{"question": "苹果?", "answer": "#### 1"}'
                       .encode("gbk") + b"\r\n")
    with pytest.raises(DataError, match=r"gbk.jsonl:2: not UTF-8 text.*save the file as UTF-8"):
        list(read_dataset(legacy, "gsm8k"))
    (tmp_path / "gbk.json").write_bytes('[{"problem": "苹果?", "answer": "1"}]'.encode("gbk"))
    with pytest.raises(DataError, match=r"gbk.json: not UTF-8 text.*save it as UTF-8"):
        list(read_dataset(tmp_path / "gbk.json", "deepscaler"))


# ---- deepscaler and math17k -----------------------------------------------------------------------------------

def test_deepscaler_reader(tmp_path, tokenizer):
    src = tmp_path / "ds.json"
    src.write_text(json.dumps([
        {"problem": "Compute 1/2 + 0.", "answer": "\\frac{1}{2}"},  # 1 kept verbatim for the verifier
        {"problem": "What is 2+3?", "answer": "\\boxed{5}"},  # 2 boxed number -> 5
        {"problem": "What is 7?", "answer": 7},  # 3 bare JSON number
        "not an object",  # 4
        {"answer": "3"},  # 5 missing problem
        {"problem": "Empty?", "answer": "  "},  # 6 empty answer
        {"problem": "Money?", "answer": "$1,200.0"},  # 7 normalised
    ]))
    rows = list(read_dataset(src, "deepscaler"))
    good = [(r.line_no, r.question, r.gold) for r in rows if isinstance(r, Record)]
    bad = [(r.line_no, r.kind) for r in rows if isinstance(r, RowError)]
    assert good == [(1, "Compute 1/2 + 0.", "\\frac{1}{2}"), (2, "What is 2+3?", "5"), (3, "What is 7?", "7"),
                    (7, "Money?", "1200")]
    assert bad == [(4, "invalid_json"), (5, "missing_field"), (6, "missing_field")]
    summary = convert(tokenizer, src, tmp_path / "ds.mindrecord", dataset_type="deepscaler",
                      prompt_template="r1_zero")
    ds = PromptDataset(tmp_path / "ds.mindrecord")
    assert summary.rows_written == len(ds) == 4 and ds.golds == ["\\frac{1}{2}", "5", "7", "1200"]

    (tmp_path / "broken.json").write_text('[{"problem": "x",\n "answer": }]')
    with pytest.raises(DataError, match=r"broken.json:2: invalid JSON"):
        list(read_dataset(tmp_path / "broken.json", "deepscaler"))
    (tmp_path / "obj.json").write_text('{"problem": "x"}')
    with pytest.raises(DataError, match="JSON list"):
        list(read_dataset(tmp_path / "obj.json", "deepscaler"))


def test_math17k_reader(tmp_path, tokenizer):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    def prompt(text):
        return [{"content": text, "role": "user"}]

    table = pa.table({
        "data_source": ["math_dapo"] * 4,
        "prompt": [prompt("Solve 2+2.\n\nRemember to put your answer on its own line after \"Answer:\"."),
                   [{"content": "You are helpful.", "role": "system"}, {"content": "Solve 3*3.", "role": "user"}],
                   [{"content": "only a system turn", "role": "system"}],
                   prompt("Solve 5-1.")],
        "reward_model": [{"ground_truth": "4", "style": "rule-lighteval/MATH_v2"},
                         {"ground_truth": "9", "style": "rule"}, {"ground_truth": "1", "style": "rule"},
                         {"ground_truth": "", "style": "rule"}],
    })
    src = tmp_path / "dapo.parquet"
    pq.write_table(table, src)
    rows = list(read_dataset(src, "math17k"))
    assert [(r.line_no, r.question.split("\n")[0], r.gold) for r in rows if isinstance(r, Record)] == [
        (1, "Solve 2+2.", "4"), (2, "Solve 3*3.", "9")]
    assert [(r.line_no, r.kind) for r in rows if isinstance(r, RowError)] == [
        (3, "missing_field"), (4, "missing_field")]
    convert(tokenizer, src, tmp_path / "dapo.mindrecord", dataset_type="math17k", prompt_template="chatml")
    ds = PromptDataset(tmp_path / "dapo.mindrecord")
    assert ds.golds == ["4", "9"] and ds[1].prompt_ids.tolist() == tokenizer.encode(
        "<|im_start|>user\nSolve 3*3.<|im_end|>\n<|im_start|>assistant\n")

    pq.write_table(pa.table({"question": ["x"]}), tmp_path / "other.parquet")
    with pytest.raises(DataError, match="reward_model"):
        list(read_dataset(tmp_path / "other.parquet", "math17k"))
    with pytest.raises(DataError, match="parquet"):
        list(read_dataset(small_gsm8k(tmp_path / "g.jsonl", 2), "math17k"))


# ---- PromptDataset --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_dataset_paths(tokenizer, tmp_path_factory):
    folder = tmp_path_factory.mktemp("small")
    paths = {}
    for n in (24, 23):
        paths[n] = folder / f"n{n}.mindrecord"
        convert(tokenizer, small_gsm8k(folder / f"n{n}.jsonl", n), paths[n])
    return paths


def epoch_indices(ds, batch_size, world_size, seed, epochs=1):
    """Per rank, the list of index arrays of its batches, each rank iterating its own copy of the dataset."""
    per_rank = []
    for rank in range(world_size):
        copy = PromptDataset(ds.path)
        per_rank.append([b.indices.tolist() for b in copy.batches(batch_size, seed=seed, rank=rank,
                                                                 world_size=world_size, num_epochs=epochs)])
    return per_rank


def test_sharding_is_disjoint_and_covers_the_data(small_dataset_paths):
    ds = PromptDataset(small_dataset_paths[24])
    ranks = epoch_indices(ds, batch_size=3, world_size=2, seed=7)
    assert [len(r) for r in ranks] == [4, 4] == [ds.steps_per_epoch(3, 2)] * 2
    flat = [i for rank in ranks for batch in rank for i in batch]
    assert sorted(flat) == list(range(24))  # disjoint and complete
    for step in range(4):  # within a step the ranks hold different prompts
        assert not set(ranks[0][step]) & set(ranks[1][step])

    odd = PromptDataset(small_dataset_paths[23])  # 23 = 3 x (3 x 2) + 5: the 5 left over are dropped per epoch
    two_epochs = epoch_indices(odd, batch_size=3, world_size=2, seed=7, epochs=2)
    for epoch in range(2):
        flat = [i for rank in two_epochs for batch in rank[3 * epoch:3 * epoch + 3] for i in batch]
        assert len(flat) == len(set(flat)) == 18
    assert all(len(b) == 3 for rank in two_epochs for b in rank)


def test_shuffling_is_deterministic_per_seed_and_epoch(small_dataset_paths):
    ds = PromptDataset(small_dataset_paths[24])
    a = epoch_indices(ds, 4, 1, seed=3, epochs=2)[0]
    assert a == epoch_indices(ds, 4, 1, seed=3, epochs=2)[0]
    assert a != epoch_indices(ds, 4, 1, seed=4, epochs=2)[0]
    assert a[:6] != a[6:] and sorted(sum(a[:6], [])) == sorted(sum(a[6:], [])) == list(range(24))
    plain = PromptDataset(ds.path)
    assert [b.indices.tolist() for b in plain.batches(6, seed=0, shuffle=False, num_epochs=1)] == [
        list(range(i, i + 6)) for i in range(0, 24, 6)]


def test_batches_carry_the_stored_rows(small_dataset_paths, tokenizer):
    ds = PromptDataset(small_dataset_paths[23])
    batch = next(ds.batches(5, seed=1))
    assert len(batch) == 5 and batch.input_ids.shape == (5, 128) and batch.input_ids.dtype == np.int32
    for j, i in enumerate(batch.indices):
        row = ds[int(i)]
        assert batch.prompt_ids[j].tolist() == row.prompt_ids.tolist() == tokenizer.encode(
            render_prompt("gsm8k_hash", row.question))
        assert batch.golds[j] == row.gold == str(2 * (row.line_no - 1) + 2)
        assert (batch.input_ids[j, batch.lengths[j]:] == tokenizer.pad_token_id).all()


def test_state_dict_resumes_at_the_exact_next_batch(small_dataset_paths):
    path = small_dataset_paths[23]
    full = [b.indices.tolist() for b in PromptDataset(path).batches(2, seed=5, rank=1, world_size=2, num_epochs=3)]
    assert len(full) == 3 * 5
    first = PromptDataset(path)
    stream = first.batches(2, seed=5, rank=1, world_size=2, num_epochs=3)
    seen = [next(stream).indices.tolist() for _ in range(7)]  # crosses the first epoch boundary
    state = json.loads(json.dumps(first.state_dict()))  # survives a checkpoint round trip
    assert state["epoch"] == 1 and state["position"] == 2
    resumed = PromptDataset(path)
    resumed.load_state_dict(state)
    rest = [b.indices.tolist() for b in resumed.batches(2, seed=5, rank=1, world_size=2, num_epochs=3)]
    assert seen + rest == full

    other = PromptDataset(path)
    other.load_state_dict(state)
    with pytest.raises(ValueError, match="seed 5"):
        next(other.batches(2, seed=6, rank=1, world_size=2))
    with pytest.raises(ValueError, match="23"):
        PromptDataset(small_dataset_paths[24]).load_state_dict(state)


def test_planned_longest_prompts_match_the_batches_and_leave_the_position(small_dataset_paths):
    """The trainer compiles the prompt widths these predict, so they must be the batches' own (here across an
    epoch boundary, on rank 1 of 2, and after a resume)."""
    path = small_dataset_paths[23]
    ds = PromptDataset(path)
    stream = ds.batches(2, seed=5, rank=1, world_size=2)
    next(stream), next(stream)
    state = ds.state_dict()
    planned = ds.planned_longest_prompts(2, 9, seed=5, rank=1, world_size=2)
    assert ds.state_dict() == state
    actual = [int(next(stream).lengths.max()) for _ in range(9)]
    assert planned.tolist() == actual and len(set(actual)) > 1
    resumed = PromptDataset(path)
    resumed.load_state_dict(state)
    assert resumed.planned_longest_prompts(2, 9, seed=5, rank=1, world_size=2).tolist() == actual


def test_prompt_dataset_rejects_foreign_files(tmp_path):
    from mindspore.mindrecord import FileWriter

    foreign = tmp_path / "foreign.mindrecord"
    writer = FileWriter(str(foreign), 1)
    writer.add_schema({"input_ids": {"type": "int32", "shape": [-1]}, "label": {"type": "int32"}}, "other")
    writer.write_raw_data([{"input_ids": np.arange(4, dtype=np.int32), "label": 1}])
    writer.commit()
    with pytest.raises(DataError, match=r"not a mindgrpo prompt MindRecord: missing field\(s\) \['prompt_ids'"):
        PromptDataset(foreign)
    with pytest.raises(DataError, match="does not exist"):
        PromptDataset(tmp_path / "missing.mindrecord")
    newer = tmp_path / "newer.mindrecord"  # right fields, but a format this version cannot read
    writer = FileWriter(str(newer), 1)
    writer.add_schema(mindrecord.mindrecord_schema(4), json.dumps({"format": mindrecord.FORMAT_NAME, "version": 99}))
    writer.write_raw_data([{"prompt_ids": np.arange(4, dtype=np.int32), "prompt_length": 4, "gold": "1",
                            "question": "q", "line_no": 1}])
    writer.commit()
    with pytest.raises(DataError, match="version 99"):
        PromptDataset(newer)
    junk = tmp_path / "junk.mindrecord"
    junk.write_bytes(b"\0" * 100)
    index_path(junk).write_bytes(b"\0" * 100)
    with pytest.raises(DataError, match="not a readable MindRecord"):
        PromptDataset(junk)
    os.replace(foreign, tmp_path / "renamed.mindrecord")
    with pytest.raises(DataError, match="index"):
        PromptDataset(tmp_path / "renamed.mindrecord")
