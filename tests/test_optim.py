"""AdamW and clipping against torch.optim.AdamW / clip_grad_norm_, in PyNative and GRAPH; the lr schedules."""
import math

import numpy as np
import pytest

import mindspore as ms
from mindspore import Parameter, Tensor, nn

from mindgrpo.config import LRScheduleConfig, OptimizerConfig
from mindgrpo.train.optim import AdamW, clip_by_global_norm, learning_rate_at


class _Step(nn.Cell):
    def __init__(self, opt, max_norm):
        super().__init__()
        self.opt, self.max_norm = opt, max_norm

    def construct(self, grads, step_size, eps, decay):
        grads, norm = clip_by_global_norm(grads, self.max_norm)
        self.opt(grads, step_size, eps, decay)
        return norm


def test_adamw_matches_torch(ms_mode):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    shapes = [(5, 3), (3,), (2, 4)]
    init = [rng.normal(size=s).astype(np.float32) for s in shapes]
    grads = [[rng.normal(size=s).astype(np.float32) * 3 for s in shapes] for _ in range(4)]
    cfg = OptimizerConfig(beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, max_grad_norm=1.0)
    params = [Parameter(Tensor(a), name=f"p{i}") for i, a in enumerate(init)]
    opt = AdamW(params, cfg)
    step = _Step(opt, cfg.max_grad_norm)
    if ms_mode == "graph":
        step = ms.jit(step)
    tparams = [torch.tensor(a, requires_grad=True) for a in init]
    topt = torch.optim.AdamW([{"params": [tparams[0], tparams[2]], "weight_decay": 0.1},
                              {"params": [tparams[1]], "weight_decay": 0.0}], lr=0.01, betas=(0.9, 0.95), eps=1e-8)
    for k, gs in enumerate(grads):
        lr = 0.01 * (k + 1) / 4 if k < 2 else 0.01
        for group in topt.param_groups:
            group["lr"] = lr
        for tp, g in zip(tparams, gs):
            tp.grad = torch.tensor(g)
        tnorm = torch.nn.utils.clip_grad_norm_(tparams, 1.0)
        topt.step()
        norm = step(tuple(Tensor(g) for g in gs), *opt.hyper_tensors(lr))
        assert float(norm) == pytest.approx(float(tnorm), rel=1e-5)
    for p, tp in zip(params, tparams):
        np.testing.assert_allclose(p.asnumpy(), tp.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_apply_gradients_steps_as_torch_and_resets_every_accumulator(ms_mode):
    """ApplyGradients (the trainer's AdamW graph): two steps from accumulated gradients equal torch.optim.AdamW's,
    and after each step every accumulator is zero, so the next step's micro-batches start from nothing."""
    torch = pytest.importorskip("torch")
    from mindspore import ParameterTuple

    from mindgrpo.train.step_graphs import ApplyGradients

    rng = np.random.default_rng(1)
    shapes = [(5, 3), (3,), (2, 4)]
    init = [rng.normal(size=s).astype(np.float32) for s in shapes]
    params = [Parameter(Tensor(a), name=f"p{i}") for i, a in enumerate(init)]
    accumulators = ParameterTuple(params).clone(prefix="grad_accum", init="zeros")
    opt = AdamW(params, OptimizerConfig(beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1))
    apply = ApplyGradients(accumulators, opt)
    tparams = [torch.tensor(a, requires_grad=True) for a in init]
    topt = torch.optim.AdamW([{"params": [tparams[0], tparams[2]], "weight_decay": 0.1},
                              {"params": [tparams[1]], "weight_decay": 0.0}], lr=0.01, betas=(0.9, 0.95), eps=1e-8)
    for _ in range(2):
        grads = [rng.normal(size=s).astype(np.float32) for s in shapes]
        for acc, g in zip(accumulators, grads):
            acc.set_data(Tensor(g))
        for tp, g in zip(tparams, grads):
            tp.grad = torch.tensor(g)
        topt.step()
        apply(*opt.hyper_tensors(0.01))
        assert all(not acc.asnumpy().any() for acc in accumulators)
    for p, tp in zip(params, tparams):
        np.testing.assert_allclose(p.asnumpy(), tp.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_optimizer_state_round_trip():
    params = [Parameter(Tensor(np.ones((2, 2), np.float32)), name="w")]
    opt = AdamW(params, OptimizerConfig())
    opt(tuple([Tensor(np.full((2, 2), 0.5, np.float32))]), *opt.hyper_tensors(0.1))
    state = opt.state_arrays()
    fresh = AdamW([Parameter(Tensor(np.ones((2, 2), np.float32)), name="w")], OptimizerConfig())
    fresh.load_state_arrays(state)
    assert fresh.step_count == 1
    np.testing.assert_array_equal(fresh.exp_avg[0].asnumpy(), opt.exp_avg[0].asnumpy())
    with pytest.raises(ValueError, match="missing"):
        fresh.load_state_arrays({"step_count": np.array(1)})


def test_schedules():
    const = LRScheduleConfig(type="constant", learning_rate=1.0, warmup_steps=4)
    assert [learning_rate_at(const, s, 10) for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
    cos = LRScheduleConfig(type="cosine", learning_rate=1.0, lr_end=0.1, warmup_steps=2)
    assert learning_rate_at(cos, 1, 12) == 1.0
    assert learning_rate_at(cos, 2, 12) == pytest.approx(1.0)
    assert learning_rate_at(cos, 7, 12) == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi * 0.5)))
    assert learning_rate_at(cos, 12, 12) == pytest.approx(0.1)


def test_linear_schedule_matches_transformers_default():
    """TRL's default: linear decay from the peak at step 0 to 0 at the last step (no warmup)."""
    linear = LRScheduleConfig(type="linear", learning_rate=1e-5)
    assert [learning_rate_at(linear, s, 4) for s in range(5)] == pytest.approx([1e-5, 7.5e-6, 5e-6, 2.5e-6, 0.0])
    warm = LRScheduleConfig(type="linear", learning_rate=1.0, lr_end=0.2, warmup_steps=2)
    assert [learning_rate_at(warm, s, 6) for s in range(7)] == pytest.approx([0.5, 1.0, 1.0, 0.8, 0.6, 0.4, 0.2])
