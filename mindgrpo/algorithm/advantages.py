"""Group-relative advantages (GRPO): each completion's reward against the other completions of its prompt.

:func:`group_advantages` is the math (MindSpore ops, in or out of a graph); :func:`generation_advantages` is what a
run computes from a generation's rewards, on the host, once: a new array the update reads, never written back into
the generation. :func:`zero_std_groups` names the groups that give no learning signal (dynamic sampling drops them,
the metrics count them).
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import mindspore as ms
from mindspore import Tensor, ops

from mindgrpo.choices import SCALE_REWARDS

# TRL adds 1e-4 to the std (verl uses 1e-6); it keeps all-equal groups finite and is negligible otherwise.
DEFAULT_STD_EPS = 1e-4


def zero_std_groups(rewards: np.ndarray, num_generations: int) -> np.ndarray:
    """bool [groups]: the groups whose rewards are all equal (advantage 0 on every completion)."""
    grouped = np.asarray(rewards).reshape(-1, num_generations)
    return grouped.max(1) == grouped.min(1)


def group_advantages(rewards, num_generations: int, scale_rewards: str = "group",
                     eps: float = DEFAULT_STD_EPS, batch_std: float | None = None) -> Tensor:
    """Advantages ``(r - mean_group) / (std + eps)`` for rewards laid out as consecutive groups.

    Args:
        rewards: [N] rewards (MindSpore tensor or numpy array), ``N = num_prompts * num_generations``, completions
            of one prompt next to each other (the order the rollout produces).
        num_generations: completions per prompt (the group size).
        scale_rewards: ``"group"`` divides by each group's std (GRPO, TRL default); ``"batch"`` by the std of all N
            rewards (more robust when many groups are nearly constant, as in TRL / "Tricks or Traps"); ``"none"``
            does not divide (Dr. GRPO: the std division biases towards too easy / too hard prompts).
        eps: added to the std before dividing.
        batch_std: for ``"batch"``, the std of the whole global batch when its rewards are spread over
            data-parallel ranks (:func:`global_batch_std`); None: the std of these N rewards.

    The std is the **unbiased** one (divides by n - 1), as TRL and verl compute it with ``torch.std``; a group of
    size 1 has no spread, so its advantage is 0. Returns the advantages, float32 [N].
    """
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards must be one of {SCALE_REWARDS}, got {scale_rewards!r}")
    if num_generations < 1:
        raise ValueError(f"num_generations must be >= 1, got {num_generations}")
    if isinstance(rewards, np.ndarray):
        rewards = Tensor(rewards.astype(np.float32))
    rewards = rewards.astype(ms.float32)
    if rewards.ndim != 1 or rewards.shape[0] % num_generations != 0:
        raise ValueError(f"rewards must be 1-D with a length divisible by num_generations={num_generations}, "
                         f"got shape {tuple(rewards.shape)}")
    num_groups = rewards.shape[0] // num_generations
    if num_generations == 1:
        return ops.zeros_like(rewards)

    grouped = rewards.reshape(num_groups, num_generations)
    centered = grouped - grouped.mean(axis=1, keep_dims=True)
    if scale_rewards == "none":
        return centered.reshape(-1)
    if scale_rewards == "group":
        std = ops.sqrt((centered * centered).sum(axis=1, keepdims=True) / (num_generations - 1))
    elif batch_std is not None:
        std = Tensor(batch_std, ms.float32)
    else:
        batch_centered = rewards - rewards.mean()
        std = ops.sqrt((batch_centered * batch_centered).sum() / (rewards.shape[0] - 1))
    return (centered / (std + eps)).reshape(-1)


def generation_advantages(rewards: np.ndarray, num_generations: int, scale_rewards: str,
                          all_reduce_sum: Optional[Callable[[np.ndarray], np.ndarray]] = None) -> np.ndarray:
    """float32 [N]: the advantages of a generation's rewards on this rank (:func:`group_advantages`).
    ``all_reduce_sum`` (sums a small array over the data-parallel ranks; None: one rank) makes ``"batch"``
    scaling divide by the std of the global batch, whose rewards the ranks share out (:func:`global_batch_std`)."""
    batch_std = (global_batch_std(rewards, all_reduce_sum)
                 if scale_rewards == "batch" and all_reduce_sum is not None else None)
    return group_advantages(rewards, num_generations, scale_rewards=scale_rewards, batch_std=batch_std).asnumpy()


def global_batch_std(rewards: np.ndarray, all_reduce_sum) -> float:
    """The unbiased std of the rewards of every data-parallel rank (TRL's ``scale_rewards="batch"`` gathers the
    global batch): two sums over the ranks, the mean first, so the squares are of centred values.
    ``all_reduce_sum(values)`` sums a small array over the data-parallel ranks."""
    rewards = np.asarray(rewards, np.float64)
    count, total = all_reduce_sum(np.array([len(rewards), rewards.sum()]))
    squares = all_reduce_sum(np.array([((rewards - total / count) ** 2).sum()]))[0]
    return float(np.sqrt(squares / max(count - 1, 1)))
