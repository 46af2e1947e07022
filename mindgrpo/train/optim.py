"""AdamW with torch semantics, global-norm clipping, and the learning-rate schedules.

The update is MindSpore's fused ``AdamWeightDecay`` kernel (CPU and Ascend), which updates the weight and both
moments in place. Written with plain ops, every parameter's update made about ten weight-sized temporaries, and a
compiled graph runs the independent per-parameter updates interleaved, so they were alive at once (the first step
of a 25M-parameter model grew RSS by 1.14 GB; with the kernel, by 0.49 GB, most of it the clipping graph). The
kernel has no bias correction, so it is folded into its scalar inputs (see :meth:`AdamW.hyper_tensors`); the
result equals ``torch.optim.AdamW`` (``tests/test_optim.py``). The scalars are passed in as tensors each step, so
changing the learning rate never recompiles, and the moments are named Parameters, so checkpoints save and restore
them by name.

ZeRO-1 (``optimizer_shard`` with data parallel > 1) keeps the moments, 8 bytes per parameter, of only the
parameters this data-parallel rank owns (:func:`mindgrpo.train.optim_state.owner_ranks`); the others get no moment
Parameters at all, which is the memory saving. After the owners' in-place updates, one AllReduce-SUM per parameter
over the data-parallel group, to which non-owners add zeros, gives every rank the new weights exactly (``x + 0 =
x``). AllReduce-SUM is used because it is the collective CPU runs on any group (see :mod:`mindgrpo.parallel.groups`).

Mixed precision (Megatron's distributed optimizer; ``actor_config.param_dtype: bfloat16``): the model's Parameters
are bf16 working weights, and only the optimizer holds fp32 state: for each parameter a rank owns, an fp32 master
copy beside the two moments. The kernel steps the master in fp32 (the gradient cast to fp32 if it was reduced in
bf16), and the working weight becomes its cast to bf16: in place on one rank, or on every rank through the same
AllReduce-SUM of the owners' fp32 masters and the others' zeros (then cast). A rank therefore holds 2 bytes a
parameter of weights and 12 of optimizer state for its 1/data_parallel share. MindSpore's CPU backend has no
bfloat16 Assign, so on CPU the graph steps the masters and :meth:`AdamW.publish` writes the working weights from the
host after it (the same sum, over the host collectives, under ZeRO-1); on Ascend the graph does it all.
"""
from __future__ import annotations

import math
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

import mindspore as ms
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops

from mindgrpo.config import LRScheduleConfig, OptimizerConfig
from mindgrpo.parallel.groups import DP, DistInfo, all_reduce_sum
from mindgrpo.train.optim_state import MASTER, MOMENTS, STEP_COUNT, owner_ranks


def learning_rate_at(schedule: LRScheduleConfig, step: int, total_steps: int) -> float:
    """Learning rate for optimizer step ``step`` (0-based): linear warmup, then constant, or a cosine or linear
    decay to lr_end (``linear`` is Hugging Face's and TRL's default schedule)."""
    peak, warmup = schedule.learning_rate, schedule.warmup_steps
    if warmup and step < warmup:
        return peak * (step + 1) / warmup
    if schedule.type == "constant":
        return peak
    horizon = max(1, (schedule.total_steps or total_steps) - warmup)
    progress = min(1.0, (step - warmup) / horizon)
    if schedule.type == "linear":
        return schedule.lr_end + (peak - schedule.lr_end) * (1.0 - progress)
    return schedule.lr_end + 0.5 * (peak - schedule.lr_end) * (1.0 + math.cos(math.pi * progress))


def _decays(param: Parameter) -> bool:
    """Weight decay applies to matrices only, not to norm scales or biases (the common LLM recipe)."""
    return len(param.shape) >= 2


# GRAPH mode unrolls a Python loop in `construct` into nested calls, and compiling stops at a call depth of 1000
# ("Exceed function call depth limit"): a loop over every parameter of Qwen2.5-0.5B (290) that grows a tuple
# already exceeds it, and any loop over Qwen2.5-32B's 771 does. So per-parameter work that needs no order is a
# HyperMap (as MindSpore's own optimizers do), and work that must keep its order (collectives every rank issues in
# the same sequence) loops over runs of at most RUN_LENGTH parameters, one method call per run.
RUN_LENGTH = 64


def parameter_runs(count: int, length: int = RUN_LENGTH):
    """(start, stop) of consecutive runs of at most ``length`` of ``count`` parameters, in order."""
    return [(start, min(start + length, count)) for start in range(0, count, length)]


_adam_step = ops.MultitypeFuncGraph("adam_step")


@_adam_step.register("Function", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor",
                     "Tensor", "Tensor", "Bool", "Bool")
def _adam_update(adam, beta1, beta2, step_size, eps, decay, no_decay, param, exp_avg, exp_avg_sq, grad, decays,
                 owned):
    """The fused kernel's in-place step of one parameter (its fp32 master, under mixed precision); the new value, or
    float32 zeros where another rank owns it (the ZeRO-1 sum then reads the owner's)."""
    if not owned:
        return ops.zeros(param.shape, ms.float32)
    if grad.dtype != param.dtype:  # bf16-reduced gradients into an fp32 master
        grad = grad.astype(param.dtype)
    update = adam(param, exp_avg, exp_avg_sq, step_size, beta1, beta2, eps, decay if decays else no_decay, grad)
    return ops.depend(param, update)


_publish = ops.MultitypeFuncGraph("publish")


@_publish.register("Tensor", "Tensor")
def _publish_weight(param, master):
    """The working weight from its stepped fp32 master (mixed precision, one data-parallel rank)."""
    return ops.assign(param, master.astype(param.dtype))


_adam_step_and_reset = ops.MultitypeFuncGraph("adam_step_and_reset")


@_adam_step_and_reset.register("Function", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor",
                               "Tensor", "Tensor", "Tensor", "Bool", "Bool")
def _adam_update_and_reset(adam, beta1, beta2, step_size, eps, decay, no_decay, param, exp_avg, exp_avg_sq,
                           accumulator, decays, owned):
    """:func:`_adam_update` reading the gradient from its accumulator Parameter, then zeroing it."""
    new = _adam_update(adam, beta1, beta2, step_size, eps, decay, no_decay, param, exp_avg, exp_avg_sq, accumulator,
                       decays, owned)
    return ops.depend(new, ops.assign(accumulator, ops.depend(ops.zeros_like(accumulator), new)))


class AdamW(nn.Cell):
    """AdamW as ``torch.optim.AdamW``: decoupled decay ``p -= lr*wd*p``, bias-corrected moments.

    ``names`` key the moments in :meth:`state_arrays` (default: the Parameters' names; the trainer passes Hugging
    Face names so checkpoints can be resharded). With ``optimizer_shard`` and ``dist.dp_size > 1`` the moments are
    partitioned over the data-parallel group (ZeRO-1, see the module docstring).
    """

    def __init__(self, params: Sequence[Parameter], config: OptimizerConfig, *, names: Optional[Sequence[str]] = None,
                 dist: Optional[DistInfo] = None, optimizer_shard: bool = False):
        super().__init__(auto_prefix=False)
        self.params = ParameterTuple(params)
        self.names = tuple(names) if names is not None else tuple(p.name for p in self.params)
        if len(self.names) != len(self.params):
            raise ValueError(f"{len(self.names)} names for {len(self.params)} parameters")
        self.sharded = bool(optimizer_shard and dist is not None and dist.dp_size > 1)
        self.dist = dist
        if self.sharded:
            owners = owner_ranks([int(np.prod(p.shape)) for p in self.params], dist.dp_size)
            owned = [i for i, owner in enumerate(owners) if owner == dist.dp_rank]
            self.all_reduce = ops.AllReduce(group=dist.dp_group)
        else:
            owned = list(range(len(self.params)))
        # slots[i]: index of parameter i's moments, or -1 when another data-parallel rank keeps them.
        position = {i: slot for slot, i in enumerate(owned)}
        slots = [position.get(i, -1) for i in range(len(self.params))]
        kept = [self.params[i] for i in owned]
        # Mixed precision: the owned parameters' fp32 master weights, which the kernel steps (see the module
        # docstring); none when the weights are fp32 themselves.
        self.mixed = any(p.dtype != ms.float32 for p in self.params)
        # Whether the step's graph writes the bf16 working weights (see the module docstring; else publish()).
        self.publishes_in_graph = not self.mixed or ms.get_context("device_target") != "CPU"
        self.slots = tuple(slots)
        self.master = ParameterTuple([_fp32_state(MASTER, p, p.astype(ms.float32)) for p in kept]
                                     if self.mixed else [])
        self.exp_avg = ParameterTuple([_fp32_state("exp_avg", p) for p in kept])
        self.exp_avg_sq = ParameterTuple([_fp32_state("exp_avg_sq", p) for p in kept])
        # One entry per parameter for the HyperMap; a parameter whose state another rank keeps stands in for it
        # (its `owned` flag is False, so the update never reads them).
        self.owned = tuple(slot >= 0 for slot in slots)
        self.stepped = ParameterTuple([self.master[slot] if self.mixed and slot >= 0 else p
                                       for slot, p in zip(slots, self.params)])
        self.exp_avg_slots = ParameterTuple([self.exp_avg[slot] if slot >= 0 else p
                                             for slot, p in zip(slots, self.params)])
        self.exp_avg_sq_slots = ParameterTuple([self.exp_avg_sq[slot] if slot >= 0 else p
                                                for slot, p in zip(slots, self.params)])
        self.hyper_map = ops.HyperMap()
        self.sync_runs = (tuple(parameter_runs(len(self.params))) if self.sharded and self.publishes_in_graph
                          else ())
        self.owned_names = tuple(self.names[i] for i in owned)
        self.beta1, self.beta2, self.eps = config.beta1, config.beta2, config.eps
        self.weight_decay = config.weight_decay
        self.decay_flags = tuple(_decays(p) and config.weight_decay > 0 for p in self.params)
        self.betas = (Tensor(config.beta1, ms.float32), Tensor(config.beta2, ms.float32))
        self.no_decay = Tensor(0.0, ms.float32)
        self.adam = ops.AdamWeightDecay()
        self.step_count = 0  # host-side: the bias corrections are folded into the scalars on the host

    def construct(self, grads, step_size, eps, decay):
        """One step with the scalars of :meth:`hyper_tensors`; the weights and moments change in place."""
        return self._step(_adam_step, grads, step_size, eps, decay)

    def step_and_reset(self, accumulators: ParameterTuple, step_size, eps, decay):
        """:meth:`construct` with the gradients in ``accumulators``, each zeroed as soon as its parameter's step has
        read it. Zeroing them all after the whole step instead made the compile time grow with the square of the
        parameter count (about 4x per doubling on CPU; Qwen2.5-32B has 771)."""
        return self._step(_adam_step_and_reset, accumulators, step_size, eps, decay)

    def _step(self, update, grads, step_size, eps, decay):
        updated = self.hyper_map(ops.partial(update, self.adam, self.betas[0], self.betas[1], step_size, eps, decay,
                                             self.no_decay),
                                 self.stepped, self.exp_avg_slots, self.exp_avg_sq_slots, grads, self.decay_flags,
                                 self.owned)
        previous = ops.depend(step_size, updated)
        if self.mixed and not self.sharded and self.publishes_in_graph:
            previous = ops.depend(previous, self.hyper_map(_publish, self.params, updated))
        for start, stop in self.sync_runs:  # ZeRO-1 only
            previous = self._sync(updated, start, stop, previous)
        return ops.depend(step_size, previous)

    def _sync(self, updated, start, stop, previous):
        """ZeRO-1's weight sync of parameters ``start..stop-1``: an AllReduce-SUM per parameter over the data-parallel
        group of its updated value (owners add their new weights, the others zeros), each waiting for the previous
        one (the ranks' graphs differ, as each updates its own parameters, and collectives must be issued in the
        same order everywhere)."""
        for i in range(start, stop):
            new = self.all_reduce(ops.depend(updated[i], previous))
            if self.mixed:
                new = new.astype(self.params[i].dtype)
            previous = ops.assign(self.params[i], new)
        return previous

    def publish(self) -> None:
        """After a step on CPU under mixed precision: each working weight from its fp32 master (see the module
        docstring). Nothing to do where the step's graph wrote them."""
        if not self.publishes_in_graph:
            self.weights_from_masters()

    def weights_from_masters(self) -> None:
        """Mixed precision: every working weight set to its fp32 master, cast to the weight's dtype, on every rank
        (the owner's master summed with the others' zeros over the data-parallel group under ZeRO-1). After a step
        on CPU, and after a resume: the checkpoint's weights are stored in bf16, so a weight kept in float32 (the
        norms) is only exact in its master."""
        if not self.mixed:
            return
        for param, slot in zip(self.params, self.slots):
            if not self.sharded:
                param.set_data(self.master[slot].astype(param.dtype))
                continue
            mine = self.master[slot].asnumpy() if slot >= 0 else np.zeros(param.shape, np.float32)
            param.set_data(Tensor(all_reduce_sum(mine, self.dist, over=DP).astype(np.float32)).astype(param.dtype))

    def hyper_tensors(self, lr: float) -> Tuple[Tensor, Tensor, Tensor]:
        """Advance the step count and return the kernel's (step size, epsilon, decay) as float32 tensors.

        torch's step is ``p -= lr*wd*p`` and ``p -= lr/c1 * m / (sqrt(v)/sqrt(c2) + eps)`` with ``c1 = 1 - beta1^t``
        and ``c2 = 1 - beta2^t``. The kernel computes ``p -= s * (m / (sqrt(v) + e) + d*p)``, which is the same
        step for ``s = lr*sqrt(c2)/c1``, ``e = eps*sqrt(c2)`` and ``d = wd*c1/sqrt(c2)``.
        """
        self.step_count += 1
        t = self.step_count
        c1, root_c2 = 1.0 - self.beta1 ** t, math.sqrt(1.0 - self.beta2 ** t)
        return (Tensor(lr * root_c2 / c1, ms.float32), Tensor(self.eps * root_c2, ms.float32),
                Tensor(self.weight_decay * c1 / root_c2, ms.float32))

    def _moments(self):
        """(state key, Parameter) for the fp32 state this rank keeps: the moments, and the master weights under
        mixed precision."""
        kinds = tuple(zip(MOMENTS, (self.exp_avg, self.exp_avg_sq))) + (((MASTER, self.master),) if self.mixed else ())
        for kind, params in kinds:
            for name, param in zip(self.owned_names, params):
                yield f"{kind}.{name}", param

    def state_arrays(self) -> Dict[str, np.ndarray]:
        """This rank's moments (``exp_avg.<name>``, ``exp_avg_sq.<name>``) plus the step count, for checkpoints;
        :func:`mindgrpo.train.optim_state.load_resharded` reads them back under any layout."""
        state = {key: param.asnumpy() for key, param in self._moments()}
        state[STEP_COUNT] = np.array(self.step_count, dtype=np.int64)
        return state

    def load_state_arrays(self, state: Dict[str, np.ndarray]) -> None:
        moments = dict(self._moments())
        missing = sorted(set(moments) - set(state))
        if missing:
            raise ValueError(f"optimizer state is missing {len(missing)} moment(s), e.g. {missing[:3]}: the "
                             "checkpoint was written for a different model or layout")
        for key, param in moments.items():
            if tuple(state[key].shape) != tuple(param.shape):
                raise ValueError(f"optimizer state {key} has shape {state[key].shape}, expected {param.shape}")
            param.set_data(Tensor(state[key], param.dtype))
        self.step_count = int(state[STEP_COUNT])

    def sync_master_from_weights(self) -> None:
        """Mixed precision: restart the fp32 masters from the working weights (after weights were loaded without
        optimizer state: a new run from a bf16 folder). A resumed run restores them with the moments instead."""
        if not self.mixed:
            return
        for i, slot in enumerate(self.slots):
            if slot >= 0:
                self.master[slot].set_data(self.params[i].astype(ms.float32))


def _fp32_state(kind: str, param: Parameter, value: Optional[Tensor] = None) -> Parameter:
    """An fp32 optimizer-state Parameter for ``param`` (zeros unless ``value``), named ``<kind>.<param name>``."""
    return Parameter(ops.zeros(param.shape, ms.float32) if value is None else value, name=f"{kind}.{param.name}",
                     requires_grad=False)


_square_sum = ops.MultitypeFuncGraph("square_sum")


@_square_sum.register("Tensor", "Number")
def _square_sum_of(grad, copies):
    square = ops.square(grad.astype(ms.float32))
    # rows first: MindSpore's CPU ReduceSum of a whole 2-D tensor is about 8x slower than over its last axis
    term = square.reshape((-1, grad.shape[-1])).sum(-1).sum() if grad.ndim > 1 else square.sum()
    return term / copies if copies > 1 else term


@_square_sum.register("Tensor")
def _square_sum_once(grad):
    return _square_sum_of(grad, 1)


_scaled = ops.MultitypeFuncGraph("scaled")


@_scaled.register("Tensor", "Tensor")
def _scaled_by(scale, grad):
    return grad * scale.astype(grad.dtype)


_hyper_map = ops.HyperMap()


def squared_norm(grads, copies: Optional[Sequence[int]] = None) -> Tensor:
    """Sum of the gradients' squared L2 norms (float32), each divided by its ``copies``: a tensor held identically
    by several tensor-parallel ranks (norm scales, replicated KV heads) is then counted once when the ranks' sums
    are added up."""
    if copies is None:
        return ops.addn(_hyper_map(_square_sum, grads))
    return ops.addn(_hyper_map(_square_sum, grads, copies))


def global_norm(grads) -> Tensor:
    """L2 norm over all gradients (float32)."""
    return ops.sqrt(squared_norm(grads))


CLIP_EPS = 1e-6  # added to the norm in the clip factor, in the graph and on the host alike


def clip_to_norm(grads, norm: Tensor, max_norm: float):
    """Scale gradients whose global norm is ``norm`` so it is at most max_norm (0 disables)."""
    if max_norm <= 0:
        return grads
    scale = ops.minimum(Tensor(1.0, ms.float32), max_norm / (norm + CLIP_EPS))
    return _hyper_map(ops.partial(_scaled, scale), grads)


def clip_scale(norm: float, max_norm: float) -> np.float32:
    """:func:`clip_to_norm`'s factor on the host, in float32 as the graph computes it (1 when max_norm is 0)."""
    if max_norm <= 0:
        return np.float32(1.0)
    return np.minimum(np.float32(1.0), np.float32(max_norm) / (np.float32(norm) + np.float32(CLIP_EPS)))


def scale_in_place(param: Parameter, scale: np.float32) -> None:
    """``param *= scale`` in the Parameter's own memory: on CPU its numpy view shares it, so no copy is made; where
    it does not (a device), the scaled copy is written back."""
    view = param.asnumpy()
    view *= scale
    if not np.shares_memory(view, param.asnumpy()):
        param.set_data(Tensor(view))


def clip_by_global_norm(grads, max_norm: float):
    """Scale gradients so their global norm is at most max_norm (0 disables); returns (grads, norm before)."""
    norm = global_norm(grads)
    return clip_to_norm(grads, norm, max_norm), norm
