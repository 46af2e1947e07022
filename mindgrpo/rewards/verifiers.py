"""The verifier registry and the built-in verifiers.

Verifiers have the signature `fn(completion, gold, **context) -> float` and live in `VERIFIERS`; `resolve_verifier`
also accepts `package.module:function` specs so users can plug in their own. Batch verifiers (TRL's reward
functions: `fn(completions, golds, **context) -> list of floats`) are registered beside them with
`register_verifier(name, batch=True)`, or marked with `@batch_verifier` for a `package.module:function` spec.
Built in: `accuracy_reward` (the final answer equals the gold one), `format_reward` (R1-Zero's
`<think>…</think><answer>…</answer>`), `hash_format_reward` (a GSM8K `#### N` line) and `geo3k_reward` (verl's
geo3k score: 0.9 x the last `\\boxed{}` graded by math-verify + 0.1 x the `<think>…</think> … \\boxed{…}` format).
"""
from __future__ import annotations

import difflib
import inspect
import re
import threading
from typing import Callable, Dict, Optional, Set

from mindgrpo._spec import import_spec
from mindgrpo.rewards.answers import (
    MARKDOWN_EMPHASIS,
    answer_candidates,
    extract_answer,
    extract_answer_text,
    math_answers_equal,
    normalize_number,
)

Verifier = Callable[..., float]
VERIFIERS: Dict[str, Verifier] = {}
# Verifiers that check format only; `RewardScorer(gate_accuracy_on_format=True)` uses them as the gate.
FORMAT_VERIFIERS: Set[Verifier] = set()
# Set to True on verifiers called once per batch, TRL style (see `batch_verifier`). An attribute of the function, not
# a registry entry: a `package.module:function` spec marks itself when its module is imported.
BATCH_MARK = "mindgrpo_batch_verifier"


class VerifierSpecError(ValueError):
    """A verifier name or `package.module:function` spec that cannot be used (bad config, not a bad completion)."""


def _check_verifier_signature(fn: Callable, where: str) -> None:
    """Refuse callables the scorer could never call, at config time instead of as a failure on every completion."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # some C callables expose no signature; they get the benefit of the doubt
    takes_context = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values())
    try:
        signature.bind("completion", "gold")
    except TypeError:
        takes_context = False
    if not takes_context:
        raise VerifierSpecError(
            f"verifier {where!r} has signature {signature}; verifiers must accept (completion, gold, **context) "
            "and ignore context keys they do not use"
        )


def batch_verifier(fn: Verifier) -> Verifier:
    """Decorator marking `fn` as a batch verifier, `fn(completions, golds, **context) -> list of floats` (TRL's reward
    functions): called once per batch with lists (context values too, one per completion), it must return one
    number per completion. For functions named as `package.module:function`; registered names use
    `register_verifier(name, batch=True)`."""
    _check_verifier_signature(fn, getattr(fn, "__qualname__", repr(fn)))
    setattr(fn, BATCH_MARK, True)
    return fn


def register_verifier(name: str, *, is_format: bool = False, batch: bool = False) -> Callable[[Verifier], Verifier]:
    """Decorator adding a verifier to `VERIFIERS` under `name` (set `is_format` for format-only checks, `batch` for
    a batch verifier: see `batch_verifier`)."""
    if not isinstance(name, str) or not name or ":" in name:
        raise VerifierSpecError(
            f"verifier name {name!r} must be a non-empty string without ':' (':' marks module specs)"
        )

    def decorator(fn: Verifier) -> Verifier:
        existing = VERIFIERS.get(name)
        if existing is not None and existing is not fn:
            raise VerifierSpecError(
                f"verifier name {name!r} is already registered to {existing.__module__}.{existing.__qualname__}; "
                "pick another name"
            )
        _check_verifier_signature(fn, name)
        VERIFIERS[name] = fn
        if is_format:
            FORMAT_VERIFIERS.add(fn)
        if batch:
            setattr(fn, BATCH_MARK, True)
        return fn

    return decorator



def is_format_verifier(fn: Verifier) -> bool:
    """Whether `fn` was registered as a format-only check (`register_verifier(..., is_format=True)`)."""
    return any(fn is known for known in FORMAT_VERIFIERS)


def is_batch_verifier(fn: Verifier) -> bool:
    """Whether `fn` is called once per batch (`@batch_verifier` or `register_verifier(..., batch=True)`)."""
    return getattr(fn, BATCH_MARK, False) is True


def resolve_verifier(spec: str) -> Verifier:
    """The verifier for a registered name (see `VERIFIERS`) or a `package.module:function` spec.

    Raises VerifierSpecError (a ValueError) naming the spec: unknown names list the known ones with a did-you-mean;
    module specs say whether the module was missing, failed to import, lacked the attribute, or named something that
    is not a verifier-shaped callable.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise VerifierSpecError(f"verifier spec must be a registered name or 'package.module:function', got {spec!r}")
    spec = spec.strip()
    if spec in VERIFIERS:
        return VERIFIERS[spec]
    if ":" not in spec:
        close = difflib.get_close_matches(spec, list(VERIFIERS), n=3)
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise VerifierSpecError(
            f"unknown verifier {spec!r}.{hint} Known verifiers: {', '.join(sorted(VERIFIERS))}. "
            "For your own function give 'package.module:function'."
        )
    target = import_spec(spec, "verifier", VerifierSpecError)
    if not callable(target):
        raise VerifierSpecError(f"verifier spec {spec!r} names a {type(target).__name__}, not a function")
    _check_verifier_signature(target, spec)
    return target


# ---------------------------------------------------------------------------------------- built-in verifiers
_TAG = r"</?(?:think|answer)>"
_FREE_TEXT = rf"(?:(?!{_TAG}).)*"  # any text without a think/answer tag, so blocks cannot nest or repeat
_R1_FORMAT = re.compile(rf"\s*<think>{_FREE_TEXT}</think>\s*<answer>{_FREE_TEXT}</answer>\s*", re.DOTALL)
_HASH_LINE = re.compile(r"^[ \t]*####(?!#)(?P<body>[^\n]*)$", re.MULTILINE)


@register_verifier("accuracy_reward")
def accuracy_reward(completion: str, gold: str, *, fallback_last_number: bool = False, **_context: object) -> float:
    """1.0 when the completion's final answer equals the gold answer, else 0.0.

    `gold` may be raw (`"1,000"`, `"$72.00"`), already normalised, or a MATH-style answer kept verbatim by the data
    pipeline (`\\frac{1}{2}`, `(1, 2)`, `\\text{east}`). First the numbers are compared: when gold and the extracted
    answer (`extract_answer`) are both plain numbers, that comparison is final. Otherwise the raw text of the last
    answer marker (`extract_answer_text`; for a prose `<answer>` block also the inline maths it ends with) is
    compared with `math_answers_equal`, so `\\boxed{\\dfrac12}` matches gold `0.5` or `\\frac{1}{2}`, and
    `\\boxed{x = 5}` matches gold `5`. `fallback_last_number` applies to numeric golds only.
    """
    expected = normalize_number(gold)
    found = extract_answer(completion, fallback_last_number=fallback_last_number)
    if expected is not None and found is not None:
        return 1.0 if found == expected else 0.0
    # A non-string gold is compared as the number it is (`float("nan")` must not match the text "nan").
    gold_text = gold if isinstance(gold, str) else expected
    answer = extract_answer_text(completion)
    if gold_text is None or answer is None:
        return 0.0  # never None == None: a completion without an answer must not match a non-numeric gold
    return 1.0 if any(math_answers_equal(candidate, gold_text) for candidate in answer_candidates(answer)) else 0.0


@register_verifier("format_reward", is_format=True)
def format_reward(completion: str, gold: str = "", **_context: object) -> float:
    """1.0 iff the whole completion is `<think>…</think>` then `<answer>…</answer>` (R1-Zero format), else 0.0.

    Whitespace may surround and separate the two blocks; nothing else may. Exactly one block of each, no nested or
    stray think/answer tags inside them. Empty blocks pass: pair this with accuracy (added or gated) so the format
    alone is never worth much.
    """
    return 1.0 if isinstance(completion, str) and _R1_FORMAT.fullmatch(completion) else 0.0


@register_verifier("final_answer_reward", is_format=True)
def final_answer_reward(completion: str, gold: str = "", **_context: object) -> float:
    """1.0 iff the completion states a final answer `accuracy_reward` can read (the last `#### …` line,
    `\\boxed{…}` or `<answer>…</answer>`, `extract_answer_text`), whatever its value, else 0.0.

    A completion cut at `max_tokens` before its answer scores 0 here, so beside accuracy it rewards finishing within
    the budget. It also rewards stopping early with a wrong answer, and a model may take that shortcut: on
    Qwen2.5-Coder-0.5B-Instruct with 256 new tokens, weight 0.2 beside accuracy's 1.0 halved the truncated answers
    in 8 steps and left held-out accuracy where it was (docs/real_qwen.md). Accuracy alone rewards only answers
    that are both finished and right.
    """
    return 1.0 if isinstance(completion, str) and extract_answer_text(completion) is not None else 0.0


@register_verifier("hash_format_reward", is_format=True)
def hash_format_reward(completion: str, gold: str = "", **_context: object) -> float:
    """1.0 iff some line is a `#### <number>` final-answer line (GSM8K style; markdown emphasis allowed), else 0.0."""
    if not isinstance(completion, str):
        return 0.0
    for match in _HASH_LINE.finditer(completion):
        if normalize_number(match["body"].strip(MARKDOWN_EMPHASIS)) is not None:
            return 1.0
    return 0.0


# verl's geo3k format (verl/utils/reward_score/geo3k.py, format_reward), verbatim: the response opens with <think>,
# closes it, and a \boxed{...} follows.
_GEO3K_FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)
GEO3K_FORMAT_WEIGHT = 0.1  # verl's compute_score(format_score=0.1): 0.9 x accuracy + 0.1 x format


def last_boxed(text: str) -> Optional[str]:
    """The content of the last `\\boxed{...}` (braces balanced), stripped; None without a closed one. The same
    span as mathruler's `extract_boxed_content`, which verl's geo3k score uses."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, begin = 0, start + len("\\boxed{")
    for i in range(begin, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth < 0:
            return text[begin:i].strip()
    return None


def latex_answers_equal(answer: str, gold: str) -> bool:
    """Whether two final answers are the same mathematics, by math-verify (LaTeX parsed to SymPy): `\\frac{40}{3}`
    = `40/3`, `60^\\circ` = `60`, `\\sqrt{48}` = `4\\sqrt{3}`, `25\\pi \\text{ cm}^2` = `25\\pi`; rounded decimals
    (13.33 for 40/3) do not count. math-verify's own alarm-based time limits only work in the main thread; elsewhere
    `reward_config.verifier_timeout` (worker processes) is what bounds a runaway simplification."""
    from math_verify import parse, verify  # lazy: SymPy and the LaTeX parser take a second to import

    limit = 5 if threading.current_thread() is threading.main_thread() else None
    # math-verify extracts delimited LaTeX: each answer becomes one $...$ span
    gold_parsed = parse(f"${gold.replace('$', '')}$", parsing_timeout=limit)
    answer_parsed = parse(f"${answer.replace('$', '')}$", parsing_timeout=limit)
    return bool(gold_parsed and answer_parsed and verify(gold_parsed, answer_parsed, timeout_seconds=limit))


@register_verifier("geo3k_reward")
def geo3k_reward(completion: str, gold: str, **_context: object) -> float:
    """verl's geo3k score: 0.9 x accuracy + 0.1 x format, so 0.0, 0.1, 0.9 or 1.0.

    Accuracy: the content of the last `\\boxed{}` equals `gold` under `latex_answers_equal` (verl grades with
    mathruler; math-verify accepts the same forms and a few more, such as `60°` and `\\frac{2}{4}` = `\\frac12`).
    Format: the whole completion is `<think>…</think>` followed by text containing `\\boxed{…}` (verl's regex).
    """
    if not isinstance(completion, str):
        return 0.0
    answer = last_boxed(completion)
    gold_text = gold if isinstance(gold, str) else normalize_number(gold)
    accurate = bool(answer and gold_text) and latex_answers_equal(answer, gold_text)
    well_formed = _GEO3K_FORMAT.fullmatch(completion) is not None
    return (1.0 - GEO3K_FORMAT_WEIGHT) * accurate + GEO3K_FORMAT_WEIGHT * well_formed


register_verifier("accuracy")(accuracy_reward)
register_verifier("format", is_format=True)(format_reward)
register_verifier("hash_format", is_format=True)(hash_format_reward)
