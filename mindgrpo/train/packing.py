"""Packed micro-batches: the reference, old-log-prob and training forwards without the completions' padding.

Rollouts are right-padded to the generation limit W (``sampling_config.max_tokens``). With the lengths users
sample (most completions stop early, a tail runs to the limit) most of a padded batch is padding, and nearly every
group holds one long completion, so padding each group to its own longest saves little. Packing (verl's
``use_remove_padding`` with ``ppo_max_token_len_per_gpu``) puts the completions of a group end to end into rows
of W tokens, first-fit decreasing (a completion at the limit fills a row alone; short ones share one), and every
forward takes R = ``actor_config.max_tokens_per_micro_batch // W`` of those rows. All forwards of a run then have
one shape per prompt width (GRAPH mode compiles each once, in ``precompile``) and their number follows the tokens
generated, not batch x limit.

A row holds completions of one group only, so it attends to one prompt: a forward computes the distinct prompts of
its rows once each, in S = min(R, B) slots (B: the rank's prompts; a row's group is its slot), and each completion
attends to its slot's prompt and causally to its own tokens, at the positions it has unpacked
(:class:`~mindgrpo.models.PackedPromptForward`): its log-probs are those of the padded forward. The loss is
computed per completion on ``[C, W]`` (C = min(N, R x num_generations), the most completions R rows of single
groups hold):
``unpack`` gathers each completion's log-probs out of the rows, and ``completions`` says which of the rank's N
completions each loss row is, so advantages and old and reference log-probs follow them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, List

import numpy as np

from mindgrpo.train.rollout_batch import RolloutBatch


@dataclass(frozen=True)
class MicroBatch:
    """One packed forward (R rows of W tokens, S prompt slots) and its C completions' loss rows."""
    prompts: np.ndarray         # int [S]: the rank's prompt (row of prompt_ids) in each slot; spare slots repeat one
    row_prompt: np.ndarray      # int32 [R]: the prompt slot of each row
    completion_ids: np.ndarray  # int32 [R, W]: completions end to end, then zeros
    positions: np.ndarray       # int32 [R, W]: each token's position: its prompt's completion start + t
    segments: np.ndarray        # int32 [R, W]: 1 + the completion's place in its row; 0 on the row's unused tail
    source: np.ndarray          # int32 [R * W]: the hidden state predicting each token, an index into [prompt
    #                             states S * P | row states R * W]: the prompt's last for a completion's first token
    completions: np.ndarray     # int [C]: the rank's completion in each loss row (unused rows: 0, masked)
    unpack: np.ndarray          # int32 [C, W]: the row slot (r * W + column) of each completion token
    mask: np.ndarray            # int32 [C, W]: 1 on the tokens of this forward's completions


def completion_lengths(completion_mask: np.ndarray) -> np.ndarray:
    """Tokens of each completion; packing needs right padding (a completion is the prefix its mask marks)."""
    lengths = completion_mask.sum(1).astype(np.int64)
    if not np.array_equal(completion_mask > 0, np.arange(completion_mask.shape[1]) < lengths[:, None]):
        raise ValueError("packing needs right-padded completions: each completion_mask row must be ones, then zeros")
    return lengths


def pack_rows(lengths: np.ndarray, num_generations: int, width: int) -> List[List[int]]:
    """Completion indices per row: each group's completions (the ``num_generations`` of one prompt) first-fit
    decreasing into rows of ``width`` tokens, group after group (the order is a stable sort, so every
    tensor-parallel rank packs identically). Completions without tokens have nothing to score and are left out."""
    rows: List[List[int]] = []
    for start in range(0, len(lengths), num_generations):
        longest_first = start + np.argsort(-lengths[start:start + num_generations], kind="stable")
        free: List[int] = []
        first = len(rows)
        for c in longest_first:
            if lengths[c] == 0:
                continue
            row = next((k for k, room in enumerate(free) if room >= lengths[c]), len(free))
            if row == len(free):
                free.append(width)
                rows.append([])
            rows[first + row].append(int(c))
            free[row] -= int(lengths[c])
    return rows


def micro_batches(rollouts: RolloutBatch, rows_per_batch: int, num_generations: int) -> Iterator[MicroBatch]:
    """The packed forwards of a step's rollouts (``prompt_ids``/``prompt_mask`` [B, P], ``completion_ids``/
    ``completion_mask`` [N, W], prompt-major with ``num_generations`` completions per prompt), made one at a
    time."""
    num_completions, width = rollouts.completion_ids.shape
    p = rollouts.prompt_ids.shape[1]
    lengths = completion_lengths(rollouts.completion_mask)
    starts = rollouts.completion_starts  # per prompt: its real length (text) or last M-RoPE position + 1
    rows = pack_rows(lengths, num_generations, width)
    r = rows_per_batch
    slots = min(r, len(rollouts.prompt_ids))
    loss_rows = min(num_completions, r * num_generations)
    for first in range(0, max(len(rows), 1), r):
        batch = rows[first:first + r]
        used = sorted({row[0] // num_generations for row in batch}) or [0]  # the prompts of these rows
        slot_of = {prompt: s for s, prompt in enumerate(used)}
        prompts = np.array(used + [used[0]] * (slots - len(used)))
        row_prompt = np.zeros(r, np.int32)
        ids = np.zeros((r, width), np.int32)
        positions = np.zeros((r, width), np.int32)
        segments = np.zeros((r, width), np.int32)
        source = np.zeros(r * width, np.int32)
        completions = np.zeros(loss_rows, np.int64)
        unpack = np.zeros((loss_rows, width), np.int32)
        mask = np.zeros((loss_rows, width), np.int32)
        k = 0
        for i, row in enumerate(batch):
            slot = slot_of[row[0] // num_generations]
            row_prompt[i] = slot
            offset = 0
            for segment, c in enumerate(row, start=1):
                length = int(lengths[c])
                cols = slice(offset, offset + length)
                ids[i, cols] = rollouts.completion_ids[c, :length]
                positions[i, cols] = starts[c // num_generations] + np.arange(length)
                segments[i, cols] = segment
                flat = i * width + offset + np.arange(length)
                # token t is predicted by the state of token t - 1, the first by its prompt's last token
                source[flat] = slots * p + flat - 1
                source[flat[0]] = slot * p + p - 1
                completions[k] = c
                unpack[k, :length] = flat
                mask[k, :length] = 1
                k += 1
                offset += length
        yield MicroBatch(prompts, row_prompt, ids, positions, segments, source, completions, unpack, mask)
