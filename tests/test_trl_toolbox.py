"""CISPO, SAPO, the entropy mask, the entropy bonus and rollout correction against the peers that define them.

* TRL 1.16.0's own numbers (``tests/fixtures/trl_toolbox_reference.npz``, made by ``tools/make_trl_loss_reference.py``
  with a real ``trl.GRPOTrainer``): loss and gradient within 1e-5, ``impl`` fused and plain, PyNative and GRAPH. One
  case is re-made live when ``trl`` imports (it cannot live in the main environment: it needs transformers 5).
* The entropy bonus with the grpo and dr_grpo reductions, which TRL does not have in verl's form: verl's formula
  written out in torch, differentiated through the logits.
* The fused setting's fallback to the plain ops, the config keys and the loss cells' entropy.
"""
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import mindgrpo  # noqa: F401  (before MindSpore)
import mindspore as ms
from mindspore import Tensor

import mindgrpo.algorithm.loss as loss_module
from mindgrpo.algorithm import LossConfig, grpo_loss, token_entropy, token_logprobs
from mindgrpo.algorithm.loss import high_entropy_mask, rollout_correction_weight
from mindgrpo.choices import LOSS_TYPES, ROLLOUT_CORRECTIONS
from mindgrpo.config import GRPOConfig, validate
from mindgrpo.config.schema import ConfigError

TOL = 1e-5
REFERENCE = Path(__file__).resolve().parent / "fixtures" / "trl_toolbox_reference.npz"
TOOL = Path(__file__).resolve().parents[1] / "tools" / "make_trl_loss_reference.py"


@pytest.fixture(scope="module")
def reference():
    data = np.load(REFERENCE)
    inputs = {k.split("/", 1)[1]: data[k] for k in data.files if k.startswith("input/")}
    cases = {str(name): {"settings": json.loads(str(data[f"case/{name}/settings"])),
                         **{part: data[f"case/{name}/{part}"] for part in ("loss", "grad", "grad_entropy",
                                                                           "correction_weight")}}
             for name in data["cases"]}
    return inputs, cases


def loss_settings(settings: dict, impl: str) -> LossConfig:
    fields = {k: v for k, v in settings.items() if k != "on_policy"}
    return LossConfig.trl(**fields, loss_impl=impl, epsilon_low=0.2)


def test_reference_covers_every_option(reference):
    """The stored cases exercise each option off- and on-policy, and each option changes TRL's result."""
    _, cases = reference
    covered = {(c["settings"]["loss_type"], c["settings"].get("rollout_correction", "none"),
                c["settings"].get("importance_sampling_level", "token"), c["settings"]["on_policy"])
               for c in cases.values()}
    for on_policy in (False, True):
        assert {("cispo", "none", "token", on_policy), ("sapo", "none", "token", on_policy),
                ("grpo", "none", "sequence", on_policy)} <= covered
        assert {mode for _, mode, _, pol in covered if pol == on_policy} == set(ROLLOUT_CORRECTIONS)
    assert any("top_entropy_quantile" in c["settings"] for c in cases.values())
    assert any("entropy_coef" in c["settings"] for c in cases.values())
    for name in ("is_token_mask_cap1.2_offpolicy", "is_sequence_mask_cap1.2_offpolicy",
                 "is_token_truncate_cap1.2_offpolicy"):  # the caps bind
        weight = cases[name]["correction_weight"]
        assert ((weight == 0) | (weight == np.float32(1.2))).any(), name
    for a, b in (("cispo_eps5_offpolicy", "cispo_eps1.1_offpolicy"), ("gspo_grpo_offpolicy", "sapo_offpolicy"),
                 ("is_token_mask_cap1.2_offpolicy", "is_token_truncate_cap1.2_offpolicy"),
                 ("is_sequence_mask_cap1.2_offpolicy", "is_sequence_truncate_cap1.2_offpolicy"),
                 ("entropy0.5_dapo_offpolicy", "entropy_coef0.05_dapo_offpolicy"),
                 ("gspo_sapo_offpolicy", "sapo_offpolicy"), ("gspo_cispo_offpolicy", "cispo_eps1.1_offpolicy")):
        assert abs(float(cases[a]["loss"]) - float(cases[b]["loss"])) > 1e-3, (a, b)


def test_correction_weight_is_trls(reference, pynative):
    """The rollout-correction weight itself equals the importance_sampling_ratio TRL's scoring made."""
    x, cases = reference
    mask = Tensor(x["completion_mask"].astype(np.float32))
    checked = 0
    for name, case in cases.items():
        settings = case["settings"]
        if settings.get("rollout_correction", "none") == "none":
            continue
        old = x["per_token_logps"] if settings["on_policy"] else x["old_per_token_logps"]
        weight = rollout_correction_weight(Tensor(old), Tensor(x["sampling_per_token_logps"]), mask,
                                           settings["rollout_correction"], settings["rollout_correction_cap"])
        active = x["completion_mask"] > 0
        np.testing.assert_allclose(weight.asnumpy()[active], case["correction_weight"][active], rtol=2e-6, atol=0,
                                   err_msg=name)
        checked += 1
    assert checked == 13


def test_entropy_mask_is_trls_quantile(pynative):
    """high_entropy_mask against torch.quantile (TRL's get_high_entropy_mask, one process) on random batches,
    including ties, one active token and none."""
    rng = np.random.default_rng(3)
    for trial in range(40):
        b, t = rng.integers(1, 5), rng.integers(1, 9)
        entropy = rng.random((b, t)).astype(np.float32) * 3
        if trial % 4 == 0:
            entropy = np.round(entropy, 0)  # ties
        mask = (rng.random((b, t)) < (0.05 if trial % 10 == 0 else 0.7)).astype(np.float32)
        rho = float(rng.choice([0.0, 0.2, 0.5, 0.8, 1.0, rng.random()]))
        got = high_entropy_mask(Tensor(entropy), Tensor(mask), rho).asnumpy()
        e, m = torch.tensor(entropy), torch.tensor(mask)
        local = e[m.bool()]
        want = (np.zeros_like(mask) if local.numel() == 0 else
                (((e * m) >= torch.quantile(local, 1 - rho)) & m.bool()).float().numpy())
        np.testing.assert_array_equal(got, want, err_msg=f"trial {trial} rho {rho}")


@pytest.mark.parametrize("impl", ["plain", "fused"])
def test_loss_and_gradient_match_trl(reference, ms_mode, impl):
    """Every stored TRL case: loss, d loss / d logp and d loss / d entropy within 1e-5 (GRAPH: one compiled graph
    for all cases). Under GRAPH, to bound compile time, ``plain`` runs the 20 off-policy cases and 4 on-policy ones,
    and ``fused`` only the cases whose fused setting runs the kernel (the entropy bonus); the rest take the plain
    ops' path, and the fallback is proven below."""
    x, cases = reference
    names = list(cases)
    if ms_mode == "graph" and impl == "fused":  # the others run the plain ops (tested just above in GRAPH)
        names = [name for name in names if loss_settings(cases[name]["settings"], impl).runs_fused]
        assert len(names) == 4
    elif ms_mode == "graph":  # compile time: every off-policy case, and on-policy one per surrogate and correction
        names = [name for name in names if "offpolicy" in name or name in GRAPH_ON_POLICY]
        assert len(names) == 24
    fns = [ms.value_and_grad(_case_loss(loss_settings(cases[name]["settings"], impl),
                                        cases[name]["settings"]["on_policy"]), grad_position=(0, 1))
           for name in names]

    def all_cases(*args):
        return tuple(fn(*args) for fn in fns)

    if ms_mode == "graph":
        all_cases = ms.jit(all_cases)
    args = [Tensor(x[k]) for k in ("per_token_logps", "entropies", "old_per_token_logps", "ref_per_token_logps",
                                   "advantages")]
    args += [Tensor(x["completion_mask"].astype(np.float32)), Tensor(x["sampling_per_token_logps"]),
             Tensor(np.float32(x["num_items_in_batch"]))]
    for name, (loss, (grad, grad_entropy)) in zip(names, all_cases(*args)):
        case = cases[name]
        assert abs(float(loss) - float(case["loss"])) <= TOL, name
        np.testing.assert_allclose(grad.asnumpy(), case["grad"], atol=TOL, rtol=0, err_msg=name)
        np.testing.assert_allclose(grad_entropy.asnumpy(), case["grad_entropy"], atol=TOL, rtol=0, err_msg=name)


GRAPH_ON_POLICY = ("cispo_eps1.1_onpolicy", "sapo_onpolicy", "gspo_grpo_onpolicy", "is_sequence_mask_cap1.2_onpolicy")


def _case_loss(cfg, on_policy):
    def loss_fn(logp, entropy, old, ref, adv, mask, sampling, num_items):
        return grpo_loss(logp, None if on_policy else old, ref if cfg.beta > 0 else None, adv, mask, cfg=cfg,
                         num_items_in_batch=num_items, max_completion_length=12, entropy=entropy,
                         sampling_logp=sampling)[0]
    return loss_fn


def test_trl_live_when_installed(reference, tiny_model_dir, fixtures_dir):
    """Re-make one stored case of each committed file with TRL itself (skipped when trl does not import, as in the
    main environment; tools/make_trl_loss_reference.py's venv has it)."""
    pytest.importorskip("trl", minversion="1.16.0")
    import importlib.util
    import tempfile

    spec = importlib.util.spec_from_file_location("make_trl_loss_reference", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    x, cases = reference
    grpo = np.load(fixtures_dir / "grpo_loss_reference.npz")
    stored = (  # (inputs seed, the file's current log-probs, case name, its settings, loss, gradient)
        (1, x["per_token_logps"], "is_sequence_mask_cap1.2_offpolicy", dict(tool.toolbox_cases()),
         float(cases["is_sequence_mask_cap1.2_offpolicy"]["loss"]), cases["is_sequence_mask_cap1.2_offpolicy"]["grad"]),
        (0, grpo["input/per_token_logps"], "dapo_beta0.04_epshigh0.28_nokliscorr", dict(tool.grpo_cases()),
         float(grpo["case/dapo_beta0.04_epshigh0.28_nokliscorr/loss"]),
         grpo["case/dapo_beta0.04_epshigh0.28_nokliscorr/grad_per_token_logps"]))
    for seed, logps, name, settings, want_loss, want_grad in stored:
        inputs = tool.make_inputs(seed)
        np.testing.assert_array_equal(inputs["per_token_logps"].numpy(), logps)
        with tempfile.TemporaryDirectory() as tmp:
            loss, grad, _, _ = tool.trl_case(str(tiny_model_dir), tmp, settings[name], inputs)
        assert abs(loss - want_loss) < 1e-7, name
        np.testing.assert_allclose(grad, want_grad, atol=1e-7, rtol=0, err_msg=name)


# ---- the entropy bonus against verl ------------------------------------------------------------------------------

def verl_agg_loss(loss_mat, loss_mask, loss_agg_mode, constant_divisor=None):
    """verl's ``agg_loss`` (verl/trainer/ppo/core_algos.py): ``token-mean`` is ``masked_mean``;
    ``seq-mean-token-mean`` the mean over sequences of each one's masked mean; ``seq-mean-token-sum-norm`` the
    token sum over a constant (verl: the response length; for Dr. GRPO TRL and mindgrpo use batch x max length,
    passed as ``constant_divisor``, the same for both terms)."""
    if loss_agg_mode == "token-mean":
        return (loss_mat * loss_mask).sum() / loss_mask.sum()
    if loss_agg_mode == "seq-mean-token-mean":
        return ((loss_mat * loss_mask).sum(-1) / loss_mask.sum(-1)).mean()
    return (loss_mat * loss_mask).sum() / constant_divisor


VERL_MODES = {"grpo": "seq-mean-token-mean", "sapo": "seq-mean-token-mean", "bnpo": "token-mean",
              "dapo": "token-mean", "cispo": "token-mean", "dr_grpo": "seq-mean-token-sum-norm"}


def verl_policy_loss(logits, ids, old, adv, mask, loss_type, coef, eps=0.2):
    """verl's actor loss with an entropy bonus (verl/workers/actor/dp_actor.py, ``update_policy``): ``entropy =
    entropy_from_logits(logits)`` (verl/utils/torch_functional.py: ``logsumexp(logits) - sum(softmax(logits) *
    logits)``), the vanilla PPO policy loss (core_algos ``compute_policy_loss_vanilla``, dual-clip off), and
    ``policy_loss = pg_loss - entropy_coeff * agg_loss(entropy, response_mask, loss_agg_mode)``. float64 torch;
    returns the loss and its gradient with respect to the logits."""
    z = torch.tensor(logits, dtype=torch.float64, requires_grad=True)
    log_prob = torch.log_softmax(z, -1).gather(-1, torch.tensor(ids, dtype=torch.int64)[..., None]).squeeze(-1)
    entropy = torch.logsumexp(z, -1) - (torch.softmax(z, -1) * z).sum(-1)
    m = torch.tensor(mask, dtype=torch.float64)
    a = torch.tensor(adv, dtype=torch.float64)[:, None]
    ratio = torch.exp(log_prob - torch.tensor(old, dtype=torch.float64))
    pg_losses = torch.maximum(-a * ratio, -a * torch.clamp(ratio, 1 - eps, 1 + eps))
    mode, divisor = VERL_MODES[loss_type], m.shape[0] * m.shape[1]
    loss = (verl_agg_loss(pg_losses, m, mode, divisor) - coef * verl_agg_loss(entropy, m, mode, divisor))
    loss.backward()
    return float(loss.detach()), z.grad.numpy()


def _logits_loss(cfg, max_completion_length):
    def loss_fn(z, ids, old, adv, mask):
        return grpo_loss(token_logprobs(z, ids), old, None, adv, mask, cfg=cfg,
                         max_completion_length=max_completion_length, entropy=token_entropy(z, keep_gradient=True))[0]
    return loss_fn


@pytest.mark.parametrize("impl", ["plain", "fused"])
def test_entropy_bonus_matches_verl(ms_mode, impl):
    """loss - coef x entropy aggregated as the loss, differentiated through the logits (the entropy's own gradient
    included), for the four reductions: within 1e-5 of verl's formula."""
    rng = np.random.default_rng(5)
    b, t, v = 6, 7, 11
    logits = (2 * rng.standard_normal((b, t, v))).astype(np.float32)
    ids = rng.integers(0, v, (b, t)).astype(np.int32)
    mask = (np.arange(t)[None] < np.array([7, 3, 5, 7, 1, 6])[:, None]).astype(np.float32)
    adv = rng.standard_normal(b).astype(np.float32)
    z64 = logits.astype(np.float64)
    logp64 = np.take_along_axis(z64 - np.log(np.exp(z64).sum(-1, keepdims=True)), ids[..., None], -1)[..., 0]
    old = (logp64 + 0.3 * rng.standard_normal((b, t))).astype(np.float32)
    coef = 0.05
    types = ("grpo", "bnpo", "dr_grpo", "dapo")
    cfgs = [LossConfig.trl(loss_type=lt, epsilon_low=0.2, entropy_coef=coef, loss_impl=impl) for lt in types]
    fns = [ms.value_and_grad(_logits_loss(cfg, t)) for cfg in cfgs]

    def all_cases(*args):
        return tuple(fn(*args) for fn in fns)

    if ms_mode == "graph":
        all_cases = ms.jit(all_cases)
    outputs = all_cases(Tensor(logits), Tensor(ids), Tensor(old), Tensor(adv), Tensor(mask))
    for loss_type, (loss, grad) in zip(types, outputs):
        want_loss, want_grad = verl_policy_loss(logits, ids, old, adv, mask, loss_type, coef)
        assert abs(float(loss) - want_loss) <= TOL, loss_type
        np.testing.assert_allclose(grad.asnumpy(), want_grad, atol=TOL, rtol=0, err_msg=loss_type)
        without, _ = verl_policy_loss(logits, ids, old, adv, mask, loss_type, 0.0)
        assert abs(want_loss - without) > 1e-3  # the bonus is there


# ---- the fused setting ------------------------------------------------------------------------------------------

@pytest.fixture
def pynative():
    """Checks that differentiate lambdas run in PyNative; an earlier test may have left GRAPH mode set."""
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    yield
    ms.set_context(mode=previous)


FALLBACKS = [dict(loss_type="cispo", epsilon_high=1.1), dict(loss_type="sapo"), dict(top_entropy_quantile=0.2),
             dict(rollout_correction="token_truncate", rollout_correction_cap=1.2),
             dict(rollout_correction="sequence_mask", rollout_correction_cap=1.2)]


@pytest.mark.parametrize("options", FALLBACKS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_fused_setting_falls_back_to_the_plain_ops(reference, monkeypatch, pynative, options):
    """impl='fused' with an option the kernel lacks never calls it and returns the plain result exactly."""
    x, _ = reference
    fused, plain = (LossConfig.trl(beta=0.04, **options, loss_impl=impl) for impl in ("fused", "plain"))
    assert not fused.runs_fused
    args = [Tensor(x[k]) for k in ("old_per_token_logps", "ref_per_token_logps", "advantages")]
    kwargs = dict(entropy=Tensor(x["entropies"]), sampling_logp=Tensor(x["sampling_per_token_logps"]))
    mask = Tensor(x["completion_mask"].astype(np.float32))
    logp = Tensor(x["per_token_logps"])

    def run(cfg):
        return ms.value_and_grad(lambda lp: grpo_loss(lp, *args, mask, cfg=cfg, **kwargs), has_aux=True)(logp)

    want = run(plain)

    def no_kernel(*_args, **_kwargs):
        raise AssertionError("the fused kernel ran")

    monkeypatch.setattr(loss_module, "fused_token_loss", no_kernel)
    (loss, metrics), grad = run(fused)
    assert float(loss) == float(want[0][0])
    np.testing.assert_array_equal(metrics.asnumpy(), want[0][1].asnumpy())
    np.testing.assert_array_equal(grad.asnumpy(), want[1].asnumpy())


def test_entropy_bonus_keeps_the_fused_kernel(reference, pynative):
    """The entropy bonus is added after the per-token kernel: the fused setting still runs it, and agrees with the
    plain ops to 1e-6."""
    x, _ = reference
    fused = LossConfig.trl(beta=0.04, entropy_coef=0.05, loss_impl="fused")
    assert fused.runs_fused
    mask = Tensor(x["completion_mask"].astype(np.float32))
    args = [Tensor(x[k]) for k in ("old_per_token_logps", "ref_per_token_logps", "advantages")]

    def run(cfg):
        fn = ms.value_and_grad(lambda lp, ent: grpo_loss(lp, *args, mask, cfg=cfg, entropy=ent)[0],
                               grad_position=(0, 1))
        return fn(Tensor(x["per_token_logps"]), Tensor(x["entropies"]))

    (loss_f, (grad_f, ent_f)), (loss_p, (grad_p, ent_p)) = run(fused), run(LossConfig.trl(
        beta=0.04, entropy_coef=0.05, loss_impl="plain"))
    assert abs(float(loss_f) - float(loss_p)) < 1e-6
    np.testing.assert_allclose(grad_f.asnumpy(), grad_p.asnumpy(), atol=1e-6, rtol=0)
    np.testing.assert_allclose(ent_f.asnumpy(), ent_p.asnumpy(), atol=1e-7, rtol=0)
    assert np.abs(ent_f.asnumpy()).max() > 5e-4  # 0.05 / 70 tokens


def test_missing_inputs_are_named(reference, pynative):
    x, _ = reference
    args = [Tensor(x[k]) for k in ("per_token_logps", "old_per_token_logps")]
    adv, mask = Tensor(x["advantages"]), Tensor(x["completion_mask"].astype(np.float32))
    with pytest.raises(ValueError, match="pass entropy"):
        grpo_loss(*args, None, adv, mask, cfg=LossConfig.trl(top_entropy_quantile=0.2))
    with pytest.raises(ValueError, match="pass sampling_logp"):
        grpo_loss(*args, None, adv, mask, cfg=LossConfig.trl(rollout_correction="token_mask"))


# ---- configuration ----------------------------------------------------------------------------------------------

def test_config_keys_defaults_choices_and_errors():
    rl = GRPOConfig().rl_config
    assert (rl.sapo_temperature_pos, rl.sapo_temperature_neg, rl.top_entropy_quantile, rl.entropy_coef,
            rl.rollout_correction, rl.rollout_correction_cap) == (1.0, 1.05, 1.0, 0.0, "none", 3.0)
    assert {"cispo", "sapo"} <= set(LOSS_TYPES)
    assert ROLLOUT_CORRECTIONS == ("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
    config = GRPOConfig()
    for key, value in (("loss_type", "cispo"), ("loss_type", "sapo"), ("rollout_correction", "sequence_mask"),
                       ("top_entropy_quantile", 0.2), ("entropy_coef", 0.01)):
        setattr(config.rl_config, key, value)
        validate(config, check_paths=False)
    bad = GRPOConfig()
    bad.rl_config.rollout_correction = "token_clip"
    bad.rl_config.top_entropy_quantile = 1.5
    bad.rl_config.entropy_coef = -0.1
    bad.rl_config.sapo_temperature_neg = 0.0
    bad.rl_config.rollout_correction_cap = 0.0
    with pytest.raises(ConfigError) as err:
        validate(bad, check_paths=False)
    for text in ("rl_config.rollout_correction = 'token_clip': choose one of none, token_truncate",
                 "rl_config.top_entropy_quantile = 1.5", "rl_config.entropy_coef = -0.1",
                 "rl_config.sapo_temperature_neg = 0.0", "rl_config.rollout_correction_cap = 0.0"):
        assert text in str(err.value)
    tp = GRPOConfig()
    tp.rl_config.entropy_coef = 0.01
    tp.actor_config.parallel_config.model_parallel = 2
    with pytest.raises(ConfigError, match="entropy_coef = 0.01 with actor_config.parallel_config.model_parallel"):
        validate(tp, check_paths=False)


def test_config_help_lists_the_keys():
    from mindgrpo.config.schema import RLConfig, field_docs

    docs = field_docs(RLConfig)
    for key in ("sapo_temperature_pos", "sapo_temperature_neg", "top_entropy_quantile", "entropy_coef",
                "rollout_correction", "rollout_correction_cap"):
        assert docs.get(key), key
    assert "cispo" in docs["loss_type"] and "sapo" in docs["loss_type"]


# ---- in the trainer --------------------------------------------------------------------------------------------

RUNS = {  # every new option, in two runs: off-policy padded, and on-policy packed
    "cispo_entropy_mask_token_correction": dict(
        loss_type="cispo", epsilon_high=5.0, top_entropy_quantile=0.2, rollout_correction="token_truncate",
        num_iterations=2),
    "sapo_entropy_bonus_sequence_correction_packed": dict(
        loss_type="sapo", entropy_coef=0.01, rollout_correction="sequence_mask", rollout_correction_cap=1.5),
}


def test_trainer_runs_every_option_in_graph_mode_without_recompiling(tmp_path, demo_prompts, demo_plain):
    """The new options on the demo model in GRAPH mode (loss_impl fused, which falls back): after precompile only
    the first update's gradient-norm and AdamW graphs compile (as in tests/test_trainer.py), and losses and
    gradients are finite. The rollout engine's log-probs stand in as the reference model's (the same weights at
    step 1, apart after), set on the batch where the trainer hands it to the worker."""
    from conftest import small_run_config
    from mindgrpo.train.trainer import GRPOTrainer

    for name, options in RUNS.items():
        config = small_run_config(tmp_path / name, demo_prompts, demo_plain.model_dir, max_prompt_length=64,
                                  seq_length=80, max_tokens=8, verifiers=["toy_verifiers:text_length"], max_steps=2,
                                  max_rollout_logprob_gap=0.0,  # the sampling log-probs are made up below
                                  **options)
        if name.endswith("packed"):
            config.actor_config.max_tokens_per_micro_batch = 32
        assert config.rl_config.mode == "graph" and config.rl_config.loss_impl == "fused"
        trainer = GRPOTrainer(config)
        worker = trainer.worker
        assert not worker.settings.runs_fused and bool(worker.pack_rows) == name.endswith("packed")
        update, seen = worker.update, []

        def with_sampling_logp(rollouts, advantages, old_logp, ref_logp, *, total_steps, update=update, seen=seen):
            rollouts = dataclasses.replace(rollouts,
                                           sampling_logp=(ref_logp * rollouts.completion_mask).astype(np.float32))
            seen.append(rollouts.sampling_logp)
            return update(rollouts, advantages, old_logp, ref_logp, total_steps=total_steps)

        worker.update = with_sampling_logp
        trainer.precompile()
        graphs = worker.compiled_graphs()
        metrics = trainer.train()
        assert worker.compiled_graphs() - graphs == 2, name
        assert len(seen) == 2 and np.abs(seen[-1]).max() > 0.1, name
        assert all(np.isfinite(metrics[key]) for key in ("actor/loss", "actor/entropy", "grad_norm")), name
        assert metrics["grad_norm"] > 0, name
