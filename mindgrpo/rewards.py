"""Rule-based rewards (verifiers) for GRPO on maths word problems, and the scorer the trainer calls.

Pure Python + numpy on purpose: rewards run on the host between rollout and the policy update, and must be testable
without MindSpore.

- `normalize_number` gives every numeric answer one canonical string, so gold answers (stored normalised by the data
  pipeline) and answers extracted from completions compare with `==`.
- `extract_answer` finds the model's final answer (`#### N`, `\\boxed{N}` or `<answer>…</answer>`).
- Verifiers have the signature `fn(completion, gold, **context) -> float` and live in `VERIFIERS`;
  `resolve_verifier` also accepts `package.module:function` specs so users can plug in their own.
- `RewardScorer` runs a configured list of verifiers over a batch. A verifier that crashes or returns junk on one
  completion costs that completion its score (and is counted), never the training run.
"""
from __future__ import annotations

import difflib
import importlib
import inspect
import logging
import math
import numbers
import re
from dataclasses import dataclass
from decimal import Context, Decimal, InvalidOperation, localcontext
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple, Union

import numpy as np

_log = logging.getLogger(__name__)

# A plausible answer has at most this many digits before or after the point; beyond it `1e999999` would expand
# into a megabyte-long string (and Decimal itself gives up on larger exponents).
_MAX_EXPONENT = 100

_FLOAT32_MAX = float(np.finfo(np.float32).max)
_MINUS_SIGNS = str.maketrans({"\u2212": "-"})  # models sometimes print the typographic minus sign

# One whole number string, as accepted by `normalize_number`. Commas must be real thousands separators: "1,5" is
# a European decimal or a list, and silently reading it as 15 would corrupt gold answers. ASCII digits only.
_WHOLE_NUMBER = re.compile(
    r"""\s*(?P<sign1>[-+]?)\s*(?:[$€£¥]\s*)?(?P<sign2>[-+]?)
    (?P<mantissa>(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|\.\d+)
    (?P<exponent>[eE][-+]?\d+)?
    \s*%?\s*\.?\s*""",
    re.VERBOSE | re.ASCII,
)

# A number inside prose. The look-behind stops matches in the middle of words, decimals or comma lists
# ("x2", "3.5" -> never "5", "1,2,3" -> nothing); the look-ahead refuses fractions and version strings ("3/4",
# "1.2.3"), which are not a plain number. A trailing sentence period is not part of the number.
_NUMBER_TOKEN = re.compile(
    r"(?<![\w.,])[-+\u2212]?[$€£¥]?[-+\u2212]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)(?!\d|[.,/]\d)",
    re.ASCII,
)

_HASH_MARKER = re.compile(r"(?<!#)####(?!#)[ \t]*(?P<body>[^\n]*)")
_BOXED_MARKER = re.compile(r"\\boxed\s*\{")
# The tempered body (no `<answer>` inside) makes `<answer><answer>5</answer>` pick the inner block and keeps the
# scan linear on completions full of unclosed tags.
_ANSWER_MARKER = re.compile(r"<answer>(?P<body>(?:(?!<answer>).)*?)</answer>", re.DOTALL)
_MARKDOWN_EMPHASIS = "*_` \t"
# `#### Step 1` is a markdown heading, not an answer: a `####` body must open like a number to be a marker.
_NUMBER_LIKE_START = re.compile(r"[-+\u2212$€£¥ \t]*\.?\d")

_LATEX_TEXT = re.compile(r"\\(?:text|textbf|textrm|mathbf|mathrm|mbox)\s*\{([^{}]*)\}")
_LATEX_NOISE = re.compile(r"\\[,;:! ]|\\?\$|\\%|~")  # spacing commands, (escaped) dollars, \%, ties

_TAG = r"</?(?:think|answer)>"
_FREE_TEXT = rf"(?:(?!{_TAG}).)*"  # any text without a think/answer tag, so blocks cannot nest or repeat
_R1_FORMAT = re.compile(rf"\s*<think>{_FREE_TEXT}</think>\s*<answer>{_FREE_TEXT}</answer>\s*", re.DOTALL)
_HASH_LINE = re.compile(r"^[ \t]*####(?!#)(?P<body>[^\n]*)$", re.MULTILINE)


def normalize_number(text: Union[str, int, float, Decimal, None]) -> Optional[str]:
    """Canonical string for a numeric answer, or None when `text` is not a plain finite number.

    `72`, `72.0`, `72.00`, `$72`, `72.`, `+72` all give `"72"`; `1,000` and `1000` give `"1000"`; `-0` gives `"0"`;
    `1e3` gives `"1000"` and `1.50` gives `"1.5"` (never scientific notation). Accepted decoration: surrounding
    whitespace, one currency sign, one sign (before or after the currency), a trailing `%` and a trailing period.
    Commas must be thousands separators (`1,5` -> None), digits must be ASCII, and |exponent| > 100, inf and nan give
    None. ints/floats/Decimals are accepted too (datasets sometimes store gold answers as numbers); bools are not.
    The output is itself accepted and maps to itself, so normalising twice is harmless.
    """
    if isinstance(text, (numbers.Real, Decimal)) and not isinstance(text, (bool, np.bool_)):
        text = str(text)
    if not isinstance(text, str):
        return None
    match = _WHOLE_NUMBER.fullmatch(text.translate(_MINUS_SIGNS))
    if match is None or (match["sign1"] and match["sign2"]):
        return None
    sign = match["sign1"] or match["sign2"]
    try:
        value = Decimal(sign + match["mantissa"].replace(",", "") + (match["exponent"] or ""))
    except InvalidOperation:  # exponent too large for Decimal to represent at all
        return None
    if value.is_zero():
        return "0"  # also covers -0, 0.000 and 0e5
    if abs(value.adjusted()) > _MAX_EXPONENT:
        return None
    # Enough precision to keep every digit: the default 28 would silently round long answers.
    with localcontext(Context(prec=len(value.as_tuple().digits) + 1)):
        return format(value.normalize(), "f")


def _last_number(text: str) -> Optional[str]:
    """Normalised last number token in prose, or None."""
    last = None
    for last in _NUMBER_TOKEN.finditer(text):
        pass
    return None if last is None else normalize_number(last.group())


def _latex_number(body: str) -> Optional[str]:
    """The number a `\\boxed{...}` body spells, or None when it is anything more (a fraction, an expression, units)."""
    body = _LATEX_TEXT.sub(r"\1", body).replace("{,}", ",")
    return normalize_number(_LATEX_NOISE.sub("", body))


def _matching_braces(text: str) -> Dict[int, int]:
    """Map each `{` position to its matching `}` in one linear pass (unbalanced braces have no entry)."""
    open_positions: List[int] = []
    pairs: Dict[int, int] = {}
    for brace in re.finditer(r"[{}]", text):
        if brace.group() == "{":
            open_positions.append(brace.start())
        elif open_positions:
            pairs[open_positions.pop()] = brace.start()
    return pairs


def _answer_markers(text: str) -> List[Tuple[int, Optional[str]]]:
    """(start position, normalised number or None) for every answer marker in `text`."""
    markers: List[Tuple[int, Optional[str]]] = []
    for match in _HASH_MARKER.finditer(text):
        body = match["body"].lstrip(_MARKDOWN_EMPHASIS)
        if _NUMBER_LIKE_START.match(body):
            token = _NUMBER_TOKEN.match(body)
            markers.append((match.start(), normalize_number(token.group()) if token else None))
    if "\\boxed" in text:
        braces = _matching_braces(text)
        for match in _BOXED_MARKER.finditer(text):
            close = braces.get(match.end() - 1)
            if close is not None:  # an unclosed \boxed{ (truncated generation) is no answer
                markers.append((match.start(), _latex_number(text[match.end():close])))
    for match in _ANSWER_MARKER.finditer(text):
        markers.append((match.start(), _last_number(match["body"])))
    return markers


def extract_answer(text: str, *, fallback_last_number: bool = False) -> Optional[str]:
    """Normalised number given by the *last* answer marker in `text`, or None.

    Markers: `#### N` (the number must open the line's text after `####`; `#### Step 1` headings are ignored),
    `\\boxed{N}` (the whole body must be a plain number: `\\boxed{\\frac{1}{2}}` gives None) and
    `<answer>…</answer>` (the last number in the body). The marker that *starts* last wins, so a `\\boxed{}` inside
    an `<answer>` block beats the block's loose numbers. When the last marker holds no plain number the result is
    None: an earlier marker is not consulted, because the model's final answer was something else.
    With `fallback_last_number=True` and no marker at all, the last number anywhere in the text is used.
    """
    if not isinstance(text, str):
        return None
    markers = _answer_markers(text)
    if markers:
        return max(markers, key=lambda marker: marker[0])[1]
    return _last_number(text) if fallback_last_number else None


Verifier = Callable[..., float]
VERIFIERS: Dict[str, Verifier] = {}
# Verifiers that check format only; `RewardScorer(gate_accuracy_on_format=True)` uses them as the gate.
FORMAT_VERIFIERS: Set[Verifier] = set()


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


def register_verifier(name: str, *, is_format: bool = False) -> Callable[[Verifier], Verifier]:
    """Decorator adding a verifier to `VERIFIERS` under `name` (set `is_format` for format-only checks)."""
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
        return fn

    return decorator


@register_verifier("accuracy_reward")
def accuracy_reward(completion: str, gold: str, *, fallback_last_number: bool = False, **_context: object) -> float:
    """1.0 when the completion's extracted answer equals the gold answer numerically, else 0.0.

    `gold` may be raw (`"1,000"`, `"$72.00"`) or already normalised. A gold that is not a plain number (the data
    pipeline keeps MATH-style golds such as `\\frac{1}{2}` verbatim) scores 0.0 for every completion: this verifier
    compares numbers only, so such prompts need a symbolic verifier.
    """
    expected = normalize_number(gold)
    if expected is None:
        return 0.0  # never None == None: a completion without an answer must not match a non-numeric gold
    return 1.0 if extract_answer(completion, fallback_last_number=fallback_last_number) == expected else 0.0


@register_verifier("format_reward", is_format=True)
def format_reward(completion: str, gold: str = "", **_context: object) -> float:
    """1.0 iff the whole completion is `<think>…</think>` then `<answer>…</answer>` (R1-Zero format), else 0.0.

    Whitespace may surround and separate the two blocks; nothing else may. Exactly one block of each, no nested or
    stray think/answer tags inside them. Empty blocks pass: pair this with accuracy (added or gated) so the format
    alone is never worth much.
    """
    return 1.0 if isinstance(completion, str) and _R1_FORMAT.fullmatch(completion) else 0.0


@register_verifier("hash_format_reward", is_format=True)
def hash_format_reward(completion: str, gold: str = "", **_context: object) -> float:
    """1.0 iff some line is a `#### <number>` final-answer line (GSM8K style; markdown emphasis allowed), else 0.0."""
    if not isinstance(completion, str):
        return 0.0
    for match in _HASH_LINE.finditer(completion):
        if normalize_number(match["body"].strip(_MARKDOWN_EMPHASIS)) is not None:
            return 1.0
    return 0.0


register_verifier("accuracy")(accuracy_reward)
register_verifier("format", is_format=True)(format_reward)
register_verifier("hash_format", is_format=True)(hash_format_reward)


def _import_spec(spec: str) -> object:
    """Import the object a `package.module:attr.path` spec names."""
    module_name, _, attr_path = spec.partition(":")
    if not module_name.strip() or not attr_path.strip():
        raise VerifierSpecError(f"verifier spec {spec!r} must look like 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise VerifierSpecError(
                f"verifier spec {spec!r}: module {module_name!r} not found; check the spelling and that its folder "
                "is on PYTHONPATH"
            ) from exc
        raise VerifierSpecError(f"verifier spec {spec!r}: importing {module_name!r} failed: {exc}") from exc
    except Exception as exc:  # a broken user module: say which spec pulled it in
        raise VerifierSpecError(
            f"verifier spec {spec!r}: importing {module_name!r} raised {type(exc).__name__}: {exc}"
        ) from exc
    target: object = module
    for part in attr_path.split("."):
        if not hasattr(target, part):
            close = difflib.get_close_matches(part, [n for n in dir(target) if not n.startswith("_")], n=3)
            hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            raise VerifierSpecError(f"verifier spec {spec!r}: {module_name!r} has no attribute {attr_path!r}.{hint}")
        target = getattr(target, part)
    return target


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
    target = _import_spec(spec)
    if not callable(target):
        raise VerifierSpecError(f"verifier spec {spec!r} names a {type(target).__name__}, not a function")
    _check_verifier_signature(target, spec)
    return target


def _as_score(value: object) -> Optional[float]:
    """The verifier's return value as a finite float32-representable score, or None when it is not one."""
    if not isinstance(value, (numbers.Real, np.bool_)):
        return None
    try:
        score = float(value)
    except (OverflowError, ValueError, TypeError):  # e.g. an int too large for a float
        return None
    # Scores are stored as float32: anything beyond its range would become inf there.
    return score if math.isfinite(score) and abs(score) <= _FLOAT32_MAX else None


@dataclass
class RewardBatch:
    """Rewards for one batch of completions."""

    total: np.ndarray  # float32 [N]: weighted sum of verifier scores (or gated, see RewardScorer)
    per_verifier: Dict[str, np.ndarray]  # float32 [N] raw score of each configured verifier, keyed by its config name
    failures: Dict[str, int]  # per verifier: completions on which it raised or returned NaN/inf/a non-number


class RewardScorer:
    """Scores completions with the verifiers named in `reward_config.verifier_function`.

    Total reward per completion:
    - default: `sum_v weight_v * score_v`;
    - `gate_accuracy_on_format=True`: `gate * sum_{v not format} weight_v * score_v`, where `gate` is 1 when every
      format verifier in the list (`format_reward`, `hash_format_reward` or any registered with `is_format=True`)
      scored exactly 1.0 on that completion, else 0. Format verifiers then add nothing themselves (their weights are
      unused): accuracy is multiplied by format instead of added to it, so a well-formatted wrong answer earns 0.

    `fallback_last_number` is passed to every verifier as a keyword (accuracy_reward honours it; others ignore it).
    """

    def __init__(
        self,
        verifier_function: Union[str, Sequence[str]],
        verifier_weight: Optional[Sequence[float]] = None,
        *,
        gate_accuracy_on_format: bool = False,
        fallback_last_number: bool = False,
    ) -> None:
        names = [verifier_function] if isinstance(verifier_function, str) else list(verifier_function)
        if not names:
            raise ValueError(
                "reward_config.verifier_function is empty; list at least one verifier, "
                "e.g. ['accuracy_reward', 'format_reward']"
            )
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(
                f"reward_config.verifier_function lists {repeated} more than once; list each verifier once and "
                "raise its reward_config.verifier_weight instead"
            )
        self.functions: Dict[str, Verifier] = {}
        for index, name in enumerate(names):
            try:
                self.functions[name] = resolve_verifier(name)
            except VerifierSpecError as exc:
                raise VerifierSpecError(f"reward_config.verifier_function[{index}]: {exc}") from exc
        self.weights = self._check_weights(names, verifier_weight)
        self.gate_accuracy_on_format = bool(gate_accuracy_on_format)
        self.fallback_last_number = bool(fallback_last_number)
        self.gates = [name for name, fn in self.functions.items() if any(fn is g for g in FORMAT_VERIFIERS)]
        if self.gate_accuracy_on_format:
            if not self.gates:
                raise ValueError(
                    "reward_config.gate_accuracy_on_format=True needs a format verifier in "
                    f"reward_config.verifier_function (got {names}); add 'format_reward' or 'hash_format_reward', "
                    "or set gate_accuracy_on_format=False"
                )
            if len(self.gates) == len(names):
                raise ValueError(
                    "reward_config.gate_accuracy_on_format=True needs something to gate: add 'accuracy_reward' to "
                    f"reward_config.verifier_function (got only format verifiers {names})"
                )
        self._warned: Set[str] = set()

    @staticmethod
    def _check_weights(names: List[str], verifier_weight: Optional[Sequence[float]]) -> Dict[str, float]:
        if verifier_weight is None:
            return {name: 1.0 for name in names}
        weights = list(verifier_weight)
        if len(weights) != len(names):
            raise ValueError(
                f"reward_config.verifier_weight has {len(weights)} entries but reward_config.verifier_function has "
                f"{len(names)} ({names}); give one weight per verifier or leave verifier_weight unset for all 1.0"
            )
        checked: Dict[str, float] = {}
        for index, (name, weight) in enumerate(zip(names, weights)):
            score = _as_score(weight) if not isinstance(weight, bool) else None
            if score is None:
                raise ValueError(
                    f"reward_config.verifier_weight[{index}] (for {name!r}) is {weight!r}; it must be a finite number"
                )
            checked[name] = float(weight)
        return checked

    def score(self, completions: Sequence[str], golds: Sequence[str], **context_lists: Sequence[object]) -> RewardBatch:
        """Score each completion against its gold answer; `context_lists` (e.g. `prompt=[...]`) are per-completion."""
        count = len(completions)
        if len(golds) != count:
            raise ValueError(
                f"RewardScorer.score got {count} completions but {len(golds)} golds; pass one gold per completion "
                "(repeat each prompt's gold once per generation)"
            )
        for key, values in context_lists.items():
            if key == "fallback_last_number":
                raise ValueError("'fallback_last_number' is a RewardScorer option, not a per-completion context list")
            if len(values) != count:
                raise ValueError(
                    f"RewardScorer.score context list {key!r} has {len(values)} entries for {count} completions"
                )
        per_verifier: Dict[str, np.ndarray] = {}
        failures: Dict[str, int] = {}
        for name, fn in self.functions.items():
            per_verifier[name], failures[name] = self._run(name, fn, completions, golds, context_lists)
        return RewardBatch(self._total(per_verifier, count), per_verifier, failures)

    def _run(
        self,
        name: str,
        fn: Verifier,
        completions: Sequence[str],
        golds: Sequence[str],
        context_lists: Mapping[str, Sequence[object]],
    ) -> Tuple[np.ndarray, int]:
        """One verifier over the batch: (float32 scores, number of failed completions)."""
        scores = np.zeros(len(completions), dtype=np.float32)
        failed = 0
        for index, (completion, gold) in enumerate(zip(completions, golds)):
            context = {key: values[index] for key, values in context_lists.items()}
            try:
                value = fn(completion, gold, fallback_last_number=self.fallback_last_number, **context)
            except Exception as exc:  # one bad completion (or verifier bug) must not stop training; it is counted
                failed += 1
                self._warn_once(name, f"raised {type(exc).__name__}: {exc}", index)
                continue
            score = _as_score(value)
            if score is None:
                failed += 1
                self._warn_once(name, f"returned {value!r} (not a finite number)", index)
                continue
            scores[index] = score
        return scores, failed

    def _warn_once(self, name: str, problem: str, index: int) -> None:
        # Counts go to RewardBatch.failures every step; the log only needs the first example to debug from.
        if name not in self._warned:
            self._warned.add(name)
            _log.warning("verifier %r %s on completion %d; such completions score 0 and are counted in "
                         "RewardBatch.failures (further failures are not logged)", name, problem, index)

    def _total(self, per_verifier: Mapping[str, np.ndarray], count: int) -> np.ndarray:
        total = np.zeros(count, dtype=np.float64)
        for name, scores in per_verifier.items():
            if not (self.gate_accuracy_on_format and name in self.gates):
                total += self.weights[name] * scores.astype(np.float64)
        if self.gate_accuracy_on_format:
            passed = np.ones(count, dtype=bool)
            for name in self.gates:
                passed &= per_verifier[name] == 1.0
            total *= passed
        return total.astype(np.float32)
