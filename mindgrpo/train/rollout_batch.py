"""``RolloutBatch``: one step's prompts and sampled completions on one rank, as the training graphs take them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import numpy as np

if TYPE_CHECKING:
    from mindgrpo.train.prompt_images import VisionBatch


@dataclass
class RolloutBatch:
    """One step's batch on this rank, prompt-major: completion i belongs to prompt i // num_generations."""
    prompt_ids: np.ndarray       # int32 [B, P]: each prompt once, left-padded to a bucket P
    prompt_mask: np.ndarray      # int32 [B, P]: 1 on real prompt tokens
    completion_ids: np.ndarray   # int32 [N, T]: right-padded, N = B x num_generations
    completion_mask: np.ndarray  # int32 [N, T]
    truncated: Optional[np.ndarray] = None  # bool [N]: reached max_tokens without EOS; None: none did
    mask_truncated: bool = False  # rl_config.mask_truncated_completions: truncated completions are not in the loss
    vision: Optional["VisionBatch"] = None  # Qwen2.5-VL prompts: M-RoPE positions and image features; None: text

    def __post_init__(self) -> None:
        self.truncated = np.zeros(len(self.completion_ids), bool) if self.truncated is None else \
            np.asarray(self.truncated, bool)

    @property
    def loss_mask(self) -> np.ndarray:
        """int32 [N, T]: the tokens the loss sees. ``completion_mask``, with the rows of truncated completions
        zeroed under ``mask_truncated`` (TRL's ``mask_truncated_completions``). The forwards still read the
        completions in full; only the loss, its token count and its metrics leave them out."""
        if not self.mask_truncated:
            return self.completion_mask
        return self.completion_mask * ~self.truncated[:, None]

    @property
    def prompt_lengths(self) -> np.ndarray:
        """int32 [N]: real prompt tokens of each completion's prompt."""
        per_prompt = self.prompt_mask.sum(1).astype(np.int32)
        return np.repeat(per_prompt, len(self.completion_ids) // len(self.prompt_ids))

    @property
    def completion_starts(self) -> np.ndarray:
        """int [B]: the position of each prompt's first completion token: its real length for text, its last
        M-RoPE position + 1 for a Qwen2.5-VL prompt (an image advances positions by less than its tokens)."""
        if self.vision is not None:
            return self.vision.completion_starts(self.prompt_ids.shape[1])
        return self.prompt_mask.sum(1).astype(np.int64)
