"""Packed micro-batches (actor_config.max_tokens_per_micro_batch) against the padded path: the packing plan puts every
token back where it came from, the packed forward's logits equal the shared-prompt forward's, and a ModelWorker's
reference and old log-probs, loss, gradients and metrics equal those of padded micro-batches, in PyNative and
GRAPH mode (on a locally made GQA model: no ../shared needed)."""
import sys
from pathlib import Path

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor, ops

from mindgrpo.config import ConfigError, GRPOConfig, validate
from mindgrpo.parallel.groups import DistInfo
from mindgrpo.models import PackedPromptForward, SharedPromptForward, build_model
from mindgrpo.train.packing import completion_lengths, micro_batches, pack_rows
from mindgrpo.train.rollout_batch import RolloutBatch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_qwen import make_tiny_qwen2  # noqa: E402

B, P, W = 3, 10, 9
NUM_GENERATIONS = 4  # completions per prompt
VOCAB, PAD = 256, 253


def make_rollouts(seed: int = 0) -> RolloutBatch:
    """Three left-padded prompts (7, 10 and 4 tokens), four completions each: ragged, one at the limit, one empty."""
    rng = np.random.default_rng(seed)
    prompt_ids = np.full((B, P), PAD, np.int32)
    prompt_mask = np.zeros((B, P), np.int32)
    for i, length in enumerate((7, 10, 4)):
        prompt_ids[i, P - length:] = rng.integers(0, PAD, length)
        prompt_mask[i, P - length:] = 1
    lengths = np.array([W, 3, 5, 2, 0, 8, 1, 4, 6, 6, 2, 7])
    completion_mask = (np.arange(W) < lengths[:, None]).astype(np.int32)
    completion_ids = np.where(completion_mask > 0, rng.integers(0, PAD, (B * NUM_GENERATIONS, W)), PAD).astype(np.int32)
    return RolloutBatch(prompt_ids, prompt_mask, completion_ids, completion_mask)


def test_rows_hold_one_group_first_fit_decreasing():
    lengths = np.array([9, 3, 5, 2, 0, 8, 1, 4, 6, 6, 2, 7])
    rows = pack_rows(lengths, NUM_GENERATIONS, W)
    assert rows == [[0], [2, 1], [3], [5, 6], [7], [11, 10], [8], [9]]
    assert sorted(c for row in rows for c in row) == [c for c in range(12) if lengths[c]]  # each once, empty left out
    assert all(sum(lengths[row]) <= W and len({c // NUM_GENERATIONS for c in row}) == 1 for row in rows)


def test_micro_batches_put_every_token_back_in_place():
    rollouts = make_rollouts()
    batches = list(micro_batches(rollouts, 2, NUM_GENERATIONS))
    assert len(batches) == 4  # 8 rows, 2 per forward
    seen = np.zeros_like(rollouts.completion_mask)
    prompt_states = 2 * P  # S = min(rows, prompts) = 2 slots
    for batch in batches:
        assert batch.completion_ids.shape == (2, W) and batch.prompts.shape == (2,) and batch.mask.shape == (8, W)
        loss_rows, tokens = np.nonzero(batch.mask)
        completions = batch.completions[loss_rows]
        packed = batch.unpack[loss_rows, tokens]
        np.testing.assert_array_equal(batch.completion_ids.reshape(-1)[packed],
                                      rollouts.completion_ids[completions, tokens])
        lengths = rollouts.prompt_mask.sum(1)
        np.testing.assert_array_equal(batch.positions.reshape(-1)[packed],
                                      lengths[completions // NUM_GENERATIONS] + tokens)
        # each row's prompt slot holds its group's prompt
        assert all(batch.prompts[batch.row_prompt[r]] == c // NUM_GENERATIONS for r, c in zip(packed // W, completions))
        first = tokens == 0  # predicted by the prompt's last state, the others by the previous token's
        slots = batch.row_prompt[packed[first] // W]
        np.testing.assert_array_equal(batch.source[packed[first]], slots * P + P - 1)
        np.testing.assert_array_equal(batch.source[packed[~first]], prompt_states + packed[~first] - 1)
        seen[completions, tokens] += 1
    np.testing.assert_array_equal(seen, rollouts.completion_mask)


def test_packing_needs_right_padded_completions():
    mask = np.ones((2, 4), np.int32)
    mask[0, 1] = 0
    with pytest.raises(ValueError, match="right-padded"):
        completion_lengths(mask)


def test_config_checks_the_token_budget():
    config = GRPOConfig()
    config.generate_config.sampling_config.max_tokens = 512
    config.actor_config.max_tokens_per_micro_batch = 500
    with pytest.raises(ConfigError, match="max_tokens_per_micro_batch = 500 is below"):
        validate(config, check_paths=False)
    config.actor_config.max_tokens_per_micro_batch = 1024
    config.rl_config.share_prompt = False
    with pytest.raises(ConfigError, match="set rl_config.share_prompt: true"):
        validate(config, check_paths=False)
    config.rl_config.share_prompt = True
    validate(config, check_paths=False)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_qwen2(tmp_path_factory.mktemp("packing") / "model", layers=2, vocab=VOCAB)


def test_packed_forward_equals_the_shared_forward(model_dir, ms_mode):
    model = build_model(model_dir)
    rollouts = make_rollouts(1)
    padded = SharedPromptForward(model, NUM_GENERATIONS, 32)(Tensor(rollouts.prompt_ids), Tensor(rollouts.prompt_mask),
                                                             Tensor(rollouts.completion_ids)).asnumpy()
    forward = PackedPromptForward(model, 32)
    packed = np.zeros_like(padded)
    for batch in micro_batches(rollouts, 2, NUM_GENERATIONS):  # 2 prompt slots for 3 prompts
        logits = forward(Tensor(rollouts.prompt_ids[batch.prompts]), Tensor(rollouts.prompt_mask[batch.prompts]),
                         Tensor(batch.completion_ids), Tensor(batch.positions), Tensor(batch.segments),
                         Tensor(batch.row_prompt), Tensor(batch.source)).asnumpy()
        loss_rows, tokens = np.nonzero(batch.mask)
        packed[batch.completions[loss_rows], tokens] = logits.reshape(-1, VOCAB)[batch.unpack[loss_rows, tokens]]
    real = rollouts.completion_mask > 0
    assert np.abs(padded[real]).max() > 0.1  # a real comparison
    np.testing.assert_allclose(packed[real], padded[real], rtol=0, atol=1e-5)


def worker(model_dir: Path, loss_type: str, budget: int, max_grad_norm: float = 1.0):
    """A ModelWorker with a reference model, two passes per rollout (old log-probs) and update micro-batches of one
    group; ``budget`` 4 x W packs four rows per forward (the 8 rows of ``make_rollouts`` in two); ``max_grad_norm``
    0 leaves the gradients unclipped."""
    from mindgrpo.train.model_worker import ModelWorker

    config = GRPOConfig()
    rl = config.rl_config
    rl.batch_size, rl.num_generations, rl.max_prompt_length, rl.seq_length = B, NUM_GENERATIONS, 16, 32
    rl.beta, rl.loss_type, rl.num_iterations = 0.04, loss_type, 2
    config.actor_config.load = str(model_dir)
    config.actor_config.micro_batch_size = config.ref_config.ref_model_batch_size = NUM_GENERATIONS
    config.actor_config.max_tokens_per_micro_batch = budget
    config.actor_config.optimizer.max_grad_norm = max_grad_norm
    config.generate_config.sampling_config.max_tokens = W
    return ModelWorker(validate(config, check_paths=False), DistInfo(), eos_token_id=VOCAB - 1, pad_token_id=PAD)


def capture_instead_of_applying(pol, grads: list):
    """``pol``, whose update ends by appending its summed gradients to ``grads`` and zeroing them (as its AdamW
    step would) instead of applying them: its weights stay as they were, for the next update to start from."""
    def capture(*hyper):
        grads.append([acc.asnumpy().copy() for acc in pol._accumulators])
        for acc in pol._accumulators:
            acc.set_data(ops.zeros_like(acc))

    pol._apply = capture
    return pol


@pytest.mark.parametrize("mode,loss_type", [("pynative", "grpo"), ("graph", "bnpo")])
def test_packed_policy_equals_the_padded_one(model_dir, mode, loss_type):
    """grpo's per-sequence means and bnpo's per-micro-batch token means, whose micro-batches packing regroups
    (dapo and dr_grpo: tests/test_algorithm.py); the fused loss op."""
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    try:
        rollouts = make_rollouts(2)
        rng = np.random.default_rng(3)
        advantages = rng.standard_normal(B * NUM_GENERATIONS).astype(np.float32)
        drift = (rng.normal(0, 0.3, rollouts.completion_mask.shape) * rollouts.completion_mask).astype(np.float32)
        results = {}
        for name, budget in (("padded", 0), ("packed", 4 * W)):
            grads = []  # each optimizer step's gradients, reduced and clipped, instead of applying them
            pol = capture_instead_of_applying(worker(model_dir, loss_type, budget), grads)
            ref = pol.reference_logprobs(rollouts)
            old = pol.actor_logprobs(rollouts) + drift  # an off-policy ratio, so the clip and KL terms are live
            metrics = pol.update(rollouts, advantages, old, ref, total_steps=1)
            results[name] = (ref, old, grads[0], metrics)
    finally:
        ms.set_context(mode=previous)
    (ref_a, old_a, grads_a, metrics_a), (ref_b, old_b, grads_b, metrics_b) = results.values()
    real = rollouts.completion_mask > 0
    np.testing.assert_allclose(ref_b[real], ref_a[real], rtol=0, atol=1e-5)
    np.testing.assert_allclose(old_b[real], old_a[real], rtol=0, atol=1e-5)
    for grad_a, grad_b in zip(grads_a, grads_b):
        scale = np.abs(grad_a).max()
        assert scale > 0 and np.abs(grad_b - grad_a).max() <= 1e-5 * scale
    assert abs(metrics_a["actor/loss"]) > 1e-3 and metrics_a["actor/pg_clipfrac"] > 0
    for key in ("actor/loss", "actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/pg_clipfrac", "grad_norm"):
        assert metrics_b[key] == pytest.approx(metrics_a[key], rel=1e-5, abs=1e-7), key
