"""Tools in a rollout: the :class:`~mindgrpo.rollout.api.TurnHandler` that answers a model turn's tool calls.

The engine hands over each ended turn as the token ids the model sampled. They are decoded only to read the calls
(:func:`~mindgrpo.tools.format.parse_calls`); the completion keeps the ids themselves. The calls of all the turns
that ended at one decode step run together in the :class:`~mindgrpo.tools.runner.ToolRunner`'s worker processes,
each result is cut to ``max_response_tokens``, and the answer (:func:`~mindgrpo.tools.format.responses_text`) is
tokenised once and handed back: those are the only tokens of a completion that are the tokeniser's rather than the
model's, and the rollout marks them out of the loss.
"""
from __future__ import annotations

import time
from typing import Dict, List, Optional, Sequence

from mindgrpo.data.tokenizer import Tokenizer
from mindgrpo.tools.format import parse_calls, responses_text
from mindgrpo.tools.runner import ToolRunner

TRUNCATED = "\n[output truncated]"


class ToolTurns:
    """Answers tool-calling turns with the tools' results, up to ``max_turns`` tool turns per completion."""

    def __init__(self, tokenizer: Tokenizer, runner: ToolRunner, max_turns: int, max_response_tokens: int):
        self.tokenizer = tokenizer
        self.runner = runner
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
