"""Group-relative advantages (GRPO): each completion's reward against the other completions of its prompt."""
from __future__ import annotations

import numpy as np
import mindspore as ms
from mindspore import Tensor, ops

from mindgrpo.choices import SCALE_REWARDS

# TRL adds 1e-4 to the std (verl uses 1e-6); it keeps all-equal groups finite and is negligible otherwise.
DEFAULT_STD_EPS = 1e-4


def group_advantages(rewards, num_generations: int, scale_rewards: str = "group",
                     eps: float = DEFAULT_STD_EPS, batch_std: float | None = None) -> tuple[Tensor, Tensor]:
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
    size 1 has no spread, so its advantage is 0.

    Returns:
        ``(advantages [N] float32, zero_std_groups)`` where ``zero_std_groups`` (int32 scalar tensor) counts the
        groups whose rewards are all equal: they give no learning signal, and the trainer logs how many there were.
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
        return ops.zeros_like(rewards), Tensor(num_groups, ms.int32)

    grouped = rewards.reshape(num_groups, num_generations)
    centered = grouped - grouped.mean(axis=1, keep_dims=True)
    all_equal = ops.equal(grouped.max(axis=1), grouped.min(axis=1))
    zero_std_groups = all_equal.astype(ms.int32).sum()
    if scale_rewards == "none":
        return centered.reshape(-1), zero_std_groups
    if scale_rewards == "group":
        std = ops.sqrt((centered * centered).sum(axis=1, keepdims=True) / (num_generations - 1))
    elif batch_std is not None:
        std = Tensor(batch_std, ms.float32)
    else:
        batch_centered = rewards - rewards.mean()
        std = ops.sqrt((batch_centered * batch_centered).sum() / (rewards.shape[0] - 1))
    return (centered / (std + eps)).reshape(-1), zero_std_groups


def global_batch_std(rewards: np.ndarray, all_reduce_sum) -> float:
    """The unbiased std of the rewards of every data-parallel rank (TRL's ``scale_rewards="batch"`` gathers the
    global batch): two sums over the ranks, the mean first, so the squares are of centred values.
    ``all_reduce_sum(values)`` sums a small array over the data-parallel ranks."""
    rewards = np.asarray(rewards, np.float64)
    count, total = all_reduce_sum(np.array([len(rewards), rewards.sum()]))
    squares = all_reduce_sum(np.array([((rewards - total / count) ** 2).sum()]))[0]
    return float(np.sqrt(squares / max(count - 1, 1)))
