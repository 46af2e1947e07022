"""GRPOTrainer on the tiny Qwen2.5-VL fixture with a geo3k MindRecord (images of two sizes), in GRAPH mode: nothing
compiles after precompile, the vision tower runs once per prompt per step and stays frozen, a resumed run repeats the
next step exactly, and the checkpoint's folder loads in transformers' Qwen2_5_VLForConditionalGeneration."""
import numpy as np
import pytest

from conftest import small_run_config

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("PIL")

ROWS = 4  # prompts: 2 steps of 2


@pytest.fixture(scope="module")
def geo3k_prompts(tmp_path_factory, vl_dir):
    """Four geo3k rows over the fixture's two images (112 x 84 and 200 x 150: 12 and 35 image tokens)."""
    from mindgrpo.data import convert_dataset
    from mindgrpo.data.images import ImageProcessorConfig
    from mindgrpo.data.tokenizer import load_tokenizer

    folder = tmp_path_factory.mktemp("geo3k")
    pngs = [(vl_dir / f"image_{i}.png").read_bytes() for i in range(2)]
    image_type = pa.list_(pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    table = pa.table({"images": pa.array([[{"bytes": pngs[i % 2], "path": f"{i}.png"}] for i in range(ROWS)],
                                         type=image_type),
                      "problem": [f"<image>Find x in figure {i}." for i in range(ROWS)],
                      "answer": [str(i + 2) for i in range(ROWS)]})
    pq.write_table(table, folder / "train.parquet")
    out = folder / "train.mindrecord"
    summary = convert_dataset(folder / "train.parquet", out, load_tokenizer(vl_dir), dataset_type="geo3k",
                    prompt_template="geo3k", max_prompt_length=160, progress=False,
                    image_config=ImageProcessorConfig.from_pretrained(vl_dir))
    assert summary.rows_written == ROWS, summary.errors
    return out


def make_config(out, dataset, model, **rl):
    cfg = small_run_config(out, dataset, model, max_prompt_length=160, seq_length=176, max_tokens=8,
                           verifiers=["geo3k_reward", "toy_verifiers:text_length"], mode="graph",
                           save_ckpt_interval=1, **rl)
    cfg.rl_config.seed = 3
    cfg.generate_config.sampling_config.temperature = 1.0
    cfg.actor_config.max_tokens_per_micro_batch = 16  # the packed forwards (the update's) ...
    cfg.ref_config.ref_model_batch_size = 4           # ... and, when they are off, the shared ones: both compile
    return cfg


@pytest.fixture(scope="module")
def vl_run(tmp_path_factory, geo3k_prompts, vl_dir):
    """Precompile, then two steps with a checkpoint after each; the second step's metrics kept for the resume."""
    from mindgrpo.train.trainer import GRPOTrainer

    out = tmp_path_factory.mktemp("vl_run")
    trainer = GRPOTrainer(make_config(out, geo3k_prompts, vl_dir))
    tower = {name: p.asnumpy().copy() for name, p in trainer.worker.actor.vision.tower.parameters_and_names()}
    trainer.precompile()
    graphs = trainer.worker.compiled_graphs()
    embedded = trainer.worker.actor.vision.prompts_embedded
    steps, after = [], []
    for _ in range(2):
        steps.append(trainer.train_step())
        after.append(trainer.worker.compiled_graphs())
        trainer.save_checkpoint()
    return {"out": out, "trainer": trainer, "tower": tower, "graphs": graphs, "after": after, "embedded": embedded,
            "steps": steps}


def test_vl_steps_compile_nothing_after_precompile_and_embed_each_prompt_once(vl_run):
    trainer = vl_run["trainer"]
    # as for text (tests/test_trainer.py), only the gradient reduction and the optimizer step compile at the first
    # update; the rollout (image prefill and decode), the vision tower and the forwards were all precompiled
    assert vl_run["after"] == [vl_run["graphs"] + 2] * 2, "a VL step compiled a graph after precompile"
    # 2 steps x 2 prompts: the tower ran once per prompt per step, not once per completion or per forward
    assert trainer.worker.actor.vision.prompts_embedded - vl_run["embedded"] == 2 * 2
    rollouts = trainer.last_rollouts
    assert rollouts.vision is not None and rollouts.vision.positions.shape[1:] == rollouts.prompt_ids.shape
    for step in vl_run["steps"]:
        assert np.isfinite(step["actor/loss"]) and step["timing/vision"] > 0
        assert step["actor/kl_loss"] >= 0


def test_vl_tower_is_frozen_and_out_of_the_optimizer(vl_run):
    trainer = vl_run["trainer"]
    tower = trainer.worker.actor.vision.tower
    assert not any(p.requires_grad for p in tower.get_parameters())
    optimized = {id(p) for p in trainer.worker.params}
    assert not optimized & {id(p) for p in tower.get_parameters()}
    assert all(np.array_equal(p.asnumpy(), vl_run["tower"][name]) for name, p in tower.parameters_and_names())
    assert trainer.worker.reference is not None and not hasattr(trainer.worker.reference, "visual")


def test_vl_checkpoint_loads_in_transformers_with_the_trained_weights(vl_run, vl_dir):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from safetensors.numpy import load_file

    folder = vl_run["out"] / "checkpoints" / "step_00000002" / "model"
    model, info = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
        folder, torch_dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    saved, source = load_file(folder / "model.safetensors"), load_file(vl_dir / "model.safetensors")
    visual = [name for name in saved if name.startswith("visual.")]
    assert visual and all(np.array_equal(saved[n], source.get(n, source.get("model." + n))) for n in visual)
    moved = [n for n in saved
             if not n.startswith("visual.") and n in source and not np.array_equal(saved[n], source[n])]
    assert moved, "the language model's weights did not change"
    state = model.state_dict()
    name = "lm_head.weight"
    assert np.array_equal(state[name].numpy(), saved[name])


def test_vl_resume_repeats_the_next_step(vl_run, geo3k_prompts, vl_dir):
    """Resumed from the step-1 checkpoint, step 2 samples the same completions and computes the same update."""
    import shutil

    from mindgrpo.train.trainer import GRPOTrainer

    out = vl_run["out"]
    shutil.rmtree(out / "checkpoints" / "step_00000002")
    trainer = GRPOTrainer(make_config(out, geo3k_prompts, vl_dir, resume_training=True))
    assert trainer.step == 1
    again, first = trainer.train_step(), vl_run["steps"][1]
    for key in ("grpo/rewards/mean", "response_length/mean", "actor/loss", "actor/kl_loss", "grad_norm"):
        assert again[key] == pytest.approx(first[key], rel=1e-5, abs=1e-7), key


def test_vl_training_forwards_score_what_the_rollout_sampled(vl_run, geo3k_prompts):
    """The wiring end to end: a fresh rollout's log-probs (the engine's image prefill and M-RoPE decode) equal the
    actor's log-probs of the same completions computed as the step computes them, packed (the run's path) and
    shared-prompt: image features in their slots, completions at positions P + rope_delta + t."""
    from mindgrpo.models import SharedPromptForward
    from mindgrpo.train.step_batch import step_batch
    from mindgrpo.train.step_graphs import CompletionLogProbs

    trainer = vl_run["trainer"]
    worker, g = trainer.worker, trainer.config.rl_config.num_generations
    # The step's own path: a generation round (each prompt's images through the tower once, the rollout with
    # them), assembled into the batch the forwards read, with the engine's log-probs of the sampled tokens.
    rollouts = trainer._rollout_and_score({}).rollouts
    sampled, real = rollouts.sampling_logp, rollouts.completion_mask.astype(bool)
    temperature = trainer.config.generate_config.sampling_config.temperature
    packed = worker.actor_logprobs(rollouts)
    shared = CompletionLogProbs(SharedPromptForward(worker.actor, g, trainer.config.rl_config.seq_length), temperature)
    logp, _ = shared(step_batch(worker._model_inputs(rollouts, 0, len(rollouts.completion_ids))))
    for name, scored in (("packed", packed), ("shared", logp.asnumpy())):
        error = np.abs(scored - sampled)[real].max()
        assert error < 1e-4, f"{name}: max |actor log-prob - rollout log-prob| = {error:.3g}"
    assert np.abs(sampled[real]).max() > 1.0  # a real comparison


def test_image_data_on_a_text_model_is_refused(tmp_path, geo3k_prompts, vl_dir, tiny_model_dir):
    """Images the actor cannot see are refused before any model is built, naming both keys."""
    from mindgrpo.data import DataError, PromptDataset
    from mindgrpo.data.tokenizer import load_tokenizer
    from mindgrpo.train.preflight import check_run_inputs

    cfg = make_config(tmp_path, geo3k_prompts, tiny_model_dir)
    cfg.rl_config.tokenizer_dir = str(vl_dir)
    with pytest.raises(DataError, match=r"rl_config.dataset_file = .* holds images but actor_config.load = .* is a "
                                        r"text model"):
        check_run_inputs(cfg, load_tokenizer(vl_dir), PromptDataset(geo3k_prompts))


def test_vl_with_dynamic_sampling_and_two_steps_per_generation(tmp_path, geo3k_prompts, vl_dir):
    """Qwen2.5-VL under DAPO's dynamic sampling and a generation of two steps: every kept prompt keeps its own
    M-RoPE positions and image features through the assembly of the rounds and the slicing into steps (a mix-up
    would score completions against another prompt's image: the log-probs would leave the rollout's)."""
    from mindgrpo.train.trainer import GRPOTrainer

    cfg = make_config(tmp_path, geo3k_prompts, vl_dir, dynamic_sampling=True, max_generation_batches=2,
                      steps_per_generation=2, max_steps=2)
    cfg.rl_config.save_ckpt_interval = 2  # whole generations only
    cfg.rl_config.mode = "pynative"  # a second set of graphs would double this test's time; the math is the same
    trainer = GRPOTrainer(cfg)
    first = trainer.train_step()
    generation = trainer._generation
    rollouts = generation.rollouts
    expected = trainer.worker.vision_batch(rollouts.prompt_ids, rollouts.prompt_mask, generation.images)
    for step in range(2):
        part = rollouts.rows(generation.step_slice(step))
        prompts = slice(step * 2, step * 2 + 2)
        np.testing.assert_array_equal(part.vision.positions, expected.positions[:, prompts])
        np.testing.assert_array_equal(part.vision.rope_deltas, expected.rope_deltas[prompts])
        for got, want in zip(part.vision.features, expected.features[prompts]):
            np.testing.assert_array_equal(got, want)
        # the old policy's log-probs, taken through each step's slice at generation (before any update): the
        # sampling policy's, so they equal the engine's
        real = part.completion_mask.astype(bool)
        assert np.abs(trainer._old_logp[step] - part.sampling_logp)[real].max() < 1e-4
    second = trainer.train_step()
    assert first["grpo/generation_batches"] >= 1 and np.isfinite(second["actor/loss"])
    assert trainer.worker.actor.vision.prompts_embedded == 4 * first["grpo/generation_batches"]
