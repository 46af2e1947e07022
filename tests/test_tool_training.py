"""Tools in a training run: the data offers them, the trainer answers the turns that call them, and the step's
metrics, completions log and loss see them; mismatches between the data's tools and the config's are refused
before anything is built."""
import json

import numpy as np
import pytest

from mindgrpo.config import ConfigError
from mindgrpo.data import DataError
from mindgrpo.tools import ToolCall, responses_text, system_turn

from conftest import convert_demo_rows, msrun_group, small_run_config


PROMPT_LENGTH = 768  # the demo tokenizer (trained on GSM8K) spends about 620 tokens on Qwen2.5's tool system turn


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory, demo_plain):
    """The demo model with room for the tool system turn (RoPE: only the config's position limit changes)."""
    import shutil

    folder = tmp_path_factory.mktemp("tool_model") / "model"
    shutil.copytree(demo_plain.model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config["max_position_embeddings"] = 2048
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def tool_prompts(tmp_path_factory, demo_plain):
    """8 demo prompts converted with --tools calculator."""
    return convert_demo_rows(tmp_path_factory.mktemp("tool_prompts"), demo_plain, 8, max_prompt_length=PROMPT_LENGTH,
                             tools=["calculator"])


def config_for(out, dataset, model, verifiers=("accuracy",), **rl):
    rl = {"max_steps": 2, "save_ckpt_interval": 0, **rl}
    return small_run_config(out, dataset, model, max_prompt_length=PROMPT_LENGTH, seq_length=PROMPT_LENGTH + 128,
                            max_tokens=128, verifiers=verifiers, mode="pynative", **rl)


def every_turn_calls(text):
    """Every model turn read as a calculator call: the random demo model writes none."""
    return [ToolCall("calculator", {"expression": "127 * 46"})]


def train_with_tools(out, tool_prompts, tool_model, steps, resume=False):
    from mindgrpo.tools import turns
    from mindgrpo.train.trainer import GRPOTrainer

    # a dense reward (the completion's length), so every step moves the weights and a resume that lost state shows
    config = config_for(out, tool_prompts, tool_model, ["toy_verifiers:text_length"], tools=["calculator"],
                        max_tool_turns=2, max_steps=steps, save_ckpt_interval=1, resume_training=resume)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(turns, "parse_calls", every_turn_calls)
        trainer = GRPOTrainer(config)
        metrics = trainer.train()
    return trainer, metrics


@pytest.fixture(scope="module")
def tool_run(tmp_path_factory, tool_prompts, tool_model):
    """Two steps in which each completion's first turns are answered by the real tool workers, through the rollout
    engine, until max_tool_turns."""
    out = tmp_path_factory.mktemp("tool_run") / "run"
    return out, *train_with_tools(out, tool_prompts, tool_model, 2)


def test_a_run_with_tools_answers_calls_and_trains_on_the_models_tokens(tool_run, tool_prompts, demo_plain):
    from mindgrpo.data import PromptDataset
    from mindgrpo.data.tokenizer import load_tokenizer
    from mindgrpo.tools import resolve_tools

    tokenizer = load_tokenizer(demo_plain.model_dir)
    dataset = PromptDataset(tool_prompts)
    prompt = tokenizer.decode(dataset[0].prompt_ids, skip_special_tokens=False)
    assert prompt.startswith(system_turn([resolve_tools(["calculator"])[0].signature]))
    out, trainer, metrics = tool_run
    rollouts = trainer.last_rollouts
    answer = tokenizer.encode(responses_text(["5842"]))
    tool = rollouts.tool_mask.astype(bool)
    assert tool.any() and not (tool & (rollouts.completion_mask == 0)).any()
    for ids, row_tool in zip(rollouts.completion_ids, tool):
        starts = np.flatnonzero(row_tool & ~np.concatenate([[False], row_tool[:-1]]))
        for start in starts:  # each response is the template's answer, whole (a cut one ends at the limit)
            piece = ids[start:start + len(answer)].tolist()
            assert piece == answer[:len(piece)]
        assert len(starts) <= 2
    np.testing.assert_array_equal(rollouts.loss_mask, rollouts.completion_mask * ~tool)
    assert metrics["tools/calls_per_completion"] > 0 and metrics["tools/errors"] == 0
    assert metrics["tools/turns_per_completion"] > 1 and metrics["tools/response_tokens_per_completion"] > 0
    assert metrics["timing/tools"] > 0 and np.isfinite(metrics["actor/loss"])
    records = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    assert any("<tool_response>\n5842\n</tool_response>" in r["transcript"] for r in records)
    assert all("<tool_response>" not in r["completion"] for r in records)  # the verifiers read the model's text


def test_a_run_with_tools_resumes_exactly(tool_run, tmp_path, tool_prompts, tool_model):
    """Two steps straight, or one step, a checkpoint and a resumed second: the second step samples the same
    completions (model tokens and tool answers), masks them alike and ends on the same weights."""
    from safetensors.numpy import load_file

    straight_dir, straight, _ = tool_run
    train_with_tools(tmp_path / "split", tool_prompts, tool_model, 1)
    resumed, _ = train_with_tools(tmp_path / "split", tool_prompts, tool_model, 2, resume=True)
    assert resumed.step == 2 and straight.last_rollouts.tool_mask.any()
    for field in ("completion_ids", "tool_mask", "loss_mask"):
        np.testing.assert_array_equal(getattr(resumed.last_rollouts, field), getattr(straight.last_rollouts, field),
                                      err_msg=field)
    weights = [load_file(run / "checkpoints" / "step_00000002" / "model" / "model.safetensors")
               for run in (straight_dir, tmp_path / "split")]
    first = load_file(tmp_path / "split" / "checkpoints" / "step_00000001" / "model" / "model.safetensors")
    assert max(np.abs(weights[0][name] - first[name]).max() for name in first) > 1e-4  # step 2 moved them
    for name in weights[0]:
        np.testing.assert_allclose(weights[1][name], weights[0][name], atol=1e-6, rtol=0, err_msg=name)


def test_the_datas_tools_and_the_configs_must_agree(tmp_path, tool_prompts, demo_prompts, tool_model):
    from mindgrpo.train.trainer import GRPOTrainer

    with pytest.raises(DataError, match=r"converted with --tools calculator, but rl_config.tools = \[\]"):
        GRPOTrainer(config_for(tmp_path / "a", tool_prompts, tool_model))
    with pytest.raises(DataError, match=r"converted with no --tools, but rl_config.tools = \['calculator'\]"):
        GRPOTrainer(config_for(tmp_path / "b", demo_prompts, tool_model, tools=["calculator"]))
    with pytest.raises(ConfigError, match="rl_config.tools: unknown tool 'calculater'"):
        GRPOTrainer(config_for(tmp_path / "c", tool_prompts, tool_model, tools=["calculater"]))
    assert not (tmp_path / "a").exists() and not (tmp_path / "c").exists()  # refused before anything was written


def test_data_cli_refuses_tools_a_template_cannot_offer(tmp_path, demo_plain):
    from mindgrpo.apps.data_cli import main

    rows = demo_plain.train_jsonl.read_text(encoding="utf-8").splitlines(keepends=True)[:2]
    (tmp_path / "train.jsonl").write_text("".join(rows), encoding="utf-8")
    common = ["--tokenizer_dir", str(demo_plain.model_dir), "--file_path", str(tmp_path / "train.jsonl"),
              "--dataset_type", "gsm8k", "--no_progress"]
    assert main(common + ["--output_path", str(tmp_path / "a.mindrecord"), "--prompt_template", "raw",
                          "--tools", "calculator"]) == 1
    assert main(common + ["--output_path", str(tmp_path / "b.mindrecord"), "--tools", "calculater"]) == 1
    assert not list(tmp_path.glob("*.mindrecord"))


def test_eval_with_tools_offers_them_and_answers_the_calls(tmp_path, tool_model, demo_plain, monkeypatch):
    """``mindgrpo eval --tools calculator``: the prompts offer the tool, the rollouts answer its calls (every turn
    read as a call here: the random demo model writes none) and the summary counts them."""
    from mindgrpo.apps.evaluation import EvaluationError, evaluate
    from mindgrpo.tools import turns

    monkeypatch.setattr(turns, "parse_calls", lambda text: [ToolCall("calculator", {"expression": "127 * 46"})])
    common = dict(limit=4, max_new_tokens=128, batch_size=16, samples=4, progress=False)  # greedy rarely stops
    result = evaluate(tool_model, demo_plain.test_jsonl, tools=["calculator"], max_tool_turns=1, **common)
    assert result.summary["tools"] == ["calculator"] and result.summary["tool_calls"] > 0
    assert result.summary["tool_errors"] == 0
    assert all("<tool_response>" not in r["completion"] for r in result.records)  # scored on the model's turns
    with pytest.raises(EvaluationError, match="^--tools: .*calculater"):  # a misspelt tool, named before decoding
        evaluate(tool_model, demo_plain.test_jsonl, tools=["calculater"], max_tool_turns=1, **common)


@msrun_group
def test_a_tensor_parallel_group_reads_its_first_ranks_tool_answers(tmp_path, tiny_model_dir):
    """Under tensor parallelism the ranks of a group decode the same rows: the group's first rank runs the tools and
    every rank reads its answers (a tool that answers with its worker's process id gives two ranks different
    texts otherwise); the other ranks start no tool worker."""
    from msrun_jobs import TESTS, msrun

    logs = msrun([TESTS / "tool_group_job.py", tiny_model_dir], tmp_path / "logs", workers=2, timeout=300)
    runs = {r["rank"]: r for r in (json.loads(line.split("ANSWERS ", 1)[1]) for line in logs.splitlines()
                                   if "ANSWERS " in line)}
    assert sorted(runs) == [0, 1]
    assert runs[0]["answers"] == runs[1]["answers"]
    none, answered, over_limit = runs[0]["answers"]
    assert none is None and answered is not None and over_limit is None
    assert runs[0]["workers"] == 1 and runs[1]["workers"] == 0
    assert runs[0]["stats"]["calls"] == 1 and runs[1]["stats"]["calls"] == 0
