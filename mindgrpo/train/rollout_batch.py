"""``RolloutBatch``: one step's prompts and sampled completions on one rank, as the training graphs take them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from mindgrpo.models.prompt_images import VisionBatch


@dataclass(frozen=True)
class RolloutBatch:
    """One step's batch on this rank, prompt-major: completion i belongs to prompt i // num_generations. A value: a
    changed batch is a new one (``dataclasses.replace``)."""
    prompt_ids: np.ndarray       # int32 [B, P]: each prompt once, left-padded to a bucket P
    prompt_mask: np.ndarray      # int32 [B, P]: 1 on real prompt tokens
    completion_ids: np.ndarray   # int32 [N, T]: right-padded, N = B x num_generations
    completion_mask: np.ndarray  # int32 [N, T]
    truncated: Optional[np.ndarray] = None  # bool [N]: reached max_tokens without EOS; None: none did
    mask_truncated: bool = False  # rl_config.mask_truncated_completions: truncated completions are not in the loss
    sampling_logp: Optional[np.ndarray] = None
    """float32 [N, T]: the rollout engine's log-prob of each sampled token, under the distribution it was sampled
    from (temperature-scaled; see ``mindgrpo.rollout.SamplingParams.logprobs``), 0 on padding. None when the engine
    gives none. Rollout correction and the ``rollout/`` gap metrics compare the training forward's log-probs to it."""
    in_loss: Optional[np.ndarray] = None
    """bool [N]: False on the rows of groups that only fill a dynamic-sampling batch to its static size (see
    mindgrpo.train.generation); None: all rows are in the loss."""
    vision: Optional[VisionBatch] = None  # Qwen2.5-VL prompts: M-RoPE positions and image features; None: text
    tool_mask: Optional[np.ndarray] = None
    """int32 [N, T]: 1 on the tool responses a multi-turn rollout appended (the model reads them, it did not sample
    them); None: every completion token is the model's."""

    def __post_init__(self) -> None:  # None: every row, as the arrays they stand for
        object.__setattr__(self, "truncated", np.zeros(len(self.completion_ids), bool) if self.truncated is None
                           else np.asarray(self.truncated, bool))
        object.__setattr__(self, "in_loss", np.ones(len(self.completion_ids), bool) if self.in_loss is None
                           else np.asarray(self.in_loss, bool))

    @property
    def loss_mask(self) -> np.ndarray:
        """int32 [N, T]: the tokens the loss sees. ``completion_mask`` without tool responses (``tool_mask``), with
        the rows of truncated completions zeroed under ``mask_truncated`` (TRL's ``mask_truncated_completions``) and
        those of filler groups (``in_loss`` False). The forwards still read the completions in full; only the loss,
        its token count and its metrics leave them out."""
        keep = self.in_loss & ~(self.truncated & self.mask_truncated)
        model = self.completion_mask if self.tool_mask is None else self.completion_mask * (1 - self.tool_mask)
        return model * keep[:, None].astype(np.int32)

    @property
    def prompt_lengths(self) -> np.ndarray:
        """int32 [N]: real prompt tokens of each completion's prompt."""
        per_prompt = self.prompt_mask.sum(1).astype(np.int32)
        return np.repeat(per_prompt, len(self.completion_ids) // len(self.prompt_ids))

    def rows(self, completions: slice) -> "RolloutBatch":
        """The batch of completions ``completions`` (whole groups, in order) and their prompts."""
        per_prompt = len(self.completion_ids) // len(self.prompt_ids)
        prompts = slice(completions.start // per_prompt, completions.stop // per_prompt)
        return RolloutBatch(self.prompt_ids[prompts], self.prompt_mask[prompts], self.completion_ids[completions],
                            self.completion_mask[completions], self.truncated[completions], self.mask_truncated,
                            None if self.sampling_logp is None else self.sampling_logp[completions],
                            self.in_loss[completions],
                            None if self.vision is None else self.vision.rows(prompts),
                            None if self.tool_mask is None else self.tool_mask[completions])

    @property
    def completion_starts(self) -> np.ndarray:
        """int [B]: the position of each prompt's first completion token: its real length for text, its last
        M-RoPE position + 1 for a Qwen2.5-VL prompt (an image advances positions by less than its tokens)."""
        if self.vision is not None:
            return self.vision.completion_starts(self.prompt_ids.shape[1])
        return self.prompt_mask.sum(1).astype(np.int64)
