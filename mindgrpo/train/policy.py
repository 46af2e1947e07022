"""The MindSpore side of a GRPO step: actor, reference, rollout engine, compiled log-prob and update graphs.

The trainer hands this module numpy batches and gets numpy results and float metrics back, so the orchestration
in :mod:`mindgrpo.train.trainer` reads as plain Python while everything heavy runs in compiled graphs here:

* ``CompletionLogProbs``: one forward over ``[prompt | completion]`` rows, projecting only the completion positions
  to the vocabulary (logits are the largest tensor: Qwen2.5's vocabulary is 151,936);
* ``GRPOLossCell``: log-probs, then :func:`mindgrpo.algorithm.grpo_loss` (fused kernel or plain ops); with
  ``actor_config.max_tokens_per_micro_batch`` the forwards take packed rows instead (``PackedLossCell``,
  :mod:`mindgrpo.train.packing`);
* gradient accumulation over micro-batches, data-parallel all-reduce, global-norm clipping and AdamW.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Optional, Sequence

import numpy as np

import mindspore as ms
from mindspore import ParameterTuple, Tensor, nn, ops

from mindgrpo.algorithm import (METRICS, LossSettings, group_advantages, grpo_loss, step_row_weights, token_entropy,
                                token_logprobs)
from mindgrpo.config import GRPOConfig
from mindgrpo.train.distributed import TP, WORLD, DistInfo, all_gather, all_reduce_sum
from mindgrpo.models import (PackedPromptForward, SharedPromptForward, build_model, export_hf, hf_parameters,
                             load_hf_weights)
from mindgrpo.models.export import export_hf_arrays
from mindgrpo.models.weights import host_array
from mindgrpo.models.tensor_parallel import parallel_token_entropy, parallel_token_logprobs
from mindgrpo.models.shard_layout import TPLayout
from mindgrpo.train import checkpoint as ckpt
from mindgrpo.train.optim import AdamW, clip_to_norm, learning_rate_at, squared_norm
from mindgrpo.train.optim_state import layout_record, load_resharded, rank_metadata
from mindgrpo.train.packing import MicroBatch, micro_batches
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
    :class:`~mindgrpo.models.SharedPromptForward` (each prompt once per group), :class:`UnsharedForward` or
    :class:`~mindgrpo.models.PackedPromptForward` (packed rows). The forward's third input holds the tokens.

    Under tensor parallelism the shared-prompt forward returns each rank's vocabulary slice of the logits, and
    the log-softmax is completed across ranks from per-row numbers (:mod:`mindgrpo.models.tensor_parallel`), so
    no rank ever holds [tokens, vocab]."""

    def __init__(self, forward: nn.Cell, temperature: float):
        super().__init__(auto_prefix=False)
        self.forward, self.temperature = forward, temperature
        comm = getattr(forward, "comm", None)
        self.tensor_parallel = comm is not None and comm.size > 1
        self.vocab_start = getattr(forward, "vocab_start", 0)

    def construct(self, *inputs):
        logits = self.forward(*inputs)
        completion_ids = inputs[2]
        if not self.tensor_parallel:
            return (token_logprobs(logits, completion_ids, self.temperature),
                    token_entropy(logits, self.temperature))
        rows = logits.reshape((-1, logits.shape[-1]))
        if self.temperature != 1.0:
            rows = rows * (1.0 / self.temperature)
        comm, ids = self.forward.comm, completion_ids.reshape((-1,)).astype(ms.int32)
        return (parallel_token_logprobs(comm, rows, ids, self.vocab_start).reshape(completion_ids.shape),
                parallel_token_entropy(comm, rows).reshape(completion_ids.shape))


def completion_forward(model: nn.Cell, config: GRPOConfig, backward: bool = False) -> nn.Cell:
    """The forward ``rl_config.share_prompt`` selects for ``model``. ``backward``: it is the actor's training
    forward, so ``actor_config.recompute`` applies (scoring without a backward never recomputes)."""
    rl = config.rl_config
    recompute = backward and config.actor_config.recompute
    if config.actor_config.max_tokens_per_micro_batch:
        return PackedPromptForward(model, rl.seq_length, recompute=recompute)
    if not rl.share_prompt:
        return UnsharedForward(model)
    return SharedPromptForward(model, rl.num_generations, rl.seq_length, recompute=recompute)


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
        return self._loss(logp, entropy, completion_mask, advantages, old_logp, ref_logp, num_items=num_items)

    def _loss(self, logp, entropy, completion_mask, advantages, old_logp, ref_logp, num_items=None, row_weights=None):
        mask = completion_mask.astype(logp.dtype)
        # On-policy (one pass per rollout) the old log-probs are the detached current ones: ratio 1, as in TRL.
        loss, metrics = grpo_loss(logp, None if self.on_policy else old_logp,
                                  ref_logp if self.settings.beta > 0 else None, advantages, mask, cfg=self.settings,
                                  num_items_in_batch=num_items, grad_accum_steps=self.grad_accum_steps,
                                  dp_size=self.dp_size, row_weights=row_weights)
        mean_entropy = (entropy * mask).sum() / ops.clamp(mask.sum(), min=1.0)
        return loss, metrics, mean_entropy


class PackedLossCell(GRPOLossCell):
    """:class:`GRPOLossCell` of a packed micro-batch (:class:`mindgrpo.train.packing.MicroBatch`): the log-probs of its
    rows are gathered into its completions' loss rows ``[C, W]`` (``unpack``), so the loss is per completion as in
    the padded path, and each completion weighs in with its weight in the step's loss (``step_row_weights``)."""

    def __init__(self, forward: nn.Cell, temperature: float, settings: LossSettings, *, on_policy: bool):
        super().__init__(forward, temperature, settings, on_policy=on_policy, grad_accum_steps=1, dp_size=1)

    def construct(self, prompt_ids, prompt_mask, completion_ids, positions, segments, row_prompt, source, unpack,
                  completion_mask, advantages, old_logp, ref_logp, row_weights):
        logp, entropy = self.logprobs(prompt_ids, prompt_mask, completion_ids, positions, segments, row_prompt, source)
        return self._loss(ops.gather(logp.reshape((-1,)), unpack, 0), ops.gather(entropy.reshape((-1,)), unpack, 0),
                          completion_mask, advantages, old_logp, ref_logp, row_weights=row_weights)


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
    """Turn each rank's accumulated gradients into its slice of the whole model's gradient, clip them in place by
    the global norm, and return that norm.

    * Data parallel: the ranks of a DP group hold the same slice and saw different prompts, so the gradients are
      averaged over the DP group (not the world: with tensor parallelism the world's ranks hold different slices).
    * Tensor parallel: a KV head replicated on several TP ranks received, on each, only the gradient flowing
      through that rank's query heads, so those parts are summed (each rank writes its KV head's slot of a zero
      buffer; an AllReduce-SUM over the TP group fills every slot; each rank reads its own back).
    * The norm adds the ranks' squared norms over the TP group, each tensor divided by the number of ranks holding
      an identical copy (``TPLayout.gradient_owners``), so every parameter of the model counts once. After the DP
      average the DP ranks hold identical gradients and add nothing.

    Every collective is an AllReduce-SUM, the one CPU runs on sub-groups, and each waits for the previous one so
    that all ranks issue them in the same order. ``layout`` is None without tensor parallelism; ``hf_names`` are
    the Hugging Face names of the accumulators' parameters, in order (needed with a layout).
    """

    def __init__(self, accumulators: ParameterTuple, max_norm: float, dist: DistInfo,
                 layout: Optional[TPLayout] = None, hf_names: Sequence[str] = ()):
        super().__init__(auto_prefix=False)
        self.accumulators, self.max_norm = accumulators, max_norm
        tp, tp_rank = (layout.tp, layout.rank) if layout is not None else (1, 0)
        if (tp, tp_rank) != (dist.tp_size, dist.tp_rank):
            raise ValueError(f"the tensor-parallel layout is rank {tp_rank} of {tp}, but this process is rank "
                             f"{dist.tp_rank} of {dist.tp_size}")
        if tp > 1 and len(hf_names) != len(accumulators):
            raise ValueError(f"{len(hf_names)} Hugging Face names for {len(accumulators)} gradient accumulators")
        self.dp_sum = ops.AllReduce(group=dist.dp_group) if dist.dp_size > 1 else None
        self.dp_scale = Tensor(1.0 / dist.dp_size, ms.float32)
        self.tp_sum = ops.AllReduce(group=dist.tp_group) if tp > 1 else None
        self.copies = tuple(layout.gradient_owners(name) for name in hf_names) if tp > 1 else None
        self.shared_kv = (tuple(layout.is_replicated_kv(name) for name in hf_names) if tp > 1
                          else (False,) * len(accumulators))
        # Ranks r with equal r // kv_replicas hold the same KV head.
        replicas = layout.kv_replicas if layout is not None else 1
        self.kv_groups, self.kv_slot = tp // replicas, tp_rank // replicas

    def construct(self):
        previous = self.dp_scale  # the last collective's output: the next one waits for it
        grads = ()
        for i in range(len(self.accumulators)):
            grad = self.accumulators[i]
            if self.shared_kv[i]:
                grad = self._sum_kv_replicas(ops.depend(grad, previous))
                previous = grad
            if self.dp_sum is not None:
                grad = self.dp_sum(ops.depend(grad, previous))
                previous = grad
                grad = grad * self.dp_scale.astype(grad.dtype)
            grads += (grad,)
        squares = squared_norm(grads, self.copies)
        if self.tp_sum is not None:
            squares = self.tp_sum(ops.depend(squares, previous))
        norm = ops.sqrt(squares)
        grads = clip_to_norm(grads, norm, self.max_norm)
        for i in range(len(self.accumulators)):
            ops.assign(self.accumulators[i], grads[i])
        return norm

    def _sum_kv_replicas(self, grad):
        if self.kv_groups == 1:
            return self.tp_sum(grad)
        parts = ()
        if self.kv_slot > 0:
            parts += (ops.zeros((self.kv_slot,) + grad.shape, grad.dtype),)
        parts += (grad.expand_dims(0),)
        if self.kv_slot < self.kv_groups - 1:
            parts += (ops.zeros((self.kv_groups - 1 - self.kv_slot,) + grad.shape, grad.dtype),)
        return self.tp_sum(ops.concat(parts))[self.kv_slot]


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
        # Under tensor parallelism each model is this rank's slices, read straight from the HF folder.
        tp = dict(tp_rank=dist.tp_rank, tp_size=dist.tp_size, tp_group=dist.tp_group)
        self.actor = build_model(actor_cfg.load, role="actor", compute_dtype=actor_cfg.compute_dtype,
                                 seq_length=rl.seq_length, **tp)
        self.hf_config = self.actor.hf_config
        self.reference = (build_model(config.ref_load, role="reference", compute_dtype=config.ref_config.compute_dtype,
                                      seq_length=rl.seq_length, **tp) if rl.beta > 0 else None)
        self.engine = build_rollout_engine(
            config.generate_config.backend, self.actor, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
            max_prompt_length=rl.max_prompt_length, max_batch_size=config.generate_config.infer_model_batch_size,
            **rollout_options(config))
        self.sampling = sampling
        self.params = self.actor.trainable_params()
        self._hf_params = hf_parameters(self.actor)  # the same Parameter objects for the run's lifetime
        hf_name_of = {id(param): name for name, param in self._hf_params.items()}
        self.param_names = [hf_name_of[id(param)] for param in self.params]
        self.layout = getattr(self.actor, "tp_layout", None) or TPLayout.for_hf_config(self.hf_config, 1, 0)
        self.full_shapes = getattr(self.actor, "full_shapes", None) or {
            name: tuple(param.shape) for name, param in self._hf_params.items()}
        self.optimizer = AdamW(self.params, actor_cfg.optimizer, names=self.param_names, dist=dist,
                               optimizer_shard=actor_cfg.parallel_config.optimizer_shard)
        self.settings = LossSettings(
            loss_type=rl.loss_type, beta=rl.beta, epsilon_low=rl.epsilon_low, epsilon_high=rl.epsilon_high,
            kl_estimator=rl.kl_estimator, use_bias_correction_kl=rl.use_bias_correction_kl,
            max_completion_length=sampling.max_tokens, impl=rl.loss_impl)
        group = rl.batch_size * rl.num_generations
        # rows of max_tokens per packed forward; 0: padded micro-batches
        self.pack_rows = actor_cfg.max_tokens_per_micro_batch // sampling.max_tokens
        actor_forward = completion_forward(self.actor, config, backward=True)
        on_policy = rl.num_iterations == 1
        loss_cell = (PackedLossCell(actor_forward, sampling.temperature, self.settings, on_policy=on_policy)
                     if self.pack_rows else
                     GRPOLossCell(actor_forward, sampling.temperature, self.settings, on_policy=on_policy,
                                  grad_accum_steps=group // actor_cfg.micro_batch_size, dp_size=dist.dp_size))
        accumulators = ParameterTuple(self.params).clone(prefix="grad_accum", init="zeros")
        self._accumulate = AccumulateGradients(loss_cell, self.params, accumulators)
        self._reduce_and_clip = ReduceAndClip(accumulators, actor_cfg.optimizer.max_grad_norm, dist,
                                              self.layout if dist.tp_size > 1 else None, self.param_names)
        self._apply = ApplyGradients(accumulators, self.optimizer)
        self._accumulators = accumulators
        # old-logprob scoring has no backward: the training forward serves unless it is marked for recompute
        scoring_forward = completion_forward(self.actor, config) if actor_cfg.recompute else actor_forward
        self._actor_logprobs = CompletionLogProbs(scoring_forward, sampling.temperature)
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
        """The actor as a Hugging Face folder (the checkpoint manager hands us a fresh, empty folder). Under tensor
        parallelism each tensor is gathered from the ranks' slices as it is written, one at a time; the other
        ranks of this tensor-parallel group must run :meth:`serve_export` meanwhile."""
        if self.dist.tp_size == 1:
            export_hf(self.actor, out_dir, hf_config=self.hf_config, tokenizer_dir=self.config.tokenizer_dir,
                      overwrite=True)
            return
        export_hf_arrays(out_dir, self.full_shapes, self._gather_full, hf_config=self.hf_config,
                         tokenizer_dir=self.config.tokenizer_dir, overwrite=True)

    def serve_export(self) -> None:
        """A tensor-parallel peer's side of :meth:`export`: the same gathers, in the same (``full_shapes``) order."""
        for name in self.full_shapes:
            self._gather_full(name)

    def _gather_full(self, hf_name: str) -> np.ndarray:
        """One full tensor from this tensor-parallel group's slices (every rank of the group must call it)."""
        pieces = all_gather(host_array(self._hf_params[hf_name]), self.dist, over=TP)
        return self.layout.assemble(hf_name, list(pieces), self.full_shapes[hf_name])

    def load_weights(self, model_dir: Path) -> None:
        load_hf_weights(self.actor, model_dir)
        self.sync_weights()

    def save_optimizer_shard(self, folder: Path) -> None:
        """This rank's AdamW moments (keyed by HF name; under ZeRO-1 only the parameters it owns) as
        ``rank_<rank>.safetensors``, and, from rank 0, the layout they were written under. Every rank writes one,
        so a checkpoint can be resharded to any layout (without ZeRO-1 data-parallel ranks write copies)."""
        ckpt.save_arrays(folder / f"rank_{self.dist.rank:05d}.safetensors", self.optimizer.state_arrays(),
                         metadata=rank_metadata(tp_rank=self.dist.tp_rank, dp_rank=self.dist.dp_rank))
        if self.dist.is_main:
            ckpt.save_json(folder / "layout.json", layout_record(tp=self.dist.tp_size, dp=self.dist.dp_size,
                                                                 optimizer_shard=self.optimizer.sharded))

    def load_optimizer(self, folder: Path) -> None:
        """This rank's moments from a checkpoint's ``optimizer/`` folder, resharded from the layout it was written
        under (tensor-parallel degree, data-parallel size, ZeRO-1 or not) to this one."""
        files = sorted(folder.glob("rank_*.safetensors"))
        state = load_resharded(files, ckpt.load_json(folder / "layout.json"), self.layout,
                               self.optimizer.owned_names, self.full_shapes)
        self.optimizer.load_state_arrays(state)

    def compiled_graphs(self) -> int:
        """Graphs MindSpore has compiled for this policy so far (its per-Cell compile caches and the engine's)."""
        cells = (self._accumulate, self._reduce_and_clip, self._apply, self._actor_logprobs, self._ref_logprobs)
        engine = getattr(self.engine, "compiled_graphs", lambda: 0)()
        return engine + sum(len(cell.compile_cache) for cell in cells if cell is not None)

    def precompile(self, data) -> None:
        """Compile the training graphs for a batch shaped like ``data`` (a ``Rollouts`` of dummy tokens): the
        reference (and old) log-probs and one accumulated micro-batch, whose gradients are then dropped. Weights
        and optimizer state are untouched. Every micro-batch of a prompt width has one shape, padded or packed."""
        if self._ref_logprobs is not None:
            self.reference_logprobs(data)
        if self.config.rl_config.num_iterations > 1:
            self.actor_logprobs(data)
        zeros = np.zeros(data.completion_mask.shape, np.float32)
        inputs, _ = next(self._loss_inputs(data, zeros[:, 0], zeros, zeros, global_tokens=1.0))
        self._accumulate(*inputs)
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
        if self.pack_rows:  # log-probs of the packed rows, put back in place (0 on padding)
            out = np.zeros(data.completion_mask.shape, np.float32)
            for batch in micro_batches(data, self.pack_rows, self.config.rl_config.num_generations):
                logp, _ = cell(*self._packed_inputs(data, batch))
                loss_rows, tokens = np.nonzero(batch.mask)
                out[batch.completions[loss_rows], tokens] = logp.asnumpy().reshape(-1)[batch.unpack[loss_rows, tokens]]
            return out
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

    @staticmethod
    def _packed_inputs(data, batch: MicroBatch):
        """The packed forward's seven inputs for one micro-batch (see mindgrpo.train.packing.MicroBatch)."""
        return (Tensor(data.prompt_ids[batch.prompts]), Tensor(data.prompt_mask[batch.prompts]),
                Tensor(batch.completion_ids), Tensor(batch.positions), Tensor(batch.segments), Tensor(batch.row_prompt),
                Tensor(batch.source))

    def _loss_inputs(self, data, advantages: np.ndarray, old: np.ndarray, ref: np.ndarray, *, global_tokens: float):
        """Each micro-batch's loss-cell inputs and its active tokens. ``global_tokens``: the step's active tokens
        on all ranks (dapo's normaliser)."""
        micro = self.config.actor_config.micro_batch_size
        if self.pack_rows:
            weights = step_row_weights(self.settings, data.completion_mask.sum(1), micro, dp_size=self.dist.dp_size,
                                       num_items_in_batch=global_tokens)
            for batch in micro_batches(data, self.pack_rows, self.config.rl_config.num_generations):
                rows = batch.completions
                yield ((*self._packed_inputs(data, batch), Tensor(batch.unpack), Tensor(batch.mask),
                        Tensor(advantages[rows]), Tensor(old[rows]), Tensor(ref[rows]), Tensor(weights[rows])),
                       int(batch.mask.sum()))
            return
        num_items = Tensor(max(1.0, global_tokens), ms.float32)
        for start in range(0, len(data.completion_ids), micro):
            rows = slice(start, start + micro)
            yield ((*self._model_inputs(data, start, micro), Tensor(data.completion_mask[rows]),
                    Tensor(advantages[rows]), Tensor(old[rows]), Tensor(ref[rows]), num_items),
                   int(data.completion_mask[rows].sum()))

    def update(self, data, advantages: np.ndarray, old_logp: Optional[np.ndarray], ref_logp: Optional[np.ndarray],
               *, total_steps: int) -> Dict[str, float]:
        """``num_iterations`` optimizer steps over this rank's rollouts; returns metrics averaged over them:
        ``actor/loss`` is an optimizer step's loss (the sum of its micro-batches'), the other ``actor/`` metrics
        token means over the step, whatever its micro-batches are."""
        rl = self.config.rl_config
        zeros = np.zeros(data.completion_mask.shape, np.float32)
        old = old_logp if old_logp is not None else zeros  # ignored on-policy: the cell uses detached logp
        ref = ref_logp if ref_logp is not None else zeros  # ignored when beta = 0
        # dapo normalises by the active tokens of the whole optimizer step on all ranks (see mindgrpo.algorithm.loss).
        global_tokens = all_reduce_sum(np.array([data.completion_mask.sum()]), self.dist)[0]
        step_tokens = max(1.0, float(data.completion_mask.sum()))
        totals: Dict[str, float] = {}
        skipped = 0
        for _ in range(rl.num_iterations):
            sums: Dict[str, float] = {}
            # No collective runs per micro-batch (only tensor-parallel ones, within identical ranks), so
            # data-parallel ranks may take different numbers of packed micro-batches.
            for inputs, tokens in self._loss_inputs(data, advantages.astype(np.float32), old, ref,
                                                    global_tokens=global_tokens):
                loss, metrics, entropy = self._accumulate(*inputs)
                named = dict(zip(METRIC_KEYS, metrics.asnumpy().tolist()))
                sums["actor/loss"] = sums.get("actor/loss", 0.0) + float(loss)
                for key, value in {"actor/entropy": float(entropy), **named}.items():
                    sums[key] = sums.get(key, 0.0) + value * tokens / step_tokens
            norm = float(self._reduce_and_clip())
            lr = learning_rate_at(self.config.actor_config.lr_schedule, self.optimizer.step_count,
                                  total_steps * rl.num_iterations)
            # Every rank must take the same branch: the norm is already global; the loss flag is made global.
            local_bad = not all(np.isfinite(v) for v in sums.values())
            if np.isfinite(norm) and not all_reduce_sum(np.array([float(local_bad)]), self.dist, over=WORLD)[0]:
                self._apply(*self.optimizer.hyper_tensors(lr))
            else:
                self._drop_gradients()
                skipped += 1  # keep the last good weights; the trainer counts and eventually stops
            for key, value in sums.items():
                totals[key] = totals.get(key, 0.0) + value
            totals["grad_norm"] = totals.get("grad_norm", 0.0) + norm
            totals["grpo/lr"] = lr
        out = {k: v / rl.num_iterations if k != "grpo/lr" else v for k, v in totals.items()}
        reduced = all_reduce_sum(np.array(list(out.values())), self.dist) / self.dist.dp_size
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


