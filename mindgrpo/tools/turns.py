"""Tools in a rollout: the :class:`~mindgrpo.rollout.api.TurnHandler` that answers a model turn's tool calls.

The engine hands over each ended turn as the token ids the model sampled. They are decoded only to read the calls
(:func:`~mindgrpo.data.tool_format.parse_calls`); the completion keeps the ids themselves. The calls of all the turns
that ended at one decode step run together in the :class:`~mindgrpo.tools.runner.ToolRunner`'s worker processes,
each result is cut to ``max_response_tokens``, and the answer (:func:`~mindgrpo.data.tool_format.responses_text`) is
tokenised once and handed back: those are the only tokens of a completion that are the tokeniser's rather than the
model's, and the rollout marks them out of the loss.

Under tensor parallelism every rank of a group decodes the same rows and must read the same answers, while a tool
may answer differently each time it runs (time, randomness, a service): the group's first rank runs the tools and
hands its answers to the others (:class:`GroupAnswers`).
"""
from __future__ import annotations

import time
from typing import Dict, List, Optional, Sequence

import numpy as np

from mindgrpo.data.tokenizer import Tokenizer
from mindgrpo.parallel.groups import TP, DistInfo, all_reduce_sum
from mindgrpo.data.tool_format import parse_calls, responses_text
from mindgrpo.tools.runner import ToolRunner

TRUNCATED = "\n[output truncated]"


class GroupAnswers:
    """The answers of a tensor-parallel group's first rank, on every rank of the group (two AllReduces of the
    group: each answer's length, then the tokens; identity for a group of one rank)."""

    def __init__(self, dist: DistInfo):
        self.dist = dist

    @property
    def answering(self) -> bool:
        """Whether this rank runs the tools (the group's first)."""
        return self.dist.index(TP) == 0

    def share(self, answers: List[Optional[List[int]]]) -> List[Optional[List[int]]]:
        if self.dist.size(TP) == 1:
            return answers
        # per answer: 0 for None (the completion ends), else its length + 1; zeros from the other ranks
        sizes = np.array([0 if a is None else len(a) + 1 for a in answers] if self.answering else [0] * len(answers))
        sizes = all_reduce_sum(sizes, self.dist, over=TP).round().astype(np.int64)
        flat = np.array([t for a in answers if a is not None for t in a], np.float64) if self.answering else \
            np.zeros(int(np.maximum(sizes - 1, 0).sum()))
        flat = all_reduce_sum(flat, self.dist, over=TP).round().astype(np.int64)  # ids < 2^24: exact in float32
        shared, at = [], 0
        for size in sizes:
            if size == 0:
                shared.append(None)
                continue
            shared.append(flat[at:at + size - 1].tolist())
            at += size - 1
        return shared


class ToolTurns:
    """Answers tool-calling turns with the tools' results, up to ``max_turns`` tool turns per completion (``dist``:
    under tensor parallelism, the group's first rank runs the tools for all its ranks)."""

    def __init__(self, tokenizer: Tokenizer, runner: ToolRunner, max_turns: int, max_response_tokens: int,
                 dist: Optional[DistInfo] = None):
        self.tokenizer = tokenizer
        self.runner = runner
        self.group = GroupAnswers(dist or DistInfo())
        self.max_turns = int(max_turns)
        self.max_response_tokens = int(max_response_tokens)
        self._stats = self._zero()

    @staticmethod
    def _zero() -> Dict[str, float]:
        return {"calls": 0, "errors": 0, "timeouts": 0, "truncated": 0, "over_turn_limit": 0, "seconds": 0.0}

    def take_stats(self) -> Dict[str, float]:
        """Counts since the last call: tool calls, failed calls (errors, timeouts included), timeouts, results cut
        to ``max_response_tokens``, turns that called a tool past ``max_turns`` (the completion ended there) and
        seconds spent running tools."""
        stats, self._stats = self._stats, self._zero()
        return stats

    def respond(self, turns: Sequence[Sequence[int]], turn_numbers: Sequence[int]) -> List[Optional[List[int]]]:
        answers = self._answer(turns, turn_numbers) if self.group.answering else [None] * len(turns)
        return self.group.share(answers)

    def _answer(self, turns: Sequence[Sequence[int]], turn_numbers: Sequence[int]) -> List[Optional[List[int]]]:
        texts = self.tokenizer.batch_decode(turns, skip_special_tokens=False)
        calls = [parse_calls(text) for text in texts]
        for i, number in enumerate(turn_numbers):
            if calls[i] and number > self.max_turns:
                self._stats["over_turn_limit"] += 1
                calls[i] = []
        flat = [call for row in calls for call in row]
        start = time.perf_counter()
        results = self.runner.run(flat) if flat else []
        self._stats["seconds"] += time.perf_counter() - start
        self._stats["calls"] += len(flat)
        self._stats["errors"] += sum(r.error for r in results)
        self._stats["timeouts"] += sum(r.timed_out for r in results)
        answers: List[Optional[List[int]]] = []
        used = 0
        for row in calls:
            if not row:
                answers.append(None)  # no call: the completion ends with this turn
                continue
            contents = [self._cut(result.text) for result in results[used:used + len(row)]]
            used += len(row)
            answers.append(self.tokenizer.encode(responses_text(contents)))
        return answers

    def _cut(self, text: str) -> str:
        ids = self.tokenizer.encode(text)
        if len(ids) <= self.max_response_tokens:
            return text
        self._stats["truncated"] += 1
        return self.tokenizer.decode(ids[:self.max_response_tokens], skip_special_tokens=False) + TRUNCATED
