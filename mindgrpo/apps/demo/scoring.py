"""The demo model on one fixed buffer: gsm8k_hash prompts right-padded to [N, SEQ_LENGTH], logits only in a window
after each prompt, and greedy or sampled answers scored by `accuracy_reward`.

The warm start trains on this buffer and measures its accuracy here: a plain loop of full forwards (no KV cache:
the model is tiny, and one compiled graph serves every step), independent of the rollout engine and of
`mindgrpo.apps.evaluation`, which tests/test_evaluation.py checks against it.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

SEQ_LENGTH = 64  # longest gsm8k_hash prompt (48 tokens) + MAX_NEW_TOKENS, checked by encode
MAX_NEW_TOKENS = 14  # the longest answer ("9 + 9 = 18\n#### 18") is 13 tokens + <|im_end|>
_WINDOW = 16  # positions scored per row from the last prompt token: covers every answer + <|im_end|>


def encode(tok, rows: Sequence[dict], with_answers: bool) -> Tuple[np.ndarray, ...]:
    """Right-padded int32 ids and attention mask [N, SEQ_LENGTH], float32 answer-token mask [N, SEQ_LENGTH], and
    the int32 start of each row's scored window (the last prompt position) [N]."""
    from mindgrpo.data import render_prompt

    ids = np.full((len(rows), SEQ_LENGTH), tok.pad_token_id, np.int32)
    attention = np.zeros_like(ids)
    answer_mask = np.zeros(ids.shape, np.float32)
    first = np.zeros(len(rows), np.int32)
    for i, row in enumerate(rows):
        prompt = tok.encode(render_prompt("gsm8k_hash", row["question"]))
        answer = tok.encode(row["answer"]) + [tok.eos_token_id] if with_answers else []
        if len(prompt) + max(len(answer), MAX_NEW_TOKENS) > SEQ_LENGTH:
            raise ValueError(f"demo row {i} is {len(prompt)} + {len(answer)} tokens, more than SEQ_LENGTH "
                             f"{SEQ_LENGTH} allows; the demo task changed without updating SEQ_LENGTH")
        ids[i, :len(prompt) + len(answer)] = prompt + answer
        attention[i, :len(prompt) + len(answer)] = 1
        answer_mask[i, len(prompt):len(prompt) + len(answer)] = 1.0
        first[i] = len(prompt) - 1
    return ids, attention, answer_mask, first


def window_functions(model):
    """Graph-mode helpers for `model`: `window(first)`, the [B, _WINDOW] positions from each row's `first` on
    (shifted left where they would run past the buffer), and `window_logits(ids, attention, first)`, the float32
    logits [B, _WINDOW, V] there."""
    from mindspore import ops

    offsets = ops.arange(_WINDOW).reshape(1, -1)
    forward = model.full_sequence(SEQ_LENGTH)

    def window(first):
        return ops.minimum(first, SEQ_LENGTH - 1 - _WINDOW).reshape(-1, 1) + offsets

    def window_logits(ids, attention, first):
        logits = forward(ids, attention)
        where = ops.broadcast_to(window(first).expand_dims(-1), (-1, -1, logits.shape[-1]))
        return ops.gather_elements(logits, 1, where)

    return window, window_logits


def answer_accuracy(model, tok, rows: Sequence[dict], decodings: Sequence[Optional[int]] = (None,)) -> List[float]:
    """Per decoding, the fraction of `rows` whose completion of the gsm8k_hash prompt earns `accuracy_reward` 1.
    A decoding is None for greedy, or an int seed for sampling at temperature 1."""
    scorer = Scorer(model, tok)
    return [scorer.accuracy(rows, seed) for seed in decodings]


class Scorer:
    """Greedy or sampled generation by a plain loop of full forwards on a fixed [N, SEQ_LENGTH] right-padded
    buffer (no KV cache: the model is tiny, and one compiled graph serves every step)."""

    def __init__(self, model, tok):
        import mindspore as ms

        self.window_logits, self.tok = ms.jit(window_functions(model)[1]), tok

    def completions(self, rows: Sequence[dict], seed: Optional[int] = None) -> List[str]:
        """Completions of the gsm8k_hash prompts, up to MAX_NEW_TOKENS, stopping at the tokenizer's stop tokens."""
        from mindspore import Tensor

        rng = None if seed is None else np.random.default_rng(seed)
        ids, attention, _, first = encode(self.tok, rows, with_answers=False)
        lengths = first.astype(np.int64) + 1
        live = np.ones(len(rows), bool)
        completions: List[List[int]] = [[] for _ in rows]
        stops = set(self.tok.stop_token_ids)
        for _ in range(MAX_NEW_TOKENS):
            window = self.window_logits(Tensor(ids), Tensor(attention), Tensor((lengths - 1).astype(np.int32)))
            shift = lengths - 1 - np.minimum(lengths - 1, SEQ_LENGTH - 1 - _WINDOW)  # where the last token sits
            logits = window.asnumpy()[np.arange(len(rows)), shift].astype(np.float64)
            if rng is None:
                tokens = logits.argmax(-1)
            else:  # inverse-CDF sampling at temperature 1: one uniform draw per row
                probs = np.exp(logits - logits.max(-1, keepdims=True))
                cumulative = np.cumsum(probs / probs.sum(-1, keepdims=True), -1)
                tokens = (cumulative < rng.random((len(rows), 1))).sum(-1).clip(max=logits.shape[-1] - 1)
            for i in np.flatnonzero(live):
                if int(tokens[i]) in stops:
                    live[i] = False
                else:
                    completions[i].append(int(tokens[i]))
                    ids[i, lengths[i]], attention[i, lengths[i]] = tokens[i], 1
                    lengths[i] += 1
            if not live.any():
                break
        return self.tok.batch_decode(completions)

    def accuracy(self, rows: Sequence[dict], seed: Optional[int] = None) -> float:
        """Mean `accuracy_reward` of `completions(rows, seed)` against the rows' `#### N` answers."""
        from mindgrpo.rewards.verifiers import accuracy_reward

        golds = [row["answer"].rsplit("####", 1)[1].strip() for row in rows]
        return float(np.mean([accuracy_reward(text, gold) for text, gold in zip(self.completions(rows, seed), golds)]))
