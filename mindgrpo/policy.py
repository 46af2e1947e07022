"""The MindSpore side of a GRPO step: actor, reference, rollout engine, compiled log-prob and update graphs.

The trainer hands this module numpy batches and gets numpy results and float metrics back, so the orchestration
in :mod:`mindgrpo.trainer` reads as plain Python while everything heavy runs in compiled graphs here:

* ``CompletionLogProbs``: one forward over ``[prompt | completion]`` rows, projecting only the completion positions
  to the vocabulary (logits are the largest tensor: Qwen2.5's vocabulary is 151,936);
* ``GRPOLossCell``: log-probs, then :func:`mindgrpo.algorithm.grpo_loss` (fused kernel or plain ops);
* gradient accumulation over micro-batches, data-parallel all-reduce, global-norm clipping and AdamW.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Optional, Sequence

import numpy as np

import mindspore as ms
from mindspore import ParameterTuple, Tensor, nn, ops

from mindgrpo.algorithm import METRICS, LossSettings, group_advantages, grpo_loss, token_entropy, token_logprobs
from mindgrpo.config import GRPOConfig
from mindgrpo.distributed import DistInfo, all_reduce_sum
from mindgrpo.models import SharedPromptForward, build_model, export_hf, load_hf_weights
from mindgrpo.optim import AdamW, clip_by_global_norm, learning_rate_at
from mindgrpo.rollout import SamplingParams, build_rollout_engine


class UnsharedForward(nn.Cell):
    """MindFormers' forward over ``[prompt | completion]`` rows -> logits of the completion positions only."""

    def __init__(self, model: nn.Cell):
        super().__init__(auto_prefix=False)
        self.model = model

    def construct(self, input_ids, attention_mask, completion_ids):
        hidden = self.model(input_ids, attention_mask)
        seq, width = input_ids.shape[1], completion_ids.shape[1]
        # The hidden state at position i predicts token i + 1: the completion is predicted from seq-width-1 on.
        return self.model.logits(hidden[:, seq - width - 1: seq - 1])


class CompletionLogProbs(nn.Cell):
    """Per-token log-probs and entropies of the completions, from a forward that returns their logits:
    :class:`~mindgrpo.models.SharedPromptForward` (each prompt once per group) or :class:`UnsharedForward`."""

    def __init__(self, forward: nn.Cell, temperature: float):
        super().__init__(auto_prefix=False)
        self.forward, self.temperature = forward, temperature

    def construct(self, prompt_part, prompt_mask, completion_ids):
        logits = self.forward(prompt_part, prompt_mask, completion_ids)
        return (token_logprobs(logits, completion_ids, self.temperature),
                token_entropy(logits, self.temperature))


def completion_forward(model: nn.Cell, config: GRPOConfig) -> nn.Cell:
    """The forward ``rl_config.share_prompt`` selects for ``model``."""
    rl = config.rl_config
    return SharedPromptForward(model, rl.num_generations, rl.seq_length) if rl.share_prompt else UnsharedForward(model)


class GRPOLossCell(nn.Cell):
    """Scalar GRPO loss of one micro-batch plus its metrics (differentiated with respect to the actor)."""

    def __init__(self, forward: nn.Cell, temperature: float, settings: LossSettings, *, on_policy: bool,
                 grad_accum_steps: int, dp_size: int):
        super().__init__(auto_prefix=False)
        self.logprobs = CompletionLogProbs(forward, temperature)
        self.settings, self.on_policy = settings, on_policy
        self.grad_accum_steps, self.dp_size = grad_accum_steps, dp_size

    def construct(self, prompt_part, prompt_mask, completion_ids, completion_mask, advantages, old_logp, ref_logp,
                  num_items):
        logp, entropy = self.logprobs(prompt_part, prompt_mask, completion_ids)
        mask = completion_mask.astype(logp.dtype)
        # On-policy (one pass per rollout) the old log-probs are the detached current ones: ratio 1, as in TRL.
        loss, metrics = grpo_loss(logp, None if self.on_policy else old_logp,
                                  ref_logp if self.settings.beta > 0 else None, advantages, mask, cfg=self.settings,
                                  num_items_in_batch=num_items, grad_accum_steps=self.grad_accum_steps,
                                  dp_size=self.dp_size)
        mean_entropy = (entropy * mask).sum() / ops.clamp(mask.sum(), min=1.0)
        return loss, metrics, mean_entropy


class AccumulateGradients(nn.Cell):
    """Forward + backward of one micro-batch, adding the gradients into accumulator Parameters.

    Keeping the sum in Parameters (instead of returning a tuple of gradients) means no tuple of tensors crosses
    the graph boundary, so GRAPH mode compiles this once per input shape and never again.
    """

    def __init__(self, loss_cell: nn.Cell, params, accumulators: ParameterTuple):
        super().__init__(auto_prefix=False)
        self.grad_fn = ms.value_and_grad(loss_cell, None, ParameterTuple(params), has_aux=True)
        self.accumulators = accumulators

    def construct(self, *inputs):
        (loss, metrics, entropy), grads = self.grad_fn(*inputs)
        for i in range(len(self.accumulators)):
            ops.assign_add(self.accumulators[i], grads[i])
        return loss, metrics, entropy


class ReduceAndClip(nn.Cell):
    """Average the accumulated gradients over data-parallel ranks and clip them in place; returns the norm."""

    def __init__(self, accumulators: ParameterTuple, max_norm: float, world_size: int):
        super().__init__(auto_prefix=False)
        self.accumulators, self.max_norm = accumulators, max_norm
        self.reducer = (nn.DistributedGradReducer(accumulators, mean=True, degree=world_size)
                        if world_size > 1 else None)

    def construct(self):
        grads = tuple(self.accumulators)
        if self.reducer is not None:
            grads = self.reducer(grads)
        grads, norm = clip_by_global_norm(grads, self.max_norm)
        for i in range(len(self.accumulators)):
            ops.assign(self.accumulators[i], grads[i])
        return norm


class ApplyGradients(nn.Cell):
    """One AdamW step with the accumulated gradients, then reset the accumulators."""

    def __init__(self, accumulators: ParameterTuple, optimizer: AdamW):
        super().__init__(auto_prefix=False)
        self.accumulators, self.optimizer = accumulators, optimizer

    def construct(self, step_size, eps, decay):
        """Scalars from :meth:`AdamW.hyper_tensors`."""
        step_size = self.optimizer(tuple(self.accumulators), step_size, eps, decay)
        for i in range(len(self.accumulators)):
            ops.assign(self.accumulators[i], ops.depend(ops.zeros_like(self.accumulators[i]), step_size))
        return step_size


class Policy:
    """Actor (+ reference) models, the rollout engine and the optimizer for one rank."""

    def __init__(self, config: GRPOConfig, dist: DistInfo, *, eos_token_id: int, pad_token_id: int):
        rl, actor_cfg = config.rl_config, config.actor_config
        sampling = config.generate_config.sampling_config
        self.config, self.dist = config, dist
        self.actor = build_model(actor_cfg.load, role="actor", compute_dtype=actor_cfg.compute_dtype,
                                 seq_length=rl.seq_length)
        self.hf_config = self.actor.hf_config
        self.reference = (build_model(config.ref_load, role="reference", compute_dtype=config.ref_config.compute_dtype,
                                      seq_length=rl.seq_length) if rl.beta > 0 else None)
        self.engine = build_rollout_engine(
            config.generate_config.backend, self.actor, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
            max_prompt_length=rl.max_prompt_length, max_batch_size=config.generate_config.infer_model_batch_size,
            **rollout_options(config))
        self.sampling = sampling
        self.params = self.actor.trainable_params()
        self.optimizer = AdamW(self.params, actor_cfg.optimizer)
        self.settings = LossSettings(
            loss_type=rl.loss_type, beta=rl.beta, epsilon_low=rl.epsilon_low, epsilon_high=rl.epsilon_high,
            kl_estimator=rl.kl_estimator, use_bias_correction_kl=rl.use_bias_correction_kl,
            max_completion_length=sampling.max_tokens, impl=rl.loss_impl)
        group = rl.batch_size * rl.num_generations
        actor_forward = completion_forward(self.actor, config)
        loss_cell = GRPOLossCell(actor_forward, sampling.temperature, self.settings, on_policy=rl.num_iterations == 1,
                                 grad_accum_steps=group // actor_cfg.micro_batch_size, dp_size=dist.world_size)
        accumulators = ParameterTuple(self.params).clone(prefix="grad_accum", init="zeros")
        self._accumulate = AccumulateGradients(loss_cell, self.params, accumulators)
        self._reduce_and_clip = ReduceAndClip(accumulators, actor_cfg.optimizer.max_grad_norm, dist.world_size)
        self._apply = ApplyGradients(accumulators, self.optimizer)
        self._accumulators = accumulators
        self._actor_logprobs = CompletionLogProbs(actor_forward, sampling.temperature)
        self._ref_logprobs = (CompletionLogProbs(completion_forward(self.reference, config), sampling.temperature)
                              if self.reference is not None else None)

    # ------------------------------------------------------------------------------------------------------------
    def generate(self, prompts: Sequence[np.ndarray], *, seed: int):
        s = self.sampling
        params = SamplingParams(max_tokens=s.max_tokens, min_tokens=s.min_tokens, temperature=s.temperature,
                                top_p=s.top_p, top_k=s.top_k, repetition_penalty=s.repetition_penalty, seed=seed,
                                n=self.config.rl_config.num_generations)
        return self.engine.generate([list(map(int, p)) for p in prompts], params)

    def advantages(self, rewards: np.ndarray):
        rl = self.config.rl_config
        advantages, zero_std_groups = group_advantages(rewards, rl.num_generations, scale_rewards=rl.scale_rewards)
        return advantages.asnumpy(), int(zero_std_groups)

    def sync_weights(self) -> None:
        self.engine.sync_weights()

    def export(self, out_dir: Path) -> None:
        export_hf(self.actor, out_dir, hf_config=self.hf_config, tokenizer_dir=self.config.tokenizer_dir,
                  overwrite=True)  # the checkpoint manager hands us a fresh, empty folder

    def load_weights(self, model_dir: Path) -> None:
        load_hf_weights(self.actor, model_dir)
        self.sync_weights()

    def compiled_graphs(self) -> int:
        """Graphs MindSpore has compiled for this policy so far (its per-Cell compile caches and the engine's)."""
        cells = (self._accumulate, self._reduce_and_clip, self._apply, self._actor_logprobs, self._ref_logprobs)
        engine = getattr(self.engine, "compiled_graphs", lambda: 0)()
        return engine + sum(len(cell.compile_cache) for cell in cells if cell is not None)

    def precompile(self, data) -> None:
        """Compile the training graphs for a batch shaped like ``data`` (a ``Rollouts`` of dummy tokens): the
        reference (and old) log-probs and one accumulated micro-batch, whose gradients are then dropped. Weights
        and optimizer state are untouched."""
        if self._ref_logprobs is not None:
            self.reference_logprobs(data)
        if self.config.rl_config.num_iterations > 1:
            self.actor_logprobs(data)
        micro = self.config.actor_config.micro_batch_size
        per_token = Tensor(np.zeros((micro, data.completion_ids.shape[1]), np.float32))
        self._accumulate(*self._model_inputs(data, 0, micro), Tensor(data.completion_mask[:micro]),
                         Tensor(np.zeros(micro, np.float32)), per_token, per_token, Tensor(1.0, ms.float32))
        self._drop_gradients()

    def _drop_gradients(self) -> None:
        """Zero the accumulated gradients (after precompiling, or for a skipped, non-finite update). Done from
        the host: it is rare, and a compiled graph for it would keep its memory for the whole run."""
        for accumulator in self._accumulators:
            accumulator.set_data(Tensor(np.zeros(accumulator.shape, np.float32), accumulator.dtype))

    # ------------------------------------------------------------------------------------------------------------
    def reference_logprobs(self, data) -> np.ndarray:
        return self._score(self._ref_logprobs, data, self.config.ref_config.ref_model_batch_size)

    def actor_logprobs(self, data) -> np.ndarray:
        return self._score(self._actor_logprobs, data, self.config.ref_config.ref_model_batch_size)

    def _score(self, cell: nn.Cell, data, chunk: int) -> np.ndarray:
        out = []
        for start in range(0, len(data.completion_ids), chunk):
            logp, _ = cell(*self._model_inputs(data, start, chunk))
            out.append(logp.asnumpy())
        return np.concatenate(out)

    def _model_inputs(self, data, start: int, count: int):
        """The forward's three inputs for completions [start, start + count): shared, the group prompts
        ``[count / G, P]`` once each; unshared, ``[prompt | completion]`` rows."""
        g = self.config.rl_config.num_generations
        rows = slice(start, start + count)
        if self.config.rl_config.share_prompt:
            groups = slice(start // g, (start + count) // g)
            prompt, mask = data.prompt_ids[groups], data.prompt_mask[groups]
        else:
            of_row = np.arange(len(data.completion_ids))[rows] // g
            prompt = np.concatenate([data.prompt_ids[of_row], data.completion_ids[rows]], 1)
            mask = np.concatenate([data.prompt_mask[of_row], data.completion_mask[rows]], 1)
        return Tensor(prompt), Tensor(mask), Tensor(data.completion_ids[rows])

    def update(self, data, advantages: np.ndarray, old_logp: Optional[np.ndarray], ref_logp: Optional[np.ndarray],
               *, total_steps: int) -> Dict[str, float]:
        """``num_iterations`` optimizer steps over this rank's rollouts; returns averaged metrics."""
        rl = self.config.rl_config
        micro = self.config.actor_config.micro_batch_size
        n, width = data.completion_ids.shape
        zeros = np.zeros((n, width), np.float32)
        old = old_logp if old_logp is not None else zeros  # ignored on-policy: the cell uses detached logp
        ref = ref_logp if ref_logp is not None else zeros  # ignored when beta = 0
        # dapo normalises by the active tokens of the whole optimizer step on all ranks (see mindgrpo.algorithm.loss).
        global_tokens = all_reduce_sum(np.array([data.completion_mask.sum()]), self.dist)[0]
        num_items = Tensor(max(1.0, global_tokens), ms.float32)
        totals: Dict[str, float] = {}
        skipped = 0
        for _ in range(rl.num_iterations):
            sums: Dict[str, float] = {}
            for start in range(0, n, micro):
                rows = slice(start, start + micro)
                loss, metrics, entropy = self._accumulate(
                    *self._model_inputs(data, start, micro), Tensor(data.completion_mask[rows]),
                    Tensor(advantages[rows].astype(np.float32)), Tensor(old[rows]), Tensor(ref[rows]), num_items)
                named = dict(zip(METRIC_KEYS, metrics.asnumpy().tolist()))
                for key, value in {"actor/loss": float(loss), "actor/entropy": float(entropy), **named}.items():
                    sums[key] = sums.get(key, 0.0) + value
            norm = float(self._reduce_and_clip())
            lr = learning_rate_at(self.config.actor_config.lr_schedule, self.optimizer.step_count,
                                  total_steps * rl.num_iterations)
            # Every rank must take the same branch: the norm is already global; the loss flag is made global.
            local_bad = not all(np.isfinite(v) for v in sums.values())
            if np.isfinite(norm) and not all_reduce_sum(np.array([float(local_bad)]), self.dist)[0]:
                self._apply(*self.optimizer.hyper_tensors(lr))
            else:
                self._drop_gradients()
                skipped += 1  # keep the last good weights; the trainer counts and eventually stops
            for key, value in sums.items():
                totals[key] = totals.get(key, 0.0) + value / (n // micro)
            totals["grad_norm"] = totals.get("grad_norm", 0.0) + norm
            totals["grpo/lr"] = lr
        out = {k: v / rl.num_iterations if k != "grpo/lr" else v for k, v in totals.items()}
        reduced = all_reduce_sum(np.array(list(out.values())), self.dist) / self.dist.world_size
        out = dict(zip(out, map(float, reduced)))
        out["skipped"] = float(skipped > 0)
        out["grpo/skipped_updates"] = float(skipped)
        return out


def rollout_options(config: GRPOConfig) -> dict:
    """Backend-specific engine settings from the config."""
    gen = config.generate_config
    if gen.backend == "vllm":
        return {"model_dir": gen.load or config.actor_config.load,
                "max_model_len": gen.max_model_len or config.rl_config.seq_length,
                "gpu_memory_utilization": gen.gpu_memory_utilization, "block_size": gen.block_size,
                "tensor_parallel_size": gen.parallel_config.model_parallel,
                "max_tokens": gen.sampling_config.max_tokens, "dtype": config.actor_config.compute_dtype,
                "seed": config.rl_config.seed}
    if gen.backend == "native":
        return {"prompt_length_buckets": config.rl_config.prompt_widths, "decode_impl": gen.decode_impl}
    return {}


# grpo_loss's metric vector (mindgrpo.algorithm.METRICS) under the seeds' metric names.
METRIC_KEYS = tuple({"pg_loss": "actor/pg_loss", "kl": "actor/kl_loss", "clipfrac": "actor/pg_clipfrac",
                     "clipfrac_low": "actor/pg_clipfrac_low", "clipfrac_high": "actor/pg_clipfrac_high",
                     "ppo_kl": "actor/ppo_kl"}[name] for name in METRICS)


