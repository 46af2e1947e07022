"""LoRA GRPO end to end on the demo model (made locally): the adapters reach the rollout engine, the backbone is
the reference and never moves, step 1's KL is 0, checkpoints are PEFT folders that resume exactly, and a rollout
that reads stale adapters stops the run."""
import shutil

import numpy as np
import pytest
from mindspore import Parameter, ParameterTuple

from conftest import small_run_config
from mindgrpo.models.lora import adapter_parameters, read_peft_spec
from mindgrpo.models.weights import hf_parameters, host_array
from mindgrpo.train.metrics import read_metrics

RANK = 4


def lora_config(out, demo_prompts, demo_plain, **rl):
    config = small_run_config(out, demo_prompts, demo_plain.model_dir, max_prompt_length=64, seq_length=80,
                              max_tokens=8, verifiers=["toy_verifiers:text_length"], **rl)
    config.actor_config.lora_rank = RANK
    config.actor_config.lora_alpha = 8.0
    config.actor_config.lr_schedule.learning_rate = 1e-2  # adapters move visibly in a step
    return config


def adapters_of(trainer):
    return {name: host_array(p) for name, p in adapter_parameters(trainer.worker.actor).items()}


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, demo_prompts, demo_plain):
    """Four LoRA steps, checkpoints at 2 and 4."""
    from mindgrpo.train.trainer import GRPOTrainer

    out = tmp_path_factory.mktemp("lora_run")
    trainer = GRPOTrainer(lora_config(out, demo_prompts, demo_plain, max_steps=4))
    backbone = {name: host_array(p) for name, p in hf_parameters(trainer.worker.actor).items()}
    trainer.train()
    return out, trainer, backbone


def test_adapters_reach_the_rollout_and_the_backbone_is_the_reference(lora_run):
    """Every step the rollout engine's log-probs of its samples equal the training forward's (1e-5: it decodes
    with the adapters the update just wrote); step 1's KL is exactly 0 (B = 0) and later ones are not; only the
    adapters are trained and the backbone ends bit for bit where it started."""
    out, trainer, backbone = lora_run
    records = read_metrics(out)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    for record in records:
        assert record["rollout/logprob_diff_max"] <= 1e-5, record
    assert records[0]["actor/kl_loss"] == 0.0
    assert all(r["actor/kl_loss"] > 0 for r in records[1:])
    assert trainer.worker.reference is None  # no second copy of the weights
    assert set(trainer.worker.param_names) == set(adapter_parameters(trainer.worker.actor))
    for name, param in hf_parameters(trainer.worker.actor).items():
        np.testing.assert_array_equal(host_array(param), backbone[name], err_msg=name)
    assert any(np.abs(v).max() > 0 for k, v in adapters_of(trainer).items() if ".lora_B." in k)


def test_checkpoints_are_peft_folders_and_resume_exactly(lora_run, tmp_path, demo_prompts, demo_plain):
    """A checkpoint's model folder is the adapters' PEFT folder (tensors equal the trainer's); resuming from step 2
    ends on step 4's adapters exactly."""
    from mindgrpo.train.trainer import GRPOTrainer

    out, trainer, _ = lora_run
    step4 = out / "checkpoints" / "step_00000004" / "model"
    assert sorted(p.name for p in step4.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert read_peft_spec(step4).rank == RANK
    final = adapters_of(trainer)

    resumed_out = tmp_path / "resumed"
    shutil.copytree(out / "checkpoints" / "step_00000002", resumed_out / "checkpoints" / "step_00000002")
    resumed = GRPOTrainer(lora_config(resumed_out, demo_prompts, demo_plain, max_steps=4, resume_training=True))
    assert resumed.step == 2
    resumed.train()
    for name, value in adapters_of(resumed).items():
        np.testing.assert_array_equal(value, final[name], err_msg=name)


def test_stale_adapters_in_the_rollout_stop_the_run(tmp_path, monkeypatch, demo_prompts, demo_plain):
    """Break the sync on purpose: the rollout engine decodes with copies of the adapters taken at the start. The
    gap check sees the rollout sample another policy at step 2 and stops the run naming the sync."""
    from mindgrpo.rollout.backends import native
    from mindgrpo.train.trainer import GRPOTrainer, TrainingError

    built = native.NativeRolloutEngine.__init__

    def with_stale_adapters(engine, actor, **options):
        """The engine as built, then its adapters swapped for copies that no update reaches."""
        built(engine, actor, **options)
        fresh = {id(p) for p in adapter_parameters(actor).values()}
        engine.weights.params = ParameterTuple([
            Parameter(p.value().copy(), name=f"stale.{p.name}", requires_grad=False) if id(p) in fresh else p
            for p in engine.weights.params])

    monkeypatch.setattr(native.NativeRolloutEngine, "__init__", with_stale_adapters)
    trainer = GRPOTrainer(lora_config(tmp_path / "run", demo_prompts, demo_plain, max_steps=3))
    with pytest.raises(TrainingError, match="step 2: .*sync of the LoRA adapters to the rollout engine"):
        trainer.train()
    first = read_metrics(tmp_path / "run")[0]
    assert first["rollout/logprob_diff_max"] <= 1e-5  # step 1 sampled the same (initial) adapters


def test_eval_and_logprobs_take_the_base_plus_the_adapter_folder(lora_run, demo_plain):
    """A LoRA run's checkpoint is evaluated as the base plus its adapters: `mindgrpo.logprobs` with `adapter_dir`
    equals the trained policy's own forward (and not the base's), and `evaluate` on the run folder finds the
    adapter folder and its base by itself."""
    import mindgrpo
    from mindgrpo.apps.evaluation import evaluate
    from mindgrpo.apps.model_source import resolve_model

    out, trainer, _ = lora_run
    adapter = out / "checkpoints" / "step_00000004" / "model"
    rng = np.random.default_rng(0)
    ids = rng.integers(3, trainer.worker.actor.spec.vocab_size, (2, 10))
    mask = np.ones_like(ids)
    tuned = mindgrpo.logprobs(demo_plain.model_dir, ids, mask, adapter_dir=adapter, mode="pynative")
    base = mindgrpo.logprobs(demo_plain.model_dir, ids, mask, mode="pynative")
    from mindgrpo.models.scoring import SequenceScorer

    policy = SequenceScorer(demo_plain.model_dir)
    policy.model = trainer.worker.actor  # the trained actor itself: backbone and adapters as they ended
    np.testing.assert_allclose(tuned, policy(ids, mask, mode="pynative"), atol=1e-5)
    assert np.abs(tuned - base).max() > 1e-3

    resolved = resolve_model(out)
    assert resolved.adapter_dir == adapter and resolved.weights_dir.resolve() == demo_plain.model_dir.resolve()
    result = evaluate(out, demo_plain.test_jsonl, limit=4, max_new_tokens=8, batch_size=4, progress=False)
    assert result.summary["adapter"] == str(adapter.resolve()) and len(result.records) == 4
