"""Rule-based rewards (verifiers) for GRPO on maths word problems, and the scorer the trainer calls.

Pure Python + numpy on purpose: rewards run on the host between rollout and the policy update, and must be testable
without MindSpore.

- `normalize_number` gives every numeric answer one canonical string, so gold answers (stored normalised by the data
  pipeline) and answers extracted from completions compare with `==`.
- `extract_answer` finds the model's final answer (`#### N`, `\\boxed{N}` or `<answer>…</answer>`) as a number;
  `extract_answer_text` gives the same marker's raw text, for answers that are not plain numbers (`\\frac{1}{2}`,
  `(1, 2)`, `\\text{east}`).
- `math_answers_equal` compares two such answers after `normalize_math_answer` (LaTeX spacing, `\\dfrac`, `\\text`,
  degrees/percent, `x =` dropped), with exact `Fraction` values for simple numeric forms and element-wise tuples. Pure
  Python and conservative: it never evaluates expressions, so `1+x` and `x+1` differ, but `1/2` never equals `2`.
- Verifiers have the signature `fn(completion, gold, **context) -> float` and live in `VERIFIERS`;
  `resolve_verifier` also accepts `package.module:function` specs so users can plug in their own. Batch verifiers
  (TRL's reward functions: `fn(completions, golds, **context) -> list of floats`) are registered beside them with
  `register_verifier(name, batch=True)`, or marked with `@batch_verifier` for a `package.module:function` spec.
- `RewardScorer` runs a configured list of verifiers over a batch, in the trainer's process or (with a time limit
  per call, or several at once) in worker processes (`mindgrpo.rewards.workers`). A verifier that crashes, hangs or
  returns junk on one completion costs that completion its score (and is counted), never the training run; one that
  fails on every completion of a batch, or a batch verifier that does not return one number per completion, is a
  bug: `VerifierError` stops the run, naming it.
"""
from __future__ import annotations

import difflib
import functools
import importlib
import inspect
import logging
import math
import numbers
import pickle
import re
import reprlib
from dataclasses import dataclass
from decimal import Context, Decimal, InvalidOperation, localcontext
from fractions import Fraction
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple, Union

import numpy as np

from mindgrpo.rewards.workers import CallOutcome, WorkerPool, WorkerStartError

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

_ASCII_SPACE_RUN = re.compile(r"\s+", re.ASCII)

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
_EMPHASIS_RUN = re.compile(r"[\s*_`]*")  # around a raw `####` answer: `**\frac12**` -> `\frac12`
# `#### Step 1` is a markdown heading, not an answer: a `####` body must open like a number or like maths (a LaTeX
# command, a bracket, or a lone variable as in `x = 5` or `x^2+1`) to be a marker.
_NUMBER_LIKE_START = re.compile(r"[-+\u2212$€£¥ \t]*\.?\d")
_MATH_LIKE_START = re.compile(
    r"[-+\u2212 \t]*(?:\\?\$|\\[A-Za-z]|[(\[{]|[A-Za-z](?![A-Za-z])[ \t]*(?:[=^_+\-*/(]|$))"
)

_LATEX_TEXT = re.compile(r"\\(?:text|textbf|textrm|mathbf|mathrm|mbox)\s*\{([^{}]*)\}")
_LATEX_NOISE = re.compile(r"\\[,;:! ]|\\?\$|\\%|~")  # spacing commands, (escaped) dollars, \%, ties

# A number in a marker body is only the answer when it stands alone: `2` in `\sqrt{2}`, `1/2`, `(1, 2)`, `x^2+1`,
# `2\pi` or `2x` is part of a larger expression. Checked on the characters around the number, after skipping
# decoration (spaces, markdown emphasis, dollars, LaTeX spacing, `%`).
_GLUED_AFTER = re.compile(r"[A-Za-z](?![A-Za-z])|\\[A-Za-z]|\(")  # directly after the number: 2x, 2\pi, 2(3)
_DECORATION = re.compile(r"(?:\s|\*\*|__|`|~|%|\\?\$|\\[,;:! %]|\\q?quad(?![A-Za-z]))*")
_MATH_AFTER = re.compile(r"[-+*/^_{}!\u2212\u00d7\u00b7\u00f7]|\\[A-Za-z]|[,:]\s*[-+\u2212]?\.?\d")
_DECORATION_BEFORE = re.compile(r"(?:\s|\*\*|__|`|~|\\?\$|\\[,;:! ]|\\q?quad(?![A-Za-z]))*\Z")
_MATH_BEFORE = re.compile(r"(?:[-+*/^_{}\u2212\u00d7\u00b7\u00f7]|\\[A-Za-z]+|[\d)\]}]\s*[,:])\Z")
_CONTEXT_CHARS = 40  # how far before a number the glue check looks (decoration longer than this is no glue)

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
    # Whitespace runs collapse to one space first: same strings accepted, but the adjacent `\s*` of the pattern can
    # no longer backtrack quadratically over a long run (`\boxed{$ $ $ …}`).
    match = _WHOLE_NUMBER.fullmatch(_ASCII_SPACE_RUN.sub(" ", text.translate(_MINUS_SIGNS)))
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


def _continues_math(text: str, end: int) -> bool:
    """Whether the number ending at `end` is followed by more of an expression (`2x`, `2\\pi`, `1 + ...`, `1, 2`)."""
    if _GLUED_AFTER.match(text, end):
        return True
    return _MATH_AFTER.match(text, _DECORATION.match(text, end).end()) is not None


def _continues_math_before(text: str, start: int) -> bool:
    """Whether the number starting at `start` ends an expression (`\\frac{1}{2}`, `1/2`, `x^2`, `(1, 2)`)."""
    before = text[max(0, start - _CONTEXT_CHARS):start]
    before = before[:_DECORATION_BEFORE.search(before).start()]
    return _MATH_BEFORE.search(before) is not None


def _hash_number(body: str) -> Optional[str]:
    """The number a `####` body opens with, or None when the body is an expression (`3/4`, `2\\sqrt{2}`, `1, 2`)."""
    body = _LATEX_TEXT.sub(r"\1", body)
    whole = _latex_number(body)
    if whole is not None:
        return whole
    token = _NUMBER_TOKEN.match(body)
    if token is None or _continues_math(body, token.end()):
        return None
    return normalize_number(token.group())


def _block_number(body: str) -> Optional[str]:
    """The number an `<answer>` body gives: the whole body, else its last number unless that is part of an
    expression (`<answer>\\frac{1}{2}</answer>` gives None, never 2)."""
    body = _LATEX_TEXT.sub(r"\1", body)
    whole = _latex_number(body)
    if whole is not None:
        return whole
    last = None
    for last in _NUMBER_TOKEN.finditer(body):
        pass
    if last is None or _continues_math_before(body, last.start()) or _continues_math(body, last.end()):
        return None
    return normalize_number(last.group())


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


def _strip_emphasis(text: str) -> str:
    """`text` without whitespace and markdown emphasis at either end (linear: the end is matched on the reverse)."""
    start = _EMPHASIS_RUN.match(text).end()
    end = len(text) - _EMPHASIS_RUN.match(text[::-1]).end()
    return text[start:end] if start < end else ""


# (start position, raw answer text, normalised number or None) of one answer marker
_Marker = Tuple[int, str, Optional[str]]


def _answer_markers(text: str) -> List[_Marker]:
    """Every answer marker in `text`, in no particular order."""
    markers: List[_Marker] = []
    for match in _HASH_MARKER.finditer(text):
        body = match["body"].lstrip(_MARKDOWN_EMPHASIS)
        if _NUMBER_LIKE_START.match(body) or _MATH_LIKE_START.match(body):
            markers.append((match.start(), _strip_emphasis(body), _hash_number(body)))
    if "\\boxed" in text:
        braces = _matching_braces(text)
        for match in _BOXED_MARKER.finditer(text):
            close = braces.get(match.end() - 1)
            if close is not None:  # an unclosed \boxed{ (truncated generation) is no answer
                body = text[match.end():close]
                markers.append((match.start(), body.strip(), _latex_number(body)))
    for match in _ANSWER_MARKER.finditer(text):
        markers.append((match.start(), match["body"].strip(), _block_number(match["body"])))
    return markers


def _last_marker(text: object) -> Optional[_Marker]:
    """The marker that starts last in `text` (the model's final answer), or None."""
    if not isinstance(text, str):
        return None
    markers = _answer_markers(text)
    return max(markers, key=lambda marker: marker[0]) if markers else None


def extract_answer(text: str, *, fallback_last_number: bool = False) -> Optional[str]:
    """Normalised number given by the *last* answer marker in `text`, or None.

    Markers: `#### N` (the line's text after `####` must open like a number or like maths; `#### Step 1` headings
    are ignored), `\\boxed{N}` (the whole body must be a plain number: `\\boxed{\\frac{1}{2}}` gives None) and
    `<answer>…</answer>` (the whole body, else its last number). A number that is part of an expression gives None,
    never a piece of it: `#### 2\\sqrt{2}`, `#### 3/4`, `<answer>1/2</answer>`, `<answer>(1, 2)</answer>`. The marker
    that *starts* last wins, so a `\\boxed{}` inside an `<answer>` block beats the block's loose numbers. When the
    last marker holds no plain number the result is None: an earlier marker is not consulted, because the model's
    final answer was something else (see `extract_answer_text` for that answer's text).
    With `fallback_last_number=True` and no marker at all, the last number anywhere in the text is used.
    """
    if not isinstance(text, str):
        return None
    marker = _last_marker(text)
    if marker is not None:
        return marker[2]
    return _last_number(text) if fallback_last_number else None


def extract_answer_text(text: str) -> Optional[str]:
    """Raw text of the *last* answer marker in `text` (the same marker `extract_answer` reads), or None.

    `#### …` gives the rest of the line (markdown emphasis stripped), `\\boxed{…}` its brace-balanced body and
    `<answer>…</answer>` the whole block, each stripped of surrounding whitespace; an empty answer gives None. No
    normalisation: `\\boxed{\\dfrac{1}{2}}` gives `"\\dfrac{1}{2}"` (see `normalize_math_answer`).
    """
    marker = _last_marker(text)
    return (marker[1] or None) if marker is not None else None


# ------------------------------------------------------------------------------------------- math answers
# MATH-style answers (DeepScaleR, DAPO-Math-17k golds kept verbatim by the data pipeline) compared as normalised
# strings, plus exact values for simple numeric forms. Deliberately no algebra: equal means "written the same after
# cosmetic normalisation" or "the same rational number".

_MAX_MATH_CHARS = 1000  # a longer "answer" is prose, not a final answer; never worth normalising
_MAX_NESTING = 8  # \text{\textbf{...}} unwrapping and \boxed{\boxed{...}} peeling depth; tuple nesting depth
_DOLLARS = re.compile(r"\\?\$")
_BOXED_WHOLE = re.compile(r"\\boxed\s*\{")
# Units after a value, dropped when what precedes them is a number: `12\text{ cm}`, `5\mbox{ inches}^2`.
_TRAILING_UNIT = re.compile(
    r"\\(?:text|textrm|mbox|mathrm)\s*\{\s*[A-Za-z][A-Za-z .]*\}(?:\s*\^\s*\{?\s*[23]\s*\}?)?\s*\.?\s*\Z"
)
_MATH_NOISE = re.compile(
    r"\\(?:left|right|displaystyle|q?quad)(?![A-Za-z])"  # sizing and spacing commands
    r"|\\[!,;: ]|~"  # thin spaces, ties
    r"|\^\s*(?:\{\s*\\circ\s*\}|\\circ)|\u00b0"  # degrees
    r"|\\?%"  # percent
    r"|\{,\}"  # LaTeX thousands separator 1{,}000
)
_FRAC_VARIANT = re.compile(r"\\[dt]frac(?![A-Za-z])")
_RELATION_ALIASES = {r"\leq": r"\le", r"\geq": r"\ge", r"\neq": r"\ne"}
_RELATION_ALIAS = re.compile(r"\\(?:leq|geq|neq)(?![A-Za-z])")
_ARG_COMMAND = re.compile(r"\\(frac|sqrt)(?![A-Za-z])")
_SHORT_ARG = re.compile(r"\\[A-Za-z]+|[0-9A-Za-z]")  # what `\frac12` / `\sqrt2` / `\frac\pi2` take as an argument
# Whitespace goes, except between a command and a letter (`\pi r` must not become the unknown command `\pir`).
_SPACES = re.compile(r"(\\[A-Za-z]+)\s+(?=[A-Za-z])|\s+")
_ASSIGNMENT = re.compile(r"[A-Za-z]=(?P<value>[^=]+)")  # `x=5`: one variable, one `=`
_FRACTION = re.compile(r"(?P<sign>[-+]?)\\frac\{(?P<num>[^{}]+)\}\{(?P<den>[^{}]+)\}|(?P<num2>[^/]+)/(?P<den2>[^/]+)")
_OPENERS, _CLOSERS = "([{", ")]}"
# The last inline-maths span of a prose answer (`<answer>The answer is $\frac12$.</answer>`), if it ends the answer.
_LAST_MATH_SPAN = re.compile(
    r"(?:\$\$(?P<a>[^$]+)\$\$|\$(?P<b>[^$]+)\$|\\\((?P<c>.+?)\\\)|\\\[(?P<d>.+?)\\\])[\s.!]*\Z", re.DOTALL
)


def _unbox(text: str) -> str:
    """`\\boxed{X}` spanning the whole text gives X (golds are sometimes stored boxed); anything else is kept."""
    for _ in range(_MAX_NESTING):
        opening = _BOXED_WHOLE.match(text)
        if opening is None or _matching_braces(text).get(opening.end() - 1) != len(text) - 1:
            break
        text = text[opening.end():-1].strip()
    return text


def _brace_short_arguments(text: str) -> str:
    """Braces around short arguments: `\\frac12` -> `\\frac{1}{2}`, `\\frac\\pi2` -> `\\frac{\\pi}{2}`,
    `\\sqrt[3]8` -> `\\sqrt[3]{8}`.

    One pass: every `\\frac`/`\\sqrt` records where braces go around its unbraced single-token arguments (a braced
    argument is skipped with the precomputed brace map, so nested commands are handled by their own visit).
    """
    if "\\frac" not in text and "\\sqrt" not in text:
        return text
    braces = _matching_braces(text)
    inserts: List[Tuple[int, str]] = []
    for command in _ARG_COMMAND.finditer(text):
        position = command.end()
        if command.group(1) == "sqrt":
            while position < len(text) and text[position].isspace():
                position += 1
            if text.startswith("[", position):
                close = text.find("]", position)
                if close < 0:
                    continue
                position = close + 1
        for _ in range(2 if command.group(1) == "frac" else 1):
            while position < len(text) and text[position].isspace():
                position += 1
            if text.startswith("{", position):
                if position not in braces:
                    break
                position = braces[position] + 1
                continue
            argument = _SHORT_ARG.match(text, position)
            if argument is None:
                break
            inserts += [(argument.start(), "{"), (argument.end(), "}")]
            position = argument.end()
    if not inserts:
        return text
    pieces, previous = [], 0
    for position, brace in sorted(inserts, key=lambda insert: insert[0]):  # stable: `}{` between two arguments
        pieces += [text[previous:position], brace]
        previous = position
    pieces.append(text[previous:])
    return "".join(pieces)


@functools.lru_cache(maxsize=4096)  # golds repeat once per generation in a group
def _normalise_math(text: str) -> str:
    """`_normalise_step` until nothing changes (`x = \\boxed{5}` needs two rounds), so the result maps to itself."""
    for _ in range(_MAX_NESTING):
        normal = _normalise_step(text)
        if normal == text:
            break
        text = normal
    return text


def _normalise_step(text: str, strip_units: bool = True) -> str:
    text = _unbox(_DOLLARS.sub("", text.translate(_MINUS_SIGNS)).strip())
    if strip_units:
        unit = _TRAILING_UNIT.search(text)
        if unit is not None and unit.start() > 0:
            value = _normalise_step(text[:unit.start()], strip_units=False)
            if _exact_value(value) is not None:
                return value
    for _ in range(_MAX_NESTING):
        unwrapped = _LATEX_TEXT.sub(r"\1", text)
        if unwrapped == text:
            break
        text = unwrapped
    text = _MATH_NOISE.sub("", text)
    text = _FRAC_VARIANT.sub(r"\\frac", text)
    text = _RELATION_ALIAS.sub(lambda alias: _RELATION_ALIASES[alias.group()], text)
    text = _brace_short_arguments(text)
    text = _SPACES.sub(lambda space: space.group(1) + " " if space.group(1) else "", text)
    text = text.rstrip(".")
    assignment = _ASSIGNMENT.fullmatch(text)
    return assignment["value"] if assignment else text


def normalize_math_answer(text: Union[str, int, float, Decimal, None]) -> Optional[str]:
    """Canonical string for a MATH-style answer, or None when `text` is not a string/number or normalises to "".

    Removes `$`, `\\left`/`\\right`, `\\displaystyle`, LaTeX spacing (`\\!`, `\\,`, `\\;`, `\\:`, `\\quad`, `~`), all
    whitespace (except between a command and a letter: `\\pi r`), a trailing `.`, degrees (`^\\circ`, `°`), `%`/`\\%`
    and `{,}`; unwraps `\\text`/`\\textbf`/`\\textrm`/`\\mathrm`/`\\mathbf`/`\\mbox` and a `\\boxed{}` around the whole
    answer; `\\dfrac`/`\\tfrac` -> `\\frac`, `\\frac12` -> `\\frac{1}{2}`, `\\sqrt2` -> `\\sqrt{2}`,
    `\\leq` -> `\\le`; drops units after a number (`12\\text{ cm}` -> `12`) and a leading single-variable assignment
    (`x = 5` -> `5`).
    The output maps to itself, so normalising twice is harmless.
    """
    if isinstance(text, (numbers.Real, Decimal)) and not isinstance(text, (bool, np.bool_)):
        text = str(text)
    if not isinstance(text, str) or len(text) > _MAX_MATH_CHARS:
        return None
    return _normalise_math(text) or None


def _exact_value(normal: str) -> Optional[Fraction]:
    """Exact value of a normalised plain number, `a/b` or `\\frac{a}{b}` (a, b plain numbers), else None."""
    plain = normalize_number(normal)
    if plain is not None:
        return Fraction(plain)
    fraction = _FRACTION.fullmatch(normal)
    if fraction is None:
        return None
    numerator = normalize_number(fraction["num"] or fraction["num2"])
    denominator = normalize_number(fraction["den"] or fraction["den2"])
    if numerator is None or denominator is None or denominator == "0":
        return None
    value = Fraction(numerator) / Fraction(denominator)
    return -value if fraction["sign"] == "-" else value


def _split_sequence(normal: str) -> Optional[Tuple[str, List[str], str]]:
    """(opening bracket, elements, closing bracket) of a tuple/interval `(a,b]` or bare list `a,b`, else None."""
    opening = closing = ""
    body = normal
    if len(normal) >= 2 and normal[0] in "([" and normal[-1] in ")]":
        depth = 0
        for index, char in enumerate(normal):
            depth += (char in _OPENERS) - (char in _CLOSERS)
            if depth <= 0 and index < len(normal) - 1:
                break  # `(1,2)+(3,4)`: the first bracket closes early, so this is no single tuple
        else:
            opening, closing, body = normal[0], normal[-1], normal[1:-1]
    elements, depth, start = [], 0, 0
    for index, char in enumerate(body):
        depth += (char in _OPENERS) - (char in _CLOSERS)
        if depth < 0:
            return None
        if char == "," and depth == 0:
            elements.append(body[start:index])
            start = index + 1
    elements.append(body[start:])
    return (opening, elements, closing) if len(elements) >= 2 else None


def _same_math(first: str, second: str, depth: int = 0) -> bool:
    """Whether two normalised answers are equal (symmetric by construction)."""
    if not first or not second:
        return False
    if first == second:
        return True
    first_value, second_value = _exact_value(first), _exact_value(second)
    if first_value is not None or second_value is not None:
        return first_value == second_value  # a number never equals an expression: `\sqrt{2}` is not 2
    first_items, second_items = _split_sequence(first), _split_sequence(second)
    if first_items is None or second_items is None or depth >= _MAX_NESTING:
        return False
    (first_open, first_elements, first_close), (second_open, second_elements, second_close) = first_items, second_items
    return (
        first_open == second_open
        and first_close == second_close
        and len(first_elements) == len(second_elements)
        and all(_same_math(a, b, depth + 1) for a, b in zip(first_elements, second_elements))
    )


def math_answers_equal(first: Union[str, int, float, Decimal], second: Union[str, int, float, Decimal]) -> bool:
    """Whether two final answers are the same after `normalize_math_answer`; symmetric, never raises.

    Equal normalised strings match; simple numeric forms (`0.5`, `1/2`, `\\frac{2}{4}`, `-\\frac{3}{4}`, `-3/4`)
    match by exact `Fraction` value, and a number never matches a non-number (`\\sqrt{2}` vs `2`); tuples,
    intervals and comma lists match element-wise in order with the same brackets (`(1, 2)` vs `\\left(1,2\\right)`,
    not `[1, 2]`). No algebra: `x+1` vs `1+x`, `\\frac{\\sqrt{2}}{2}` vs `\\frac{1}{\\sqrt{2}}` and `0.\\overline{3}`
    vs `\\frac13` do not match. Empty answers match nothing, not even each other.
    """
    first_normal, second_normal = normalize_math_answer(first), normalize_math_answer(second)
    if first_normal is None or second_normal is None:
        return False
    return _same_math(first_normal, second_normal)


def _answer_candidates(answer: str) -> List[str]:
    """The raw answer, plus the inline-maths span a prose answer ends with (`The answer is $\\frac12$.`)."""
    tail = answer[-_MAX_MATH_CHARS:]  # the span must end the answer; bounding the search keeps it cheap
    span = _LAST_MATH_SPAN.search(tail) if "$" in tail or "\\(" in tail or "\\[" in tail else None
    if span is None or (span.start() == 0 and len(tail) == len(answer)):
        return [answer]
    return [answer, span["a"] or span["b"] or span["c"] or span["d"]]


Verifier = Callable[..., float]
VERIFIERS: Dict[str, Verifier] = {}
# Verifiers that check format only; `RewardScorer(gate_accuracy_on_format=True)` uses them as the gate.
FORMAT_VERIFIERS: Set[Verifier] = set()
# Set to True on verifiers called once per batch, TRL style (see `batch_verifier`). An attribute of the function, not
# a registry entry: a `package.module:function` spec marks itself when its module is imported.
BATCH_MARK = "mindgrpo_batch_verifier"


class VerifierSpecError(ValueError):
    """A verifier name or `package.module:function` spec that cannot be used (bad config, not a bad completion)."""


class VerifierError(RuntimeError):
    """A verifier that is broken, not unlucky: it failed on every completion of a batch, or (a batch verifier) did
    not return one number per completion. Rewards of 0 from it would train the policy on nothing, silently, so the
    trainer stops with this error before the update (`GRPOTrainer.train` lets it through unchanged)."""


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
    return 1.0 if any(math_answers_equal(candidate, gold_text) for candidate in _answer_candidates(answer)) else 0.0


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


# Shows what a verifier returned in warnings and errors, shortened (a verifier may return a whole document).
_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxstring, _SHORT_REPR.maxother = 80, 160


# How several verifiers' scores become the reward the advantages are computed from (reward_config.aggregation),
# TRL's `multi_objective_aggregation`. The one list of choices: mindgrpo.config's CHOICES reads it from here.
AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")
# Added to each group's std by `normalize_then_sum`: TRL's 1e-4, the same as mindgrpo.algorithm.advantages'
# DEFAULT_STD_EPS (not imported: that module loads MindSpore, and rewards must not).
GROUP_STD_EPS = 1e-4


def group_normalize(scores: np.ndarray, group_size: int, eps: float = GROUP_STD_EPS) -> np.ndarray:
    """`(r - group mean) / (group std + eps)` over consecutive groups of `group_size` scores, float64 [N].

    The std is the unbiased one (TRL's `nanstd`); a group of one has no spread and gives 0, as in TRL."""
    grouped = np.asarray(scores, np.float64).reshape(-1, group_size)
    centered = grouped - grouped.mean(axis=1, keepdims=True)
    if group_size == 1:
        return centered.reshape(-1)
    std = np.sqrt((centered * centered).sum(axis=1, keepdims=True) / (group_size - 1))
    return (centered / (std + eps)).reshape(-1)


@dataclass
class RewardBatch:
    """Rewards for one batch of completions."""

    total: np.ndarray  # float32 [N]: weighted sum of verifier scores (or gated, see RewardScorer); what is logged
    per_verifier: Dict[str, np.ndarray]  # float32 [N] raw score of each configured verifier, keyed by its config name
    failures: Dict[str, int]  # per verifier: completions on which it raised, timed out or returned NaN/inf/a non-number
    timeouts: Dict[str, int]  # per verifier: completions whose call exceeded the time limit (also in failures)
    aggregated: np.ndarray  # float32 [N]: what the advantages are computed from (`total` unless normalize_then_sum)


@dataclass
class _Tally:
    """One verifier's results over a batch, as they come in."""

    scores: np.ndarray
    failed: int = 0
    timed_out: int = 0
    first: str = ""  # the first failure, e.g. "raised ValueError: bad on completion 3"
    cause: Optional[BaseException] = None


class RewardScorer:
    """Scores completions with the verifiers named in `reward_config.verifier_function`.

    Total reward per completion (`RewardBatch.total`, the logged reward):
    - default: `sum_v weight_v * score_v`;
    - `gate_accuracy_on_format=True`: `gate * sum_{v not format} weight_v * score_v`, where `gate` is 1 when every
      format verifier in the list (`format_reward`, `hash_format_reward` or any registered with `is_format=True`)
      scored exactly 1.0 on that completion, else 0. Format verifiers then add nothing themselves (their weights are
      unused): accuracy is multiplied by format instead of added to it, so a well-formatted wrong answer earns 0.

    `aggregation` (TRL's `multi_objective_aggregation`) says what the advantages are computed from
    (`RewardBatch.aggregated`): `sum_then_normalize` the total above; `normalize_then_sum` (GDPO) the weighted sum of
    each verifier's scores normalised within its group of `group_size` consecutive completions (`group_normalize`),
    so a verifier with a wide range cannot drown out the others.

    `fallback_last_number` is passed to every verifier as a keyword (accuracy_reward honours it; others ignore it).

    With `verifier_timeout > 0` or `verifier_parallel > 0` the verifiers run in `max(1, verifier_parallel)` worker
    processes (`mindgrpo.rewards.workers`), which must be able to import each verifier by name; a call that takes
    longer than `verifier_timeout` seconds is cut, scores 0 and is counted in `RewardBatch.timeouts` and `failures`.
    Call :meth:`close` (or use the scorer as a context manager) to stop the workers early; they also stop when the
    scorer is garbage collected or the process exits.
    """

    def __init__(
        self,
        verifier_function: Union[str, Sequence[str]],
        verifier_weight: Optional[Sequence[float]] = None,
        *,
        gate_accuracy_on_format: bool = False,
        fallback_last_number: bool = False,
        aggregation: str = "sum_then_normalize",
        group_size: int = 1,
        verifier_timeout: float = 0.0,
        verifier_parallel: int = 0,
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
        self.batched = {name for name, fn in self.functions.items() if getattr(fn, BATCH_MARK, False) is True}
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
        self.aggregation, self.group_size = self._check_aggregation(aggregation, group_size)
        self.verifier_timeout, processes = self._check_workers(verifier_timeout, verifier_parallel)
        self._pool: Optional[WorkerPool] = None
        if processes:
            for index, (name, fn) in enumerate(self.functions.items()):
                _check_sendable(name, fn, index)
            self._pool = WorkerPool(self.functions, processes, timeout=self.verifier_timeout)
        self._warned: Set[Tuple[str, bool]] = set()

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

    def _check_aggregation(self, aggregation: str, group_size: int) -> Tuple[str, int]:
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"reward_config.aggregation = {aggregation!r}: choose one of {', '.join(AGGREGATIONS)}")
        if aggregation == "normalize_then_sum" and self.gate_accuracy_on_format:
            raise ValueError(
                "reward_config.aggregation = normalize_then_sum normalises each verifier on its own, and "
                "reward_config.gate_accuracy_on_format multiplies accuracy by format: choose one of them"
            )
        if isinstance(group_size, bool) or not isinstance(group_size, numbers.Integral) or group_size < 1:
            raise ValueError(f"RewardScorer group_size = {group_size!r}: must be a whole number >= 1 (the "
                             "completions per prompt, rl_config.num_generations)")
        return aggregation, int(group_size)

    @staticmethod
    def _check_workers(verifier_timeout: float, verifier_parallel: int) -> Tuple[float, int]:
        """(timeout, worker processes to start: 0 runs the verifiers in this process)."""
        timeout = _as_score(verifier_timeout) if not isinstance(verifier_timeout, bool) else None
        if timeout is None or timeout < 0:
            raise ValueError(f"reward_config.verifier_timeout = {verifier_timeout!r}: must be a finite number of "
                             "seconds >= 0 (0: no time limit)")
        if isinstance(verifier_parallel, bool) or not isinstance(verifier_parallel, numbers.Integral) \
                or verifier_parallel < 0:
            raise ValueError(f"reward_config.verifier_parallel = {verifier_parallel!r}: must be a whole number >= 0 "
                             "(0: verifiers run in the trainer's process)")
        workers = int(verifier_parallel) or (1 if timeout > 0 else 0)  # a time limit needs a process to kill
        return timeout, workers

    def close(self) -> None:
        """Stop the worker processes, if any (a later `score` starts them again)."""
        if self._pool is not None:
            self._pool.close()

    def __enter__(self) -> "RewardScorer":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def score(self, completions: Sequence[str], golds: Sequence[str], **context_lists: Sequence[object]) -> RewardBatch:
        """Score each completion against its gold answer; `context_lists` (e.g. `prompt=[...]`) are per-completion.

        Raises VerifierError when a verifier failed on every completion (and there was at least one), or when a
        batch verifier returned anything but one number per completion."""
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
        if self.aggregation == "normalize_then_sum" and count % self.group_size:
            raise ValueError(f"RewardScorer.score got {count} completions, not whole groups of {self.group_size} "
                             "(reward_config.aggregation = normalize_then_sum normalises within each group)")
        tallies = {name: _Tally(np.zeros(count, dtype=np.float32)) for name in self.functions}
        calls = self._calls(completions, golds, context_lists)
        for (name, index, _, _), outcome in zip(calls, self._run(calls)):
            if index is None:
                self._take_batch(name, tallies[name], outcome, count)
            else:
                self._take(name, tallies[name], index, outcome)
        for name, tally in tallies.items():
            if count and tally.failed == count:
                hint = (" Raise reward_config.verifier_timeout or make the verifier faster." if tally.timed_out
                        else " Fix the verifier, or remove it from reward_config.verifier_function.")
                raise VerifierError(
                    f"verifier {name!r} failed on all {count} completions of this batch, so every reward it gave "
                    f"would be 0: that is a bug, not noise, and the run stops before the update. First failure: "
                    f"{tally.first}.{hint}"
                ) from tally.cause
        per_verifier = {name: tally.scores for name, tally in tallies.items()}
        total = self._total(per_verifier, count)
        return RewardBatch(total, per_verifier, {name: t.failed for name, t in tallies.items()},
                           {name: t.timed_out for name, t in tallies.items()}, self._aggregated(per_verifier, total))

    def _calls(self, completions: Sequence[str], golds: Sequence[str],
               context_lists: Mapping[str, Sequence[object]]) -> List[Tuple[str, Optional[int], tuple, dict]]:
        """Every verifier call of a batch: (verifier, completion index or None for a batch call, args, kwargs)."""
        calls: List[Tuple[str, Optional[int], tuple, dict]] = []
        for name in self.functions:
            if name in self.batched:
                context = {key: list(values) for key, values in context_lists.items()}
                calls.append((name, None, (list(completions), list(golds)),
                              {"fallback_last_number": self.fallback_last_number, **context}))
                continue
            for index, (completion, gold) in enumerate(zip(completions, golds)):
                context = {key: values[index] for key, values in context_lists.items()}
                calls.append((name, index, (completion, gold),
                              {"fallback_last_number": self.fallback_last_number, **context}))
        return calls

    def _run(self, calls: List[Tuple[str, Optional[int], tuple, dict]]) -> List[CallOutcome]:
        if self._pool is None:
            return [_call_here(self.functions[name], args, kwargs) for name, _, args, kwargs in calls]
        try:
            return self._pool.run([(name, args, kwargs) for name, _, args, kwargs in calls])
        except WorkerStartError as exc:
            raise VerifierError(f"the verifier workers (reward_config.verifier_parallel / verifier_timeout) could "
                                f"not start: {exc}") from exc

    def _problem(self, outcome: CallOutcome) -> str:
        if outcome.timed_out:
            return f"exceeded reward_config.verifier_timeout = {self.verifier_timeout:g} s"
        return outcome.error

    def _take(self, name: str, tally: _Tally, index: int, outcome: CallOutcome) -> None:
        """One per-completion call's outcome: a score, or a counted failure."""
        if not outcome.error and not outcome.timed_out:
            score = _as_score(outcome.value)
            if score is not None:
                tally.scores[index] = score
                return
            problem = f"returned {_SHORT_REPR.repr(outcome.value)} (not a finite number)"
        else:
            problem = self._problem(outcome)
        self._fail(name, tally, f"{problem} on completion {index}", outcome)

    def _take_batch(self, name: str, tally: _Tally, outcome: CallOutcome, count: int) -> None:
        """A batch verifier's outcome: one number per completion, or VerifierError."""
        if outcome.error or outcome.timed_out:  # no score for any completion
            for _ in range(count):
                self._fail(name, tally, f"{self._problem(outcome)} on the whole batch", outcome)
            return
        values = outcome.value
        if not isinstance(values, (list, tuple)) and not (isinstance(values, np.ndarray) and values.ndim == 1):
            shown = (f"an array of shape {values.shape}" if isinstance(values, np.ndarray)
                     else f"{_SHORT_REPR.repr(values)} ({type(values).__name__})")
            raise VerifierError(f"batch verifier {name!r} returned {shown}; it must return a list of {count} "
                                "numbers, one per completion")
        if len(values) != count:
            raise VerifierError(f"batch verifier {name!r} returned {len(values)} scores for {count} completions; it "
                                "must return one number per completion, in the order given")
        for index, value in enumerate(values):
            if not isinstance(value, (numbers.Real, np.bool_)):
                raise VerifierError(
                    f"batch verifier {name!r} returned {_SHORT_REPR.repr(value)} ({type(value).__name__}) for "
                    f"completion {index}, not a number; return a float for every completion (None, TRL's 'does not "
                    "apply', is not supported: return 0.0)")
            score = _as_score(value)
            if score is None:
                self._fail(name, tally, f"returned {value!r} (not a finite number) on completion {index}", outcome)
            else:
                tally.scores[index] = score

    def _fail(self, name: str, tally: _Tally, problem: str, outcome: CallOutcome) -> None:
        tally.failed += 1
        tally.timed_out += outcome.timed_out
        if not tally.first:
            tally.first, tally.cause = problem, outcome.exception
        # Counts go to RewardBatch.failures every step; the log only needs the first example (of a failure, and of a
        # timeout) to debug from.
        if (name, outcome.timed_out) not in self._warned:
            self._warned.add((name, outcome.timed_out))
            _log.warning("verifier %r %s; such completions score 0 and are counted in RewardBatch.%s (further "
                         "ones are not logged)", name, problem,
                         "timeouts and failures" if outcome.timed_out else "failures")

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

    def _aggregated(self, per_verifier: Mapping[str, np.ndarray], total: np.ndarray) -> np.ndarray:
        if self.aggregation == "sum_then_normalize":
            return total
        summed = np.zeros(len(total), dtype=np.float64)
        for name, scores in per_verifier.items():
            summed += self.weights[name] * group_normalize(scores, self.group_size)
        return summed.astype(np.float32)


def _call_here(fn: Verifier, args: tuple, kwargs: dict) -> CallOutcome:
    """A verifier call in this process."""
    try:
        return CallOutcome(value=fn(*args, **kwargs))
    except Exception as exc:  # one bad completion (or verifier bug) must not stop training; it is counted
        return CallOutcome(error=f"raised {type(exc).__name__}: {exc}", exception=exc)


def _check_sendable(name: str, fn: Verifier, index: int) -> None:
    """Refuse, at config time, a verifier a worker process could not import by name."""
    problem = ""
    if getattr(fn, "__module__", type(fn).__module__) == "__main__":
        problem = "it is defined in the __main__ script or a notebook, which workers do not run"
    else:
        try:
            pickle.loads(pickle.dumps(fn))
        except Exception as exc:
            problem = f"{type(exc).__name__}: {exc}"
    if problem:
        raise VerifierSpecError(
            f"reward_config.verifier_function[{index}] {name!r} must run in a worker process "
            f"(reward_config.verifier_timeout or verifier_parallel is set), and workers import verifiers by name, "
            f"but it cannot be sent to one ({problem}). Define it at the top level of a module on PYTHONPATH, or "
            "set verifier_timeout: 0 and verifier_parallel: 0 to run it in the trainer's process"
        )
