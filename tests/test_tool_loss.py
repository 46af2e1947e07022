"""Tool responses stay out of the loss (issue: multi-turn tools, token-in token-out). A ModelWorker's update on
completions that hold tool responses (``RolloutBatch.tool_mask``) must equal, padded and packed, TRL's GRPO loss
over the model's own tokens (float64 torch, tests/test_algorithm.torch_reference) chained through the actor's log-
probs of the whole sequences, tool tokens included as context: the loss from the reference formula, the weight
gradients as the vector-Jacobian product of its d loss / d log-probs with the actor's own full-sequence forward."""
import sys
from pathlib import Path

import numpy as np
import pytest

import mindgrpo  # noqa: F401  (before MindSpore)
import mindspore as ms
from mindspore import Tensor, ops


sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_algorithm import torch_reference  # noqa: E402
from test_packing import B, NUM_GENERATIONS, VOCAB, W, capture_instead_of_applying, make_rollouts, worker  # noqa: E402
from tiny_qwen import make_tiny_qwen2  # noqa: E402


def with_tool_responses(rollouts):
    """The rollouts with tool responses inside some completions (after a model turn, followed by more model
    tokens), one at a completion's end, and none in others."""
    import dataclasses

    tool = np.zeros_like(rollouts.completion_mask)
    tool[0, 2:6] = 1   # a 9-token completion: 2 model tokens, a 4-token response, 3 model tokens
    tool[5, 1:4] = 1   # 8 tokens
    tool[8, 3:6] = 1   # 6 tokens: the response ends the completion
    tool[11, 2:4] = 1  # 7 tokens
    assert (tool <= rollouts.completion_mask).all()
    return dataclasses.replace(rollouts, tool_mask=tool)


def vjp_through_the_actor(pol, rollouts, cotangent: np.ndarray):
    """d/d weights of sum(cotangent * log-probs of the completion tokens), the log-probs from the actor's own
    full-sequence forward over [prompt | completion] rows (every completion token attended to, tool ones too)."""
    of_row = np.arange(len(rollouts.completion_ids)) // NUM_GENERATIONS
    ids = np.concatenate([rollouts.prompt_ids[of_row], rollouts.completion_ids], 1)
    mask = np.concatenate([rollouts.prompt_mask[of_row], rollouts.completion_mask], 1)
    p = rollouts.prompt_ids.shape[1]
    forward = pol.actor.full_sequence(ids.shape[1])
    target = Tensor(rollouts.completion_ids[..., None].astype(np.int32))
    weight = Tensor(cotangent.astype(np.float32))

    def objective(ids, mask):
        logits = forward(ids, mask)[:, p - 1:p - 1 + W]
        logp = ops.gather_elements(ops.log_softmax(logits, -1), 2, target)[..., 0]
        return (logp * weight).sum()

    grads = ms.grad(objective, grad_position=None, weights=pol.params)(Tensor(ids), Tensor(mask))
    return [g.asnumpy() for g in grads]


def test_the_update_trains_on_the_models_tokens_only(tmp_path):
    """Padded and packed micro-batches (one model, one reference: the reference does not depend on the path)."""
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        model_dir = make_tiny_qwen2(tmp_path / "model", layers=2, vocab=VOCAB)
        plain = make_rollouts(2)
        rollouts = with_tool_responses(plain)
        rng = np.random.default_rng(3)
        advantages = rng.standard_normal(B * NUM_GENERATIONS).astype(np.float32)
        drift = (rng.normal(0, 0.3, plain.completion_mask.shape) * plain.completion_mask).astype(np.float32)
        noise = 0.2 * rng.standard_normal(drift.shape).astype(np.float32)
        results, expected = {}, None
        for name, budget in (("padded", 0), ("packed", 4 * W)):
            grads = []
            # two passes per rollout (so the old log-probs given are used: ratio and clip live), no clipping (the
            # captured gradients are then the loss's own)
            pol = capture_instead_of_applying(worker(model_dir, "grpo", budget, max_grad_norm=0.0), grads)
            # the reference is the actor's initial weights: moved off them, so the KL term is live too
            ref = pol.reference_logprobs(rollouts) + noise
            logp = pol.actor_logprobs(rollouts)
            old = logp + drift  # an off-policy ratio: the clip and KL terms are live
            metrics = pol.update(rollouts, advantages, old, ref, total_steps=1)
            pol.update(plain, advantages, old, ref, total_steps=1)  # the same rollouts, every token in the loss
            results[name] = (metrics, grads[0], grads[2])  # each update's first pass (the weights never move)
            if expected is None:
                model_mask = rollouts.completion_mask * (1 - rollouts.tool_mask)
                loss, dlogp, _ = torch_reference(logp, old, ref, advantages, model_mask, loss_type="grpo", beta=0.04,
                                                 epsilon_low=0.2, epsilon_high=0.2, use_bias_correction_kl=False)
                expected = vjp_through_the_actor(pol, rollouts, dlogp)
    finally:
        ms.set_context(mode=previous)
    for name, (metrics, ours, everything) in results.items():
        assert metrics["actor/loss"] == pytest.approx(loss, rel=1e-5, abs=1e-7), name
        differs = 0
        for grad, want, unmasked in zip(ours, expected, everything):
            scale = np.abs(want).max()
            assert scale > 0 and np.abs(grad - want).max() <= 2e-5 * scale, name
            differs += np.abs(unmasked - want).max() > 1e-2 * scale
        assert differs > len(expected) // 2  # the tool tokens would have moved the gradients had they been in the loss
