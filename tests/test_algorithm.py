"""GRPO algorithm: TRL's own loss and gradient, an independent float64 torch reference, advantages, log-probs, KL."""
import numpy as np
import pytest
import torch

import mindgrpo  # noqa: F401  (before MindSpore)
import mindspore as ms
from mindspore import Tensor

from mindgrpo.algorithm import (METRICS, LossConfig, group_advantages, grpo_loss, kl_penalty, step_row_weights,
                                token_entropy, token_logprobs, zero_std_groups)
from mindgrpo.choices import LOSS_IMPLS as IMPLS, LOSS_TYPES, canonical_kl_estimator


def metrics_dict(metrics):
    """Name the entries of ``grpo_loss``'s metrics vector."""
    return dict(zip(METRICS, metrics.asnumpy().tolist()))


def run(fn, mode: str):
    """``fn`` as is in PyNative, compiled with ms.jit in GRAPH mode."""
    return ms.jit(fn) if mode == "graph" else fn


def load_trl(fixtures_dir):
    ref = np.load(fixtures_dir / "grpo_loss_reference.npz")
    inputs = {k.split("/", 1)[1]: ref[k] for k in ref.files if k.startswith("input/")}
    cases = []
    for name in (str(n) for n in ref["cases"]):
        beta, eps_low, eps_high, corr = (float(v) for v in ref[f"case/{name}/config"])
        cfg = dict(loss_type=name.split("_beta")[0], beta=beta, epsilon_low=eps_low, epsilon_high=eps_high,
                   use_bias_correction_kl=bool(corr), max_completion_length=inputs["completion_mask"].shape[1])
        cases.append((name, cfg, float(ref[f"case/{name}/loss"]), ref[f"case/{name}/grad_per_token_logps"]))
    return inputs, cases


def trl_tensors(inputs):
    return tuple(Tensor(inputs[k]) for k in ("per_token_logps", "old_per_token_logps", "ref_per_token_logps",
                                             "advantages", "completion_mask", "num_items_in_batch"))


# ---------------------------------------------------------------------------------------------------------------
# Independent reference: TRL 1.16's GRPOTrainer._compute_loss formulas (and verl's KL estimators) in float64 torch.

def torch_reference(logp, old, ref, adv, mask, *, loss_type, beta, epsilon_low, epsilon_high, kl_estimator="k3",
                    use_bias_correction_kl=True, max_completion_length=None, num_items=None, grad_accum_steps=1,
                    dp_size=1):
    """Loss, d loss / d logp and the metrics vector, from plain torch autograd in float64."""
    lp = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    old_t = lp.detach() if old is None else torch.tensor(old, dtype=torch.float64)
    m = torch.tensor(mask, dtype=torch.float64)
    a = torch.tensor(adv, dtype=torch.float64)
    a = a[:, None] if a.ndim == 1 else a
    ratio = torch.exp(lp - old_t)
    lo, hi = 1 - epsilon_low, 1 + epsilon_high
    pg = -torch.min(ratio * a, ratio.clamp(lo, hi) * a)
    if ref is None:
        kl = torch.zeros_like(lp)
    else:
        d = torch.tensor(ref, dtype=torch.float64) - lp
        if kl_estimator == "k1":
            kl = -d
        elif kl_estimator == "k2":
            kl = 0.5 * d * d
        else:
            dc = d.clamp(-20, 20)
            kl = (torch.exp(dc) - dc - 1).clamp(-10, 10)
        if use_bias_correction_kl:
            kl = kl * ratio
    token = pg + beta * kl
    if loss_type == "grpo":
        loss = ((token * m).sum(-1) / m.sum(-1).clamp(min=1)).mean() / grad_accum_steps
    elif loss_type == "bnpo":
        loss = (token * m).sum() / m.sum().clamp(min=1) / grad_accum_steps
    elif loss_type == "dr_grpo":
        loss = (token * m).sum() / (lp.shape[0] * max_completion_length) / grad_accum_steps
    else:
        total = float(m.sum()) if num_items is None else float(num_items)
        loss = (token * m).sum() * dp_size / max(1.0, total)
    loss.backward()
    low = ((ratio < lo) & (a < 0)).double()
    high = ((ratio > hi) & (a > 0)).double()
    n = m.sum().clamp(min=1)
    metrics = [float((x * m).sum() / n) for x in (pg.detach(), kl.detach(), low, high, low + high, old_t - lp.detach())]
    return float(loss.detach()), lp.grad.numpy(), np.array(metrics)


def random_batch(seed: int, batch: int, length: int, *, ratio_scale=0.3, ref_scale=0.2, token_adv=False):
    rng = np.random.default_rng(seed)
    old = -(0.5 + 2.5 * rng.random((batch, length)))
    logp = old + ratio_scale * rng.standard_normal((batch, length))
    ref = logp + ref_scale * rng.standard_normal((batch, length))
    mask = (rng.random((batch, length)) < 0.8).astype(np.float32)
    mask[0, :] = 0  # a fully masked row must contribute nothing
    adv = rng.standard_normal((batch, length) if token_adv else batch)
    return tuple(x.astype(np.float32) for x in (logp, old, ref, adv, mask))


def assert_close_to_reference(loss, grad, ref_loss, ref_grad, tol=1e-5):
    assert abs(float(loss) - ref_loss) < tol
    np.testing.assert_allclose(grad.asnumpy(), ref_grad, atol=tol, rtol=0)


def loss_config(cfg: dict, impl: str) -> LossConfig:
    """The LossConfig of a reference case's settings (``cfg``: LossConfig fields over TRL's defaults, plus the
    max_completion_length the loss takes as an argument)."""
    return LossConfig.trl(**{k: v for k, v in cfg.items() if k != "max_completion_length"}, loss_impl=impl)


def loss_with(cfg: dict, impl: str):
    """The loss as a function of the batch, for one case (GRAPH mode needs a closure, not a default)."""
    settings, limit = loss_config(cfg, impl), cfg.get("max_completion_length")

    def loss_fn(logp, old, ref, adv, mask, num_items):
        return grpo_loss(logp, old, ref, adv, mask, cfg=settings, num_items_in_batch=num_items,
                         max_completion_length=limit)[0]
    return loss_fn


# ---------------------------------------------------------------------------------------------------------------
# TRL 1.16's own numbers

@pytest.mark.parametrize("impl", IMPLS)
def test_all_trl_cases_match_loss_and_gradient(fixtures_dir, ms_mode, impl):
    """Every case of grpo_loss_reference.npz (4 loss types x beta x eps_high x KL correction) within 1e-5."""
    inputs, cases = load_trl(fixtures_dir)
    grad_fns = tuple(ms.value_and_grad(loss_with(cfg, impl)) for _, cfg, _, _ in cases)

    def all_cases(*args):  # one graph for all 24 cases: one compilation instead of 24
        return tuple(fn(*args) for fn in grad_fns)

    outputs = run(all_cases, ms_mode)(*trl_tensors(inputs))
    assert len(outputs) == len(cases) == 24
    for (name, _, ref_loss, ref_grad), (loss, grad) in zip(cases, outputs):
        assert abs(float(loss) - ref_loss) < 1e-5, name
        np.testing.assert_allclose(grad.asnumpy(), ref_grad, atol=1e-5, rtol=0, err_msg=name)


@pytest.mark.parametrize("impl", IMPLS)
def test_trl_fixture_metrics_match_reference(fixtures_dir, impl):
    inputs, cases = load_trl(fixtures_dir)
    for name, cfg, _, _ in cases:
        if "beta0.04" not in name:
            continue
        _, metrics = grpo_loss(*trl_tensors(inputs)[:5], cfg=loss_config(cfg, impl),
                               max_completion_length=cfg["max_completion_length"])
        *_, ref_metrics = torch_reference(inputs["per_token_logps"], inputs["old_per_token_logps"],
                                          inputs["ref_per_token_logps"], inputs["advantages"],
                                          inputs["completion_mask"], **cfg)
        np.testing.assert_allclose(metrics.asnumpy(), ref_metrics, atol=1e-6, err_msg=name)
        named = metrics_dict(metrics)
        assert list(named) == list(METRICS)
        assert named["clipfrac"] == pytest.approx(named["clipfrac_low"] + named["clipfrac_high"], abs=1e-6)
        assert 0 < named["clipfrac_high"] < 1  # the fixture's log-ratios ~ N(0, 0.3) clip some tokens


# ---------------------------------------------------------------------------------------------------------------
# Beyond the fixture: estimators, token-level advantages, on-policy, clamps (float64 torch reference)

@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("kl_estimator,use_bias_correction_kl,ref_scale",
                         [("k1", False, 0.2), ("k2", True, 0.2), ("k3", False, 4.0), ("k3", True, 30.0)])
def test_loss_matches_torch_reference(impl, loss_type, kl_estimator, use_bias_correction_kl, ref_scale):
    """ref_scale 4 makes k3's value clamp bind, 30 also its log-ratio clamp; both must stop the gradient."""
    logp, old, ref, adv, mask = random_batch(7, 5, 9, ref_scale=ref_scale, token_adv=loss_type == "bnpo")
    cfg = dict(loss_type=loss_type, beta=0.1, epsilon_low=0.2, epsilon_high=0.28, kl_estimator=kl_estimator,
               use_bias_correction_kl=use_bias_correction_kl, max_completion_length=12)
    settings = loss_config(cfg, impl)
    fn = ms.value_and_grad(lambda lp: grpo_loss(lp, Tensor(old), Tensor(ref), Tensor(adv), Tensor(mask),
                                                cfg=settings, num_items_in_batch=40, max_completion_length=12)[0])
    loss, grad = fn(Tensor(logp))
    ref_loss, ref_grad, _ = torch_reference(logp, old, ref, adv, mask, num_items=40, **cfg)
    assert_close_to_reference(loss, grad, ref_loss, ref_grad)


@pytest.mark.parametrize("impl", IMPLS)
def test_on_policy_ratio_is_one_but_carries_the_gradient(impl):
    logp, _, _, adv, mask = random_batch(3, 4, 6)
    settings = LossConfig.trl(loss_type="grpo", loss_impl=impl)
    fn = ms.value_and_grad(lambda lp: grpo_loss(lp, None, None, Tensor(adv), Tensor(mask), cfg=settings))
    (loss, metrics), grad = fn(Tensor(logp))
    ref_loss, ref_grad, ref_metrics = torch_reference(logp, None, None, adv, mask, loss_type="grpo", beta=0.0,
                                                      epsilon_low=0.2, epsilon_high=0.2)
    assert_close_to_reference(loss, grad, ref_loss, ref_grad)
    named = metrics_dict(metrics)
    assert named["clipfrac"] == 0 and named["ppo_kl"] == 0 and named["kl"] == 0
    assert np.abs(grad.asnumpy()).max() > 0


def _micro_batch_loss_and_grad(batch, rows, settings, grad_accum_steps, dp_size):
    """The loss of the micro-batch ``rows`` of ``batch`` (log-probs, old, ref, advantages, mask) as one rank of
    ``dp_size`` reduces it, ``num_items`` counting the whole batch's tokens, and its gradient by the log-probs."""
    logp, old, ref, adv, mask = batch
    num_items = Tensor(np.float32(mask.sum()))
    fn = ms.value_and_grad(lambda lp: grpo_loss(
        lp, Tensor(old[rows]), Tensor(ref[rows]), Tensor(adv[rows]), Tensor(mask[rows]), cfg=settings,
        num_items_in_batch=num_items, grad_accum_steps=grad_accum_steps, dp_size=dp_size,
        max_completion_length=10)[0])
    loss, grad = fn(Tensor(logp[rows]))
    return float(loss), grad.asnumpy()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
def test_accumulation_and_data_parallel_equal_one_big_batch(impl, loss_type):
    """2 ranks x 2 micro-batches: summed micro-batch gradients, averaged over ranks, equal the full batch's."""
    logp, old, ref, adv, mask = random_batch(11, 8, 10)
    settings = LossConfig.trl(loss_type=loss_type, beta=0.05, epsilon_low=0.2, epsilon_high=0.28, loss_impl=impl)
    batch = (logp, old, ref, adv, mask)

    def value_and_grad(rows, grad_accum_steps, dp_size):
        return _micro_batch_loss_and_grad(batch, rows, settings, grad_accum_steps, dp_size)

    full_loss, full_grad = value_and_grad(slice(0, 8), 1, 1)
    world, accum = 2, 2
    rank_losses, grad = [], np.zeros_like(full_grad)
    for rank in range(world):
        total = 0.0
        for micro in range(accum):
            rows = slice(4 * rank + 2 * micro, 4 * rank + 2 * micro + 2)
            loss, micro_grad = value_and_grad(rows, accum, world)
            total += loss
            grad[rows] = micro_grad / world  # the reducer's mean over ranks
        rank_losses.append(total)
    assert np.mean(rank_losses) == pytest.approx(full_loss, abs=1e-6)
    np.testing.assert_allclose(grad, full_grad, atol=1e-7)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_every_reduction_is_the_same_on_one_rank_and_on_two(impl, loss_type):
    """The layout does not change the step: one process summing 4 micro-batches of 2 sequences, and 2 data-parallel
    ranks summing 2 each whose gradients the reducer averages, give the same gradient for every loss_type (bnpo's
    per-micro-batch token means included; dapo's num_items counts the tokens of both ranks)."""
    logp, old, ref, adv, mask = random_batch(13, 8, 10)
    settings = LossConfig.trl(loss_type=loss_type, beta=0.05, epsilon_low=0.2, epsilon_high=0.28, loss_impl=impl)
    batch = (logp, old, ref, adv, mask)

    def gradient(rows, grad_accum_steps, dp_size):
        return _micro_batch_loss_and_grad(batch, rows, settings, grad_accum_steps, dp_size)[1]

    one, two = np.zeros_like(logp), np.zeros_like(logp)
    for micro in range(4):
        rows = slice(2 * micro, 2 * micro + 2)
        one[rows] = gradient(rows, 4, 1)
        two[rows] = gradient(rows, 2, 2) / 2  # rank micro // 2's micro-batch; the reducer's mean over 2 ranks
    np.testing.assert_allclose(two, one, rtol=0, atol=1e-8)
    assert np.abs(one).max() > 1e-3


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_row_weights_give_the_step_loss_however_sequences_are_grouped(impl, loss_type):
    """Packed training regroups a step's sequences into micro-batches of other sizes and members: summed with
    step_row_weights, they give the loss and gradient of the consecutive micro-batches of micro_batch_size (one rank
    of two: dapo's num_items counts both)."""
    logp, old, ref, adv, mask = random_batch(12, 8, 10)
    settings = LossConfig.trl(loss_type=loss_type, beta=0.05, epsilon_low=0.2, epsilon_high=0.28, loss_impl=impl)
    num_items = float(mask.sum()) * 1.7  # the other rank's tokens too
    weights = step_row_weights(settings, mask.sum(1), 4, dp_size=2, num_items_in_batch=num_items,
                               max_completion_length=10)

    def value_and_grad(rows, **reduce):
        fn = ms.value_and_grad(lambda lp: grpo_loss(lp, Tensor(old[rows]), Tensor(ref[rows]), Tensor(adv[rows]),
                                                    Tensor(mask[rows]), cfg=settings, max_completion_length=10,
                                                    **reduce)[0])
        loss, grad = fn(Tensor(logp[rows]))
        return float(loss), grad.asnumpy()

    def step(groups, **reduce):
        loss, grad = 0.0, np.zeros_like(logp)
        for rows in groups:
            part, grad[rows] = value_and_grad(rows, **(reduce or {"row_weights": Tensor(weights[rows])}))
            loss += part
        return loss, grad

    padded = step([np.arange(0, 4), np.arange(4, 8)], num_items_in_batch=Tensor(np.float32(num_items)),
                  grad_accum_steps=2, dp_size=2)
    regrouped = step([np.array([6, 1, 3]), np.array([0, 7]), np.array([2, 5, 4])])
    assert regrouped[0] == pytest.approx(padded[0], rel=1e-5) and abs(padded[0]) > 1e-3
    np.testing.assert_allclose(regrouped[1], padded[1], rtol=0, atol=1e-7)
    assert np.abs(padded[1]).max() > 1e-3


# ---------------------------------------------------------------------------------------------------------------
# Settings and input validation

def test_loss_config_defaults_and_validation():
    """A run's defaults are MindRLHF's (the rl_config group's), LossConfig.trl()'s TRL 1.16's; a bad value fails
    at construction, naming the field."""
    run, trl = LossConfig(), LossConfig.trl()
    assert (run.loss_type, run.beta, run.use_bias_correction_kl) == ("grpo", 0.04, False)
    assert (trl.loss_type, trl.beta, trl.epsilon_high, trl.use_bias_correction_kl) == ("dapo", 0.0, 0.2, True)
    assert LossConfig.trl(epsilon_low=0.1).epsilon_high == 0.1
    assert LossConfig(kl_estimator="low_var_kl").kl_estimator == "k3"
    assert LossConfig(kl_estimator="mse").kl_estimator == "k2"
    for bad, key in ((dict(loss_type="ppo"), "loss_type"), (dict(kl_estimator="k4"), "kl_estimator"),
                     (dict(loss_impl="cuda"), "loss_impl"), (dict(epsilon_low=1.5), "epsilon_low"),
                     (dict(beta=-0.1), "beta"), (dict(sapo_temperature_neg=0.0), "sapo_temperature_neg"),
                     (dict(top_entropy_quantile=1.5), "top_entropy_quantile")):
        with pytest.raises(ValueError, match=key):
            LossConfig(**bad)


def test_the_run_config_is_its_loss_group():
    """rl_config is made of its concept groups; the loss group the step graphs hold is a copy of its fields."""
    from mindgrpo.config import GRPOConfig
    rl = GRPOConfig().rl_config
    assert isinstance(rl, LossConfig) and LossConfig in type(rl).groups()
    rl.loss_type, rl.kl_estimator, rl.epsilon_high = "dapo", "low_var_kl", 0.28
    group = LossConfig.of(rl)
    assert (group.loss_type, group.kl_estimator, group.epsilon_high) == ("dapo", "k3", 0.28)
    assert type(group) is LossConfig


def test_grpo_loss_rejects_inconsistent_inputs():
    logp, old, ref, adv, mask = (Tensor(x) for x in random_batch(0, 3, 4))
    with pytest.raises(ValueError, match="ref_logp"):
        grpo_loss(logp, old, None, adv, mask, cfg=LossConfig.trl(beta=0.1))
    with pytest.raises(ValueError, match="max_completion_length"):
        grpo_loss(logp, old, ref, adv, mask, cfg=LossConfig.trl(loss_type="dr_grpo"))
    with pytest.raises(ValueError, match="num_items_in_batch"):
        grpo_loss(logp, old, ref, adv, mask, cfg=LossConfig.trl(), grad_accum_steps=2)
    with pytest.raises(ValueError, match="mask"):
        grpo_loss(logp, old, ref, adv, mask[:, :2], cfg=LossConfig.trl())
    with pytest.raises(ValueError, match="advantages"):
        grpo_loss(logp, old, ref, Tensor(np.zeros(5, np.float32)), mask, cfg=LossConfig.trl())


# ---------------------------------------------------------------------------------------------------------------
# Group advantages

def numpy_advantages(rewards, group, scale, eps=1e-4):
    grouped = rewards.reshape(-1, group).astype(np.float64)
    centered = grouped - grouped.mean(1, keepdims=True)
    if scale == "group":
        centered = centered / (grouped.std(1, ddof=1, keepdims=True) + eps)
    elif scale == "batch":
        centered = centered / (rewards.astype(np.float64).std(ddof=1) + eps)
    return centered.reshape(-1)


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
def test_group_advantages_match_unbiased_std_formula(ms_mode, scale_rewards):
    rewards = np.array([1, 0, 0, 1, 0.5, 0.5, 0.5, 0.5, 2, -1, 0, 3], np.float32)  # 3 groups of 4, one constant
    def advantages_of(r):
        return group_advantages(r, 4, scale_rewards=scale_rewards)

    advantages = run(advantages_of, ms_mode)(Tensor(rewards))
    np.testing.assert_allclose(advantages.asnumpy(), numpy_advantages(rewards, 4, scale_rewards), atol=1e-5)
    assert zero_std_groups(rewards, 4).tolist() == [False, True, False]
    assert np.all(advantages.asnumpy()[4:8] == 0)  # all-equal rewards: no signal


def _on_ranks(fn, shares):
    """fn(share, all_reduce_sum) on one thread per share, whose all_reduce_sum sums the ranks' arrays (a stand-in
    for the data-parallel collective: every rank waits for the others at each call, as AllReduce does)."""
    import threading

    barrier, slots, results = threading.Barrier(len(shares)), [None] * len(shares), [None] * len(shares)

    def run(rank):
        def all_reduce_sum(values):
            slots[rank] = np.asarray(values, np.float64)
            barrier.wait()
            total = sum(slots)
            barrier.wait()  # nobody overwrites a slot before everyone has summed
            return total
        results[rank] = fn(shares[rank], all_reduce_sum)

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(len(shares))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_batch_scaling_over_data_parallel_ranks_equals_one_batch():
    """scale_rewards "batch" with the global batch's rewards spread over 3 data-parallel ranks: each rank's
    advantages, divided by global_batch_std, are its rows of the whole batch's (the rank's own std would not be)."""
    from mindgrpo.algorithm import global_batch_std

    rewards = np.array([1, 0, 0, 1, 0.5, 0.5, 0.5, 0.5, 2, -1, 0, 3], np.float32)
    whole = group_advantages(rewards, 2, scale_rewards="batch").asnumpy()
    shares = np.split(rewards, 3)
    stds = _on_ranks(global_batch_std, shares)
    assert stds == pytest.approx([rewards.astype(np.float64).std(ddof=1)] * 3, rel=1e-12)
    gap = 0.0
    for rank, (share, std) in enumerate(zip(shares, stds)):
        ours = group_advantages(share, 2, scale_rewards="batch", batch_std=std).asnumpy()
        np.testing.assert_allclose(ours, whole[rank * 4:(rank + 1) * 4], atol=1e-6)
        own = group_advantages(share, 2, scale_rewards="batch").asnumpy()
        gap = max(gap, float(np.abs(own - ours).max()))
    assert gap > 1e-2


def test_group_advantages_edge_cases():
    lone = np.array([3.0, -1.0, 2.0], np.float32)
    advantages = group_advantages(lone, 1)
    assert np.all(advantages.asnumpy() == 0) and zero_std_groups(lone, 1).all()  # nothing to compare to
    advantages = group_advantages(np.array([0.0, 1.0], np.float32), 2)
    assert advantages.asnumpy() == pytest.approx([-0.5 / (np.sqrt(0.5) + 1e-4), 0.5 / (np.sqrt(0.5) + 1e-4)], rel=1e-5)
    with pytest.raises(ValueError, match="divisible"):
        group_advantages(np.zeros(5, np.float32), 2)
    with pytest.raises(ValueError, match="scale_rewards"):
        group_advantages(np.zeros(4, np.float32), 2, scale_rewards="global")


# ---------------------------------------------------------------------------------------------------------------
# Log-probs and entropy

def test_token_logprobs_match_huggingface_forward(tiny_model_dir):
    """The fixture model's HF logits: our log-probs equal HF's log_softmax-gather on real tokens."""
    ref = np.load(tiny_model_dir / "reference.npz")
    logp = token_logprobs(Tensor(ref["logits"][:, :-1]), Tensor(ref["input_ids"][:, 1:].astype(np.int32)))
    ok = ref["token_logprobs_mask"].astype(bool)
    np.testing.assert_allclose(logp.asnumpy()[ok], ref["token_logprobs"][ok], atol=1e-5)


@pytest.mark.parametrize("temperature,chunk_size", [(1.0, None), (0.7, 4)])
def test_token_logprobs_and_gradient_match_torch(ms_mode, temperature, chunk_size):
    rng = np.random.default_rng(5)
    logits = (3 * rng.standard_normal((2, 5, 37))).astype(np.float32)
    targets = rng.integers(0, 37, size=(2, 5)).astype(np.int32)
    weights = rng.standard_normal((2, 5)).astype(np.float32)

    def weighted(x):
        return (token_logprobs(x, Tensor(targets), temperature, chunk_size) * Tensor(weights)).sum()

    value, grad = run(ms.value_and_grad(weighted), ms_mode)(Tensor(logits))
    x = torch.tensor(logits, dtype=torch.float64, requires_grad=True)
    ref = torch.log_softmax(x / temperature, -1).gather(-1, torch.tensor(targets, dtype=torch.int64)[..., None])
    ref_value = (ref.squeeze(-1) * torch.tensor(weights, dtype=torch.float64)).sum()
    ref_value.backward()
    assert float(value) == pytest.approx(ref_value.item(), abs=1e-4)
    np.testing.assert_allclose(grad.asnumpy(), x.grad.numpy(), atol=1e-5)


@pytest.mark.parametrize("chunk_size", [None, 3])
def test_token_entropy_matches_torch(ms_mode, chunk_size):
    rng = np.random.default_rng(6)
    logits = (4 * rng.standard_normal((2, 4, 50))).astype(np.float32)
    def entropy_of(x):
        return token_entropy(x, 0.8, chunk_size)

    entropy = run(entropy_of, ms_mode)(Tensor(logits))
    probs = torch.softmax(torch.tensor(logits, dtype=torch.float64) / 0.8, -1)
    ref = -(probs * torch.log(probs)).sum(-1)
    np.testing.assert_allclose(entropy.asnumpy(), ref.numpy(), atol=1e-5)


def test_token_logprobs_rejects_bad_inputs():
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(Tensor(np.zeros((1, 2, 3), np.float32)), Tensor(np.zeros((1, 2), np.int32)), 0.0)
    with pytest.raises(ValueError, match="do not match"):
        token_logprobs(Tensor(np.zeros((1, 2, 3), np.float32)), Tensor(np.zeros((1, 3), np.int32)))


# ---------------------------------------------------------------------------------------------------------------
# KL estimators

def test_kl_estimators_and_clamps():
    logp = np.array([-1.0, -2.0, -0.5, -1.0, -30.0], np.float32)
    ref = np.array([-1.0, -1.5, -0.9, -4.0, -1.0], np.float32)
    d = (ref - logp).astype(np.float64)
    expected = {"k1": -d, "k2": 0.5 * d * d,
                "k3": np.clip(np.exp(np.clip(d, -20, 20)) - np.clip(d, -20, 20) - 1, -10, 10)}
    for name, values in expected.items():
        out = kl_penalty(Tensor(logp), Tensor(ref), name).asnumpy()
        np.testing.assert_allclose(out, values, rtol=1e-5, atol=1e-6, err_msg=name)
    assert kl_penalty(Tensor(logp), Tensor(ref), "k3").asnumpy()[-1] == 10.0  # log-ratio 29: clamped to 10
    assert canonical_kl_estimator("kl") == "k1"
    with pytest.raises(ValueError, match="kl_estimator"):
        kl_penalty(Tensor(logp), Tensor(ref), "full")
