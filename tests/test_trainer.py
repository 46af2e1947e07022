"""GRPOTrainer end to end on the tiny fixture: metrics, checkpoints, refused layouts, precompile (padded and packed
micro-batches) and skipped updates. Exact resume after SIGKILL and msrun data parallel are in tests/test_faults.py
(on a locally made model)."""
import json
from pathlib import Path

import numpy as np
import pytest

from conftest import small_run_config
from mindgrpo.config import GRPOConfig
from mindgrpo.train.metrics import METRIC_NAMES, read_metrics


@pytest.fixture(scope="module")
def prompts(tmp_path_factory, tiny_model_dir):
    """48 GSM8K-format questions, each five of the demo's problems in a row (the answer is the last one's), whose
    prompts (gsm8k_hash template) are 65..128 tokens long: one shape bucket, so the step graphs compile once."""
    from mindgrpo.apps.demo.problems import make_problems
    from mindgrpo.data import convert_dataset, render_prompt
    from mindgrpo.data.tokenizer import load_tokenizer

    folder = tmp_path_factory.mktemp("prompts")
    tokenizer = load_tokenizer(tiny_model_dir)
    problems, _ = make_problems(seed=1)
    rows = [{"question": " ".join(p["question"] for p in problems[k:k + 5]), "answer": problems[k + 4]["answer"]}
            for k in range(0, len(problems) - 4, 5)]
    rows = [row for row in rows if 65 <= len(tokenizer.encode(render_prompt("gsm8k_hash", row["question"]))) <= 128]
    assert len(rows) >= 48, len(rows)
    (folder / "small.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows[:48]), encoding="utf-8")
    out = folder / "small.mindrecord"
    convert_dataset(folder / "small.jsonl", out, tokenizer, dataset_type="gsm8k",
                    prompt_template="gsm8k_hash", max_prompt_length=192, progress=False)
    return out


def make_config(out: Path, dataset: Path, model: Path, **rl) -> GRPOConfig:
    """A small run on the GSM8K-format prompts of the fixture model (see conftest.small_run_config)."""
    return small_run_config(out, dataset, model, **{"max_prompt_length": 192, "seq_length": 256, **rl},
                            max_tokens=12, verifiers=["accuracy_reward", "toy_verifiers:text_length"])


def final_weights(run: Path) -> dict:
    from safetensors.numpy import load_file

    newest = sorted((run / "checkpoints").glob("step_*"))[-1]
    return load_file(newest / "model" / "model.safetensors")


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, prompts, tiny_model_dir):
    """Two steps in one process; shared by the checks below (one compile for all of them)."""
    from mindgrpo.train.trainer import GRPOTrainer

    out = tmp_path_factory.mktemp("run")
    trainer = GRPOTrainer(make_config(out, prompts, tiny_model_dir, max_steps=2, num_iterations=2))
    trainer.train()
    return out, trainer


def test_metrics_jsonl_and_tensorboard_have_every_metric(trained_run):
    out, _ = trained_run
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    expected = set(METRIC_NAMES) | {"grpo/rewards/accuracy_reward", "grpo/rewards/text_length"}
    missing = expected - set(rows[-1])
    assert not missing, missing
    assert all(np.isfinite(rows[-1][name]) for name in expected)
    assert rows[-1]["response_length/max"] <= 12 and rows[-1]["timing/all"] > 0
    # the peak RSS is this process's (the trainer ran in it): at most the kernel's high-water mark, never falling
    high_water_gib = next(int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines()
                          if line.startswith("VmHWM:")) / 2**20
    assert 0.1 < rows[0]["memory/peak_rss_gib"] <= rows[1]["memory/peak_rss_gib"] <= high_water_gib
    assert rows[-1]["actor/kl_loss"] > 0  # two passes over each batch: the policy moved away from the reference
    events = list((out / "tensorboard").glob("events.out.tfevents.*"))
    assert events and sum(e.stat().st_size for e in events) > 1000
    blob = b"".join(e.read_bytes() for e in events)
    for name in expected:
        assert name.encode() in blob, name


def test_completions_and_checkpoint(trained_run):
    out, trainer = trained_run
    records = [json.loads(line) for line in (out / "completions.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(records) == 2 * 2 * 4 and {"prompt", "completion", "gold", "reward", "rewards"} <= set(records[0])
    assert records[0]["prompt"].startswith("<|im_start|>user\n")
    ckpt = out / "checkpoints" / "step_00000002"
    assert (ckpt / "manifest.json").is_file()
    assert {"model", "optimizer", "trainer"} <= {p.name for p in ckpt.iterdir()}
    from mindgrpo.models import state_dict_hf

    saved, live = final_weights(out), state_dict_hf(trainer.worker.actor)
    assert saved.keys() == live.keys()
    for name in saved:
        np.testing.assert_array_equal(saved[name], live[name])


def test_weights_moved(trained_run, tiny_model_dir):
    from mindgrpo.models import build_model, state_dict_hf

    _, trainer = trained_run
    start = state_dict_hf(build_model(tiny_model_dir, role="reference"))
    now = state_dict_hf(trainer.worker.actor)
    assert max(np.abs(now[k] - start[k]).max() for k in now) > 1e-4


def test_layouts_that_cannot_run_are_refused_before_loading_anything():
    """Layouts the models cannot share (a reference split differently from the actor) are refused when the
    config is validated, before any process group or weight."""
    from mindgrpo.config import ConfigError, GRPOConfig
    from mindgrpo.train.trainer import GRPOTrainer

    config = GRPOConfig()
    config.actor_config.parallel_config.model_parallel = 2
    config.ref_config.parallel_config.model_parallel = 4
    with pytest.raises(ConfigError, match="ref_config.parallel_config.model_parallel = 4 differs"):
        GRPOTrainer(config, check_paths=False)


def test_precompile_leaves_the_weights_and_a_skipped_update_keeps_them(tmp_path, prompts, tiny_model_dir):
    """precompile() runs a dummy micro-batch and drops its gradients; a non-finite update is skipped the same way.
    Either must leave the weights, the optimizer and the accumulated gradients as they were, and after precompile
    the run's steps compile nothing but the first update's gradient-norm and AdamW graphs."""
    from mindgrpo.models import state_dict_hf
    from mindgrpo.train.trainer import GRPOTrainer

    trainer = GRPOTrainer(make_config(tmp_path / "run", prompts, tiny_model_dir, max_steps=2))
    worker = trainer.worker

    def assert_unchanged(weights, optimizer_steps):
        now = state_dict_hf(worker.actor)
        assert all(np.array_equal(now[k], weights[k]) for k in weights)
        assert all(not acc.asnumpy().any() for acc in worker._accumulators)
        assert worker.optimizer.step_count == optimizer_steps

    initial = state_dict_hf(worker.actor)
    trainer.precompile()
    assert_unchanged(initial, 0)
    graphs = worker.compiled_graphs()
    trainer.train_step()
    assert worker.compiled_graphs() - graphs == 2

    # Advantages this large overflow the gradients to inf (a NaN advantage would zero them in the clipped branch),
    # so the skipped update has non-zero accumulated gradients to drop.
    trained = state_dict_hf(worker.actor)
    rollouts = trainer.last_rollouts
    huge = np.full(len(rollouts.completion_ids), 3e38, np.float32)
    metrics = worker.update(rollouts, huge, None, np.zeros(rollouts.completion_mask.shape, np.float32), total_steps=2)
    assert metrics["skipped"] == 1.0
    assert_unchanged(trained, 1)


def test_packed_micro_batches_compile_once(tmp_path, prompts, tiny_model_dir):
    """With actor_config.max_tokens_per_micro_batch every packed forward of a prompt width has one shape, whatever
    the completions' lengths: after precompile the steps compile nothing but the first update's gradient-norm and
    AdamW graphs."""
    from mindgrpo.train.trainer import GRPOTrainer

    config = make_config(tmp_path / "run", prompts, tiny_model_dir, max_steps=2, num_iterations=2)
    config.actor_config.max_tokens_per_micro_batch = 24  # two rows of the 12-token limit per forward
    trainer = GRPOTrainer(config)
    trainer.precompile()
    graphs = trainer.worker.compiled_graphs()
    metrics = trainer.train()
    assert trainer.worker.compiled_graphs() - graphs == 2
    assert all(np.isfinite(metrics[key]) for key in ("actor/loss", "actor/kl_loss", "actor/entropy", "grad_norm"))
