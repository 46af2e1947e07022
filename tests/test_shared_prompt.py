"""The shared-prompt forward equals the completions pass over repeated [prompt | completion] rows: logits and the
gradients of a log-prob loss, in PyNative and GRAPH mode, with left padding, ragged completions and GQA; and
``recompute=True`` gives the same gradients."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

import mindspore as ms
from mindspore import ParameterTuple, Tensor, nn

from mindgrpo.algorithm import token_logprobs
from mindgrpo.config import ConfigError, GRPOConfig, validate
from mindgrpo.models import SharedPromptForward, build_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_qwen import make_tiny_qwen2  # noqa: E402

G, P, T = 3, 12, 7
PAD = 4093


def batch(seed: int = 0):
    """Two prompts (9 and 12 real tokens, left-padded) with three completions each; completion 1 ends early."""
    rng = np.random.default_rng(seed)
    prompt_ids = np.full((2, P), PAD, np.int32)
    prompt_mask = np.zeros((2, P), np.int32)
    for i, length in enumerate((9, 12)):
        prompt_ids[i, P - length:] = rng.integers(0, 4000, length)
        prompt_mask[i, P - length:] = 1
    completion_ids = rng.integers(0, 4000, (2 * G, T)).astype(np.int32)
    completion_mask = np.ones((2 * G, T), np.int32)
    completion_mask[1, 5:] = 0
    completion_ids[1, 5:] = PAD
    return prompt_ids, prompt_mask, completion_ids, completion_mask


def unshared(prompt_ids, prompt_mask, completion_ids, completion_mask):
    ids = np.concatenate([np.repeat(prompt_ids, G, 0), completion_ids], 1)
    mask = np.concatenate([np.repeat(prompt_mask, G, 0), completion_mask], 1)
    return Tensor(ids), Tensor(mask)


class SharedLoss(nn.Cell):
    def __init__(self, model, recompute: bool = False):
        super().__init__(auto_prefix=False)
        self.forward = SharedPromptForward(model, G, 64, recompute=recompute)

    def construct(self, prompt_ids, prompt_mask, completion_ids, weights):
        return (token_logprobs(self.forward(prompt_ids, prompt_mask, completion_ids), completion_ids) * weights).sum()


class UnsharedLoss(nn.Cell):
    """The same sum over ``[prompt | completion]`` rows (``rl_config.share_prompt: false``'s pass)."""

    def __init__(self, model):
        super().__init__(auto_prefix=False)
        self.forward = model.completions(64)

    def construct(self, input_ids, attention_mask, completion_ids, weights):
        return (token_logprobs(self.forward(input_ids, attention_mask, completion_ids), completion_ids) * weights).sum()


@pytest.fixture(scope="module")
def actor(tiny_model_dir):
    return build_model(tiny_model_dir)


def test_logits_equal_the_unshared_forward(actor, ms_mode):
    prompt_ids, prompt_mask, completion_ids, completion_mask = batch()
    shared = SharedPromptForward(actor, G, 64)(Tensor(prompt_ids), Tensor(prompt_mask), Tensor(completion_ids))
    ids, mask = unshared(prompt_ids, prompt_mask, completion_ids, completion_mask)
    expected = actor.completions(64)(ids, mask, Tensor(completion_ids)).asnumpy()
    real = completion_mask.astype(bool)
    np.testing.assert_allclose(shared.asnumpy()[real], expected[real], rtol=0, atol=2e-5)
    assert np.abs(expected).max() > 0.1  # a real comparison, not zeros against zeros


def test_gradients_equal_the_unshared_forward(actor, ms_mode):
    prompt_ids, prompt_mask, completion_ids, completion_mask = batch(1)
    weights = Tensor((np.random.default_rng(2).standard_normal((2 * G, T)) * completion_mask).astype(np.float32))
    params = ParameterTuple(actor.trainable_params())
    loss_s, grads_s = ms.value_and_grad(SharedLoss(actor), None, params)(
        Tensor(prompt_ids), Tensor(prompt_mask), Tensor(completion_ids), weights)
    ids, mask = unshared(prompt_ids, prompt_mask, completion_ids, completion_mask)
    loss_u, grads_u = ms.value_and_grad(UnsharedLoss(actor), None, params)(ids, mask, Tensor(completion_ids), weights)
    assert float(loss_s) == pytest.approx(float(loss_u), rel=1e-5)
    for param, gs, gu in zip(params, grads_s, grads_u):
        gs, gu = gs.asnumpy(), gu.asnumpy()
        scale = max(np.abs(gu).max(), 1e-6)
        assert np.abs(gs - gu).max() <= 1e-4 * scale, param.name


@pytest.fixture(scope="module")
def local_actor(tmp_path_factory):
    """A 3-layer GQA model made here (vocabulary above the batch's ids), so this test needs no ../shared."""
    return build_model(make_tiny_qwen2(tmp_path_factory.mktemp("tiny") / "model", layers=3, vocab=4096))


def test_recompute_gives_the_same_gradients(local_actor, ms_mode):
    """Each decoder layer is a recomputed Cell; the backward recomputes its activations and must give the
    gradients of the stored-activation backward (the graph is the same math, so to rounding)."""
    prompt_ids, prompt_mask, completion_ids, completion_mask = batch(3)
    weights = Tensor((np.random.default_rng(4).standard_normal((2 * G, T)) * completion_mask).astype(np.float32))
    params = ParameterTuple(local_actor.trainable_params())
    inputs = (Tensor(prompt_ids), Tensor(prompt_mask), Tensor(completion_ids), weights)
    recomputed = SharedLoss(local_actor, recompute=True)
    # every layer Cell, and only those, is marked (MindSpore records it as _has_config_recompute)
    assert [layer._has_config_recompute for layer in recomputed.forward.layers] == [True] * 3
    assert not recomputed.forward._has_config_recompute
    loss_r, grads_r = ms.value_and_grad(recomputed, None, params)(*inputs)
    loss_s, grads_s = ms.value_and_grad(SharedLoss(local_actor), None, params)(*inputs)
    assert float(loss_r) == pytest.approx(float(loss_s), rel=1e-6)
    assert len(grads_r) == len(params) > 3 * 9
    for param, gr, gs in zip(params, grads_r, grads_s):
        gr, gs = gr.asnumpy(), gs.asnumpy()
        scale = np.abs(gs).max()
        assert scale > 0, param.name  # every Parameter gets a gradient: a real comparison
        assert np.abs(gr - gs).max() <= 1e-6 * scale, param.name


def test_config_demands_whole_groups_only_of_the_shared_forward():
    """The shared forward needs whole groups per micro-batch; unshared rows take any micro-batch size, at any
    tensor-parallel degree (the completions pass runs on slices: tests/tp_worker.py)."""
    config = GRPOConfig()
    config.rl_config.num_generations = 8
    config.actor_config.micro_batch_size = 12
    config.actor_config.parallel_config.model_parallel = 2
    validate_error = "actor_config.micro_batch_size = 12 is not a multiple of rl_config.num_generations = 8"
    with pytest.raises(ConfigError, match=validate_error):
        validate(config, check_paths=False)
    config.rl_config.share_prompt = False
    validate(config, check_paths=False)


class TwoForwards(nn.Cell):
    """Two models' shared-prompt forwards in one graph."""

    def __init__(self, first, second):
        super().__init__(auto_prefix=False)
        self.first, self.second = SharedPromptForward(first, G, 64), SharedPromptForward(second, G, 64)

    def construct(self, prompt_ids, prompt_mask, completion_ids):
        return (self.first(prompt_ids, prompt_mask, completion_ids),
                self.second(prompt_ids, prompt_mask, completion_ids))


def test_layers_compile_once_yet_each_model_keeps_its_own_constants(tmp_path, ms_mode):
    """Every decoder layer reuses one parsed graph (``qwen2_blocks.reused_layer``), with its own Parameters as
    inputs. Two models in one graph that differ only in a constant of the layer (RMSNorm's epsilon) must each
    compute with their own: a layer graph reused across them would silently give the first model's numerics."""
    prompt_ids, prompt_mask, completion_ids, completion_mask = batch(5)
    ids, mask = unshared(prompt_ids, prompt_mask, completion_ids, completion_mask)
    real = completion_mask.astype(bool)
    models = []
    for eps in (1e-6, 0.5):
        folder = make_tiny_qwen2(tmp_path / f"eps{eps}", layers=3, vocab=4096)
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(dict(config, rms_norm_eps=eps)))
        models.append(build_model(folder))
    both = TwoForwards(*models)(Tensor(prompt_ids), Tensor(prompt_mask), Tensor(completion_ids))
    expected = [model.completions(64)(ids, mask, Tensor(completion_ids)).asnumpy()[real] for model in models]
    assert np.abs(expected[0] - expected[1]).max() > 1e-2  # the constant matters: a real test of the key
    for shared, reference in zip(both, expected):
        np.testing.assert_allclose(shared.asnumpy()[real], reference, rtol=0, atol=2e-5)
