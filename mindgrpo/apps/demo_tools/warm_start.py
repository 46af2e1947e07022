"""The tool demo's supervised warm start: the model sees both answer formats before GRPO does.

Half the rows are prompts offering the calculator, answered by a call, the tool's response and `#### N`
(:func:`~mindgrpo.apps.demo_tools.task.transcript`, the response out of the loss as in GRPO); half are prompts
without tools, answered directly (`347 * 82 = 28454\\n#### 28454`). One model, so the runs with and without the
tool start from the same weights and differ only in the prompts and the rollout. It stops once the tool rows'
model tokens are all the model's top choice in TARGET_MATCH of them over the last batches (teacher-forced: the
call copies the question's numbers, the answer the response's), leaving GRPO room to improve.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Dict, Sequence, Tuple

import numpy as np

from mindgrpo.apps.demo.warm_start import BATCH_SIZE, fit_until_match
from mindgrpo.apps.demo_tools.task import direct, transcript

TARGET_MATCH = 0.30


def _pack(tok, prompts: Sequence[str], completions, length: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Right-padded ids, attention and loss mask [N, length] of prompts followed by (ids, model mask) completions."""
    ids = np.full((len(prompts), length), tok.pad_token_id, np.int32)
    attention = np.zeros_like(ids)
    mask = np.zeros(ids.shape, np.float32)
    for r, (prompt, (completion, model)) in enumerate(zip(prompts, completions)):
        prompt_ids = tok.encode(prompt)
        end = len(prompt_ids) + len(completion)
        if end > length:
            raise ValueError(f"warm-start row {r} is {end} tokens, more than the buffer's {length}: the demo's task "
                             "changed without updating its buffer lengths")
        ids[r, :end] = prompt_ids + completion
        attention[r, :end] = 1
        mask[r, len(prompt_ids):end] = model
    return ids, attention, mask


def encode(tok, system: str, prompts: Sequence[str], rows: Sequence[dict], lengths: Tuple[int, int]
           ) -> Tuple[Tuple[np.ndarray, ...], Tuple[np.ndarray, ...]]:
    """The two halves of the warm start: each row's prompt (its user turn, `prompts`) with the system turn listing
    the calculator (`system`) before it and its transcript after, and without them with its direct answer.

    The tool rows all begin with the system turn (199 tokens against at most 81 of their own), so it is computed
    once per batch (the shared-prompt forward, as GRPO scores a group): the system turn's ids ``[1, P]``, then the
    rows' user turns and transcripts, right-padded to ``[N, lengths[0]]``, with their loss mask. Each tool row is
    exactly the tokens of its whole prompt (checked). The rows without tools are (ids, attention, loss mask)
    ``[N, lengths[1]]``."""
    prefix = tok.encode(system)
    for r, prompt in enumerate(prompts):
        if tok.encode(system + prompt) != prefix + tok.encode(prompt):
            raise ValueError(f"warm-start row {r}: its system turn and user turn tokenise differently apart than "
                             "together")
    ids, _, mask = _pack(tok, prompts, [transcript(tok, row) for row in rows], lengths[0])
    return ((np.array([prefix], np.int32), ids, mask),
            _pack(tok, prompts, [direct(tok, row) for row in rows], lengths[1]))


def warm_start(init_dir: Path, out_dir: Path, arrays, *, max_steps: int, seed: int) -> Dict[str, object]:
    """Fine-tune the model in `init_dir` on `arrays` (from :func:`encode`), export it to `out_dir`; returns the
    steps, time and the tool rows' final teacher-forced exact match."""
    import mindspore as ms
    from mindspore import Tensor, ops

    from mindgrpo.models import build_model, export_hf, read_hf_config

    start_time = time.perf_counter()
    (system_ids, *tool_rows), plain_rows = arrays
    half = BATCH_SIZE // 2  # rows of each format per step; a row's two formats are drawn apart
    model = build_model(init_dir, role="actor")
    tool_forward = model.shared_prompt(half, system_ids.shape[1] + tool_rows[0].shape[1])
    plain_forward = model.full_sequence(plain_rows[0].shape[1])

    def token_terms(logits, targets, weights):
        """(summed log-likelihood of the model tokens, rows whose every model token is the top choice), from the
        logits that predict `targets`."""
        logp = ops.gather_elements(ops.log_softmax(logits, -1), 2, targets.expand_dims(-1)).squeeze(-1)
        misses = (ops.cast(ops.not_equal(logits.argmax(-1), targets), ms.float32) * weights).sum(-1)
        return (logp * weights).sum(), ops.cast(misses == 0, ms.float32).sum()

    system, system_mask = Tensor(system_ids), Tensor(np.ones_like(system_ids))

    def loss_fn(tool_ids, tool_mask, plain_ids, plain_attention, plain_mask):
        tool_logp, exact_tool_rows = token_terms(tool_forward(system, system_mask, tool_ids), tool_ids, tool_mask)
        plain_logits = plain_forward(plain_ids, plain_attention)[:, :-1]
        plain_logp, _ = token_terms(plain_logits, plain_ids[:, 1:], plain_mask[:, 1:])
        return -(tool_logp + plain_logp) / (tool_mask.sum() + plain_mask.sum()), exact_tool_rows

    facts = fit_until_match(
        model, loss_fn, lambda batch: [a[batch[:half]] for a in tool_rows] + [a[batch[half:]] for a in plain_rows],
        rows=len(tool_rows[0]), scored_rows=half, target_match=TARGET_MATCH, max_steps=max_steps, seed=seed)
    export_hf(model, out_dir, hf_config=read_hf_config(init_dir), tokenizer_dir=init_dir)
    return {**facts, "warm_start_seconds": round(time.perf_counter() - start_time, 1)}
