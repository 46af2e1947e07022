"""``RolloutBatch``: one step's prompts and sampled completions on one rank, as the training graphs take them."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class RolloutBatch:
    """One step's batch on this rank, prompt-major: completion i belongs to prompt i // num_generations."""
    prompt_ids: np.ndarray       # int32 [B, P]: each prompt once, left-padded to a bucket P
    prompt_mask: np.ndarray      # int32 [B, P]: 1 on real prompt tokens
    completion_ids: np.ndarray   # int32 [N, T]: right-padded, N = B x num_generations
    completion_mask: np.ndarray  # int32 [N, T]

    @property
    def prompt_lengths(self) -> np.ndarray:
        """int32 [N]: real prompt tokens of each completion's prompt."""
        per_prompt = self.prompt_mask.sum(1).astype(np.int32)
        return np.repeat(per_prompt, len(self.completion_ids) // len(self.prompt_ids))
