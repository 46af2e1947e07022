"""DAPO's dynamic sampling (rl_config.dynamic_sampling), the rollout log-prob gap metrics and
rl_config.steps_per_generation.

The group filter is checked against verl's behaviour written out below; then all three in GRAPH-mode trainer runs on
the embedded demo model (no recompilation after precompile), and steps_per_generation with dynamic sampling resumes
exactly from a checkpoint."""
import json
import shutil

import numpy as np
import pytest

from conftest import small_run_config
from mindgrpo.config import ConfigError, Derived, GRPOConfig, validate
from mindgrpo.algorithm.advantages import zero_std_groups
from mindgrpo.train.generation import kept_groups, select_groups


# ---- the reference, written out ------------------------------------------------------------------------------------

def verl_dynamic_sampling(rounds_rewards, prompt_bsz, n, max_num_gen_batches):
    """verl, recipe/dapo/dapo_ray_trainer.py, ``RayDAPOTrainer.fit`` with ``algorithm.filter_groups.enable``
    (volcengine/verl), in numpy: per generation batch, the std (numpy's, ddof 0) of each prompt's n rewards; the
    prompts with std > 0 (or a single trajectory) keep all their trajectories, which are appended to the batch; while
    fewer than ``prompt_bsz`` prompts are kept another batch is generated, unless ``max_num_gen_batches`` (> 0) batches
    were, when verl raises ValueError; then the batch is cut to ``prompt_bsz * n`` trajectories. Returns the kept
    trajectories as (generation batch, index) and the number of generation batches."""
    batch, num_prompt_in_batch = [], 0
    for num_gen_batches, rewards in enumerate(rounds_rewards, start=1):
        per_prompt = np.asarray(rewards, np.float64).reshape(-1, n)
        kept_prompts = [p for p in range(len(per_prompt)) if np.std(per_prompt[p]) > 0 or n == 1]
        num_prompt_in_batch += len(kept_prompts)
        batch += [(num_gen_batches - 1, p * n + k) for p in kept_prompts for k in range(n)]
        if num_prompt_in_batch < prompt_bsz:
            if max_num_gen_batches <= 0 or num_gen_batches < max_num_gen_batches:
                continue
            raise ValueError(f"{num_gen_batches=} >= {max_num_gen_batches=}. Generated too many.")
        return batch[:prompt_bsz * n], num_gen_batches
    raise AssertionError("ran out of generation batches")


def ours(rounds_rewards, prompt_bsz, n, max_rounds):
    """mindgrpo's rounds and selection, as GRPOTrainer._rollout_and_score runs them on one rank."""
    kept = []
    for rewards in rounds_rewards[:max_rounds]:
        kept.append(kept_groups(zero_std_groups(np.asarray(rewards, np.float32), n), n))
        if sum(k.sum() for k in kept) >= prompt_bsz:
            break
    chosen, in_loss = select_groups(kept, prompt_bsz)
    return [(r, g * n + k) for r, g in chosen for k in range(n)], np.repeat(in_loss, n), len(kept)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("n", [1, 4])
def test_kept_groups_and_rounds_are_verls(seed, n):
    """Rewards on the demo's scale (accuracy 0/1 plus format 0/0.1), some groups all equal: the same trajectories,
    in the same order, from the same number of rounds as verl, whenever verl fills its batch."""
    rng = np.random.default_rng(seed)
    prompt_bsz = 6
    rounds = [rng.choice([0.0, 0.1, 1.0, 1.1], size=(prompt_bsz, n), p=[0.5, 0.1, 0.1, 0.3]) for _ in range(12)]
    for r in rounds:  # make most groups flat, as a model that is mostly all right or all wrong does
        flat = rng.random(prompt_bsz) < 0.7
        r[flat] = r[flat, :1]
    rounds = [r.reshape(-1) for r in rounds]
    expected, verl_rounds = verl_dynamic_sampling(rounds, prompt_bsz, n, max_num_gen_batches=12)
    got, in_loss, our_rounds = ours(rounds, prompt_bsz, n, max_rounds=12)
    assert got == expected and our_rounds == verl_rounds and in_loss.all()
    if n == 4:
        assert verl_rounds > 1  # the case is not trivial: some round was short


def test_at_the_round_limit_we_train_on_what_was_kept_where_verl_raises():
    rounds = [np.array([1.0, 1.0, 0.0, 0.0, 0.0, 0.0]), np.array([0.0, 0.0, 0.0, 1.0, 1.0, 1.0])]  # n = 3
    with pytest.raises(ValueError, match="Generated too many"):
        verl_dynamic_sampling(rounds, prompt_bsz=2, n=3, max_num_gen_batches=2)
    got, in_loss, used = ours(rounds, prompt_bsz=2, n=3, max_rounds=2)
    # the one kept group (round 0, group 0) first and in the loss; a dropped one fills the other slot, out of it
    assert used == 2 and got[:3] == [(0, 0), (0, 1), (0, 2)] and in_loss.tolist() == [True] * 3 + [False] * 3
    assert got[3:] == [(0, 3), (0, 4), (0, 5)]


def test_config_checks_the_new_keys():
    cfg = GRPOConfig()
    cfg.rl_config.max_generation_batches = 0
    cfg.rl_config.steps_per_generation = 2
    cfg.rl_config.save_ckpt_interval = 3
    cfg.rl_config.max_steps = 5
    with pytest.raises(ConfigError) as err:
        validate(cfg, check_paths=False)
    for key in ("max_generation_batches", "save_ckpt_interval = 3", "max_steps = 5"):
        assert key in str(err.value)
    cfg.rl_config.max_generation_batches, cfg.rl_config.save_ckpt_interval, cfg.rl_config.max_steps = 3, 4, 6
    validate(cfg, check_paths=False)
    cfg.rl_config.max_steps, cfg.rl_config.epochs = 0, 2
    assert Derived(cfg).total_steps(steps_per_epoch=7) == 14  # whole generations of 2 steps
    cfg.rl_config.epochs = 1
    assert Derived(cfg).total_steps(steps_per_epoch=7) == 6


# ---- in the trainer --------------------------------------------------------------------------------------------------

def run_steps(trainer):
    """Each step's metrics, rollouts, generation and that generation's old-policy log-probs (one per step)."""
    out = []
    while trainer.step < trainer.total_steps:
        metrics = trainer.train_step()
        out.append((metrics, trainer.last_rollouts, trainer._generation, trainer._old_logp))
    return out


def gap_from(logp, rollouts):
    """The rollout/ metrics from host arrays: the training forward's log-probs against the engine's."""
    mask = rollouts.loss_mask > 0
    diff = (logp - rollouts.sampling_logp)[mask]
    return {"rollout/logprob_diff_mean": np.abs(diff).mean(), "rollout/logprob_diff_max": np.abs(diff).max(),
            "rollout/is_ratio_mean": np.exp(diff).mean()}


def test_dynamic_sampling_in_graph_mode_fills_the_batch_without_recompiling(tmp_path, demo_prompts, demo_plain):
    """Groups of prompts with even answers score all 0: dynamic sampling drops them and reads more prompts. Every
    trained group has unequal rewards, the step has batch_size groups, the gap metrics equal the ones computed from
    the old-policy log-probs, and nothing compiles after precompile but the first update's two graphs."""
    from mindgrpo.train.trainer import GRPOTrainer

    config = small_run_config(tmp_path / "run", demo_prompts, demo_plain.model_dir, max_prompt_length=64,
                              seq_length=80, max_tokens=8, verifiers=["toy_verifiers:flat_when_gold_even"],
                              max_steps=3, dynamic_sampling=True, max_generation_batches=4, num_iterations=2,
                              loss_type="dapo", beta=0.0)
    trainer = GRPOTrainer(config)
    trainer.precompile()
    graphs = trainer.worker.compiled_graphs()
    seen = run_steps(trainer)
    assert trainer.worker.compiled_graphs() - graphs == 2
    trainer.metrics.close()
    trainer.scorer.close()

    for metrics, rollouts, generation, old_logp in seen:
        assert len(rollouts.prompt_ids) == config.rl_config.batch_size
        in_loss = rollouts.in_loss.reshape(-1, 4)[:, 0]
        rewards = generation.rewards.reshape(-1, 4)
        # kept groups (unequal rewards) first, then, only if the round limit was reached, fillers out of the loss
        assert (rewards[in_loss].max(1) > rewards[in_loss].min(1)).all()
        assert (rewards[~in_loss].max(1) == rewards[~in_loss].min(1)).all()
        assert in_loss.tolist() == sorted(in_loss.tolist(), reverse=True)
        assert metrics["grpo/unfilled_groups"] == (~in_loss).sum()
        assert metrics["grpo/generation_batches"] == generation.rounds
        assert in_loss.all() or generation.rounds == config.rl_config.max_generation_batches
        assert all(int(float(gold)) % 2 for gold in np.array(generation.golds)[rollouts.in_loss])  # odd answers only
        first = generation.first_round.rewards.aggregated.reshape(-1, 4)
        assert metrics["grpo/zero_std_groups"] == (first.max(1) == first.min(1)).sum()
        if in_loss.any():
            expected = gap_from(old_logp[0], rollouts)
            for key, value in expected.items():
                assert metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-7)
            assert metrics["rollout/logprob_diff_max"] < 1e-4  # the engine's decode and the training forward agree
    rounds = sum(generation.rounds for _, _, generation, _ in seen)
    assert rounds > len(seen)  # some step needed a second round
    # every round read one batch of prompts: the saved data position is the rounds', not the steps'
    state = trainer.dataset.state_dict()
    assert state["epoch"] * trainer.dataset.steps_per_epoch(2) + state["position"] == rounds
    print(json.dumps({"generation_batches": [m["grpo/generation_batches"] for m, *_ in seen],
                      "gap_max": [m["rollout/logprob_diff_max"] for m, *_ in seen]}))


def test_at_the_round_limit_the_step_trains_on_masked_fillers_and_goes_on(tmp_path, demo_prompts, demo_plain):
    """A verifier that gives every completion the same reward: no group is ever kept. Each step runs
    max_generation_batches rounds, fills its batch with dropped groups out of the loss, logs it, and the run
    continues (verl and DAPO's own code stop here)."""
    from mindgrpo.train.trainer import GRPOTrainer

    config = small_run_config(tmp_path / "run", demo_prompts, demo_plain.model_dir, max_prompt_length=64,
                              seq_length=80, max_tokens=8, verifiers=["toy_verifiers:constant"], max_steps=2,
                              dynamic_sampling=True, max_generation_batches=2, mode="pynative")
    trainer = GRPOTrainer(config)
    for metrics, rollouts, *_ in run_steps(trainer):
        assert metrics["grpo/generation_batches"] == 2 and metrics["grpo/unfilled_groups"] == 2
        assert not rollouts.in_loss.any() and rollouts.loss_mask.sum() == 0
        assert metrics["grad_norm"] == 0 and "rollout/logprob_diff_mean" in metrics
    assert trainer.dataset.state_dict()["position"] == 4  # 2 steps x 2 rounds, each a batch of prompts
    trainer.metrics.close()
    trainer.scorer.close()


def test_steps_per_generation_with_dynamic_sampling_resumes_exactly(tmp_path, demo_prompts, demo_plain):
    """Two steps per generation: the second step generates nothing, its old log-probs are the generation's (taken
    before the first step's update), a checkpoint in the middle of a generation is refused, and a run resumed from
    the checkpoint between generations logs what the uninterrupted run logged."""
    from mindgrpo.train.metrics import read_metrics
    from mindgrpo.train.trainer import GRPOTrainer, TrainingError

    def config(out, resume=False):
        return small_run_config(out, demo_prompts, demo_plain.model_dir, max_prompt_length=64, seq_length=80,
                                max_tokens=8, verifiers=["toy_verifiers:flat_when_gold_even"], max_steps=4,
                                steps_per_generation=2, dynamic_sampling=True, max_generation_batches=3,
                                save_ckpt_interval=2, resume_training=resume, beta=0.0, mode="pynative")

    trainer = GRPOTrainer(config(tmp_path / "full"))
    seen = []
    while trainer.step < trainer.total_steps:
        seen.append((trainer.train_step(), trainer.last_rollouts, trainer._generation, trainer._old_logp))
        if trainer.step == 1:  # in the middle of a generation: refused, with the rule
            with pytest.raises(TrainingError, match="only be saved between generations"):
                trainer.save_checkpoint()
        if trainer.step == 2:
            saved = trainer.save_checkpoint()
    trainer.metrics.close()
    trainer.scorer.close()
    first, second = seen[0][2], seen[1][2]
    assert first is second and len(seen[1][3]) == 2 and seen[1][0]["timing/rollout"] == 0
    np.testing.assert_array_equal(seen[1][1].completion_ids, first.rollouts.completion_ids[8:])
    assert seen[2][2] is not first

    # a run that stopped after its step-2 checkpoint (the generation boundary) resumes from it
    shutil.copytree(saved, tmp_path / "half" / "checkpoints" / saved.name)
    resumed = GRPOTrainer(config(tmp_path / "half", resume=True))
    assert resumed.step == 2
    run_steps(resumed)
    resumed.metrics.close()
    resumed.scorer.close()
    full = read_metrics(tmp_path / "full" / "metrics.jsonl")[2:]
    again = read_metrics(tmp_path / "half" / "metrics.jsonl")
    for a, b in zip(full, again, strict=True):
        for key in ("grpo/rewards/mean", "actor/loss", "grad_norm", "grpo/generation_batches",
                    "response_length/mean", "rollout/logprob_diff_mean"):
            assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-9), key


def test_steps_per_generation_in_graph_mode_without_recompiling(tmp_path, demo_prompts, demo_plain):
    """Two steps per generation in GRAPH mode: after precompile only the first update's two graphs compile (the
    old-policy scoring and the second step's slice included), and the second step's ratio is taken against the
    generation's log-probs: its rollout gap holds the first update's change, the first step's does not."""
    from mindgrpo.train.trainer import GRPOTrainer

    config = small_run_config(tmp_path / "run", demo_prompts, demo_plain.model_dir, max_prompt_length=64,
                              seq_length=80, max_tokens=8, verifiers=["toy_verifiers:flat_when_gold_even"],
                              max_steps=2, steps_per_generation=2, loss_type="dapo", beta=0.0)
    trainer = GRPOTrainer(config)
    trainer.precompile()
    graphs = trainer.worker.compiled_graphs()
    first, second = trainer.train_step(), trainer.train_step()
    assert trainer.worker.compiled_graphs() - graphs == 2
    trainer.metrics.close()
    trainer.scorer.close()
    assert second["timing/rollout"] == 0  # the second step trains on the generation's second half
    assert first["rollout/logprob_diff_max"] < 1e-4 < second["rollout/logprob_diff_max"]
