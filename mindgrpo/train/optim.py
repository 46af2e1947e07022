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
"""
from __future__ import annotations

import math
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

import mindspore as ms
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops

from mindgrpo.config import LRScheduleConfig, OptimizerConfig
from mindgrpo.parallel.groups import DistInfo
from mindgrpo.train.optim_state import MOMENTS, STEP_COUNT, owner_ranks


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
    """The fused kernel's in-place step of one parameter; the new value, or zeros where another rank owns it."""
    if not owned:
        return ops.zeros_like(param)
    update = adam(param, exp_avg, exp_avg_sq, step_size, beta1, beta2, eps, decay if decays else no_decay, grad)
    return ops.depend(param, update)


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
        if self.sharded:
            owners = owner_ranks([int(np.prod(p.shape)) for p in self.params], dist.dp_size)
            owned = [i for i, owner in enumerate(owners) if owner == dist.dp_rank]
            self.all_reduce = ops.AllReduce(group=dist.dp_group)
        else:
            owned = list(range(len(self.params)))
        # slots[i]: index of parameter i's moments, or -1 when another data-parallel rank keeps them.
        position = {i: slot for slot, i in enumerate(owned)}
        slots = [position.get(i, -1) for i in range(len(self.params))]
        kept = ParameterTuple([self.params[i] for i in owned])
        self.exp_avg = kept.clone(prefix="exp_avg", init="zeros")
        self.exp_avg_sq = kept.clone(prefix="exp_avg_sq", init="zeros")
        # One entry per parameter for the HyperMap; a parameter whose moments another rank keeps stands in for them
        # (its `owned` flag is False, so the update never reads them).
        self.owned = tuple(slot >= 0 for slot in slots)
        self.exp_avg_slots = ParameterTuple([self.exp_avg[slot] if slot >= 0 else p
                                             for slot, p in zip(slots, self.params)])
        self.exp_avg_sq_slots = ParameterTuple([self.exp_avg_sq[slot] if slot >= 0 else p
                                                for slot, p in zip(slots, self.params)])
        self.hyper_map = ops.HyperMap()
        self.sync_runs = tuple(parameter_runs(len(self.params))) if self.sharded else ()
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
                                 self.params, self.exp_avg_slots, self.exp_avg_sq_slots, grads, self.decay_flags,
                                 self.owned)
        previous = ops.depend(step_size, updated)
        for start, stop in self.sync_runs:  # ZeRO-1 only
            previous = self._sync(updated, start, stop, previous)
        return ops.depend(step_size, previous)

    def _sync(self, updated, start, stop, previous):
        """ZeRO-1's weight sync of parameters ``start..stop-1``: an AllReduce-SUM per parameter over the data-parallel
        group of its updated value (owners add their new weights, the others zeros), each waiting for the previous
        one (the ranks' graphs differ, as each updates its own parameters, and collectives must be issued in the
        same order everywhere)."""
        for i in range(start, stop):
            previous = ops.assign(self.params[i], self.all_reduce(ops.depend(updated[i], previous)))
        return previous

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
        """(state key, moment Parameter) for the moments this rank keeps."""
        for moment, params in zip(MOMENTS, (self.exp_avg, self.exp_avg_sq)):
            for name, param in zip(self.owned_names, params):
                yield f"{moment}.{name}", param

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


def clip_to_norm(grads, norm: Tensor, max_norm: float):
    """Scale gradients whose global norm is ``norm`` so it is at most max_norm (0 disables)."""
    if max_norm <= 0:
        return grads
    scale = ops.minimum(Tensor(1.0, ms.float32), max_norm / (norm + 1e-6))
    return _hyper_map(ops.partial(_scaled, scale), grads)


def clip_by_global_norm(grads, max_norm: float):
    """Scale gradients so their global norm is at most max_norm (0 disables); returns (grads, norm before)."""
    norm = global_norm(grads)
    return clip_to_norm(grads, norm, max_norm), norm
