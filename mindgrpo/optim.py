"""AdamW with torch semantics, global-norm clipping, and the learning-rate schedules.

MindSpore's ``nn.AdamWeightDecay`` has no bias correction and ``mint.optim.AdamW`` has no CPU kernel, so the
update is written here with plain ops (it compiles into the GRAPH-mode train step on CPU and Ascend alike). The
learning rate and the bias corrections are passed in as tensors each step, so changing them never recompiles,
and the moments are named Parameters, so checkpoints save and restore them by name.
"""
from __future__ import annotations

import math
from typing import Dict, Sequence, Tuple

import numpy as np

import mindspore as ms
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops

from mindgrpo.config import LRScheduleConfig, OptimizerConfig


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


class AdamW(nn.Cell):
    """AdamW as ``torch.optim.AdamW``: decoupled decay ``p -= lr*wd*p``, bias-corrected moments."""

    def __init__(self, params: Sequence[Parameter], config: OptimizerConfig):
        super().__init__(auto_prefix=False)
        self.params = ParameterTuple(params)
        self.exp_avg = self.params.clone(prefix="exp_avg", init="zeros")
        self.exp_avg_sq = self.params.clone(prefix="exp_avg_sq", init="zeros")
        self.beta1, self.beta2, self.eps = config.beta1, config.beta2, config.eps
        self.weight_decay = config.weight_decay
        self.decay_flags = tuple(_decays(p) for p in self.params)
        self.step_count = 0  # host-side: the bias corrections are computed here and passed in

    def construct(self, grads, lr, bias_correction1, bias_correction2):
        for i in range(len(self.params)):
            param, m, v, g = self.params[i], self.exp_avg[i], self.exp_avg_sq[i], grads[i]
            if self.decay_flags[i] and self.weight_decay > 0:
                ops.assign(param, param * (1.0 - lr * self.weight_decay))
            ops.assign(m, m * self.beta1 + g * (1.0 - self.beta1))
            ops.assign(v, v * self.beta2 + ops.square(g) * (1.0 - self.beta2))
            denom = ops.sqrt(v) / ops.sqrt(bias_correction2) + self.eps
            ops.assign(param, param - (lr / bias_correction1) * m / denom)
        return lr

    def hyper_tensors(self, lr: float) -> Tuple[Tensor, Tensor, Tensor]:
        """Advance the step count and return (lr, 1 - beta1^t, 1 - beta2^t) as float32 tensors."""
        self.step_count += 1
        t = self.step_count
        return (Tensor(lr, ms.float32), Tensor(1.0 - self.beta1 ** t, ms.float32),
                Tensor(1.0 - self.beta2 ** t, ms.float32))

    def state_arrays(self) -> Dict[str, np.ndarray]:
        """Moments by parameter name plus the step count, for checkpoints."""
        state = {p.name: p.asnumpy() for p in (*self.exp_avg, *self.exp_avg_sq)}
        state["step_count"] = np.array(self.step_count, dtype=np.int64)
        return state

    def load_state_arrays(self, state: Dict[str, np.ndarray]) -> None:
        names = {p.name for p in (*self.exp_avg, *self.exp_avg_sq)}
        missing = sorted(names - set(state))
        if missing:
            raise ValueError(f"optimizer state is missing {len(missing)} moment(s), e.g. {missing[:3]}: the "
                             "checkpoint was written for a different model")
        for p in (*self.exp_avg, *self.exp_avg_sq):
            if tuple(state[p.name].shape) != tuple(p.shape):
                raise ValueError(f"optimizer state {p.name} has shape {state[p.name].shape}, expected {p.shape}")
            p.set_data(Tensor(state[p.name], p.dtype))
        self.step_count = int(state["step_count"])


def global_norm(grads) -> Tensor:
    """L2 norm over all gradients (float32)."""
    return ops.sqrt(ops.addn([ops.reduce_sum(ops.square(g.astype(ms.float32))) for g in grads]))


def clip_by_global_norm(grads, max_norm: float):
    """Scale gradients so their global norm is at most max_norm (0 disables); returns (grads, norm before)."""
    norm = global_norm(grads)
    if max_norm <= 0:
        return grads, norm
    scale = ops.minimum(Tensor(1.0, ms.float32), max_norm / (norm + 1e-6))
    return tuple(g * scale.astype(g.dtype) for g in grads), norm
