"""``mindgrpo samples RUN``: find completions in a run's ``completions.jsonl`` (the "aha moment"), and read them.

A run logs each step's completions there (``rl_config.save_prompt_completions_data``): step, prompt, completion,
gold answer, total reward and each verifier's, and with tools the whole exchange (``transcript``). This module
reads them back and keeps those that match every filter given: a step range, a reward range, one verifier's
reward, a completion length (in characters), a regular expression (``--grep "wait|let me check"``, case-insensitive,
searched in the completion, or the transcript when there is one). ``--first N`` / ``--last N`` keep the earliest or
latest N matches of each prompt: with both, one prompt's early and late completions side by side. The matches print
readably in a terminal or go into one self-contained HTML page (``--html``).
"""
from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

PathLike = Union[str, Path]
COMPLETIONS_FILE = "completions.jsonl"


class SamplesError(ValueError):
    """The run or a filter cannot be used; the message names the path or flag."""


def completions_file(run: PathLike) -> Path:
    """``run``'s completions: the file itself, or ``completions.jsonl`` in a run folder."""
    path = Path(run)
    if path.is_dir():
        path = path / COMPLETIONS_FILE
    if not path.is_file():
        raise SamplesError(f"{path} does not exist: give a run's output folder (rl_config.output_dir) or its "
                           f"{COMPLETIONS_FILE}; a run writes it when rl_config.save_prompt_completions_data is on")
    return path


def read_samples(path: PathLike) -> Iterator[Dict[str, Any]]:
    """The records of a completions file in order; a line that is not a JSON record is an error naming it (the
    last line may be cut short by a killed run, and is skipped)."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            if number == len(lines):
                return  # a run killed while writing its last line
            raise SamplesError(f"{path}, line {number}: not a JSON record ({err.msg})") from None
        if not isinstance(record, dict) or "completion" not in record:
            raise SamplesError(f"{path}, line {number}: not a completion record (no 'completion')")
        yield record


@dataclass(frozen=True)
class Filters:
    """Which completions to keep; every filter that is set must match."""
    steps: Optional[Tuple[int, int]] = None
    """Inclusive step range."""
    reward: Optional[Tuple[float, float]] = None
    """Inclusive range of the total reward."""
    verifier: Optional[Tuple[str, float, float]] = None
    """(verifier name, low, high): one verifier's reward in an inclusive range."""
    length: Optional[Tuple[int, int]] = None
    """Inclusive range of the completion's length in characters."""
    grep: Optional[str] = None
    """A regular expression searched (case-insensitively) in the completion, or in the transcript with tools."""

    def __post_init__(self):
        if self.grep is not None:
            try:
                re.compile(self.grep)
            except re.error as err:
                raise SamplesError(f"--grep {self.grep!r} is not a regular expression: {err}") from None

    def keep(self, record: Dict[str, Any]) -> bool:
        if self.steps and not self.steps[0] <= int(record.get("step", 0)) <= self.steps[1]:
            return False
        if self.reward and not _within(record.get("reward"), self.reward):
            return False
        if self.verifier:
            name, low, high = self.verifier
            if not _within(_verifier_reward(record, name), (low, high)):
                return False
        if self.length and not self.length[0] <= len(record["completion"]) <= self.length[1]:
            return False
        if self.grep and not re.search(self.grep, text_of(record), re.IGNORECASE):
            return False
        return True


def _within(value: Any, bounds: Tuple[float, float]) -> bool:
    return isinstance(value, (int, float)) and bounds[0] <= value <= bounds[1]


def _verifier_reward(record: Dict[str, Any], name: str) -> Optional[float]:
    """A verifier's reward, by its registered or full name (``accuracy`` finds ``accuracy_reward`` too)."""
    rewards = record.get("rewards") or {}
    for key in (name, f"{name}_reward"):
        if key in rewards:
            return rewards[key]
    matches = [v for k, v in rewards.items() if k.rsplit(":", 1)[-1].rsplit(".", 1)[-1] in (name, f"{name}_reward")]
    return matches[0] if matches else None


def text_of(record: Dict[str, Any]) -> str:
    """What a completion said: the transcript of a tool run (every turn and tool response), else the completion."""
    return record.get("transcript") or record["completion"]


def select(records: Sequence[Dict[str, Any]], filters: Filters, *, first: int = 0, last: int = 0,
           limit: int = 0) -> List[Dict[str, Any]]:
    """The records that pass ``filters``, in file order; ``first``/``last`` keep each prompt's earliest/latest
    matches (both: each prompt's first ones, then its last ones, grouped by prompt); ``limit`` caps the count."""
    kept = [r for r in records if filters.keep(r)]
    if first or last:
        by_prompt: Dict[str, List[Dict[str, Any]]] = {}
        for record in kept:
            by_prompt.setdefault(record.get("prompt", ""), []).append(record)
        chosen = []
        for group in by_prompt.values():
            picked = group[:first] if first else []
            tail = group[-last:] if last else []
            chosen += picked + [r for r in tail if not any(r is p for p in picked)]
        kept = chosen
    return kept[:limit] if limit else kept


def format_text(records: Sequence[Dict[str, Any]], *, width: int = 100) -> str:
    """The records as terminal text: a header line each (step, reward, verifiers, gold), the prompt's last line,
    then the completion (or transcript)."""
    blocks = []
    for record in records:
        rewards = " ".join(f"{k.rsplit(':', 1)[-1]}={v:g}" for k, v in (record.get("rewards") or {}).items()
                           if isinstance(v, (int, float)))
        reward = record.get("reward")
        header = (f"step {record.get('step', '?')} | reward {reward:g}" if isinstance(reward, (int, float))
                  else f"step {record.get('step', '?')} | reward -")
        header += (f" | {rewards}" if rewards else "") + (f" | gold {record['gold']}" if record.get("gold") else "")
        question = _question(record.get("prompt", ""))
        blocks.append("\n".join(["=" * width, header, f"Q: {question}", "-" * width, text_of(record).rstrip()]))
    return "\n".join(blocks) + ("\n" + "=" * width if blocks else "")


def _question(prompt: str) -> str:
    """The last user turn of a ChatML prompt, or the prompt's text, on one line."""
    turns = re.findall(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", prompt, re.DOTALL)
    text = turns[-1] if turns else prompt
    return " ".join(text.split())


def format_html(records: Sequence[Dict[str, Any]], *, title: str, grep: Optional[str] = None) -> str:
    """One self-contained page (no scripts, no outside files): a card per record, ``grep``'s matches marked."""
    cards = []
    for record in records:
        body = html.escape(text_of(record))
        if grep:
            body = re.sub(f"({grep})", r"<mark>\1</mark>", body, flags=re.IGNORECASE) if _safe(grep) else body
        rewards = ", ".join(f"{html.escape(k)}: {v:g}" for k, v in (record.get("rewards") or {}).items()
                            if isinstance(v, (int, float)))
        reward = record.get("reward")
        cards.append(
            f"<section><h2>step {record.get('step', '?')} &middot; reward "
            f"{reward if isinstance(reward, (int, float)) else '-'}</h2>"
            f"<p class=meta>{rewards}{' &middot; gold ' + html.escape(str(record['gold'])) if record.get('gold') else ''}"
            f"</p><p class=q>{html.escape(_question(record.get('prompt', '')))}</p><pre>{body}</pre></section>")
    style = ("body{font-family:sans-serif;max-width:60em;margin:auto}section{border:1px solid #ccc;margin:1em 0;"
             "padding:.5em 1em}pre{white-space:pre-wrap}.meta{color:#555}.q{font-style:italic}mark{background:#fe8}")
    return (f"<!DOCTYPE html><html><head><meta charset=utf-8><title>{html.escape(title)}</title><style>{style}"
            f"</style></head><body><h1>{html.escape(title)}</h1><p>{len(records)} completions</p>{''.join(cards)}"
            "</body></html>\n")


def _safe(pattern: str) -> bool:
    """Whether the pattern can be wrapped in a group and searched in escaped HTML (no backreferences)."""
    return not re.search(r"\\\d", pattern)
