"""DAPO's soft overlong punishment: a reward penalty that rises linearly over the last tokens before ``max_tokens``.

DAPO (Yu et al. 2025, section 3.4) and verl (``verl/workers/reward_manager/dapo.py``, ``overlong_buffer``), with
L = ``max_tokens``, B = ``rl_config.overlong_buffer_length``, f = ``rl_config.overlong_penalty_factor`` and n the
completion's length:

    expected_len = L - B
    exceed_len   = n - expected_len
    penalty      = min(-exceed_len / B * f, 0)         # 0 up to L - B tokens, -f at L

added to the reward before the group advantages, so an over-long answer is worth less than a concise one without
the cliff of a hard truncation penalty. n is verl's ``valid_response_length``: the response's attention-mask sum,
which counts the EOS token that ended it (verl's ``get_response_mask`` keeps the first EOS), the same as the
rollout's ``completion_mask`` row sum here.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mindgrpo.rewards.scorer import RewardBatch


@dataclass(frozen=True)
class OverlongPenalty:
    """The penalty of ``rl_config.overlong_buffer_length`` / ``overlong_penalty_factor`` at ``max_tokens``."""

    max_tokens: int
    buffer_length: int = 0  # 0: off, every penalty is 0
    penalty_factor: float = 1.0

    def __call__(self, lengths: np.ndarray) -> np.ndarray:
        """float32 [N]: each completion's penalty (<= 0) from its length in tokens, EOS included."""
        lengths = np.asarray(lengths, np.float64)
        if self.buffer_length <= 0:
            return np.zeros(lengths.shape, np.float32)
        exceed = lengths - (self.max_tokens - self.buffer_length)
        return np.minimum(-exceed / self.buffer_length * self.penalty_factor, 0.0).astype(np.float32)

    def add_to(self, rewards: RewardBatch, lengths: np.ndarray) -> np.ndarray:
        """Add the penalty to the rewards the advantages use and to the logged total (verl's reward is score +
        penalty); the verifiers' own scores are left as they were. Returns the penalty, float32 [N]."""
        penalty = self(lengths)
        if self.buffer_length > 0:
            rewards.total = (rewards.total + penalty).astype(np.float32)
            rewards.aggregated = (rewards.aggregated + penalty).astype(np.float32)
        return penalty
