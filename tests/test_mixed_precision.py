"""Mixed precision (``actor_config.param_dtype: bfloat16``): bf16 working weights, fp32 master weights and moments
in the optimizer only, against torch running the same recipe (fp32 master AdamW, its weights cast to bf16), in
PyNative and GRAPH: the optimizer alone, and three whole GRPO updates of the ModelWorker against a torch twin of
the recipe on transformers' Qwen2."""
import sys
from pathlib import Path

import numpy as np
import pytest

import mindspore as ms
from mindspore import Parameter, Tensor

from mindgrpo.config import OptimizerConfig
from mindgrpo.parallel.groups import DistInfo
from mindgrpo.train.optim import AdamW
from mindgrpo.train.step_graphs import ApplyGradients, ReduceAndClip, gradient_buffers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import small_run_config  # noqa: E402

SHAPES = [(6, 5), (5,), (3, 6)]


def bf16_values(torch, array):
    """float32 values exactly representable in bfloat16 (torch's round-to-nearest-even)."""
    return torch.tensor(array).to(torch.bfloat16).float().numpy()


def test_bf16_weights_step_as_torch_with_fp32_master_adamw(ms_mode):
    """Three steps: the bf16 working weights equal torch's fp32 master AdamW weights cast to bf16 (within one bf16
    step where the two masters straddle a rounding boundary: they agree to float32 rounding), the masters to 1e-5,
    and the clip uses the fp32 gradients' global norm."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    init = [bf16_values(torch, rng.normal(size=s).astype(np.float32)) for s in SHAPES]
    params = [Parameter(Tensor(a).astype(ms.bfloat16), name=f"p{i}") for i, a in enumerate(init)]
    cfg = OptimizerConfig(beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, max_grad_norm=1.0)
    opt = AdamW(params, cfg)
    accumulators = gradient_buffers(params, "float32")
    reduce, apply = ReduceAndClip(accumulators, cfg.max_grad_norm, DistInfo()), ApplyGradients(accumulators, opt)
    assert not opt.publishes_in_graph  # CPU has no bf16 Assign: the host writes the bf16 weights after each step
    master = [torch.tensor(a, requires_grad=True) for a in init]
    topt = torch.optim.AdamW([{"params": [master[0], master[2]], "weight_decay": 0.1},
                              {"params": [master[1]], "weight_decay": 0.0}], lr=0.01, betas=(0.9, 0.95), eps=1e-8)
    for _ in range(3):
        # Two micro-batches' gradients, each in the weights' dtype (as the backward of bf16 weights gives them),
        # summed in the float32 buffers.
        micro = [[bf16_values(torch, 2 * rng.normal(size=s).astype(np.float32)) for s in SHAPES] for _ in range(2)]
        grads = [a + b for a, b in zip(*micro)]
        for acc, g in zip(accumulators, grads):
            acc.set_data(Tensor(g))
        for p, g in zip(master, grads):
            p.grad = torch.tensor(g)
        torch_norm = torch.nn.utils.clip_grad_norm_(master, 1.0)
        topt.step()
        assert reduce.reduce_and_clip() == pytest.approx(float(torch_norm), rel=1e-6)
        apply(*opt.hyper_tensors(0.01))
        opt.publish()
    for mine, weight, theirs, start in zip(opt.master, params, master, init):
        want = theirs.detach()
        np.testing.assert_allclose(mine.asnumpy(), want.numpy(), rtol=1e-5, atol=1e-7)
        assert weight.dtype == ms.bfloat16
        got, bf16 = weight.astype(ms.float32).asnumpy(), want.to(torch.bfloat16).float().numpy()
        step = np.abs(bf16) * 2.0 ** -7  # one bfloat16 step (8 significant bits) at each value
        assert (np.abs(got - bf16) <= step).all()
        assert (got == bf16).mean() > 0.9, (got == bf16).mean()
        assert np.abs(got - start).max() > 1e-3  # the weights moved


def test_master_weights_are_optimizer_state_only_and_round_trip():
    """The fp32 masters live in the optimizer (named master.<name> in its state, fp32) and restore exactly; a new
    run from bf16 weights starts its masters from them."""
    params = [Parameter(Tensor(np.full(s, 0.5, np.float32)).astype(ms.bfloat16), name=f"p{i}")
              for i, s in enumerate(SHAPES)]
    opt = AdamW(params, OptimizerConfig(), names=["a", "b", "c"])
    state = opt.state_arrays()
    assert sorted(k for k in state if k.startswith("master.")) == ["master.a", "master.b", "master.c"]
    assert all(state[f"master.{n}"].dtype == np.float32 for n in "abc")
    state["master.a"] = np.full(SHAPES[0], 0.123456789, np.float32)
    opt.load_state_arrays(state)
    np.testing.assert_array_equal(opt.master[0].asnumpy(), state["master.a"])
    params[0].set_data(Tensor(np.full(SHAPES[0], 0.25, np.float32)).astype(ms.bfloat16))
    opt.sync_master_from_weights()
    np.testing.assert_array_equal(opt.master[0].asnumpy(), np.full(SHAPES[0], 0.25, np.float32))
    fp32 = AdamW([Parameter(Tensor(np.ones(s, np.float32)), name=f"q{i}") for i, s in enumerate(SHAPES)],
                 OptimizerConfig())
    assert not fp32.mixed and not any(k.startswith("master.") for k in fp32.state_arrays())


def test_bf16_grpo_step_exports_bf16_and_resumes_exactly(tmp_path, demo_plain, demo_prompts):
    """A GRPO step with bf16 weights (rollout over them, the reference model, the update through the fp32 masters),
    its checkpoint written in bf16 (which transformers loads), then a second trainer resuming from it with the
    exact bf16 weights, fp32 masters, moments and step. The reference is stored in bf16 as the actor's first
    weights, so step 1's KL is exactly 0 (with a float32 reference read from the float32 folder it was the bf16
    rounding's, 6.7e-8 here)."""
    from mindgrpo.train.trainer import GRPOTrainer

    def config(**rl):
        cfg = small_run_config(tmp_path / "run", demo_prompts, demo_plain.model_dir, max_prompt_length=64,
                               seq_length=80, max_tokens=8, verifiers=["toy_verifiers:text_length"],
                               save_ckpt_interval=1, **rl)
        cfg.actor_config.param_dtype = "bfloat16"
        return cfg

    def state(trainer):
        opt = trainer.worker.optimizer
        arrays = {f"param/{i}": p.astype(ms.float32).asnumpy() for i, p in enumerate(trainer.worker.params)}
        for kind, params in (("master", opt.master), ("exp_avg", opt.exp_avg), ("exp_avg_sq", opt.exp_avg_sq)):
            arrays.update({f"{kind}/{i}": p.asnumpy() for i, p in enumerate(params)})
        return arrays, trainer.step

    first = GRPOTrainer(config(max_steps=1))
    assert all(p.dtype == ms.bfloat16 for p in first.worker.params if len(p.shape) == 2)  # MindFormers keeps norms fp32
    metrics = first.train()
    assert np.isfinite(metrics["grad_norm"]) and metrics["grad_norm"] > 0
    print(f"step 1 KL: {metrics['actor/kl_loss']:.3e}")
    assert metrics["actor/kl_loss"] == 0.0
    reference = [p for p in first.worker.reference.get_parameters() if len(p.shape) == 2]
    assert reference and all(p.dtype == ms.bfloat16 for p in reference)
    saved, step = state(first)
    masters = [saved[f"master/{i}"] for i in range(len(first.worker.params))]
    weights = [saved[f"param/{i}"] for i in range(len(first.worker.params))]
    assert any(np.abs(m - w).max() > 0 for m, w in zip(masters, weights))  # the masters hold more than bf16 does
    folder = tmp_path / "run" / "checkpoints" / "step_00000001" / "model"
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(folder, torch_dtype="auto")
    assert loaded.dtype == torch.bfloat16  # stored as BF16 and declared so in config.json
    embed = loaded.get_input_embeddings().weight.float().detach().numpy()
    np.testing.assert_array_equal(embed, weights[0])

    resumed = GRPOTrainer(config(max_steps=2, resume_training=True))
    loaded_state, loaded_step = state(resumed)
    assert loaded_step == step == 1 and loaded_state.keys() == saved.keys()
    for name, array in saved.items():
        np.testing.assert_array_equal(loaded_state[name], array, err_msg=name)


# ------------------------------------------------------------------------------------------------ a whole GRPO step
TWIN_B, TWIN_G, TWIN_P, TWIN_T, TWIN_STEPS, TWIN_LR, TWIN_TEMPERATURE, TWIN_BETA = 2, 4, 8, 6, 3, 1e-3, 0.7, 0.04


def _twin_rollouts(vocab: int, pad: int):
    """Fixed rollouts: 2 prompts (the second left-padded) x 4 completions (ragged, right-padded), advantages."""
    from mindgrpo.train.rollout_batch import RolloutBatch

    rng = np.random.default_rng(7)
    prompt_ids = rng.integers(0, vocab - 3, (TWIN_B, TWIN_P)).astype(np.int32)
    prompt_mask = np.ones_like(prompt_ids)
    prompt_mask[1, :3], prompt_ids[1, :3] = 0, pad
    completion_ids = rng.integers(0, vocab - 3, (TWIN_B * TWIN_G, TWIN_T)).astype(np.int32)
    completion_mask = np.ones_like(completion_ids)
    for row, length in enumerate([6, 4, 6, 2, 5, 6, 3, 6]):
        completion_mask[row, length:], completion_ids[row, length:] = 0, pad
    advantages = rng.normal(size=TWIN_B * TWIN_G).astype(np.float32)
    return RolloutBatch(prompt_ids, prompt_mask, completion_ids, completion_mask), advantages, rng


class _TorchGRPOTwin:
    """The bf16 recipe in torch, written from its definition: bf16 working weights (RMSNorm scales float32, as
    mindgrpo keeps them), the forward in float32 from them (transformers' Qwen2 through ``functional_call``), TRL's
    ``grpo`` loss on-policy with the k3 KL (clamped as verl's ``low_var_kl``, which binds here: the tiny model's
    log-probs move by several nats in three steps), each micro-batch's gradients in the weights' dtype summed in float32,
    ``clip_grad_norm_``, then ``torch.optim.AdamW`` on float32 masters cast back to bf16."""

    def __init__(self, torch, transformers, folder, rollouts, optimizer_config):
        self.torch = torch
        self.model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                                        attn_implementation="eager").eval()
        self.masters = {}
        for name, param in self.model.named_parameters():
            value = param.detach().clone()
            self.masters[name] = (value if name.endswith("norm.weight") else value.to(torch.bfloat16).float())
            self.masters[name].requires_grad_(True)
        self.optimizer = torch.optim.AdamW(list(self.masters.values()), lr=TWIN_LR, betas=(
            optimizer_config.beta1, optimizer_config.beta2), eps=optimizer_config.eps, weight_decay=0.0)
        self.max_norm = optimizer_config.max_grad_norm
        g = TWIN_G
        rows = np.arange(len(rollouts.completion_ids)) // g
        self.ids = torch.tensor(np.concatenate([rollouts.prompt_ids[rows], rollouts.completion_ids], 1),
                                dtype=torch.int64)
        mask = np.concatenate([rollouts.prompt_mask[rows], rollouts.completion_mask], 1)
        self.attention = torch.tensor(mask, dtype=torch.int64)
        self.positions = torch.tensor(np.maximum(np.cumsum(mask, 1) - 1, 0), dtype=torch.int64)
        self.loss_mask = torch.tensor(rollouts.completion_mask, dtype=torch.float32)

    def working(self):
        """The working weights as leaves of their own: bf16 (float32 for the norm scales)."""
        torch = self.torch
        return {name: (m.detach().clone() if name.endswith("norm.weight") else m.detach().to(torch.bfloat16))
                .requires_grad_(True) for name, m in self.masters.items()}

    def logp(self, weights, rows):
        torch = self.torch
        params = {name: w.float() for name, w in weights.items()}
        logits = torch.func.functional_call(self.model, params, (self.ids[rows],), {
            "attention_mask": self.attention[rows], "position_ids": self.positions[rows]}).logits
        logits = logits[:, TWIN_P - 1:-1] / TWIN_TEMPERATURE
        return torch.log_softmax(logits, -1).gather(-1, self.ids[rows, TWIN_P:, None])[..., 0]

    def step(self, advantages, ref_logp, micro: int):
        torch = self.torch
        weights = self.working()
        total = {name: torch.zeros_like(m) for name, m in self.masters.items()}
        loss_sum, chunks = 0.0, len(advantages) // micro
        for start in range(0, len(advantages), micro):
            rows = slice(start, start + micro)
            logp = self.logp(weights, rows)
            ratio = torch.exp(logp - logp.detach())  # on-policy: the old log-probs are the current ones
            a = torch.tensor(advantages[rows])[:, None]
            delta = (torch.tensor(ref_logp[rows]) - logp).clamp(-20.0, 20.0)  # k3 clamped as verl's low_var_kl
            per_token = -(ratio * a) + TWIN_BETA * (torch.exp(delta) - delta - 1).clamp(-10.0, 10.0)
            m = self.loss_mask[rows]
            loss = ((per_token * m).sum(1) / m.sum(1).clamp(min=1.0)).mean() / chunks
            grads = torch.autograd.grad(loss, list(weights.values()))
            for name, grad in zip(weights, grads):
                total[name] += grad.float()  # each micro-batch's gradient in the weight's dtype, summed in float32
            loss_sum += float(loss.detach())
        for name, master in self.masters.items():
            master.grad = total[name]
        norm = float(torch.nn.utils.clip_grad_norm_(list(self.masters.values()), self.max_norm))
        self.optimizer.step()
        self.optimizer.zero_grad()
        return loss_sum, norm

    def bf16_weights(self):
        return {name: m.detach().to(self.torch.bfloat16).float().numpy() for name, m in self.masters.items()}


def test_bf16_grpo_steps_equal_a_torch_twin(tmp_path, ms_mode):
    """Three GRPO updates of mindgrpo's ModelWorker with bf16 weights (the shared-prompt forward, two micro-batches,
    the k3 KL, clipping, fp32-master AdamW) against :class:`_TorchGRPOTwin` on the same rollouts.

    Tolerances: the two compute the same float32 math in a different order (relative differences about 1e-6), so
    losses and gradient norms agree to 1e-5 relative. A bf16 weight is a rounding of its master; a master that
    differs by 1e-6 relative from the twin's rounds to the same bf16 value except when it lies within that distance
    of a rounding boundary, so at most a few in 10,000 weights may differ, and then by one bf16 step (2^-7 of its
    magnitude, 2^-8 relative rounding on either side)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tiny_qwen import make_tiny_qwen2

    from mindgrpo.config import GRPOConfig, validate
    from mindgrpo.models import hf_parameters
    from mindgrpo.train.model_worker import ModelWorker

    vocab = 256
    folder = make_tiny_qwen2(tmp_path / "model", layers=2, vocab=vocab, tied=False)
    config = GRPOConfig()
    rl = config.rl_config
    rl.mode = ms_mode
    rl.batch_size, rl.num_generations, rl.max_prompt_length, rl.seq_length = TWIN_B, TWIN_G, TWIN_P, 32
    rl.beta, rl.loss_type, rl.kl_estimator, rl.num_iterations = TWIN_BETA, "grpo", "k3", 1
    actor = config.actor_config
    actor.load, actor.param_dtype, actor.micro_batch_size = str(folder), "bfloat16", TWIN_G
    actor.lr_schedule.type, actor.lr_schedule.learning_rate = "constant", TWIN_LR
    actor.optimizer.weight_decay, actor.optimizer.max_grad_norm = 0.0, 1.0
    config.ref_config.ref_model_batch_size = TWIN_G
    sampling = config.generate_config.sampling_config
    sampling.temperature, sampling.max_tokens = TWIN_TEMPERATURE, TWIN_T
    worker = ModelWorker(validate(config, check_paths=False), DistInfo(), eos_token_id=vocab - 1,
                         pad_token_id=vocab - 3)
    rollouts, advantages, rng = _twin_rollouts(vocab, vocab - 3)
    twin = _TorchGRPOTwin(torch, transformers, folder, rollouts, actor.optimizer)
    with torch.no_grad():
        first = twin.logp(twin.working(), slice(None)).numpy()
    ref_logp = (first + rng.normal(0, 0.05, first.shape)).astype(np.float32) * rollouts.completion_mask

    for step in range(TWIN_STEPS):
        metrics = worker.update(rollouts, advantages, None, ref_logp, total_steps=TWIN_STEPS)
        loss, norm = twin.step(advantages, ref_logp, TWIN_G)
        assert metrics["actor/loss"] == pytest.approx(loss, rel=1e-5, abs=1e-7), step
        assert metrics["grad_norm"] == pytest.approx(norm, rel=1e-5), step
    assert norm > 1.0  # the clip acted
    opt, name_of = worker.optimizer, {id(p): n for n, p in hf_parameters(worker.actor).items()}
    masters = {name_of[id(p)]: (opt.master[slot].asnumpy() if slot >= 0 else p.asnumpy())
               for p, slot in zip(opt.params, opt.slots)}
    ours = {name: p.astype(ms.float32).asnumpy() for name, p in hf_parameters(worker.actor).items()}
    theirs = twin.bf16_weights()
    assert set(ours) == set(theirs) == set(masters) == set(twin.masters)
    reach = TWIN_LR * TWIN_STEPS  # AdamW moves an element by at most about lr a step
    moved = differ = elements = 0
    master_errors = []
    for name, want in theirs.items():
        got, start = ours[name], twin.model.get_parameter(name).detach().to(torch.bfloat16).float().numpy()
        error = np.abs(masters[name] - twin.masters[name].detach().numpy())
        master_errors.append(error.ravel())
        assert error.max() <= 0.02 * reach, (name, float(error.max()))
        step = 2.0 ** -7 * np.maximum(np.abs(got), np.abs(want))  # one bf16 step at the larger of the two
        assert (np.abs(got - want) <= step + error.max()).all(), name
        moved += int((want != start).sum())
        differ += int((got != want).sum())
        elements += want.size
    master_errors = np.concatenate(master_errors)
    print(f"masters: max |diff| {master_errors.max():.2e}, mean {master_errors.mean():.2e} (lr x steps {reach:.0e}); "
          f"bf16 weights differing: {differ} of {elements}, moved: {moved}")
    assert master_errors.mean() <= 1e-4 * reach
    assert moved > elements // 2  # three steps at lr 1e-3 move most bf16 weights
    assert differ <= elements // 100
