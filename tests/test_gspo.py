"""GSPO: ``importance_sampling_level: sequence`` against TRL 1.16's formula (loss and gradient), the fused setting's
fallback to the plain ops, and the config key."""
import numpy as np
import pytest
import torch

import mindgrpo  # noqa: F401  (before MindSpore)
import mindspore as ms
from mindspore import Tensor

import mindgrpo.algorithm.loss as loss_module
from mindgrpo.algorithm import LossConfig, grpo_loss, step_row_weights
from mindgrpo.choices import CLIPPED_LOSS_TYPES, IMPORTANCE_SAMPLING_LEVELS, LOSS_TYPES
from mindgrpo.config import GRPOConfig, validate
from mindgrpo.config.schema import ConfigError

TOL = 1e-5


def trl_compute_loss(logp, old, ref, adv, mask, *, importance_sampling_level, loss_type, beta, epsilon_low,
                     epsilon_high, use_bias_correction_kl, max_completion_length, num_items_in_batch):
    """TRL 1.16.0's loss, written out from ``trl/trainer/grpo_trainer.py``, ``GRPOTrainer._compute_loss`` (one
    process, gradient accumulation 1, steps_per_generation 1, ``delta`` None, no entropy mask, no vLLM correction),
    in float64 torch. Returns the loss and d loss / d logp.

    TRL's lines, in order: ``old = per_token_logps.detach()`` when no old log-probs; ``log_ratio = per_token_logps -
    old``; at sequence level ``log_importance_weights = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)``,
    unsqueezed to [B, 1] (nothing detached); ``coef_1 = exp(log_importance_weights)``; the k3 KL times ``coef_1``
    when ``use_bias_correction_kl``; ``coef_2 = clamp(coef_1, 1 - eps_low, 1 + eps_high)``; ``per_token_loss =
    -min(coef_1 * A, coef_2 * A) + beta * kl``; then the loss_type reduction."""
    lp = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    old_t = lp.detach() if old is None else torch.tensor(old, dtype=torch.float64)
    m = torch.tensor(mask, dtype=torch.float64)
    a = torch.tensor(adv, dtype=torch.float64).unsqueeze(1)
    log_ratio = lp - old_t
    if importance_sampling_level == "token":
        log_importance_weights = log_ratio
    else:
        log_importance_weights = ((log_ratio * m).sum(-1) / m.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    coef_1 = torch.exp(log_importance_weights)
    if beta != 0.0:
        r = torch.tensor(ref, dtype=torch.float64)
        per_token_kl = torch.exp(r - lp) - (r - lp) - 1
        if use_bias_correction_kl:
            per_token_kl = per_token_kl * coef_1
    coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
    per_token_loss = -torch.min(coef_1 * a, coef_2 * a)
    if beta != 0.0:
        per_token_loss = per_token_loss + beta * per_token_kl
    if loss_type == "grpo":
        loss = ((per_token_loss * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
    elif loss_type == "bnpo":
        loss = (per_token_loss * m).sum() / m.sum().clamp(min=1.0)
    elif loss_type == "dr_grpo":
        loss = (per_token_loss * m).sum() / (per_token_loss.size(0) * max_completion_length)
    else:  # dapo: num_items_in_batch / num_processes * G_acc / steps_per_generation, all 1 here
        loss = (per_token_loss * m).sum() / max(1.0, float(num_items_in_batch))
    loss.backward()
    return float(loss.detach()), lp.grad.numpy()


@pytest.fixture(scope="module")
def trl_inputs(fixtures_dir):
    ref = np.load(fixtures_dir / "grpo_loss_reference.npz")
    inputs = {k.split("/", 1)[1]: ref[k] for k in ref.files if k.startswith("input/")}
    cases = {str(n): (tuple(float(v) for v in ref[f"case/{n}/config"]), float(ref[f"case/{n}/loss"]),
                      ref[f"case/{n}/grad_per_token_logps"]) for n in ref["cases"]}
    return inputs, cases


def settings_grid():
    """Every clipped loss type x beta x eps_high x KL bias correction (the fixture's grid; cispo and sapo at
    sequence level are checked against TRL itself in tests/test_trl_toolbox.py)."""
    for loss_type in CLIPPED_LOSS_TYPES:
        for beta in (0.0, 0.04):
            for eps_high in (0.2, 0.28):
                for corr in ((True, False) if beta else (True,)):
                    yield dict(loss_type=loss_type, beta=beta, epsilon_low=0.2, epsilon_high=eps_high,
                               use_bias_correction_kl=corr, max_completion_length=12)


def test_written_out_formula_is_trls_at_token_level(trl_inputs):
    """The formula above, at token level, gives TRL's own stored numbers for all 24 fixture cases: it is TRL's
    _compute_loss, and its sequence branch differs only by TRL's two lines."""
    x, cases = trl_inputs
    assert len(cases) == 24
    for name, ((beta, eps_low, eps_high, corr), trl_loss, trl_grad) in cases.items():
        loss, grad = trl_compute_loss(
            x["per_token_logps"], x["old_per_token_logps"], x["ref_per_token_logps"], x["advantages"],
            x["completion_mask"], importance_sampling_level="token", loss_type=name.split("_beta")[0], beta=beta,
            epsilon_low=eps_low, epsilon_high=eps_high, use_bias_correction_kl=bool(corr),
            max_completion_length=12, num_items_in_batch=x["num_items_in_batch"])
        assert abs(loss - trl_loss) < 1e-6, name
        np.testing.assert_allclose(grad, trl_grad, atol=1e-6, rtol=0, err_msg=name)


def fixture_variants(x):
    """(name, logp, old, ref): the fixture's off-policy batch (num_iterations > 1: old != logp); the same with its
    log-ratios x4, so that some sequences' ratios leave the clip range (ref moved along, keeping ref - logp inside
    the k3 clamps of mindgrpo.algorithm.kl, which TRL does not have); and on-policy (old = logp detached)."""
    logp, old, ref = x["per_token_logps"], x["old_per_token_logps"], x["ref_per_token_logps"]
    wide = (old + 4.0 * (logp - old)).astype(np.float32)
    return (("off_policy", logp, old, ref), ("off_policy_wide", wide, old, (wide + (ref - logp)).astype(np.float32)),
            ("on_policy", logp, None, ref))


def test_sequence_level_matches_trl_loss_and_gradient(trl_inputs, ms_mode):
    """Sequence level, every loss type and setting, three batches: loss and gradient within 1e-5 of TRL's formula,
    in PyNative and GRAPH (one compiled graph for all cases). (``impl="fused"`` runs these same ops at sequence
    level: test_fused_setting_runs_the_plain_ops_at_sequence_level.)"""
    x, _ = trl_inputs
    grid = list(settings_grid())
    fns = [ms.value_and_grad(_loss_fn(LossConfig.trl(**{k: v for k, v in cfg.items() if k != "max_completion_length"},
                                                     loss_impl="plain", importance_sampling_level="sequence")))
           for cfg in grid]

    def all_cases(logp, old, ref, adv, mask, num_items):
        return tuple(fn(logp, old, ref, adv, mask, num_items) for fn in fns)

    def on_policy_cases(logp, ref, adv, mask, num_items):
        return tuple(fn(logp, None, ref, adv, mask, num_items) for fn in fns)

    if ms_mode == "graph":  # compiled once each, reused for every batch
        all_cases, on_policy_cases = ms.jit(all_cases), ms.jit(on_policy_cases)
    adv, mask, num_items = x["advantages"], x["completion_mask"], x["num_items_in_batch"]
    clipped = set()
    for variant, logp, old, ref in fixture_variants(x):
        common = (Tensor(ref), Tensor(adv), Tensor(mask), Tensor(num_items))
        outputs = (on_policy_cases(Tensor(logp), *common) if old is None else
                   all_cases(Tensor(logp), Tensor(old), *common))
        for cfg, (loss, grad) in zip(grid, outputs):
            want_loss, want_grad = trl_compute_loss(logp, old, ref, adv, mask, importance_sampling_level="sequence",
                                                    num_items_in_batch=num_items, **cfg)
            label = f"{variant} {cfg}"
            assert abs(float(loss) - want_loss) < TOL, label
            np.testing.assert_allclose(grad.asnumpy(), want_grad, atol=TOL, rtol=0, err_msg=label)
            assert np.abs(want_grad).max() > 1e-3, label
        if old is not None:
            m = mask.astype(np.float64)
            seq_ratio = np.exp(((logp - old) * m).sum(1) / np.maximum(m.sum(1), 1))
            if ((seq_ratio < 0.8) | (seq_ratio > 1.28)).any():
                clipped.add(variant)
    assert "off_policy_wide" in clipped  # the clip binds on some sequences: that branch is exercised


def _loss_fn(settings):
    def loss_fn(logp, old, ref, adv, mask, num_items):
        return grpo_loss(logp, old, ref, adv, mask, cfg=settings, num_items_in_batch=num_items,
                         max_completion_length=12)[0]
    return loss_fn


def test_sequence_level_differs_from_token_level(trl_inputs):
    """The option changes the result off-policy (else the test above could pass with the token-level loss)."""
    x, cases = trl_inputs
    kwargs = dict(loss_type="grpo", beta=0.0, epsilon_low=0.2, epsilon_high=0.2, use_bias_correction_kl=True,
                  max_completion_length=12, num_items_in_batch=70)
    inputs = (x["per_token_logps"], x["old_per_token_logps"], x["ref_per_token_logps"], x["advantages"],
              x["completion_mask"])
    seq_loss, seq_grad = trl_compute_loss(*inputs, importance_sampling_level="sequence", **kwargs)
    _, token_loss, token_grad = cases["grpo_beta0_epshigh0.2"]
    assert abs(seq_loss - token_loss) > 1e-3 and np.abs(seq_grad - token_grad).max() > 1e-3


@pytest.fixture
def pynative():
    """These checks differentiate lambdas with ms.value_and_grad, which only PyNative runs; an earlier test in the
    suite may have left GRAPH mode set."""
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    yield
    ms.set_context(mode=previous)


def test_fused_setting_runs_the_plain_ops_at_sequence_level(trl_inputs, monkeypatch, pynative):
    """impl='fused' with sequence level never calls the fused kernel and returns the plain result exactly."""
    x, _ = trl_inputs
    fused = LossConfig.trl(loss_type="grpo", beta=0.04, loss_impl="fused", importance_sampling_level="sequence")
    plain = LossConfig.trl(loss_type="grpo", beta=0.04, loss_impl="plain", importance_sampling_level="sequence")
    assert not fused.runs_fused and not plain.runs_fused and LossConfig.trl(loss_impl="fused").runs_fused
    args = tuple(Tensor(x[k]) for k in ("per_token_logps", "old_per_token_logps", "ref_per_token_logps",
                                        "advantages", "completion_mask"))
    want = ms.value_and_grad(lambda lp: grpo_loss(lp, *args[1:], cfg=plain), has_aux=True)(args[0])

    def no_kernel(*_args, **_kwargs):
        raise AssertionError("the fused kernel ran at sequence level")

    monkeypatch.setattr(loss_module, "fused_token_loss", no_kernel)
    (loss, metrics), grad = ms.value_and_grad(lambda lp: grpo_loss(lp, *args[1:], cfg=fused), has_aux=True)(args[0])
    assert float(loss) == float(want[0][0])
    np.testing.assert_array_equal(metrics.asnumpy(), want[0][1].asnumpy())
    np.testing.assert_array_equal(grad.asnumpy(), want[1].asnumpy())


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_sequence_level_row_weights_equal_the_reduction(trl_inputs, loss_type, pynative):
    """Packed training's per-sequence weights give the same loss and gradient at sequence level (the ratio is
    computed within each completion's row, so regrouping rows cannot change it)."""
    x, _ = trl_inputs
    settings = LossConfig.trl(loss_type=loss_type, beta=0.04, loss_impl="plain", importance_sampling_level="sequence")
    args = tuple(Tensor(x[k]) for k in ("old_per_token_logps", "ref_per_token_logps", "advantages",
                                        "completion_mask"))
    weights = step_row_weights(settings, x["completion_mask"].sum(1), 8, num_items_in_batch=70.0,
                               max_completion_length=12)
    reduced = ms.value_and_grad(lambda lp: grpo_loss(lp, *args, cfg=settings, num_items_in_batch=70,
                                                     max_completion_length=12)[0])
    weighted = ms.value_and_grad(lambda lp: grpo_loss(lp, *args, cfg=settings, row_weights=Tensor(weights))[0])
    (loss_a, grad_a), (loss_b, grad_b) = (fn(Tensor(x["per_token_logps"])) for fn in (reduced, weighted))
    assert float(loss_b) == pytest.approx(float(loss_a), abs=1e-6)
    np.testing.assert_allclose(grad_b.asnumpy(), grad_a.asnumpy(), atol=1e-7, rtol=0)


def test_config_key_default_choices_and_errors():
    assert IMPORTANCE_SAMPLING_LEVELS == ("token", "sequence")
    config = GRPOConfig()
    assert config.rl_config.importance_sampling_level == "token"
    assert LossConfig().importance_sampling_level == "token"
    config.rl_config.importance_sampling_level = "sequence"
    validate(config, check_paths=False)
    config.rl_config.importance_sampling_level = "sentence"
    with pytest.raises(ConfigError, match="rl_config.importance_sampling_level = 'sentence': choose one of token, "
                                          "sequence"):
        validate(config, check_paths=False)
    with pytest.raises(ValueError, match="importance_sampling_level"):
        LossConfig(importance_sampling_level="sentence")


# ---- in the trainer --------------------------------------------------------------------------------------------

def test_trainer_runs_gspo_in_graph_mode_without_recompiling(tmp_path, demo_prompts, demo_plain):
    """GSPO's recipe (sequence level, loss_type grpo) with two optimizer passes per rollout (old != logp on the
    second) on the demo model in GRAPH mode: after precompile only the first update's gradient-norm and AdamW graphs
    compile (as in tests/test_trainer.py), and the losses and gradients are finite."""
    from conftest import small_run_config
    from mindgrpo.train.trainer import GRPOTrainer

    config = small_run_config(tmp_path / "run", demo_prompts, demo_plain.model_dir, max_prompt_length=64,
                              seq_length=80, max_tokens=8, verifiers=["toy_verifiers:text_length"], max_steps=2,
                              num_iterations=2, loss_type="grpo", importance_sampling_level="sequence")
    assert config.rl_config.mode == "graph" and config.rl_config.loss_impl == "fused"
    trainer = GRPOTrainer(config)
    assert trainer.worker.settings.importance_sampling_level == "sequence" and not trainer.worker.settings.runs_fused
    trainer.precompile()
    graphs = trainer.worker.compiled_graphs()
    metrics = trainer.train()
    assert trainer.worker.compiled_graphs() - graphs == 2
    assert all(np.isfinite(metrics[key]) for key in ("actor/loss", "actor/kl_loss", "grad_norm"))
    assert metrics["grad_norm"] > 0
