"""One generation: the rollouts a run samples at once, scored, kept or dropped, then cut into its steps' batches.

Two options shape it (both off by default, when a generation is one batch of ``batch_size`` prompts for one step):

* **Dynamic sampling** (DAPO, Yu et al. 2025, section 3.2; verl's ``algorithm.filter_groups``): a group whose
  rewards are all equal has advantage 0 on every completion, so it only dilutes the batch. Such groups are dropped
  and more prompts are generated, round after round, until ``wanted`` groups are kept or
  ``rl_config.max_generation_batches`` rounds have run. Kept groups are taken in round order, the first ``wanted``
  of them, as verl's trainer concatenates its rounds and cuts the batch to size. verl raises when its limit is
  reached (and DAPO's own code aborts: BytedTsinghua-SIA/DAPO#22); here the step trains on what was kept. The
  batch's shapes must not change (GRAPH mode would recompile), so the empty slots are filled with dropped groups
  whose ``in_loss`` is False: they run through the forwards, but their loss mask is 0, so they add no gradient,
  no tokens to the loss's normalisers and nothing to its metrics.
* **steps_per_generation** (TRL's): one generation holds ``batch_size x steps_per_generation`` groups, and
  :meth:`Generation.step` hands them to the next steps ``batch_size`` at a time.

Which groups to keep is decided on the rewards the advantages are computed from (the verifiers' weighted sum plus
the overlong penalty): those are the ones whose equality makes the advantages 0.

What the rollout stage returns is frozen (:class:`Round`, :class:`Generation`): the advantages and the old
policy's log-probs are computed from a generation as new values, never written back into it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from mindgrpo.models.prompt_images import PromptVision
from mindgrpo.rewards.scorer import RewardBatch
from mindgrpo.rollout import FINISH_LENGTH, PromptImages, RolloutResult
from mindgrpo.train.rollout_batch import RolloutBatch


def kept_groups(zero_std: np.ndarray, num_generations: int) -> np.ndarray:
    """bool [groups]: the groups dynamic sampling keeps, those whose rewards are not all equal (``zero_std``:
    :func:`mindgrpo.algorithm.advantages.zero_std_groups`). A group of one completion is kept, as in verl (its
    advantage is 0 either way)."""
    return ~np.asarray(zero_std, bool) | (num_generations == 1)


def select_groups(kept: Sequence[np.ndarray], wanted: int) -> Tuple[List[Tuple[int, int]], np.ndarray]:
    """The ``wanted`` groups of a step from the rounds' kept flags: ``[(round, group)]`` and ``in_loss`` (bool
    [wanted]). Kept groups first, in round order; if there are fewer than ``wanted``, dropped ones (in round order)
    fill the rest with ``in_loss`` False."""
    kept_slots = [(r, g) for r, flags in enumerate(kept) for g in np.flatnonzero(flags)]
    dropped = [(r, g) for r, flags in enumerate(kept) for g in np.flatnonzero(~np.asarray(flags, bool))]
    chosen = (kept_slots + dropped)[:wanted]
    if len(chosen) < wanted:
        raise ValueError(f"{len(chosen)} groups were generated, fewer than the {wanted} a step needs")
    return [(int(r), int(g)) for r, g in chosen], np.arange(wanted) < len(kept_slots)


@dataclass(frozen=True)
class Round:
    """One round of generation on this rank: prompts, their completions, texts and rewards."""
    prompt_ids: List[np.ndarray]  # unpadded, one per prompt
    golds: List[str]
    result: RolloutResult
    completions: List[str]        # decoded, one per completion
    rewards: RewardBatch
    overlong: np.ndarray          # float32 [N]: the overlong penalty already added to the rewards (0 when off)
    zero_std: np.ndarray
    """bool [groups]: the groups whose aggregated rewards are all equal, found once: dynamic sampling drops them
    (:func:`kept_groups`), the first round's are counted in the metrics."""
    images: Optional[List[Optional[PromptImages]]] = None  # Qwen2.5-VL: each prompt's embedded images; None: text
    tool_stats: Dict[str, float] = field(default_factory=dict)  # ToolTurns.take_stats() of this round; {}: no tools


@dataclass(frozen=True)
class Generation:
    """The groups one generation keeps, as whole-generation arrays, and its bookkeeping.

    ``rollouts`` holds ``steps x batch_size`` groups in step order; ``first_round`` is the first round's raw
    output (a plain sample of the policy: the reward metrics describe it, so they mean the same with and without
    dynamic sampling); ``rounds`` is how many rounds were generated on every rank (the same on all)."""
    rollouts: RolloutBatch
    rewards: np.ndarray                  # float32 [N]: what the advantages are computed from
    totals: np.ndarray                   # float32 [N]: the logged reward of each completion
    per_verifier: Dict[str, np.ndarray]  # float32 [N] each: each verifier's score
    failures: Dict[str, int]             # per verifier, over every round: failed calls (timeouts included)
    timeouts: Dict[str, int]             # per verifier, over every round: calls that exceeded the time limit
    completions: List[str]
    golds: List[str]
    prompts: List[np.ndarray]            # unpadded ids of each group's prompt
    first_round: Round
    rounds: int
    steps: int
    images: Optional[List[Optional[PromptImages]]]  # each group's prompt's embedded images (Qwen2.5-VL); None: text
    tool_stats: Dict[str, float]         # over every round: tool calls, failures, ... and seconds ({}: no tools)

    @classmethod
    def assemble(cls, rounds: List[Round], kept: List[np.ndarray], *, wanted: int, steps: int, width: int,
                 num_generations: int, pad_token_id: int, mask_truncated: bool, total_rounds: int,
                 vision: Optional[PromptVision] = None) -> "Generation":
        """Gather the selected groups of ``rounds`` into one batch with prompts left-padded to ``width``; a
        Qwen2.5-VL generation's rollouts carry its prompts' M-RoPE positions and features (``vision``: the
        actor's tower, which embedded the rounds' images)."""
        chosen, in_loss = select_groups(kept, wanted)
        G = num_generations
        prompts = [rounds[r].prompt_ids[g] for r, g in chosen]
        prompt = np.full((wanted, width), pad_token_id, np.int32)
        prompt_mask = np.zeros((wanted, width), np.int32)
        for i, ids in enumerate(prompts):
            prompt[i, width - len(ids):] = ids
            prompt_mask[i, width - len(ids):] = 1
        rows = [(r, g * G + k) for r, g in chosen for k in range(G)]

        def stack(get) -> np.ndarray:
            return np.stack([get(rounds[r])[i] for r, i in rows])

        ids, mask = stack(lambda rd: rd.result.completion_ids), stack(lambda rd: rd.result.completion_mask)
        truncated = np.array([rounds[r].result.finish_reasons[i] == FINISH_LENGTH for r, i in rows], bool)
        with_logp = all(rd.result.logprobs is not None for rd in rounds)
        sampling_logp = stack(lambda rd: rd.result.logprobs).astype(np.float32) * (mask > 0) if with_logp else None
        with_tools = any(rd.result.tool_mask is not None for rd in rounds)
        tool_mask = stack(lambda rd: rd.result.completion_mask - rd.result.model_mask).astype(np.int32) \
            if with_tools else None
        images = None if rounds[0].images is None else [rounds[r].images[g] for r, g in chosen]
        rollouts = RolloutBatch(prompt, prompt_mask, np.where(mask > 0, ids, pad_token_id).astype(np.int32),
                                mask.astype(np.int32), truncated, mask_truncated=mask_truncated,
                                sampling_logp=sampling_logp, in_loss=np.repeat(in_loss, G),
                                vision=None if images is None else vision.batch(prompt, prompt_mask, images),
                                tool_mask=tool_mask)
        names = list(rounds[0].rewards.per_verifier)
        return cls(rollouts, stack(lambda rd: rd.rewards.aggregated).astype(np.float32),
                   stack(lambda rd: rd.rewards.total).astype(np.float32),
                   {name: stack(lambda rd: rd.rewards.per_verifier[name]).astype(np.float32) for name in names},
                   {name: sum(rd.rewards.failures[name] for rd in rounds) for name in names},
                   {name: sum(rd.rewards.timeouts[name] for rd in rounds) for name in names},
                   [rounds[r].completions[i] for r, i in rows], [rounds[r].golds[i // G] for r, i in rows],
                   prompts, rounds[0], total_rounds, steps, images,
                   {key: sum(rd.tool_stats[key] for rd in rounds) for key in rounds[0].tool_stats})

    @property
    def unfilled_groups(self) -> int:
        """Slots filled with dropped groups (out of the loss) because the round limit was reached."""
        G = len(self.rollouts.completion_ids) // len(self.rollouts.prompt_ids)
        return int((~self.rollouts.in_loss).sum()) // G

    def step_slice(self, step: int) -> slice:
        """The completions of the generation's ``step``-th step."""
        per_step = len(self.rollouts.completion_ids) // self.steps
        return slice(step * per_step, (step + 1) * per_step)

    def step(self, step: int) -> RolloutBatch:
        """The rollouts of the generation's ``step``-th step."""
        return self.rollouts.rows(self.step_slice(step))
