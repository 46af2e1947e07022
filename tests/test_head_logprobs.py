"""The fused head (``actor_config.head_impl: fused``, mindgrpo/ops/head_logprobs.py) equals its plain-ops twin,
``token_logprobs`` and ``token_entropy`` of ``hidden @ weight.T``: log-probs, entropies, and the gradients to the
hidden states and to a trained head, in PyNative and GRAPH mode; a frozen head gets none. Through the model's
passes (shared prompt, unshared, packed; tied and untied heads) the log-probs and every trained parameter's gradient
equal the plain head's, so the trainer may pick either."""
import sys
from pathlib import Path

import numpy as np
import pytest

import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

from mindgrpo.algorithm import token_entropy, token_logprobs
from mindgrpo.config import GRPOConfig
from mindgrpo.models import build_model
from mindgrpo.ops.head_logprobs import head_logprobs
from mindgrpo.train.model_worker import ModelWorker
from mindgrpo.train.packing import micro_batches
from mindgrpo.train.rollout_batch import RolloutBatch
from mindgrpo.train.step_batch import step_batch
from mindgrpo.train.step_graphs import CompletionLogProbs, completion_forward, training_head_mode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_shared_prompt import G, batch  # noqa: E402

TEMPERATURE = 0.7
# Rows over 64 cross the kernel's chunk; the scale makes some rows peaked (entropy near 0), as a trained model's are.
ROWS, HIDDEN, VOCAB = 150, 32, 700


class Head(nn.Cell):
    """sum(logp * g) and the entropies of hidden @ proj through the head, fused or plain."""

    def __init__(self, fused: bool, trained: bool, seed: int = 0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.weight = Parameter(Tensor(rng.normal(0, 1.0, (VOCAB, HIDDEN)).astype(np.float32)), name="w",
                                requires_grad=trained)
        self.proj = Parameter(Tensor((np.eye(HIDDEN) + rng.normal(0, 0.05, (HIDDEN, HIDDEN))).astype(np.float32)),
                              name="proj")
        self.fused, self.trained = fused, trained
        self.inv_temp = Tensor([1.0 / TEMPERATURE], ms.float32)

    def construct(self, hidden, ids, g):
        x = ops.matmul(hidden, self.proj)
        if self.fused:
            logp, entropy = head_logprobs(x, self.weight, ids, self.inv_temp,
                                          "train_head" if self.trained else "train")
        else:
            logits = ops.matmul(x, self.weight.T).reshape((1, ROWS, VOCAB))
            logp = token_logprobs(logits, ids.reshape((1, ROWS)), TEMPERATURE).reshape((ROWS,))
            entropy = token_entropy(logits, TEMPERATURE).reshape((ROWS,))
        return (logp * g).sum(), logp, entropy


def head_run(fused: bool, trained: bool):
    rng = np.random.default_rng(1)
    hidden = Tensor((rng.normal(0, 1, (ROWS, HIDDEN)) * rng.choice([0.2, 3.0], (ROWS, 1))).astype(np.float32))
    ids = Tensor(rng.integers(0, VOCAB, ROWS).astype(np.int32))
    g = Tensor(rng.normal(0, 1, ROWS).astype(np.float32))
    net = Head(fused, trained)
    (_, logp, entropy), grads = ms.value_and_grad(net, None, net.trainable_params(), has_aux=True)(hidden, ids, g)
    return logp.asnumpy(), entropy.asnumpy(), [grad.asnumpy() for grad in grads]


@pytest.mark.parametrize("trained", [True, False], ids=["trained_head", "frozen_head"])
def test_kernel_equals_the_plain_ops(ms_mode, trained):
    fused, plain = head_run(True, trained), head_run(False, trained)
    np.testing.assert_allclose(fused[0], plain[0], atol=2e-5)
    np.testing.assert_allclose(fused[1], plain[1], atol=2e-5)
    assert plain[1].min() < 1e-2 < 3.0 < plain[1].max()  # peaked and flat rows both checked
    assert len(fused[2]) == len(plain[2]) == (2 if trained else 1)
    for ours, theirs in zip(fused[2], plain[2]):  # sums over rows and the vocabulary: float32 order, to 1e-5 of scale
        np.testing.assert_allclose(ours, theirs, atol=1e-5 * np.abs(theirs).max(), rtol=0)


def test_scoring_mode_equals_training_mode():
    rng = np.random.default_rng(2)
    hidden = Tensor(rng.normal(0, 1, (ROWS, HIDDEN)).astype(np.float32))
    weight = Tensor(rng.normal(0, 1, (VOCAB, HIDDEN)).astype(np.float32))
    ids, inv_temp = Tensor(rng.integers(0, VOCAB, ROWS).astype(np.int32)), Tensor([1.0], ms.float32)
    scored = head_logprobs(hidden, weight, ids, inv_temp, "score")
    trained = head_logprobs(hidden, weight, ids, inv_temp, "train")
    for a, b in zip(scored, trained):
        np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())


def test_an_id_outside_the_vocabulary_is_an_error():
    hidden, weight = Tensor(np.zeros((4, HIDDEN), np.float32)), Tensor(np.zeros((VOCAB, HIDDEN), np.float32))
    with pytest.raises(Exception):
        head_logprobs(hidden, weight, Tensor(np.array([0, 1, VOCAB, 2], np.int32)), Tensor([1.0], ms.float32),
                      "score")[0].asnumpy()


def pass_config(pass_name: str, head_impl: str) -> GRPOConfig:
    config = GRPOConfig()
    config.rl_config.num_generations = G
    config.rl_config.seq_length = 64
    config.rl_config.share_prompt = pass_name != "unshared"
    config.actor_config.max_tokens_per_micro_batch = 2 * 7 if pass_name == "packed" else 0
    config.actor_config.head_impl = head_impl
    return config


def pass_inputs(pass_name: str):
    prompt_ids, prompt_mask, completion_ids, completion_mask = batch()
    if pass_name == "shared":
        return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids}
    if pass_name == "unshared":
        return {"input_ids": np.concatenate([np.repeat(prompt_ids, G, 0), completion_ids], 1),
                "attention_mask": np.concatenate([np.repeat(prompt_mask, G, 0), completion_mask], 1),
                "completion_ids": completion_ids}
    rollouts = RolloutBatch(prompt_ids, prompt_mask, completion_ids, completion_mask)
    first = next(micro_batches(rollouts, 2, G))  # the packed pass's first micro-batch, as the trainer makes it
    return ModelWorker._packed_inputs(rollouts, first)


class PassLoss(nn.Cell):
    def __init__(self, logprobs: CompletionLogProbs, weights: Tensor):
        super().__init__(auto_prefix=False)
        self.logprobs, self.weights = logprobs, weights

    def construct(self, batch):
        logp, entropy = self.logprobs(batch)
        return (logp * self.weights).sum(), logp, entropy


@pytest.mark.parametrize("pass_name", ["shared", "unshared", "packed"])
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_passes_with_the_fused_head_equal_the_plain_head(ms_mode, pass_name, tied, tiny_model_dir,
                                                         tiny_untied_model_dir):
    results = {}
    for head_impl in ("fused", "plain"):
        model = build_model(tiny_model_dir if tied else tiny_untied_model_dir)
        config = pass_config(pass_name, head_impl)
        forward = completion_forward(model, config, backward=True)
        assert forward.head_outside == (head_impl == "fused")
        inputs = pass_inputs(pass_name)
        weights = Tensor(np.random.default_rng(3).normal(0, 1, inputs["completion_ids"].shape).astype(np.float32))
        loss = PassLoss(CompletionLogProbs(forward, TEMPERATURE, head_mode=training_head_mode(forward)), weights)
        params = model.trainable_params()
        (_, logp, entropy), grads = ms.value_and_grad(loss, None, params, has_aux=True)(step_batch(inputs))
        results[head_impl] = (logp.asnumpy(), entropy.asnumpy(), {p.name: g.asnumpy() for p, g in zip(params, grads)})
    fused, plain = results["fused"], results["plain"]
    np.testing.assert_allclose(fused[0], plain[0], atol=2e-5)
    np.testing.assert_allclose(fused[1], plain[1], atol=2e-5)
    head_name = "model.tok_embeddings.embedding_weight" if tied else "lm_head.weight"
    assert head_name in fused[2] and np.abs(fused[2][head_name]).max() > 1e-3  # the head's gradient is there
    for name, grad in plain[2].items():
        np.testing.assert_allclose(fused[2][name], grad, atol=1e-5 * np.abs(grad).max(), rtol=0, err_msg=name)


@pytest.mark.parametrize("recompute", [True, False], ids=["recompute", "no_recompute"])
def test_lora_gradients_with_the_fused_head_equal_the_plain_head(ms_mode, recompute, tiny_untied_model_dir):
    """The real-model recipe's combination: LoRA adapters on a frozen, untied head, the fused head, layers
    recomputed in the backward. Every adapter's gradient equals the plain head's without recompute (the reference),
    so an update moves the policy the way the loss asks."""
    from mindgrpo.models.lora import LoraSpec

    results = {}
    for head_impl, rc in (("fused", recompute), ("plain", False)):
        model = build_model(tiny_untied_model_dir, lora=LoraSpec(4, 8, ("q_proj", "v_proj", "gate_proj", "down_proj")))
        rng = np.random.default_rng(5)
        for param in model.trainable_params():  # B away from zero, so that A's gradients are not zero too
            param.set_data(Tensor(rng.normal(0, 0.05, param.shape).astype(np.float32)))
        config = pass_config("shared", head_impl)
        config.actor_config.recompute = rc
        forward = completion_forward(model, config, backward=True)
        inputs = pass_inputs("shared")
        weights = Tensor(np.random.default_rng(3).normal(0, 1, inputs["completion_ids"].shape).astype(np.float32))
        loss = PassLoss(CompletionLogProbs(forward, TEMPERATURE, head_mode=training_head_mode(forward)), weights)
        params = model.trainable_params()
        (_, logp, _), grads = ms.value_and_grad(loss, None, params, has_aux=True)(step_batch(inputs))
        results[head_impl] = (logp.asnumpy(), {p.name: g.asnumpy() for p, g in zip(params, grads)})
    fused, plain = results["fused"], results["plain"]
    np.testing.assert_allclose(fused[0], plain[0], atol=2e-5)
    assert sorted(plain[1]) == sorted(fused[1]) and len(plain[1]) >= 16
    assert all(np.abs(g).max() > 1e-6 for g in plain[1].values())
    for name, grad in plain[1].items():
        np.testing.assert_allclose(fused[1][name], grad, atol=1e-5 * np.abs(grad).max(), rtol=0, err_msg=name)
