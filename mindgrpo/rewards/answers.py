"""The model's final answer: finding it in a completion and comparing it with the gold answer.

Pure Python on purpose (rewards run on the host between rollout and the policy update; the data pipeline normalises
gold answers with the same `normalize_number`).

- `normalize_number` gives every numeric answer one canonical string, so gold answers (stored normalised by the data
  pipeline) and answers extracted from completions compare with `==`.
- `extract_answer` finds the model's final answer (`#### N`, `\\boxed{N}` or `<answer>…</answer>`) as a number;
  `extract_answer_text` gives the same marker's raw text, for answers that are not plain numbers (`\\frac{1}{2}`,
  `(1, 2)`, `\\text{east}`).
- `math_answers_equal` compares two such answers after `normalize_math_answer` (LaTeX spacing, `\\dfrac`, `\\text`,
  degrees/percent, `x =` dropped), with exact `Fraction` values for simple numeric forms and element-wise tuples. Pure
  Python and conservative: it never evaluates expressions, so `1+x` and `x+1` differ, but `1/2` never equals `2`.
"""
from __future__ import annotations

import functools
import numbers
import re
from decimal import Context, Decimal, InvalidOperation, localcontext
from fractions import Fraction
from typing import Dict, List, Optional, Tuple, Union

import numpy as np

# A plausible answer has at most this many digits before or after the point; beyond it `1e999999` would expand
# into a megabyte-long string (and Decimal itself gives up on larger exponents).
_MAX_EXPONENT = 100

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
MARKDOWN_EMPHASIS = "*_` \t"  # around answers and `####` lines, e.g. `#### **72**`
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


def _number_as_text(value: object) -> object:
    """A number as its string (datasets sometimes store gold answers as numbers; a bool is no answer), else `value`."""
    if isinstance(value, (numbers.Real, Decimal)) and not isinstance(value, (bool, np.bool_)):
        return str(value)
    return value


def normalize_number(text: Union[str, int, float, Decimal, None]) -> Optional[str]:
    """Canonical string for a numeric answer, or None when `text` is not a plain finite number.

    `72`, `72.0`, `72.00`, `$72`, `72.`, `+72` all give `"72"`; `1,000` and `1000` give `"1000"`; `-0` gives `"0"`;
    `1e3` gives `"1000"` and `1.50` gives `"1.5"` (never scientific notation). Accepted decoration: surrounding
    whitespace, one currency sign, one sign (before or after the currency), a trailing `%` and a trailing period.
    Commas must be thousands separators (`1,5` -> None), digits must be ASCII, and |exponent| > 100, inf and nan give
    None. ints/floats/Decimals are accepted too (datasets sometimes store gold answers as numbers); bools are not.
    The output is itself accepted and maps to itself, so normalising twice is harmless.
    """
    text = _number_as_text(text)
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


def _last_number_token(text: str) -> Optional[re.Match]:
    """The last number token in `text`, or None."""
    last = None
    for last in _NUMBER_TOKEN.finditer(text):
        pass
    return last


def _last_number(text: str) -> Optional[str]:
    """Normalised last number token in prose, or None."""
    last = _last_number_token(text)
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
    last = _last_number_token(body)
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
        body = match["body"].lstrip(MARKDOWN_EMPHASIS)
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
    text = _number_as_text(text)
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


def answer_candidates(answer: str) -> List[str]:
    """Texts to compare with a gold answer: the raw answer, plus the inline-maths span a prose answer ends with
    (`The answer is $\\frac12$.`)."""
    tail = answer[-_MAX_MATH_CHARS:]  # the span must end the answer; bounding the search keeps it cheap
    span = _LAST_MATH_SPAN.search(tail) if "$" in tail or "\\(" in tail or "\\[" in tail else None
    if span is None or (span.start() == 0 and len(tail) == len(answer)):
        return [answer]
    return [answer, span["a"] or span["b"] or span["c"] or span["d"]]

