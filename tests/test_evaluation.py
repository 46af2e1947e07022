"""mindgrpo.apps.evaluation and tools/eval_gsm8k.py: scoring of hand-made completions, maj@k voting, batching with a
fake engine, model folders (Hugging Face, run, checkpoint, step), and end-to-end runs on the tiny fixture and the
demo model (whose greedy accuracy the demo measured independently, without a KV cache)."""
import json
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from mindgrpo.data import DataError
from mindgrpo.apps.evaluation import (EvaluationError, Problem, answer_of, generate_completions, majority_vote,
                                      read_problems, score_problems, summary_path)
from mindgrpo.apps.model_source import ModelSourceError, resolve_model
from mindgrpo.rollout import FINISH_LENGTH, FINISH_STOP, RolloutResult, SamplingParams

REPO = Path(__file__).resolve().parents[1]
TOOL = REPO / "tools" / "eval_gsm8k.py"


def problems_with(*golds: str):
    return [Problem(i, i + 1, f"question {i}", gold) for i, gold in enumerate(golds)]


# ------------------------------------------------------------------------------------------------ scoring
def test_score_hand_made_greedy_completions():
    cases = [  # (completion, gold, answer, correct)
        ("She has 16 - 3 - 4 = 9 eggs, 9 * 2 = 18.\n#### 18", "18", "18", True),
        ("The answer is \\boxed{18}.", "18", "18", True),
        ("#### 1,000 dollars", "1000", "1000", True),
        ("#### $18.00", "18", "18", True),
        ("#### 17", "18", "17", False),
        ("#### 18\nwait, no.\n#### 19", "18", "19", False),  # the last marker is the final answer
        ("so the answer is 18", "18", None, False),  # no marker: training gives no reward either
        ("", "18", None, False),
        ("\x00\ufffd cent cent cent ebec", "18", None, False),
        ("#### 3/4", "18", "3/4", False),
    ]
    problems = problems_with(*(gold for _, gold, _, _ in cases))
    records, summary = score_problems(problems, [c for c, _, _, _ in cases],
                                      finish_reasons=[FINISH_STOP] * (len(cases) - 1) + [FINISH_LENGTH])
    assert [(r["answer"], r["correct"]) for r in records] == [(a, c) for _, _, a, c in cases]
    assert [r["index"] for r in records] == list(range(len(cases)))
    assert records[0]["line_no"] == 1 and records[0]["question"] == "question 0" and records[0]["gold"] == "18"
    assert "samples" not in records[0]
    assert summary == {"problems": 10, "correct": 4, "pass@1": 0.4, "no_answer": 3, "truncated": 1}


def test_fallback_last_number_follows_the_training_setting():
    problems = problems_with("18")
    assert not score_problems(problems, ["so the answer is 18"])[0][0]["correct"]
    records, _ = score_problems(problems, ["so the answer is 18"], fallback_last_number=True)
    assert records[0]["correct"] and records[0]["answer"] == "18"


def test_majority_vote():
    assert majority_vote(["5", "3", "5", None]) == ("5", 2)
    assert majority_vote([None, None, "4"]) == ("4", 1)  # no answer is no vote, however many
    assert majority_vote(["3", "5", "5", "3"]) == ("3", 2)  # tie: the answer seen first
    assert majority_vote(["5", "3", "3", "5"]) == ("5", 2)
    assert majority_vote([None, None]) == (None, 0)
    assert majority_vote([]) == (None, 0)


def test_maj_at_k_records_and_summary():
    problems = problems_with("18", "18", "7", "7")
    greedy = ["#### 18", "#### 17", "", "#### 7"]
    samples = [
        ["#### 18", "#### 17", "#### 17", "no idea"],        # majority wrong, but one sample right
        ["#### 18", "\\boxed{17}", "18.0 is it\n#### 18", ""],  # 18 twice (normalised), 17 once: right
        ["#### 6", "#### 7", "#### 8", "#### 9"],            # four-way tie: the first (6) wins, wrong
        ["", "", "garbage", "x"],                             # nobody answers: no majority, wrong
    ]
    records, summary = score_problems(problems, greedy, samples)
    assert [(r["maj_answer"], r["maj_votes"], r["maj_correct"]) for r in records] == [
        ("17", 2, False), ("18", 2, True), ("6", 1, False), (None, 0, False)]
    assert [r["pass_at_k"] for r in records] == [True, True, True, False]
    assert records[0]["sample_answers"] == ["18", "17", "17", None]
    assert records[0]["sample_correct"] == [True, False, False, False]
    assert records[1]["samples"] == samples[1]
    assert summary["samples"] == 4 and summary["pass@1"] == 0.5
    assert summary["maj@4"] == 0.25 and summary["pass@4"] == 0.75
    assert summary["sample_pass@1"] == pytest.approx((1 + 2 + 1 + 0) / 16)


def test_score_rejects_mismatched_inputs():
    with pytest.raises(ValueError, match="2 problems but 1 greedy"):
        score_problems(problems_with("1", "2"), ["#### 1"])
    with pytest.raises(ValueError, match="same number of samples"):
        score_problems(problems_with("1", "2"), ["", ""], [["a"], ["a", "b"]])


def test_answer_of_normalises_like_training():
    assert answer_of("#### 1,000.0") == "1000"
    assert answer_of("\\boxed{\\frac{1}{2}}") is not None  # non-numeric answers still vote, normalised
    assert answer_of("\\boxed{\\frac{1}{2}}") == answer_of("\\boxed{\\dfrac{1}{2}}")
    assert answer_of("no answer here 42") is None and answer_of("no answer here 42", fallback_last_number=True) == "42"


# ------------------------------------------------------------------------------------------------ input files
def test_read_problems_and_errors_name_file_and_line(tmp_path):
    good = {"question": "What is 2 + 2?", "answer": "2 + 2 = 4\n#### 4"}
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps(good) + "\n\n" + json.dumps({**good, "answer": "#### 1,234"}) + "\n")
    problems = read_problems(path)
    assert [(p.index, p.line_no, p.gold) for p in problems] == [(0, 1, "4"), (1, 3, "1234")]
    assert len(read_problems(path, limit=1)) == 1

    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text(json.dumps(good) + "\n{not json\n")
    with pytest.raises(DataError, match=f"{bad_json}:2: invalid JSON"):
        read_problems(bad_json)
    no_answer = tmp_path / "no_answer.jsonl"
    no_answer.write_text(json.dumps(good) + "\n" + json.dumps(good) + "\n" + json.dumps({**good, "answer": "4"}) + "\n")
    with pytest.raises(DataError, match=f"{no_answer}:3: .*####"):
        read_problems(no_answer)
    assert len(read_problems(no_answer, limit=2)) == 2  # --limit reads no further than it needs
    with pytest.raises(DataError, match="no such file"):
        read_problems(tmp_path / "missing.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match="holds no problems"):
        read_problems(tmp_path / "empty.jsonl")
    with pytest.raises(EvaluationError, match="--limit"):
        read_problems(path, limit=0)


def test_cli_reports_bad_input_without_a_traceback(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "#### 1"}\n[1, 2]\n')
    done = subprocess.run([sys.executable, str(TOOL), str(tmp_path), str(bad)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    assert done.returncode == 2, done.stderr
    assert f"error: {bad}:2: expected a JSON object" in done.stderr and "Traceback" not in done.stderr
    assert not list(tmp_path.glob("eval_*"))  # nothing written


# ------------------------------------------------------------------------------------------------ batching
class FakeTokenizer:
    def batch_decode(self, sequences):
        return [" ".join(map(str, seq)) for seq in sequences]


class FakeEngine:
    """Answers prompt p with tokens [len(p), sample number, seed % 100] (then a stop token), recording its calls."""

    def __init__(self):
        self.calls = []

    def generate(self, prompts, params, images=None, turns=None):
        self.calls.append(([list(p) for p in prompts], params))
        rows = [[len(p), j, params.seed % 100] for p in prompts for j in range(params.num_generations)]
        ids = np.zeros((len(rows), params.max_tokens), np.int32)
        mask = np.zeros_like(ids)
        for r, row in enumerate(rows):
            ids[r, :3], mask[r, :3] = row, 1
        return RolloutResult(ids, mask, [FINISH_STOP] * len(rows))


def test_generate_completions_batches_by_length_and_restores_order():
    prompts = [[1] * n for n in (5, 2, 9, 2, 7, 1, 3)]
    engine = FakeEngine()
    params = SamplingParams(max_tokens=4, temperature=1.0, num_generations=3, seed=11)
    texts, reasons, tokens = generate_completions(engine, FakeTokenizer(), prompts, params, batch_size=7,
                                                  progress=False)
    assert [len(call[0]) for call in engine.calls] == [2, 2, 2, 1]  # 7 rows a call = 2 prompts x 3 samples
    lengths = [len(p) for call in engine.calls for p in call[0]]
    assert lengths == sorted(lengths)  # shortest first: shape buckets are reused, not rebuilt
    for i, prompt in enumerate(prompts):  # every prompt got its own completions back, in order
        assert [t.split()[:2] for t in texts[i]] == [[str(len(prompt)), str(j)] for j in range(3)]
    assert reasons == [[FINISH_STOP] * 3] * len(prompts) and tokens == 3 * 3 * len(prompts)
    seeds = [call[1].seed for call in engine.calls]
    assert len(set(seeds)) == len(seeds)  # each chunk its own stream...
    again = FakeEngine()
    generate_completions(again, FakeTokenizer(), prompts, params, batch_size=7, progress=False)
    assert [c[1].seed for c in again.calls] == seeds  # ...reproducible from the seed


# ------------------------------------------------------------------------------------------------ model folders
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, tiny_model_dir, demo_plain):
    """A run folder as the trainer leaves it: config.yaml, a prompt MindRecord made with the `chatml` template,
    and checkpoints step 1 and 2 whose model part is written by the trainer's own writer (export_hf)."""
    import mindgrpo  # noqa: F401
    from mindgrpo.train.checkpoint import CheckpointManager
    from mindgrpo.config import GRPOConfig, dump_yaml
    from mindgrpo.data import convert_dataset
    from mindgrpo.models import build_model, export_hf
    from mindgrpo.data.tokenizer import load_tokenizer

    tiny, gsm8k = tiny_model_dir, demo_plain.test_jsonl.parent  # the demo's GSM8K-format test.jsonl
    run = tmp_path_factory.mktemp("run")
    lines = (gsm8k / "test.jsonl").read_text(encoding="utf-8").splitlines()[:8]
    (run / "train.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    convert_dataset(run / "train.jsonl", run / "train.mindrecord", load_tokenizer(tiny), dataset_type="gsm8k",
                    prompt_template="chatml", max_prompt_length=256, progress=False)
    config = GRPOConfig()
    config.rl_config.dataset_file = str(run / "train.mindrecord")
    config.rl_config.output_dir = str(run)
    config.actor_config.load = str(tiny)
    dump_yaml(config, run / "config.yaml")
    model = build_model(tiny, role="actor")
    manager = CheckpointManager(run / "checkpoints", keep_last=2)
    for step in (1, 2):
        manager.save(step, {"model": lambda d: export_hf(model, d, hf_config=model.hf_config, tokenizer_dir=tiny,
                                                        overwrite=True)})
    return run, tiny, gsm8k


def test_resolve_model_folders(tiny_run, tmp_path):
    run, tiny, _ = tiny_run
    step2 = run / "checkpoints" / "step_00000002"
    for path in (run, run / "checkpoints", step2, step2 / "model"):
        resolved = resolve_model(path)
        assert (resolved.weights_dir, resolved.tokenizer_dir, resolved.step) == (step2 / "model", step2 / "model", 2)
        assert resolved.template == "chatml"  # read from the run's training MindRecord
    plain = resolve_model(tiny)
    assert (plain.weights_dir, plain.tokenizer_dir, plain.step, plain.template) == (tiny, tiny, None, None)

    with pytest.raises(ModelSourceError, match="does not exist"):
        resolve_model(tmp_path / "nowhere")
    with pytest.raises(ModelSourceError, match="neither a Hugging Face model folder"):
        resolve_model(tmp_path)
    with pytest.raises(ModelSourceError, match="--tokenizer"):
        resolve_model(tiny, tokenizer=tmp_path)


def test_damaged_latest_checkpoint_falls_back(tiny_run, tmp_path):
    run, tiny, _ = tiny_run
    copy = tmp_path / "run"
    shutil.copytree(run / "checkpoints", copy / "checkpoints")
    weights = copy / "checkpoints" / "step_00000002" / "model" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resolved = resolve_model(copy / "checkpoints")
    assert resolved.step == 1 and any("sha256 mismatch" in str(w.message) for w in caught)
    with pytest.raises(ModelSourceError, match="sha256 mismatch"):
        resolve_model(copy / "checkpoints" / "step_00000002")  # asked for by name: refused, not replaced


def test_checkpoint_without_tokenizer_names_the_flag(tiny_run, tmp_path):
    from mindgrpo.train.checkpoint import CheckpointManager

    _, tiny, _ = tiny_run
    bare = CheckpointManager(tmp_path / "checkpoints").save(3, {"model": lambda d: [
        shutil.copy(tiny / name, d / name) for name in ("config.json", "model.safetensors")]})
    with pytest.raises(ModelSourceError, match="pass --tokenizer"):  # no tokenizer and no run config to find one
        resolve_model(bare)
    resolved = resolve_model(bare, tokenizer=tiny)
    assert (resolved.weights_dir, resolved.tokenizer_dir, resolved.step) == (bare / "model", tiny, 3)


def test_evaluate_run_folder_matches_its_weights_as_hf_folder(tiny_run, tmp_path):
    """The run's checkpoint is the fixture's weights: evaluating the run (template chatml, taken from the run) and
    the fixture with --template chatml must give the same completions."""
    from mindgrpo.apps.evaluation import evaluate

    run, tiny, gsm8k = tiny_run
    settings = dict(limit=3, max_new_tokens=6, batch_size=4, progress=False)
    from_run = evaluate(run, gsm8k / "test.jsonl", output=tmp_path / "run.jsonl", **settings)
    from_hf = evaluate(tiny, gsm8k / "test.jsonl", template="chatml", **settings)
    assert from_run.summary["step"] == 2 and from_run.summary["template"] == "chatml"
    assert [r["completion"] for r in from_run.records] == [r["completion"] for r in from_hf.records]
    written = [json.loads(line) for line in (tmp_path / "run.jsonl").read_text(encoding="utf-8").splitlines()]
    assert written == from_run.records
    assert json.loads(summary_path(tmp_path / "run.jsonl").read_text()) == from_run.summary


# ------------------------------------------------------------------------------------------------ end to end
def test_cli_end_to_end_on_tiny_fixture(tiny_model_dir, demo_plain, tmp_path):
    gsm8k_dir = demo_plain.test_jsonl.parent  # GSM8K-format rows
    out = tmp_path / "results" / "tiny.jsonl"
    done = subprocess.run(
        [sys.executable, str(TOOL), str(tiny_model_dir), str(gsm8k_dir / "test.jsonl"), "--limit", "4",
         "--max-new-tokens", "8", "--batch-size", "8", "--samples", "2", "--output", str(out)],
        capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    questions = [json.loads(line)["question"]
                 for line in (gsm8k_dir / "test.jsonl").read_text(encoding="utf-8").splitlines()[:4]]
    assert [r["index"] for r in records] == list(range(4)) and [r["question"] for r in records] == questions
    for r in records:  # every problem scored, with every field, whatever the random model wrote
        assert isinstance(r["completion"], str) and isinstance(r["correct"], bool)
        assert r["finish_reason"] in (FINISH_STOP, FINISH_LENGTH) and r["gold"]
        assert len(r["samples"]) == len(r["sample_answers"]) == len(r["sample_correct"]) == 2
        assert isinstance(r["maj_correct"], bool) and isinstance(r["pass_at_k"], bool)
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary == json.loads(summary_path(out).read_text())
    assert summary["problems"] == 4 and summary["pass@1"] == sum(r["correct"] for r in records) / 4
    assert summary["template"] == "gsm8k_hash" and summary["samples"] == 2
    assert 0 < summary["generated_tokens"] <= 4 * 8 * 3  # 4 problems x 8 tokens x (greedy + 2 samples)
    assert "pass@1 (greedy)" in done.stdout and "maj@2" in done.stdout
    assert sorted(p.name for p in out.parent.iterdir()) == ["tiny.jsonl", "tiny.summary.json"]  # no temp files


def test_demo_greedy_accuracy_matches_the_demos_own_measurement(tmp_path):
    """The demo measured its model's greedy test accuracy with full forwards and no KV cache (mindgrpo.apps.demo);
    the evaluator, through the KV-cache engine, must find the same (up to a rare near-tie flipping an argmax)."""
    from mindgrpo.apps import demo
    from mindgrpo.apps.evaluation import evaluate

    assets = demo.make_demo(demo.default_demo_dir())  # the cache examples/grpo/main.py and the notebook use
    result = evaluate(assets.model_dir, assets.test_jsonl, max_new_tokens=demo.MAX_NEW_TOKENS, batch_size=64,
                      progress=False)
    assert result.summary["problems"] == demo.NUM_TEST
    assert result.accuracy == pytest.approx(assets.facts["test_greedy_accuracy"], abs=1.5 / demo.NUM_TEST)
    assert result.summary["no_answer"] < demo.NUM_TEST // 4  # the warm start taught it to write "#### N"


def test_import_stays_light():
    """Scoring needs no MindSpore: importing mindgrpo.apps.evaluation must not load it (it loads with the first
    model)."""
    code = ("import sys, mindgrpo, mindgrpo.apps.evaluation; "
            "print('mindspore' in sys.modules, mindgrpo.evaluate is mindgrpo.apps.evaluation.evaluate)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.stdout.strip() == "False True", done.stdout + done.stderr


# ------------------------------------------------------------------------------------------------ MATH-style data
MATH_ROWS = [{"problem": "What is $\\frac{2}{4}$ in lowest terms?", "answer": "\\frac{1}{2}", "level": "Level 1"},
             {"problem": "Find $x$ if $x^2 = 2$ and $x > 0$.", "answer": "\\boxed{\\sqrt{2}}"},
             {"question": "AIME-style: how many divisors has 12?", "answer": "6"}]


def write_math_files(folder):
    import pyarrow as pa
    import pyarrow.parquet as pq

    jsonl = folder / "math.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in MATH_ROWS), encoding="utf-8")
    parquet = folder / "math.parquet"
    pq.write_table(pa.table({"problem": [r.get("problem") or r.get("question") for r in MATH_ROWS],
                             "answer": [r["answer"] for r in MATH_ROWS]}), parquet)
    return jsonl, parquet


def test_math_problems_are_read_from_jsonl_and_parquet_and_judged_with_math_verify(tmp_path):
    """``--dataset-type math`` (MATH500, AIME): problem + answer; answers compared as training's accuracy_reward
    compares them (math-verify), so equal values written differently count."""
    from mindgrpo.apps.evaluation import read_problems

    jsonl, parquet = write_math_files(tmp_path)
    for path in (jsonl, parquet):
        problems = read_problems(path, dataset_type="math")
        assert [p.gold for p in problems] == ["\\frac{1}{2}", "\\sqrt{2}", "6"]
        assert problems[2].question.startswith("AIME-style")
    problems = read_problems(jsonl, dataset_type="math")
    greedy = ["So it is \\boxed{\\dfrac{1}{2}}.", "x = \\boxed{\\sqrt 2}", "The answer is \\boxed{7}."]
    samples = [["\\boxed{0.5}", "\\boxed{1/3}"], ["\\boxed{\\sqrt{2}}", "\\boxed{\\sqrt{2}}"], ["\\boxed{6}", "#### 6"]]
    records, summary = score_problems(problems, greedy, samples)
    assert [r["correct"] for r in records] == [True, True, False]
    assert [r["pass_at_k"] for r in records] == [True, True, True] and records[1]["maj_correct"]
    assert summary["pass@1"] == pytest.approx(2 / 3)
    (tmp_path / "bad.jsonl").write_text('{"problem": "p", "answer": "1"}\n{"problem": "q"}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"bad.jsonl:2.*answer"):
        read_problems(tmp_path / "bad.jsonl", dataset_type="math")


def test_a_file_of_the_other_form_is_refused_naming_the_type_and_none_reads_the_files_form(tmp_path, capsys):
    """GSM8K rows read as math would keep each whole solution as the gold answer and mark every right answer wrong
    (exit 0); MATH-style rows read as GSM8K would stop on a missing 'question'. Each ends in one line naming the
    type to pass, before any model is loaded (the model argument here is no model at all). Without a type, the
    file's form chooses the reader."""
    from mindgrpo.apps.eval_cli import main
    from mindgrpo.data.readers import detect_dataset_type

    gsm8k = tmp_path / "gsm8k.jsonl"
    gsm8k.write_text("".join(json.dumps({"question": f"What is {i} + 2?", "answer": f"{i} + 2 = {i + 2}\n#### {i + 2}"})
                             + "\n" for i in range(3)), encoding="utf-8")
    math_jsonl, parquet = write_math_files(tmp_path)
    with pytest.raises(DataError, match=r"gsm8k.jsonl:1: a GSM8K row .*--dataset-type gsm8k"):
        read_problems(gsm8k, dataset_type="math")
    with pytest.raises(DataError, match=r"math.jsonl:1: a MATH-style row .*--dataset-type math"):
        read_problems(math_jsonl, dataset_type="gsm8k")
    for data, wrong, right in ((gsm8k, "math", "gsm8k"), (math_jsonl, "gsm8k", "math")):
        out = tmp_path / f"eval_{wrong}.jsonl"
        assert main([str(tmp_path / "no_model"), str(data), "--dataset-type", wrong, "--output", str(out),
                     "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"--dataset-type {right}" in err and not out.exists()
    assert [p.gold for p in read_problems(gsm8k)] == ["2", "3", "4"]
    assert [p.gold for p in read_problems(math_jsonl)] == ["\\frac{1}{2}", "\\sqrt{2}", "6"]
    assert [detect_dataset_type(p) for p in (gsm8k, math_jsonl, parquet)] == ["gsm8k", "math", "math"]


def test_eval_cli_runs_math_problems(tmp_path, demo_plain):
    from mindgrpo.apps.eval_cli import main

    jsonl, _ = write_math_files(tmp_path)
    out = tmp_path / "eval.jsonl"
    assert main([str(demo_plain.model_dir), str(jsonl), "--max-new-tokens", "8",  # the file's form: math
                 "--output", str(out), "--no-progress"]) == 0
    summary = json.loads(summary_path(out).read_text())
    assert summary["dataset_type"] == "math" and summary["problems"] == 3
    assert "tools" not in summary  # a plain Hugging Face folder: no run, no tools
