"""The compiled pieces of a GRPO step, as MindSpore Cells: forwards, log-probs, the loss, and the gradient update.

:class:`mindgrpo.train.model_worker.ModelWorker` builds them once per run and feeds each a micro-batch as one named
batch (:mod:`mindgrpo.train.step_batch`); each compiles once per input shape in GRAPH mode.

* ``completion_forward`` picks the forward over ``[prompt | completion]`` rows (shared prompt, unshared or packed),
  which projects only the completion positions to the vocabulary (logits are the largest tensor: Qwen2.5's
  vocabulary is 151,936); ``CompletionLogProbs`` turns its logits into per-token log-probs and entropies;
* ``GRPOLossCell``: log-probs, then :func:`mindgrpo.algorithm.grpo_loss` (fused kernel or plain ops); with
  ``actor_config.max_tokens_per_micro_batch`` the forwards take packed rows instead (``PackedLossCell``,
  :mod:`mindgrpo.train.packing`);
* ``AccumulateGradients`` (forward + backward of a micro-batch), ``ReduceAndClip`` (data-parallel average,
  tensor-parallel sums, global-norm clipping) and ``ApplyGradients`` (one AdamW step).
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

import mindspore as ms
from mindspore import ParameterTuple, Tensor, nn, ops

from mindgrpo.algorithm import LossConfig, grpo_loss, token_entropy, token_logprobs
from mindgrpo.config import Derived, GRPOConfig
from mindgrpo.models.passes import ModelPass
from mindgrpo.models.qwen2 import Qwen2Model
from mindgrpo.parallel.groups import DistInfo
from mindgrpo.ops.head_logprobs import MODES as HEAD_MODES, head_logprobs
from mindgrpo.parallel.layers import parallel_token_entropy, parallel_token_logprobs
from mindgrpo.parallel.layout import TPLayout
from mindgrpo.train.step_batch import pass_inputs
from mindgrpo.train.optim import (AdamW, clip_scale, clip_to_norm, parameter_runs, scale_in_place,
                                  squared_norm)


class CompletionLogProbs(nn.Cell):
    """Per-token log-probs and entropies of the completions, from a pass of the model
    (:class:`~mindgrpo.models.passes.ModelPass`): :meth:`~mindgrpo.models.qwen2.Qwen2Model.shared_prompt` (each
    prompt once per group), ``completions`` (``[prompt | completion]`` rows) or ``packed`` (packed rows).

    Under tensor parallelism the shared-prompt forward returns each rank's vocabulary slice of the logits, and
    the log-softmax is completed across ranks from per-row numbers (:mod:`mindgrpo.parallel.layers`), so
    no rank ever holds [tokens, vocab].

    A forward built with ``head_outside`` (:func:`completion_forward` with ``actor_config.head_impl: fused``)
    returns the normed final states and the head weight instead, and the head, log-softmax and entropy run as one
    chunked kernel (:mod:`mindgrpo.ops.head_logprobs`) in ``head_mode``: ``score`` without a backward, ``train``
    or ``train_head`` (the head's weight is trained too) in the loss.

    ``entropy_gradient``: the entropies carry their gradient (the entropy bonus); not under tensor parallelism,
    whose entropy is a metric only (the config refuses ``entropy_coef`` there), nor with the head outside."""

    def __init__(self, forward: ModelPass, temperature: float, entropy_gradient: bool = False,
                 head_mode: str = "score"):
        super().__init__(auto_prefix=False)
        self.forward, self.temperature = forward, temperature
        self.input_names = forward.INPUTS
        self.tensor_parallel = forward.comm.size > 1
        self.vocab_start = forward.vocab_start
        if entropy_gradient and self.tensor_parallel:
            raise ValueError("the entropy bonus (rl_config.entropy_coef > 0) is not available with tensor "
                             "parallelism: the vocabulary-parallel entropy has no gradient")
        if entropy_gradient and forward.head_outside:
            raise ValueError("the entropy bonus needs the plain head (actor_config.head_impl: plain): the fused "
                             "head's entropy has no gradient")
        if head_mode not in HEAD_MODES:
            raise ValueError(f"head_mode={head_mode!r}: expected one of {', '.join(HEAD_MODES)}")
        self.entropy_gradient, self.head_mode = entropy_gradient, head_mode
        self.head_outside = forward.head_outside
        self.inv_temp = Tensor([1.0 / temperature], ms.float32)

    def construct(self, batch):
        completion_ids = batch["completion_ids"]
        if self.head_outside:
            hidden, head = self.forward(*pass_inputs(self.input_names, batch))
            logp, entropy = head_logprobs(hidden.reshape((-1, hidden.shape[-1])), head,
                                          completion_ids.reshape((-1,)).astype(ms.int32), self.inv_temp,
                                          self.head_mode)
            return logp.reshape(completion_ids.shape), entropy.reshape(completion_ids.shape)
        logits = self.forward(*pass_inputs(self.input_names, batch))
        if not self.tensor_parallel:
            return (token_logprobs(logits, completion_ids, self.temperature),
                    token_entropy(logits, self.temperature, keep_gradient=self.entropy_gradient))
        rows = logits.reshape((-1, logits.shape[-1]))
        if self.temperature != 1.0:
            rows = rows * (1.0 / self.temperature)
        comm, ids = self.forward.comm, completion_ids.reshape((-1,)).astype(ms.int32)
        return (parallel_token_logprobs(comm, rows, ids, self.vocab_start).reshape(completion_ids.shape),
                parallel_token_entropy(comm, rows).reshape(completion_ids.shape))


def completion_forward(model: Qwen2Model, config: GRPOConfig, backward: bool = False,
                       adapters: bool = True) -> ModelPass:
    """The pass of ``model`` that ``actor_config.max_tokens_per_micro_batch`` and ``rl_config.share_prompt``
    select. ``backward``: it is the actor's training forward, so ``actor_config.recompute`` applies (scoring
    without a backward never recomputes). ``adapters=False``: a LoRA actor's backbone alone (its reference).
    The head is applied outside the pass (:class:`CompletionLogProbs`) where :func:`fused_head_applies`."""
    rl = config.rl_config
    recompute = backward and config.actor_config.recompute
    head_outside = fused_head_applies(model, config, backward)
    if config.actor_config.max_tokens_per_micro_batch:
        return model.packed(rl.seq_length, recompute=recompute, adapters=adapters, head_outside=head_outside)
    if not rl.share_prompt:
        return model.completions(rl.seq_length, adapters=adapters, head_outside=head_outside)
    return model.shared_prompt(rl.num_generations, rl.seq_length, recompute=recompute, adapters=adapters,
                               head_outside=head_outside)


def fused_head_applies(model: Qwen2Model, config: GRPOConfig, backward: bool) -> bool:
    """Whether ``actor_config.head_impl: fused`` runs for this built model's passes (:meth:`Derived.fused_head`, asked
    with the model's own compute and head dtypes and layout)."""
    return Derived(config).fused_head(ms.get_context("device_target"), compute_dtype=model.compute_dtype,
                                      head_dtype=str(model.lm_head.weight.dtype).lower(),
                                      model_parallel=model.layout.tp, backward=backward)


def training_head_mode(forward: ModelPass) -> str:
    """The fused head's mode in a training forward: ``train_head`` when the head's weight trains (full parameters:
    ``lm_head`` or the tied embedding table), ``train`` when it is frozen (LoRA)."""
    return "train_head" if forward.head_requires_grad() else "train"


class GRPOLossCell(nn.Cell):
    """Scalar GRPO loss of one micro-batch plus its metrics (differentiated with respect to the actor)."""

    def __init__(self, forward: ModelPass, temperature: float, settings: LossConfig, *, on_policy: bool,
                 grad_accum_steps: int, dp_size: int, max_completion_length: int):
        super().__init__(auto_prefix=False)
        self.logprobs = CompletionLogProbs(forward, temperature, entropy_gradient=settings.entropy_coef > 0,
                                           head_mode=training_head_mode(forward))
        self.settings, self.on_policy = settings, on_policy
        self.grad_accum_steps, self.dp_size = grad_accum_steps, dp_size
        self.max_completion_length = max_completion_length

    def construct(self, batch):
        """``batch``: a micro-batch (:mod:`mindgrpo.train.step_batch`)."""
        logp, entropy = self.logprobs(batch)
        return self._loss(logp, entropy, batch, num_items=batch["num_items"])

    def _loss(self, logp, entropy, batch, num_items=None, row_weights=None):
        mask = batch["loss_mask"].astype(logp.dtype)
        old_logp, ref_logp, sampling_logp = batch["old_logp"], batch["ref_logp"], batch["sampling_logp"]
        settings = self.settings
        # On-policy (one pass per rollout) the old log-probs are the detached current ones: ratio 1, as in TRL.
        loss, metrics = grpo_loss(logp, None if self.on_policy else old_logp,
                                  ref_logp if settings.beta > 0 else None, batch["advantages"], mask, cfg=settings,
                                  num_items_in_batch=num_items, grad_accum_steps=self.grad_accum_steps,
                                  dp_size=self.dp_size, max_completion_length=self.max_completion_length,
                                  row_weights=row_weights,
                                  entropy=entropy if settings.needs_entropy else None,
                                  sampling_logp=sampling_logp if settings.rollout_correction != "none" else None)
        mean_entropy = ops.stop_gradient((entropy * mask).sum() / ops.clamp(mask.sum(), min=1.0))
        return loss, metrics, mean_entropy, rollout_gap_sums(logp, sampling_logp, mask)


def rollout_gap_sums(logp, sampling_logp, mask):
    """[sum |d|, max |d|, sum exp(d)] over the active tokens, d = training log-prob - rollout engine's log-prob:
    the ``rollout/`` gap metrics, from the log-probs the loss computes anyway (no extra forward; a few elementwise
    ops on [micro-batch, T]). No gradient flows through them."""
    diff = ops.stop_gradient(logp) - sampling_logp
    active = mask > 0
    gap = ops.abs(diff) * mask
    ratio = ops.where(active, ops.exp(ops.where(active, diff, ops.zeros_like(diff))), ops.zeros_like(diff))
    return ops.stack([gap.sum(), gap.max(), ratio.sum()])


class PackedLossCell(GRPOLossCell):
    """:class:`GRPOLossCell` of a packed micro-batch (:class:`mindgrpo.train.packing.MicroBatch`): the log-probs of its
    rows are gathered into its completions' loss rows ``[C, W]`` (``unpack``), so the loss is per completion as in
    the padded path, and each completion weighs in with its weight in the step's loss (``step_row_weights``)."""

    def __init__(self, forward: ModelPass, temperature: float, settings: LossConfig, *, on_policy: bool):
        # The completions' weights (step_row_weights) hold the step's reduction: no constants are needed here.
        super().__init__(forward, temperature, settings, on_policy=on_policy, grad_accum_steps=1, dp_size=1,
                         max_completion_length=None)

    def construct(self, batch):
        """``batch``: a packed micro-batch (:mod:`mindgrpo.train.step_batch`); ``unpack`` maps its loss rows'
        tokens to the packed rows' positions."""
        logp, entropy = self.logprobs(batch)
        unpack = batch["unpack"]
        return self._loss(ops.gather(logp.reshape((-1,)), unpack, 0), ops.gather(entropy.reshape((-1,)), unpack, 0),
                          batch, row_weights=batch["row_weights"])


def gradient_buffers(params: Sequence[ms.Parameter], dtype: str) -> ParameterTuple:
    """One zero accumulator per parameter, in ``dtype`` (``actor_config.grad_reduce_dtype``): the gradients of
    every micro-batch are added into these, reduced over ranks, clipped and read by the optimizer in place, so
    they are the only gradient copy of the step."""
    dtype = getattr(ms, dtype)
    return ParameterTuple([ms.Parameter(ops.zeros(p.shape, dtype), name=f"grad_accum.{p.name}", requires_grad=False)
                           for p in params])


_add_into = ops.MultitypeFuncGraph("add_into")


@_add_into.register("Tensor", "Tensor")
def _add_gradient(accumulator, grad):
    """accumulator += grad, the gradient cast first when it is in the weights' dtype (bf16 weights, fp32 buffers)."""
    return ops.assign_add(accumulator, grad if grad.dtype == accumulator.dtype else grad.astype(accumulator.dtype))


class AccumulateGradients(nn.Cell):
    """Forward + backward of one micro-batch, adding the gradients into accumulator Parameters.

    Keeping the sum in Parameters (instead of returning a tuple of gradients) means no tuple of tensors crosses
    the graph boundary, so GRAPH mode compiles this once per input shape and never again.
    """

    def __init__(self, loss_cell: nn.Cell, params, accumulators: ParameterTuple):
        super().__init__(auto_prefix=False)
        self.grad_fn = ms.value_and_grad(loss_cell, None, ParameterTuple(params), has_aux=True)
        self.accumulators = accumulators
        self.hyper_map = ops.HyperMap()

    def construct(self, batch):
        (loss, metrics, entropy, gap), grads = self.grad_fn(batch)
        added = self.hyper_map(_add_into, self.accumulators, grads)
        return ops.depend(loss, added), metrics, entropy, gap


class ReduceAndClip(nn.Cell):
    """Turn each rank's accumulated gradients into its slice of the whole model's gradient, clip them in place by
    the global norm, and return that norm.

    * Data parallel: the ranks of a DP group hold the same slice and saw different prompts, so the gradients are
      averaged over the DP group (not the world: with tensor parallelism the world's ranks hold different slices).
    * Tensor parallel: a KV head replicated on several TP ranks received, on each, only the gradient flowing
      through that rank's query heads, so those parts are summed (each rank writes its KV head's slot of a zero
      buffer; an AllReduce-SUM over the TP group fills every slot; each rank reads its own back). The replicated
      half of a LoRA adapter likewise holds each rank's part (``TPLayout.sums_gradient_over_tp``), summed over the
      TP group.
    * The norm adds the ranks' squared norms over the TP group, each tensor divided by the number of ranks holding
      an identical copy (``TPLayout.gradient_owners``), so every parameter of the model counts once. After the DP
      average the DP ranks hold identical gradients and add nothing.

    Every collective is an AllReduce-SUM, the one CPU runs on sub-groups, and each waits for the previous one so
    that all ranks issue them in the same order (in runs of accumulators, :func:`~mindgrpo.train.optim.parameter_runs`,
    so that no compiled loop grows with the model's depth). ``layout`` is None without tensor parallelism;
    ``hf_names`` are the Hugging Face names of the accumulators' parameters, in order (needed with a layout).
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
        self.tp_partial = (tuple(layout.sums_gradient_over_tp(name) for name in hf_names) if tp > 1
                           else (False,) * len(accumulators))
        # Ranks r with equal r // kv_replicas hold the same KV head.
        replicas = layout.kv_replicas if layout is not None else 1
        self.kv_groups, self.kv_slot = tp // replicas, tp_rank // replicas
        # The accumulators a collective touches, in order, in runs.
        reduced = [i for i in range(len(accumulators))
                   if self.dp_sum is not None or self.shared_kv[i] or self.tp_partial[i]]
        self.runs = tuple(tuple(reduced[start:stop]) for start, stop in parameter_runs(len(reduced)))
        self.hyper_map, self.assign = ops.HyperMap(), ops.Assign()
        # On CPU every node of a compiled graph keeps its output buffer for the life of the process, so scaling the
        # accumulators in the graph kept a second copy of every gradient (788 MiB beside 1 GiB of gradients,
        # measured): there the host scales them in place instead (:meth:`reduce_and_clip`).
        self.clips_in_graph = ms.get_context("device_target") != "CPU"

    def construct(self):
        previous = self.dp_scale  # the last collective's output: the next one waits for it
        for run in self.runs:
            previous = self._reduce(run, previous)
        squares = squared_norm(self.accumulators, self.copies)
        if self.tp_sum is not None:
            squares = self.tp_sum(ops.depend(squares, previous))
        norm = ops.sqrt(squares)
        if not self.clips_in_graph:
            return ops.depend(norm, previous)
        clipped = self.hyper_map(self.assign, self.accumulators, clip_to_norm(self.accumulators, norm, self.max_norm))
        return ops.depend(norm, clipped)

    def reduce_and_clip(self) -> float:
        """The step: the collectives, the global norm and the clip (in the graph, or on the host on CPU); returns
        the norm before clipping. A non-finite norm leaves the gradients as they are (the update is skipped)."""
        norm = float(self())
        if not self.clips_in_graph and np.isfinite(norm):
            scale = clip_scale(norm, self.max_norm)
            if scale < 1:
                for accumulator in self.accumulators:
                    scale_in_place(accumulator, scale)
        return norm

    def _reduce(self, run, previous):
        """The collectives of the accumulators in ``run``, in place; returns the last collective's output."""
        for i in run:
            grad = self.accumulators[i]
            if self.shared_kv[i]:
                grad = self._sum_kv_replicas(ops.depend(grad, previous))
                previous = grad
            elif self.tp_partial[i]:
                grad = self.tp_sum(ops.depend(grad, previous))
                previous = grad
            if self.dp_sum is not None:
                grad = self.dp_sum(ops.depend(grad, previous))
                previous = grad
                grad = grad * self.dp_scale.astype(grad.dtype)
            previous = ops.depend(previous, self.assign(self.accumulators[i], grad))
        return previous

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
    """One AdamW step with the accumulated gradients, each accumulator reset once its parameter's step read it."""

    def __init__(self, accumulators: ParameterTuple, optimizer: AdamW):
        super().__init__(auto_prefix=False)
        self.accumulators, self.optimizer = accumulators, optimizer

    def construct(self, step_size, eps, decay):
        """Scalars from :meth:`AdamW.hyper_tensors`."""
        return self.optimizer.step_and_reset(self.accumulators, step_size, eps, decay)
