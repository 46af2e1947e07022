"""DAPO's length controls: the soft overlong penalty (rl_config.overlong_buffer_length / overlong_penalty_factor)
against verl's formula, and truncated completions left out of the loss (rl_config.mask_truncated_completions) as
TRL does; then both in a GRAPH-mode trainer run on the embedded demo, with no recompilation after precompile."""
import json

import numpy as np
import pytest

from conftest import small_run_config
from mindgrpo.config import ConfigError, GRPOConfig, validate
from mindgrpo.rewards import RewardBatch
from mindgrpo.rewards.overlong import OverlongPenalty
from mindgrpo.train.rollout_batch import RolloutBatch


# ---- the references, written out ------------------------------------------------------------------------------

def verl_overlong_reward(valid_response_length, max_resp_len, overlong_buffer_len, overlong_penalty_factor):
    """verl, verl/workers/reward_manager/dapo.py, DAPORewardManager.__call__, the ``overlong_buffer_cfg.enable``
    branch (volcengine/verl; reward = score + overlong_reward)."""
    expected_len = max_resp_len - overlong_buffer_len
    exceed_len = valid_response_length - expected_len
    overlong_reward = min(-exceed_len / overlong_buffer_len * overlong_penalty_factor, 0)
    return overlong_reward


def verl_response_mask(response_ids, eos_token_id):
    """verl, verl/utils/torch_functional.py, get_response_mask (in numpy): 1 up to and including the first EOS.
    verl's valid_response_length is this mask's sum, so it counts the EOS token."""
    is_eos = np.isin(response_ids, np.atleast_1d(eos_token_id)).astype(np.int64)
    return np.logical_not((np.cumsum(is_eos, axis=1) - is_eos).astype(bool)).astype(np.int64)


def trl_truncation_mask(completion_ids_list, completion_mask, eos_token_id, pad_token_id):
    """TRL 1.16, trl/trainer/grpo_trainer.py, _generate_and_score_completions, ``if self.mask_truncated_completions``:
    a completion whose last token is neither EOS nor pad is truncated and its completion_mask row is zeroed. The
    rewards and the group advantages are computed from all completions, truncated ones included."""
    eos_and_pad = [eos_token_id, pad_token_id]
    is_truncated = np.array([ids[-1] not in eos_and_pad for ids in completion_ids_list])
    return completion_mask * (~is_truncated)[:, None].astype(completion_mask.dtype)


# ---- the overlong penalty -------------------------------------------------------------------------------------

@pytest.mark.parametrize("max_tokens, buffer, factor", [(20, 8, 1.0), (512, 128, 0.5), (7, 1, 2.0)])
def test_overlong_penalty_is_verls_below_inside_and_at_the_end_of_the_buffer(max_tokens, buffer, factor):
    start = max_tokens - buffer
    lengths = np.unique([1, start - 1, start, start + 1, (start + max_tokens) // 2, max_tokens - 1, max_tokens])
    penalty = OverlongPenalty(max_tokens, buffer, factor)(lengths)
    expected = np.array([verl_overlong_reward(int(n), max_tokens, buffer, factor) for n in lengths])
    np.testing.assert_allclose(penalty, expected, rtol=1e-6, atol=1e-7)
    assert penalty.dtype == np.float32
    assert np.all(penalty[lengths <= start] == 0)  # below and at the buffer's start: no penalty
    assert penalty[-1] == pytest.approx(-factor)  # at max_tokens: the whole factor
    assert np.all(np.diff(penalty[lengths >= start]) < 0)  # inside: falls linearly with every token


def test_penalty_lengths_count_the_eos_token_as_verls_valid_response_length():
    """The trainer's length is the rollout's completion_mask row sum, which keeps the EOS token that ended the
    completion (mindgrpo.rollout.api.RolloutResult): the same as verl's response-mask sum."""
    from mindgrpo.rollout.api import assemble_result

    eos, pad, max_tokens = 2, 0, 10
    rows = [[5, 6, 7, 2], [5] * 10, [2], [9, 9, 9, 9, 9, 9, 9, 9, 2]]
    result = assemble_result(rows, ["stop", "length", "stop", "stop"], None, max_tokens, pad)
    verl_lengths = verl_response_mask(np.array([r + [pad] * (max_tokens - len(r)) for r in rows]), eos).sum(1)
    np.testing.assert_array_equal(result.completion_mask.sum(1), verl_lengths)
    penalty = OverlongPenalty(max_tokens, 4, 1.0)
    np.testing.assert_allclose(penalty(result.completion_mask.sum(1)),
                               [verl_overlong_reward(int(n), max_tokens, 4, 1.0) for n in verl_lengths], atol=1e-7)


def test_penalty_is_added_to_the_reward_the_advantages_use_and_off_by_default():
    rewards = RewardBatch(total=np.array([1, 0, 1, 1], np.float32), per_verifier={"v": np.array([1, 0, 1, 1.0])},
                          failures={"v": 0}, timeouts={"v": 0}, aggregated=np.array([1, 0, 1, 1], np.float32))
    lengths = np.array([3, 10, 8, 9])
    penalty = OverlongPenalty(10, 4, 1.0).add_to(rewards, lengths)
    np.testing.assert_allclose(penalty, [0, -1, -0.5, -0.75])
    np.testing.assert_allclose(rewards.total, [1, -1, 0.5, 0.25])
    np.testing.assert_allclose(rewards.aggregated, [1, -1, 0.5, 0.25])
    np.testing.assert_array_equal(rewards.per_verifier["v"], [1, 0, 1, 1])  # the verifier's own score is kept

    off = RewardBatch(total=np.ones(4, np.float32), per_verifier={}, failures={}, timeouts={},
                      aggregated=np.ones(4, np.float32))
    assert not OverlongPenalty(10).add_to(off, lengths).any()
    assert off.total.tolist() == off.aggregated.tolist() == [1.0] * 4
    rl = GRPOConfig().rl_config
    assert (rl.overlong_buffer_length, rl.overlong_penalty_factor, rl.mask_truncated_completions) == (0, 1.0, False)


def test_config_checks_the_buffer_and_the_factor():
    config = GRPOConfig()
    config.generate_config.sampling_config.max_tokens = 64
    config.rl_config.overlong_buffer_length = 64
    config.rl_config.overlong_penalty_factor = -0.5
    with pytest.raises(ConfigError) as err:
        validate(config, check_paths=False)
    assert "rl_config.overlong_buffer_length = 64: must be in [0, generate_config.sampling_config.max_tokens = 64)" \
        in str(err.value)
    assert "rl_config.overlong_penalty_factor = -0.5: must not be negative" in str(err.value)
    config.rl_config.overlong_buffer_length, config.rl_config.overlong_penalty_factor = 16, 1.0
    validate(config, check_paths=False)


# ---- truncated completions out of the loss ---------------------------------------------------------------------

def test_loss_mask_zeroes_truncated_completions_as_trl():
    eos, pad, width = 2, 0, 6
    rows = [[5, 6, 2], [5, 6, 7, 8, 9, 4], [2], [7, 7, 7, 7, 7, 7]]
    ids = np.array([r + [pad] * (width - len(r)) for r in rows], np.int32)
    mask = (np.arange(width) < np.array([len(r) for r in rows])[:, None]).astype(np.int32)
    truncated = np.array([len(r) == width and r[-1] != eos for r in rows])
    batch = RolloutBatch(np.ones((1, 3), np.int32), np.ones((1, 3), np.int32), ids, mask, truncated,
                         mask_truncated=True)
    np.testing.assert_array_equal(batch.loss_mask, trl_truncation_mask(rows, mask, eos, pad))
    assert batch.loss_mask.dtype == np.int32
    unmasked = RolloutBatch(batch.prompt_ids, batch.prompt_mask, ids, mask, truncated)
    np.testing.assert_array_equal(unmasked.loss_mask, mask)  # off: every token is in the loss
    assert not RolloutBatch(batch.prompt_ids, batch.prompt_mask, ids, mask).truncated.any()


def _masked_loss_case(seed=0, batch=4, width=7, vocab=11):
    rng = np.random.default_rng(seed)
    lengths = np.array([3, width, 5, width])
    mask = (np.arange(width) < lengths[:, None]).astype(np.int32)
    truncated = np.array([False, True, False, False])  # the last one ended with EOS exactly at the limit
    return dict(logits=rng.normal(size=(batch, width, vocab)).astype(np.float32),
                targets=rng.integers(0, vocab, (batch, width)).astype(np.int32),
                ref=(rng.normal(size=(batch, width)) - 2.5).astype(np.float32),
                adv=rng.normal(size=batch).astype(np.float32), mask=mask, truncated=truncated)


@pytest.mark.parametrize("impl", ["plain", "fused"])
@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_a_masked_completion_gives_no_gradient_and_the_loss_is_the_others(ms_mode, impl, loss_type):
    """The loss cell's mask is RolloutBatch.loss_mask: the truncated completion's logits get exactly zero gradient,
    and the loss (and the others' gradients) are those of the batch without it. dapo normalises by the kept tokens,
    so the two are equal; grpo is TRL's mean over all completions, the masked one counting 0: (B - 1) / B of it."""
    import mindspore as ms
    from mindspore import Tensor, nn

    from mindgrpo.algorithm import LossConfig, grpo_loss, token_logprobs

    class Loss(nn.Cell):
        def __init__(self, logits, settings):
            super().__init__()
            self.logits = ms.Parameter(Tensor(logits), name="logits")
            self.settings = settings

        def construct(self, targets, ref, adv, mask, num_items):
            logp = token_logprobs(self.logits, targets)
            return grpo_loss(logp, None, ref, adv, mask, cfg=self.settings, num_items_in_batch=num_items)

    class LossAndGrad(nn.Cell):
        def __init__(self, net):
            super().__init__()
            self.grad_fn = ms.value_and_grad(net, None, net.trainable_params(), has_aux=True)

        def construct(self, *inputs):
            (loss, _), grads = self.grad_fn(*inputs)
            return loss, grads[0]

    a = _masked_loss_case()
    settings = LossConfig.trl(loss_type=loss_type, beta=0.04, loss_impl=impl)
    rollouts = RolloutBatch(np.ones((1, 2), np.int32), np.ones((1, 2), np.int32), a["targets"], a["mask"],
                            a["truncated"], mask_truncated=True)
    mask = rollouts.loss_mask

    def run(rows, mask):
        net = LossAndGrad(Loss(a["logits"][rows], settings))
        loss, grad = net(Tensor(a["targets"][rows]), Tensor(a["ref"][rows]), Tensor(a["adv"][rows]),
                         Tensor(mask[rows]), Tensor(np.float32(max(1, mask[rows].sum()))))
        return float(loss), grad.asnumpy()

    everyone = np.arange(4)
    kept = np.flatnonzero(~a["truncated"])
    loss, grad = run(everyone, mask)
    loss_kept, grad_kept = run(kept, mask)
    assert np.all(grad[a["truncated"]] == 0)
    share = 1.0 if loss_type == "dapo" else len(kept) / len(everyone)
    assert loss == pytest.approx(loss_kept * share, rel=1e-5, abs=1e-7)
    np.testing.assert_allclose(grad[kept], grad_kept * share, rtol=1e-5, atol=1e-7)
    unmasked_loss, _ = run(everyone, a["mask"])
    assert abs(unmasked_loss - loss) > 1e-4  # the masked completion did count before


# ---- in the trainer --------------------------------------------------------------------------------------------

def some_stop_early(generate, eos: int, pad: int):
    """The engine's ``generate``, with an EOS written into every other completion (the random demo model nearly
    never samples one): lengths below, at the start of, inside and at the end of the overlong buffer, the last
    ending with EOS exactly at max_tokens (not truncated); the others are truncated. Shapes stay the engine's."""
    def wrapped(prompts, params, *images):
        result = generate(prompts, params, *images)
        for row in range(0, len(result.finish_reasons), 2):
            length = 2 + row % (params.max_tokens - 1)  # 2, 4, 6, 8 with max_tokens 8 and 4 x 2 completions
            result.completion_ids[row, length - 1] = eos
            result.completion_ids[row, length:] = pad
            result.completion_mask[row, length:] = 0
            result.finish_reasons[row] = "stop"
        return result
    return wrapped


def test_trainer_logs_the_length_metrics_and_does_not_recompile(tmp_path, demo_prompts, demo_plain, monkeypatch):
    from mindgrpo.train.metrics import read_metrics
    from mindgrpo.train.trainer import GRPOTrainer

    max_tokens, buffer = 8, 4
    config = small_run_config(tmp_path / "run", demo_prompts, demo_plain.model_dir, max_prompt_length=64,
                              seq_length=80, max_tokens=max_tokens, verifiers=["toy_verifiers:text_length"],
                              max_steps=3, overlong_buffer_length=buffer, overlong_penalty_factor=0.5,
                              mask_truncated_completions=True, loss_type="dapo",
                              max_rollout_logprob_gap=0.0)  # EOS written over sampled tokens below: a real gap
    trainer = GRPOTrainer(config)
    engine = trainer.worker.engine
    monkeypatch.setattr(engine, "generate", some_stop_early(engine.generate, trainer.tokenizer.eos_token_id,
                                                            trainer.tokenizer.pad_token_id))
    trainer.precompile()
    graphs = trainer.worker.compiled_graphs()
    seen = []
    while trainer.step < trainer.total_steps:
        metrics = trainer.train_step()
        seen.append((metrics, trainer.last_rollouts))
    # the first update compiles its gradient-norm and AdamW graphs (as in tests/test_trainer.py); nothing else
    assert trainer.worker.compiled_graphs() - graphs == 2
    trainer.metrics.close()
    trainer.scorer.close()

    eos = trainer.tokenizer.eos_token_id
    for metrics, rollouts in seen:
        lengths = verl_response_mask(rollouts.completion_ids, eos).sum(1)
        np.testing.assert_array_equal(rollouts.completion_mask.sum(1), np.minimum(lengths, max_tokens))
        expected = np.mean([verl_overlong_reward(int(n), max_tokens, buffer, 0.5) for n in lengths])
        assert metrics["grpo/overlong_penalty/mean"] == pytest.approx(expected, abs=1e-6)
        ended_by_length = (lengths == max_tokens) & ~np.isin(rollouts.completion_ids[:, -1], np.atleast_1d(eos))
        np.testing.assert_array_equal(rollouts.truncated, ended_by_length)
        assert metrics["grpo/truncated_frac"] == pytest.approx(ended_by_length.mean())
        np.testing.assert_array_equal(rollouts.loss_mask.sum(1), np.where(ended_by_length, 0, lengths))
        assert 0 < ended_by_length.mean() < 1 and np.isfinite(metrics["actor/loss"]) and metrics["grad_norm"] > 0
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    for row in rows:
        assert {"grpo/truncated_frac", "grpo/overlong_penalty/mean", "grpo/zero_std_groups"} <= set(row)
    print(json.dumps({k: [round(r[k], 4) for r in rows] for k in ("grpo/truncated_frac",
                                                                  "grpo/overlong_penalty/mean")}))


def test_default_run_logs_truncation_and_a_zero_penalty(tmp_path, demo_prompts, demo_plain):
    """With the defaults nothing changes but two more figures in the log: truncated completions stay in the loss
    and the penalty is 0. (PyNative: nothing here depends on the mode.)"""
    from mindgrpo.train.trainer import GRPOTrainer

    config = small_run_config(tmp_path / "run", demo_prompts, demo_plain.model_dir, max_prompt_length=64,
                              seq_length=80, max_tokens=8, verifiers=["toy_verifiers:text_length"], max_steps=1,
                              mode="pynative")
    trainer = GRPOTrainer(config)
    metrics = trainer.train()
    rollouts = trainer.last_rollouts
    assert metrics["grpo/overlong_penalty/mean"] == 0.0
    assert metrics["grpo/truncated_frac"] == pytest.approx(rollouts.truncated.mean())
    np.testing.assert_array_equal(rollouts.loss_mask, rollouts.completion_mask)


@pytest.mark.parametrize("mode,loss_type", [("pynative", "grpo"), ("graph", "dapo")])
def test_worker_update_leaves_truncated_completions_out_padded_and_packed(tmp_path, mode, loss_type):
    """A ModelWorker's update with truncated completions masked equals, padded and packed, the update on the same
    rollouts whose truncated rows have an all-zero completion mask (TRL's way of masking them)."""
    import dataclasses

    import mindspore as ms

    from test_packing import B, NUM_GENERATIONS, VOCAB, capture_instead_of_applying, make_rollouts, worker
    from tiny_qwen import make_tiny_qwen2

    model_dir = make_tiny_qwen2(tmp_path / "model", layers=2, vocab=VOCAB)
    base = make_rollouts(4)
    truncated = np.zeros(B * NUM_GENERATIONS, bool)
    truncated[[0, 5, 9]] = True  # one at the limit and two shorter ones: which rows does not matter to the loss
    masked = dataclasses.replace(base, truncated=truncated, mask_truncated=True)
    zeroed = dataclasses.replace(base, completion_mask=base.completion_mask * ~truncated[:, None])
    advantages = np.random.default_rng(5).standard_normal(B * NUM_GENERATIONS).astype(np.float32)
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    packed = 4 * base.completion_ids.shape[1]
    try:
        workers, captured, results = {}, [], []  # one worker per token budget (padded, packed): compiled once
        for rollouts, budget in ((zeroed, 0), (masked, 0), (masked, packed)):
            if budget not in workers:
                workers[budget] = capture_instead_of_applying(worker(model_dir, loss_type, budget), captured)
            pol = workers[budget]
            ref, old = pol.reference_logprobs(base), pol.actor_logprobs(base)
            metrics = pol.update(rollouts, advantages, old, ref, total_steps=1)
            results.append((captured.pop(), metrics))
    finally:
        ms.set_context(mode=previous)
    (expected, expected_metrics), *others = results
    for grads, metrics in others:
        for grad, want in zip(grads, expected):
            scale = np.abs(want).max()
            assert scale > 0 and np.abs(grad - want).max() <= 1e-5 * scale
        for key in ("actor/loss", "actor/pg_loss", "actor/kl_loss", "grad_norm"):
            assert metrics[key] == pytest.approx(expected_metrics[key], rel=1e-5, abs=1e-7), key
