"""The bf16 recipe's whole GRPO update, in mindgrpo and in torch, for tests/test_mixed_precision.py (one process)
and tests/bf16_twin_job.py (the same updates at tensor parallel 2 under msrun): the fixed rollouts, the worker's
config, the torch twin written from the recipe's definition, and the comparison of their results."""
import numpy as np

TWIN_B, TWIN_G, TWIN_P, TWIN_T, TWIN_STEPS, TWIN_LR, TWIN_TEMPERATURE, TWIN_BETA = 2, 4, 8, 6, 3, 1e-3, 0.7, 0.04
TWIN_VOCAB = 256


def twin_rollouts(vocab: int, pad: int):
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


class TorchGRPOTwin:
    """The bf16 recipe in torch, written from its definition: bf16 working weights (RMSNorm scales float32, as
    mindgrpo keeps them), the forward in float32 from them (transformers' Qwen2 through ``functional_call``), TRL's
    ``grpo`` loss on-policy with the k3 KL (clamped as verl's ``low_var_kl``, which binds here: the tiny model's
    log-probs move by several nats in three steps), each micro-batch's gradients in the weights' dtype summed in
    float32, ``clip_grad_norm_``, then ``torch.optim.AdamW`` on float32 masters cast back to bf16."""

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


def twin_config(folder, mode: str, model_parallel: int = 1):
    """The worker's config: bf16 weights, 2 prompts x 4 completions, one micro-batch per group, k3 KL, clipping."""
    from mindgrpo.config import GRPOConfig, validate

    config = GRPOConfig()
    rl = config.rl_config
    rl.mode = mode
    rl.batch_size, rl.num_generations, rl.max_prompt_length, rl.seq_length = TWIN_B, TWIN_G, TWIN_P, 32
    rl.beta, rl.loss_type, rl.kl_estimator, rl.num_iterations = TWIN_BETA, "grpo", "k3", 1
    actor = config.actor_config
    actor.load, actor.param_dtype, actor.micro_batch_size = str(folder), "bfloat16", TWIN_G
    actor.lr_schedule.type, actor.lr_schedule.learning_rate = "constant", TWIN_LR
    actor.optimizer.weight_decay, actor.optimizer.max_grad_norm = 0.0, 1.0
    config.ref_config.ref_model_batch_size = TWIN_G
    for section in (config.actor_config, config.ref_config, config.generate_config):
        section.parallel_config.model_parallel = model_parallel
    sampling = config.generate_config.sampling_config
    sampling.temperature, sampling.max_tokens = TWIN_TEMPERATURE, TWIN_T
    return validate(config, check_paths=False)


def twin_inputs(torch, transformers, folder, config):
    """(the torch twin at the folder's weights, the rollouts, their advantages, reference log-probs): the reference
    is the twin's first log-probs plus noise, so the KL term has a gradient from step 1."""
    rollouts, advantages, rng = twin_rollouts(TWIN_VOCAB, TWIN_VOCAB - 3)
    twin = TorchGRPOTwin(torch, transformers, folder, rollouts, config.actor_config.optimizer)
    with torch.no_grad():
        first = twin.logp(twin.working(), slice(None)).numpy()
    ref_logp = (first + rng.normal(0, 0.05, first.shape)).astype(np.float32) * rollouts.completion_mask
    return twin, rollouts, advantages, ref_logp


def check_against_twin(torch, twin, advantages, ref_logp, steps, masters, weights):
    """Step the twin as mindgrpo stepped (``steps``: its (loss, gradient norm) per update) and compare; ``masters``
    and ``weights`` are mindgrpo's final fp32 masters and bf16 weights (as float32) by Hugging Face name.

    Tolerances: the two compute the same float32 math in a different order (relative differences about 1e-6), so
    losses and gradient norms agree to 1e-5 relative. A bf16 weight is a rounding of its master; a master that
    differs by 1e-6 relative from the twin's rounds to the same bf16 value except when it lies within that distance
    of a rounding boundary, so at most a few in 10,000 weights may differ, and then by one bf16 step (2^-7 of its
    magnitude, 2^-8 relative rounding on either side)."""
    import pytest

    for step, (ours_loss, ours_norm) in enumerate(steps):
        loss, norm = twin.step(advantages, ref_logp, TWIN_G)
        assert ours_loss == pytest.approx(loss, rel=1e-5, abs=1e-7), step
        assert ours_norm == pytest.approx(norm, rel=1e-5), step
    assert norm > 1.0  # the clip acted
    theirs = twin.bf16_weights()
    assert set(weights) == set(theirs) == set(masters) == set(twin.masters)
    reach = TWIN_LR * len(steps)  # AdamW moves an element by at most about lr a step
    moved = differ = elements = 0
    master_errors = []
    for name, want in theirs.items():
        got, start = weights[name], twin.model.get_parameter(name).detach().to(torch.bfloat16).float().numpy()
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
