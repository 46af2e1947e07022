"""Tests for mindgrpo.rewards: number normalisation, answer extraction, math answers, verifiers, registry, scorer
(broken, hanging and batch verifiers, worker processes, aggregation of several verifiers)."""
import logging
import math
import sys
import textwrap
import time
import types
import uuid
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mindgrpo  # noqa: F401  (must precede any MindSpore import; rewards itself imports none)
from mindgrpo.rewards import verifiers
from mindgrpo.rewards import (
    RewardScorer,
    VerifierError,
    VerifierSpecError,
    accuracy_reward,
    extract_answer,
    extract_answer_text,
    format_reward,
    hash_format_reward,
    math_answers_equal,
    normalize_math_answer,
    normalize_number,
    register_verifier,
    resolve_verifier,
)

FAST = settings(max_examples=200, deadline=None)


@pytest.fixture
def registry(monkeypatch):
    """A private copy of the verifier registry, so tests can register functions without leaking them."""
    monkeypatch.setattr(verifiers, "VERIFIERS", dict(verifiers.VERIFIERS))
    monkeypatch.setattr(verifiers, "FORMAT_VERIFIERS", set(verifiers.FORMAT_VERIFIERS))
    return verifiers.VERIFIERS


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """Write a module with the given source under tmp_path, importable under a unique name; returns that name."""
    created = []

    def write(source: str) -> str:
        name = f"user_verifiers_{uuid.uuid4().hex[:8]}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        created.append(name)
        return name

    monkeypatch.syspath_prepend(str(tmp_path))
    yield write
    for name in created:
        sys.modules.pop(name, None)


# ----------------------------------------------------------------------------------------------- normalize_number

@pytest.mark.parametrize(
    "raw, expected",
    [
        ("72", "72"), ("72.0", "72"), ("72.00", "72"), ("$72", "72"), ("72.", "72"), (" +72 ", "72"),
        ("1,000", "1000"), ("1000", "1000"), ("$1,234,567.890", "1234567.89"), ("1.50", "1.5"), (".5", "0.5"),
        ("-3.25", "-3.25"), ("\u22125", "-5"), ("$-5", "-5"), ("-$5", "-5"), ("- 5", "-5"), ("50%", "50"),
        ("-0", "0"), ("-0.0", "0"), ("0.000", "0"), ("+0", "0"), ("0e5", "0"),
        ("1e3", "1000"), ("1E-3", "0.001"), ("2.5e2", "250"), ("-1e0", "-1"),
        ("12345678901234567890123456789012345", "12345678901234567890123456789012345"),  # no rounding at 28 digits
        (72, "72"), (72.0, "72"), (-0.0, "0"), (Decimal("72.50"), "72.5"), (np.float32(2.5), "2.5"),
    ],
)
def test_normalize_number_canonical_forms(raw, expected):
    assert normalize_number(raw) == expected


@pytest.mark.parametrize(
    "raw",
    [
        "", "   ", "abc", "-", "$", ".", "nan", "NaN", "inf", "-Infinity", "sNaN", "1e100000",
        "1e99999999999999999999999", "1,2", "1,00", "12,34,567", "1 000", "1_000", "\u0667\u0662", "1/2", "3-5",
        "--5", "-$-5", "1.2.3", "72 apples", None, True, float("nan"), float("inf"), ["72"],
    ],
)
def test_normalize_number_rejects_non_numbers(raw):
    assert normalize_number(raw) is None


@FAST
@given(st.integers(min_value=-10**15, max_value=10**15), st.integers(min_value=0, max_value=4))
def test_normalize_number_matches_int_formatting(value, zeros):
    """Thousands separators, trailing zero decimals and `$` never change an integer's canonical form."""
    assert normalize_number(f"{value:,}") == str(value)
    assert normalize_number(f"{value}." + "0" * zeros) == str(value)
    assert normalize_number(f"${value}" if value >= 0 else f"-${-value}") == str(value)


@FAST
@given(st.decimals(min_value=-10**9, max_value=10**9, places=6, allow_nan=False, allow_infinity=False))
def test_normalize_number_preserves_value(value):
    normal = normalize_number(str(value))
    assert normal is not None and "e" not in normal.lower()
    assert Decimal(normal) == value


# --------------------------------------------------------------------------------------------------- extraction

@pytest.mark.parametrize(
    "text, expected",
    [
        ("so 8 * 9 = 72\n#### 72", "72"),
        ("#### 72.00", "72"),
        ("#### $72", "72"),
        ("#### 1,000", "1000"),
        ("#### 1000.", "1000"),
        ("#### -5", "-5"),
        ("#### 0.25", "0.25"),
        ("####72", "72"),
        ("#### **42**", "42"),
        ("#### 72 apples", "72"),
        ("The area is \\boxed{72}.", "72"),
        ("\\boxed{ 1{,}000 }", "1000"),
        ("\\boxed{\\$72.50}", "72.5"),
        ("\\boxed{-3}", "-3"),
        ("\\boxed{\\text{72}}", "72"),
        ("\\boxed{\\frac{1}{2}}", None),  # nested braces: found, but not a plain number
        ("\\boxed{x+1}", None),
        ("<answer>42</answer>", "42"),
        ("<answer>First 3 then 4, so 12</answer>", "12"),  # several numbers: the last one
        ("<answer>\n$1,234.50\n</answer>", "1234.5"),
        ("<answer>seventy-two</answer>", None),
        ("#### 5\n<answer>6</answer>", "6"),  # last marker wins ...
        ("<answer>6</answer>\n#### 5", "5"),
        ("\\boxed{1} then \\boxed{2}", "2"),
        ("#### 9\nno wait \\boxed{10}", "10"),
        ("\\boxed{10} #### 9", "9"),
        ("<answer>\\boxed{\\frac{1}{2}}</answer>", None),  # ... and a boxed answer inside <answer> is the last marker
        ("#### 3/4", None),  # a fraction is not a plain number, and the last marker is authoritative
        ("#### 7\n\\boxed{\\frac{1}{2}}", None),
        ("#### Step 1: add\n#### 12", "12"),  # markdown headings are not markers
        ("The answer is 72.", None),  # no marker, no fallback
        ("", None),
        ("\\boxed{7", None),  # truncated boxed answer is no marker
        # a number that is part of an expression is not the answer (never a piece of it)
        ("#### 2\\sqrt{2}", None),
        ("#### 2^{10}", None),
        ("#### 1 + \\sqrt{2}", None),
        ("#### 1, 2", None),
        ("#### 2x", None),
        ("#### 1e3", "1000"),
        ("#### 72 \\text{ dollars}", "72"),
        ("#### 50\\%", "50"),
        ("#### 12cm", "12"),  # a unit word, not a variable
        ("<answer>1/2</answer>", None),
        ("<answer>\\frac{1}{2}</answer>", None),
        ("<answer>\\sqrt{2}</answer>", None),
        ("<answer>(1, 2)</answer>", None),
        ("<answer>x^2+1</answer>", None),
        ("<answer>3 \\cdot 4</answer>", None),
        ("<answer>**12**</answer>", "12"),
        ("<answer>3 + 4 = 7</answer>", "7"),
        ("<answer>x = 5</answer>", "5"),
        # `####` bodies that open like maths are markers too, so they end the answer as the last marker
        ("#### 5\n#### x^2", None),
        ("#### 5\n#### \\frac{1}{2}", None),
        ("#### 5\n#### Final answer", "5"),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The answer is 72.", "72"),
        ("I spent $1,000 and then -3.5 more", "-3.5"),
        ("x2 and 3.5", "3.5"),
        ("the numbers 1,2,3", None),  # ambiguous comma list: no number
        ("step 1 ... version 1.2.3", "1"),
        ("no digits here", None),
        ("#### Step 1: think", "1"),  # heading is no marker, so the fallback applies
        ("\\boxed{7", "7"),
        ("#### 72\nand later 99", "72"),  # a marker exists: the fallback is not used
        ("\\boxed{\\frac{1}{2}}", None),  # marker without a plain number: still no fallback
    ],
)
def test_extract_answer_fallback_last_number(text, expected):
    assert extract_answer(text, fallback_last_number=True) == expected
    if expected is not None and "####" not in text:
        assert extract_answer(text) is None  # only the fallback found it


def test_extract_answer_non_string_is_none():
    assert extract_answer(None) is None  # type: ignore[arg-type]
    assert extract_answer_text(None) is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("#### 72", "72"),
        ("#### **72 apples**", "72 apples"),
        ("so\n####  \\frac{1}{2}.  \nthanks", "\\frac{1}{2}."),
        ("#### -\\frac{3}{4}", "-\\frac{3}{4}"),
        ("#### x = 5", "x = 5"),
        ("#### (1, 2)\r", "(1, 2)"),
        ("#### $\\sqrt{2}$", "$\\sqrt{2}$"),
        ("#### Step 1: add", None),  # heading, not a marker
        ("The area is \\boxed{\\frac{\\sqrt{3}}{2}} square units.", "\\frac{\\sqrt{3}}{2}"),
        ("\\boxed{ \\text{east} }", "\\text{east}"),
        ("\\boxed{\\boxed{5}}", "5"),  # the inner box starts last
        ("<answer>\n(1, 2)\n</answer>", "(1, 2)"),
        ("<answer>The answer is $x^2+1$.</answer>", "The answer is $x^2+1$."),
        ("<answer>\\boxed{3/4}</answer>", "3/4"),
        ("\\boxed{1} then #### \\pi", "\\pi"),
        ("\\boxed{\\frac{1}{2}", None),  # unclosed
        ("\\boxed{}", None),  # empty answer
        ("<answer>  </answer>", None),
        ("no marker \\frac{1}{2}", None),
        ("", None),
    ],
)
def test_extract_answer_text(text, expected):
    assert extract_answer_text(text) == expected


def test_extract_answer_text_reads_the_marker_extract_answer_reads():
    for text in ["#### 72 apples", "\\boxed{1{,}000}", "<answer>so 12</answer>", "#### 1\n\\boxed{2}"]:
        assert normalize_number(extract_answer(text)) is not None and extract_answer_text(text) is not None
    assert extract_answer("\\boxed{2}\n#### x^2") is None and extract_answer_text("\\boxed{2}\n#### x^2") == "x^2"


# ---------------------------------------------------------------------------------------------------- verifiers

@pytest.mark.parametrize(
    "completion, gold, expected",
    [
        ("#### 72", "72", 1.0),
        ("#### 72.00", "$72", 1.0),
        ("\\boxed{1000}", "1,000", 1.0),
        ("<answer>1,000</answer>", "1000", 1.0),
        ("#### 71", "72", 0.0),
        ("The answer is 72", "72", 0.0),  # needs a marker unless fallback is on
        ("#### -5", "5", 0.0),
        ("<answer>0.5</answer>", ".50", 1.0),
        ("#### 72", 72, 1.0),  # numeric gold straight from a dataframe
    ],
)
def test_accuracy_reward(completion, gold, expected):
    assert accuracy_reward(completion, gold, prompt="ignored", question="ignored", unknown=1) == expected


def test_accuracy_reward_fallback_and_missing_answers():
    assert accuracy_reward("The answer is 72", "72", fallback_last_number=True) == 1.0
    # Nothing matches a missing or empty answer, in particular not a non-numeric or empty gold.
    assert accuracy_reward("no answer at all", "seventy") == 0.0
    assert accuracy_reward("no answer at all", "") == 0.0
    assert accuracy_reward("\\boxed{}", "") == 0.0
    assert accuracy_reward("<answer> $ </answer>", "\\,") == 0.0
    # the fallback is for numeric golds: loose prose never matches a MATH-style gold
    assert accuracy_reward("so it is \\frac{1}{2}", "\\frac{1}{2}", fallback_last_number=True) == 0.0
    # a non-string gold is the number it is
    assert accuracy_reward("\\boxed{\\frac{144}{2}}", 72) == 1.0
    assert accuracy_reward("\\boxed{nan}", float("nan")) == 0.0


# ------------------------------------------------------------------------------------------------ math answers

# (gold as stored by the data pipeline, completion) pairs from DeepScaleR / MATH / DAPO-Math-17k style answers
MATH_MATCHES = [
    ("\\frac{1}{2}", "\\boxed{\\frac{1}{2}}"),
    ("\\frac{1}{2}", "\\boxed{\\dfrac{1}{2}}"),
    ("\\frac{1}{2}", "\\boxed{\\tfrac12}"),
    ("\\frac{1}{2}", "#### 1/2"),
    ("\\frac{1}{2}", "#### 0.5"),
    ("\\frac{1}{2}", "\\boxed{\\frac{2}{4}}"),
    ("\\frac{1}{2}", "<answer>The answer is $\\frac{1}{2}$.</answer>"),
    ("0.5", "\\boxed{\\frac{1}{2}}"),  # numeric gold, fraction answer
    ("2", "\\boxed{\\frac{4}{2}}"),
    ("-\\frac{3}{4}", "\\boxed{-3/4}"),
    ("-\\frac{3}{4}", "\\boxed{\\frac{-3}{4}}"),
    ("-\\frac{3}{4}", "#### -0.75"),
    ("\\frac{3}{4}", "\\boxed{0.75}"),
    ("\\sqrt{2}", "\\boxed{\\sqrt2}"),
    ("\\frac{\\sqrt{3}}{2}", "\\boxed{\\dfrac{\\sqrt3}{2}}"),
    ("2\\sqrt{5}", "\\boxed{2 \\sqrt{5}}"),
    ("\\frac{\\pi}{2}", "\\boxed{\\frac\\pi2}"),
    ("(1, 2)", "\\boxed{(1,2)}"),
    ("(1, 2)", "\\boxed{\\left( 1, 2 \\right)}"),
    ("(\\frac{1}{2}, -3)", "\\boxed{(0.5, -3)}"),
    ("(-\\infty, 3]", "\\boxed{\\left(-\\infty,3\\right]}"),
    ("x^2+1", "\\boxed{x^2 + 1}"),
    ("x^2+1", "\\boxed{y = x^2+1}"),
    ("5", "\\boxed{x = 5}"),
    ("5", "#### x = 5"),
    ("\\text{east}", "\\boxed{east}"),
    ("\\text{east}", "\\boxed{\\mbox{east}}"),
    ("\\text{(C)}", "\\boxed{(C)}"),
    ("\\mathrm{AB}", "\\boxed{\\text{AB}}"),
    ("90^\\circ", "\\boxed{90}"),
    ("90", "\\boxed{90^{\\circ}}"),
    ("50\\%", "\\boxed{50}"),
    ("12\\text{ cm}", "\\boxed{12}"),
    ("12", "\\boxed{12 \\text{ cm}^2}"),
    ("\\$5.50", "#### $5.50"),
    ("10{,}000", "\\boxed{10000}"),
    ("\\displaystyle \\frac{7}{3}", "\\boxed{\\frac73.}"),
    ("\\pi r^2", "\\boxed{\\pi  r^2}"),
    ("3\\!\\cdot\\!4^{n}", "\\boxed{3 \\cdot 4^{n}}"),
    ("\\boxed{x \\leq 3}", "\\boxed{x\\le3}"),  # a gold stored still boxed
]

# (gold, completion) pairs that look close but are different answers, or are not answers at all
MATH_MISMATCHES = [
    ("2", "\\boxed{1/2}"),
    ("2", "<answer>1/2</answer>"),
    ("2", "\\boxed{\\sqrt{2}}"),
    ("2", "<answer>\\sqrt{2}</answer>"),
    ("2", "#### 2\\sqrt{2}"),
    ("2", "<answer>(1, 2)</answer>"),
    ("1", "<answer>x^2+1</answer>"),
    ("10", "\\boxed{2^{10}}"),
    ("\\frac{1}{2}", "\\boxed{\\frac{1}{3}}"),
    ("\\frac{1}{2}", "\\boxed{2}"),
    ("-\\frac{3}{4}", "\\boxed{3/4}"),
    ("\\frac{3}{4}", "\\boxed{\\frac{4}{3}}"),
    ("\\sqrt{2}", "\\boxed{\\sqrt{3}}"),
    ("\\sqrt{2}", "\\boxed{1.414}"),
    ("\\frac{\\sqrt{2}}{2}", "\\boxed{\\frac{1}{\\sqrt{2}}}"),  # equal, but proving it needs algebra
    ("(1, 2)", "\\boxed{(2, 1)}"),
    ("(1, 2)", "\\boxed{[1, 2]}"),
    ("(1, 2)", "\\boxed{(1, 2, 3)}"),
    ("(1, 2)", "\\boxed{2}"),
    ("[1, 2)", "\\boxed{[1, 2]}"),
    ("x^2+1", "\\boxed{x^2-1}"),
    ("x+1", "\\boxed{1+x}"),  # no algebra
    ("\\text{east}", "\\boxed{west}"),
    ("\\text{East}", "\\boxed{east}"),
    ("1000", "\\boxed{1,0}"),
    ("\\frac{1}{2}", "\\frac{1}{2}"),  # no answer marker at all
    ("\\frac{1}{2}", "#### 7\n\\boxed{\\frac{1}{3}}"),  # the last marker decides
    ("\\frac{1}{2}", "\\boxed{\\frac{1}{2}}\n#### 7"),
    ("\\frac{1}{2}", "<answer>Since $y = \\frac{1}{2}$, the answer is 3</answer>"),
    ("\\frac{1}{2}", "\\boxed{\\frac{1}{2}"),  # truncated
    ("\\frac{1}{0}", "\\boxed{\\frac{2}{0}}"),
    ("5", "\\boxed{x = y = 5}"),
    ("", "\\boxed{}"),
]


@pytest.mark.parametrize("gold, completion", MATH_MATCHES)
def test_accuracy_reward_matches_math_answers(gold, completion):
    assert accuracy_reward(completion, gold) == 1.0


@pytest.mark.parametrize("gold, completion", MATH_MISMATCHES)
def test_accuracy_reward_refuses_different_math_answers(gold, completion):
    assert accuracy_reward(completion, gold) == 0.0


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("$\\dfrac{1}{2}$", "\\frac{1}{2}"),
        ("\\frac12", "\\frac{1}{2}"),
        ("\\frac 1 2", "\\frac{1}{2}"),
        ("\\frac{1}2", "\\frac{1}{2}"),
        ("\\frac\\pi{2}", "\\frac{\\pi}{2}"),
        ("\\frac{\\frac12}{3}", "\\frac{\\frac{1}{2}}{3}"),
        ("\\sqrt2+\\sqrt[3]{8}", "\\sqrt{2}+\\sqrt[3]{8}"),
        ("\\sqrt[3]8", "\\sqrt[3]{8}"),
        ("\\left( 1 , 2 \\right]", "(1,2]"),
        ("\\leftarrow", "\\leftarrow"),  # not \left
        ("x \\, = \\; 5 .", "5"),
        ("y = 2x + 3", "2x+3"),
        ("x = y = 5", "x=y=5"),  # not a single assignment
        ("f(x) = 5", "f(x)=5"),
        ("\\text{\\textbf{east}}", "east"),
        ("12\\text{ cm}", "12"),  # a \text-style unit is dropped after a number only
        ("12\\,\\mathrm{cm}", "12"),
        ("x\\text{ cm}", "xcm"),
        ("12 cm", "12cm"),
        ("45^{\\circ}", "45"),
        ("45\\textdegree", "45\\textdegree"),
        ("20\\%", "20"),
        ("\\$1{,}000", "1000"),
        ("\\pi  r", "\\pi r"),
        ("\\displaystyle\\tfrac{a}{b}", "\\frac{a}{b}"),
        ("x \\geq 2", "x\\ge2"),
        ("\\boxed{\\boxed{7}}", "7"),
        ("\\boxed{1}+\\boxed{2}", "\\boxed{1}+\\boxed{2}"),
        ("\u22125", "-5"),
        ("  ", None),
        ("$\\,$", None),
        (None, None),
        (0.5, "0.5"),
    ],
)
def test_normalize_math_answer(raw, expected):
    assert normalize_math_answer(raw) == expected


def test_math_answers_equal_is_conservative():
    assert math_answers_equal("\\frac{1}{2}", "1/2") and math_answers_equal("1/2", 0.5)
    assert math_answers_equal("(1, \\frac{1}{2})", "(1,0.5)")
    assert math_answers_equal("((1,2),3)", "((1, 2), 3)")
    assert not math_answers_equal("(1,2)+(3,4)", "(1,2)+(3,5)")
    assert not math_answers_equal("", "") and not math_answers_equal(None, None)  # type: ignore[arg-type]
    assert not math_answers_equal("1,000", "(1,000)")
    assert not math_answers_equal("x" * 2000, "x" * 2000)  # far too long to be a final answer


@pytest.mark.parametrize(
    "completion",
    [
        "\\boxed{" + "$ " * 20000 + "}",  # once quadratic in normalize_number (minutes)
        "<answer>" + "\\(" * 20000 + "</answer>",
        "#### 5" + " " * 20000 + "x",
        "#### x" + "* " * 20000,
        "<answer>" + "1, " * 20000 + "</answer>",
        "\\boxed{" + "\\frac{" * 5000 + "}" * 5000 + "}",
    ],
)
def test_pathological_completions_stay_linear(completion):
    assert accuracy_reward(completion, "\\frac{1}{2}") == 0.0 and accuracy_reward(completion, "3") == 0.0


@pytest.mark.parametrize(
    "completion",
    [
        "<think>8*9=72</think><answer>72</answer>",
        "  \n<think>a\nb</think>\n\n<answer>\n72\n</answer>\n  ",
        "<think></think><answer></answer>",
        "<think>x < y and a > b</think><answer>1</answer>",
    ],
)
def test_format_reward_accepts(completion):
    assert format_reward(completion, "72", prompt="p") == 1.0


@pytest.mark.parametrize(
    "completion",
    [
        "Sure! <think>x</think><answer>1</answer>",  # text before <think>
        "<think>x</think><answer>1</answer> Hope this helps",  # trailing text
        "<think>x</think>",  # missing answer
        "<answer>1</answer>",  # missing think
        "<think>x</think><answer>1</answer><answer>2</answer>",  # two answer blocks
        "<think>x</think><think>y</think><answer>1</answer>",  # two think blocks
        "<think>x</think> between <answer>1</answer>",
        "<think>x<answer>1</answer></think><answer>1</answer>",  # nested tags
        "<answer>1</answer><think>x</think>",  # wrong order
        "<think>x</think><answer>1",  # unclosed
        "<THINK>x</THINK><ANSWER>1</ANSWER>",
        "",
    ],
)
def test_format_reward_rejects(completion):
    assert format_reward(completion, "72") == 0.0


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("work\n#### 72", 1.0),
        ("work\n#### $1,000.\nthanks", 1.0),
        ("  ####  -3.5  ", 1.0),
        ("#### **72**", 1.0),
        ("#### Step 1", 0.0),
        ("#### 3/4", 0.0),
        ("##### 72", 0.0),
        ("the answer is #### maybe\n72", 0.0),
        ("no marker 72", 0.0),
    ],
)
def test_hash_format_reward(completion, expected):
    assert hash_format_reward(completion, "72", question="q") == expected


def test_builtin_registry_and_aliases():
    assert verifiers.VERIFIERS["accuracy_reward"] is verifiers.VERIFIERS["accuracy"] is accuracy_reward
    assert verifiers.VERIFIERS["format_reward"] is verifiers.VERIFIERS["format"] is format_reward
    assert verifiers.VERIFIERS["hash_format_reward"] is hash_format_reward
    assert format_reward in verifiers.FORMAT_VERIFIERS and accuracy_reward not in verifiers.FORMAT_VERIFIERS


def test_register_verifier(registry):
    @register_verifier("length_penalty")
    def length_penalty(completion, gold, **context):
        return -len(completion) / 100

    assert resolve_verifier("length_penalty") is length_penalty
    with pytest.raises(VerifierSpecError, match="'length_penalty' is already registered"):
        register_verifier("length_penalty")(lambda completion, gold, **context: 0.0)
    with pytest.raises(VerifierSpecError, match=r"must accept \(completion, gold, \*\*context\)"):
        register_verifier("no_context")(lambda completion, gold: 0.0)
    with pytest.raises(VerifierSpecError, match="without ':'"):
        register_verifier("pkg:fn")
    assert "no_context" not in registry


# ------------------------------------------------------------------------------------------------- resolve_verifier

def test_resolve_verifier_module_spec(user_module):
    name = user_module(
        """
        def exact_match(completion, gold, **context):
            return float(completion.strip() == gold)

        class Namespace:
            @staticmethod
            def always_one(completion, gold, **context):
                return 1.0

        NOT_A_FUNCTION = 3

        def no_kwargs(completion, gold):
            return 0.0
        """
    )
    fn = resolve_verifier(f"{name}:exact_match")
    assert fn(" 72 ", "72", prompt="p") == 1.0 and fn("71", "72") == 0.0
    assert resolve_verifier(f" {name}:Namespace.always_one ")("x", "y") == 1.0

    missing = f"'{name}:exact_mtch'.*no attribute 'exact_mtch'.*Did you mean 'exact_match'"
    with pytest.raises(VerifierSpecError, match=missing):
        resolve_verifier(f"{name}:exact_mtch")
    with pytest.raises(VerifierSpecError, match="names a int, not a function"):
        resolve_verifier(f"{name}:NOT_A_FUNCTION")
    with pytest.raises(VerifierSpecError, match=r"no_kwargs.*must accept \(completion, gold, \*\*context\)"):
        resolve_verifier(f"{name}:no_kwargs")


def test_resolve_verifier_import_failures(user_module):
    with pytest.raises(VerifierSpecError, match="'no_such_pkg_xyz.mod:fn'.*module 'no_such_pkg_xyz.mod' not found"):
        resolve_verifier("no_such_pkg_xyz.mod:fn")
    broken_dependency = user_module("import no_such_dependency_xyz\n")
    with pytest.raises(VerifierSpecError, match=f"importing '{broken_dependency}' failed.*no_such_dependency_xyz"):
        resolve_verifier(f"{broken_dependency}:fn")
    crashing = user_module("raise RuntimeError('config missing')\n")
    with pytest.raises(VerifierSpecError, match="raised RuntimeError: config missing"):
        resolve_verifier(f"{crashing}:fn")
    with pytest.raises(VerifierSpecError, match="must look like 'package.module:function'"):
        resolve_verifier("somemodule:")


@pytest.mark.parametrize(
    "spec, suggestion",
    [("accuracy_rewrd", "accuracy_reward"), ("fromat_reward", "format_reward"), ("hash_fromat", "hash_format")],
)
def test_resolve_verifier_unknown_name_did_you_mean(spec, suggestion):
    with pytest.raises(VerifierSpecError) as info:
        resolve_verifier(spec)
    message = str(info.value)
    assert f"unknown verifier '{spec}'" in message
    assert f"Did you mean '{suggestion}'" in message
    assert "Known verifiers: accuracy, accuracy_reward, final_answer_reward, format, format_reward" in message
    assert "package.module:function" in message


@pytest.mark.parametrize("spec", ["", "   ", None, 3])
def test_resolve_verifier_rejects_empty_specs(spec):
    with pytest.raises(VerifierSpecError, match="must be a registered name"):
        resolve_verifier(spec)


def test_resolve_verifier_unrelated_name_has_no_suggestion():
    with pytest.raises(VerifierSpecError) as info:
        resolve_verifier("zzzzzz")
    assert "Did you mean" not in str(info.value)


# ---------------------------------------------------------------------------------------------------------- scorer

# (completion, accuracy vs gold "72", format) for scorer tests
CASES = [
    ("<think>9*8</think><answer>72</answer>", 1.0, 1.0),
    ("<think>9*8</think><answer>5</answer>", 0.0, 1.0),
    ("#### 72", 1.0, 0.0),
    ("nothing useful", 0.0, 0.0),
]
COMPLETIONS = [case[0] for case in CASES]
ACCURACY = np.array([case[1] for case in CASES], dtype=np.float32)
FORMAT = np.array([case[2] for case in CASES], dtype=np.float32)
GOLDS = ["72"] * len(CASES)


def test_scorer_weighted_sum():
    batch = RewardScorer(["accuracy_reward", "format_reward"], [2.0, 0.5]).score(COMPLETIONS, GOLDS)
    np.testing.assert_array_equal(batch.per_verifier["accuracy_reward"], ACCURACY)
    np.testing.assert_array_equal(batch.per_verifier["format_reward"], FORMAT)
    np.testing.assert_allclose(batch.total, 2.0 * ACCURACY + 0.5 * FORMAT)
    assert batch.total.dtype == np.float32 and batch.total.shape == (len(CASES),)
    assert all(scores.dtype == np.float32 for scores in batch.per_verifier.values())
    assert batch.failures == {"accuracy_reward": 0, "format_reward": 0}


def test_shuffled_rewards_are_the_real_ones_in_another_order_drawn_from_the_batch():
    """reward_config.shuffle_rewards (the control run): the advantages' rewards are a permutation of the real ones,
    the logged total stays real, and the same batch draws the same permutation (a resumed run repeats it)."""
    real = RewardScorer(["accuracy_reward", "format_reward"], [2.0, 0.5]).score(COMPLETIONS, GOLDS)
    control = RewardScorer(["accuracy_reward", "format_reward"], [2.0, 0.5], shuffle_rewards=True)
    shuffled = control.score(COMPLETIONS, GOLDS)
    np.testing.assert_array_equal(shuffled.total, real.total)
    np.testing.assert_array_equal(np.sort(shuffled.aggregated), np.sort(real.aggregated))
    assert not np.array_equal(shuffled.aggregated, real.aggregated)
    np.testing.assert_array_equal(control.score(COMPLETIONS, GOLDS).aggregated, shuffled.aggregated)


def test_final_answer_reward_scores_any_readable_answer():
    from mindgrpo.rewards.verifiers import final_answer_reward

    assert [final_answer_reward(text) for text in (
        "so the total is \\boxed{40}", "#### 18", "<answer>7</answer>", "the total number of triangles eaten is:",
        "#### Step 1: add")] == [1.0, 1.0, 1.0, 0.0, 0.0]


def test_scorer_default_weights_and_single_name():
    batch = RewardScorer(["accuracy", "format"]).score(COMPLETIONS, GOLDS)
    np.testing.assert_allclose(batch.total, ACCURACY + FORMAT)
    single = RewardScorer("accuracy").score(COMPLETIONS, GOLDS)
    np.testing.assert_allclose(single.total, ACCURACY)


def test_scorer_gates_accuracy_on_format():
    scorer = RewardScorer(["accuracy_reward", "format_reward"], [2.0, 0.5], gate_accuracy_on_format=True)
    batch = scorer.score(COMPLETIONS, GOLDS)
    np.testing.assert_allclose(batch.total, 2.0 * ACCURACY * FORMAT)  # format weight unused when gating
    np.testing.assert_array_equal(batch.total, [2.0, 0.0, 0.0, 0.0])
    np.testing.assert_array_equal(batch.per_verifier["format_reward"], FORMAT)  # raw scores still reported


def test_scorer_gate_needs_format_and_something_to_gate():
    with pytest.raises(ValueError, match="gate_accuracy_on_format=True needs a format verifier"):
        RewardScorer(["accuracy_reward"], gate_accuracy_on_format=True)
    with pytest.raises(ValueError, match="needs something to gate"):
        RewardScorer(["format_reward", "hash_format_reward"], gate_accuracy_on_format=True)


def test_scorer_fallback_last_number_reaches_accuracy():
    completions, golds = ["The answer is 72.", "I think 5"], ["72", "72"]
    assert RewardScorer(["accuracy_reward"]).score(completions, golds).total.tolist() == [0.0, 0.0]
    scorer = RewardScorer(["accuracy_reward"], fallback_last_number=True)
    assert scorer.score(completions, golds).total.tolist() == [1.0, 0.0]


@pytest.mark.parametrize(
    "functions, weights, match",
    [
        (["accuracy_reward", "format_reward"], [1.0],
         "verifier_weight has 1 entries but reward_config.verifier_function has 2"),
        (["accuracy_reward"], [1.0, 2.0], "reward_config.verifier_weight has 2 entries"),
        ([], None, "reward_config.verifier_function is empty"),
        (["accuracy_reward", "accuracy_reward"], None, "lists \\['accuracy_reward'\\] more than once"),
        (["accuracy_reward"], [float("nan")], r"reward_config.verifier_weight\[0\] \(for 'accuracy_reward'\)"),
        (["accuracy_reward"], ["1"], r"reward_config.verifier_weight\[0\]"),
        (["accuracy_reward", "acuracy"], None, r"reward_config.verifier_function\[1\]: unknown verifier 'acuracy'"),
    ],
)
def test_scorer_config_errors(functions, weights, match):
    with pytest.raises(ValueError, match=match):
        RewardScorer(functions, weights)


def test_scorer_counts_failures_and_never_raises(registry, caplog):
    @register_verifier("explodes_on_boom")
    def explodes(completion, gold, **context):
        if "boom" in completion:
            raise RuntimeError("kaboom")
        return 1.0

    @register_verifier("nan_on_odd")
    def nan_on_odd(completion, gold, **context):
        return float("nan") if len(completion) % 2 else 0.5

    @register_verifier("junk")
    def junk(completion, gold, **context):
        return {"a": "1.0", "b": float("inf"), "c": 1e39, "d": None, "e": True, "f": np.float64(0.25)}[completion]

    scorer = RewardScorer(["explodes_on_boom", "nan_on_odd", "accuracy_reward"], [1.0, 2.0, 4.0])
    completions = ["ok", "boom", "odd", "#### 72 boom"]
    with caplog.at_level(logging.WARNING, logger="mindgrpo.rewards.scorer"):
        batch = scorer.score(completions, ["72"] * 4)
        scorer.score(completions, ["72"] * 4)
    np.testing.assert_array_equal(batch.per_verifier["explodes_on_boom"], [1.0, 0.0, 1.0, 0.0])
    np.testing.assert_array_equal(batch.per_verifier["nan_on_odd"], [0.5, 0.5, 0.0, 0.5])
    np.testing.assert_array_equal(batch.per_verifier["accuracy_reward"], [0.0, 0.0, 0.0, 1.0])
    np.testing.assert_allclose(batch.total, [2.0, 1.0, 1.0, 5.0])
    assert batch.failures == {"explodes_on_boom": 2, "nan_on_odd": 1, "accuracy_reward": 0}
    # one warning per failing verifier per scorer, however many batches fail
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 2
    assert any("'explodes_on_boom' raised RuntimeError: kaboom on completion 1" in m for m in messages)

    junk_batch = RewardScorer(["junk"]).score(list("abcdef"), ["0"] * 6)
    np.testing.assert_array_equal(junk_batch.per_verifier["junk"], [0, 0, 0, 0, 1.0, 0.25])
    assert junk_batch.failures == {"junk": 4}


def test_scorer_non_numeric_golds():
    completions = ["#### 1", "\\boxed{\\dfrac12}", "\\boxed{\\frac{1}{3}}", "\\boxed{(1, 2)}"]
    batch = RewardScorer(["accuracy_reward"]).score(completions, ["1", "\\frac{1}{2}", "\\frac{1}{2}", "(1,2)"])
    assert batch.failures == {"accuracy_reward": 0}
    np.testing.assert_array_equal(batch.total, [1.0, 1.0, 0.0, 1.0])


def test_scorer_passes_context_elementwise(registry):
    seen = []

    @register_verifier("records_context")
    def records(completion, gold, **context):
        seen.append((completion, gold, context))
        return 0.0

    RewardScorer(["records_context"], fallback_last_number=True).score(
        ["c0", "c1"], ["g0", "g1"], prompt=["p0", "p1"], question=["q0", "q1"]
    )
    assert seen == [
        ("c0", "g0", {"fallback_last_number": True, "prompt": "p0", "question": "q0"}),
        ("c1", "g1", {"fallback_last_number": True, "prompt": "p1", "question": "q1"}),
    ]


def test_scorer_batch_shape_errors():
    scorer = RewardScorer(["accuracy_reward"])
    with pytest.raises(ValueError, match="got 2 completions but 1 golds"):
        scorer.score(["a", "b"], ["1"])
    with pytest.raises(ValueError, match="context list 'prompt' has 1 entries for 2 completions"):
        scorer.score(["a", "b"], ["1", "2"], prompt=["p"])
    with pytest.raises(ValueError, match="is a RewardScorer option"):
        scorer.score(["a"], ["1"], fallback_last_number=[True])
    empty = scorer.score([], [])
    assert empty.total.shape == (0,) and empty.failures == {"accuracy_reward": 0}


def test_scorer_custom_format_gate_via_registry(registry):
    @register_verifier("starts_with_hash", is_format=True)
    def starts_with_hash(completion, gold, **context):
        return float(completion.startswith("#"))

    batch = RewardScorer(["accuracy_reward", "starts_with_hash"], gate_accuracy_on_format=True).score(
        ["#### 72", "x #### 72"], ["72", "72"]
    )
    np.testing.assert_array_equal(batch.total, [1.0, 0.0])


# ------------------------------------------------------------------ broken, hanging and batch verifiers; workers
# Verifiers that worker processes run must be importable by name: they live in tests/toy_verifiers.py.

def test_a_verifier_that_hangs_is_cut_at_the_timeout_and_counted(caplog):
    """A hang in Python (time.sleep) and one in C (a catastrophic regex, which no signal can interrupt) are each cut
    after verifier_timeout: that completion scores 0 and is counted, the others score, and the next batch is scored
    by the replacement workers."""
    scorer = RewardScorer(["toy_verifiers:hangs_on_request", "accuracy_reward"], verifier_timeout=1.0,
                          verifier_parallel=2)
    with scorer, caplog.at_level(logging.WARNING, logger="mindgrpo.rewards.scorer"):
        start = time.monotonic()
        batch = scorer.score(["#### 72", "sleep", "regex", "fine"], ["72"] * 4)
        elapsed = time.monotonic() - start
        np.testing.assert_array_equal(batch.per_verifier["toy_verifiers:hangs_on_request"], [7.0, 0.0, 0.0, 4.0])
        np.testing.assert_array_equal(batch.total, [8.0, 0.0, 0.0, 4.0])
        assert batch.failures == batch.timeouts == {"toy_verifiers:hangs_on_request": 2, "accuracy_reward": 0}
        assert elapsed < 30  # the sleep alone would take 600 s, the regex far longer
        again = scorer.score(["ok", "#### 72"], ["72", "72"])
    np.testing.assert_array_equal(again.total, [2.0, 8.0])
    assert again.timeouts == {"toy_verifiers:hangs_on_request": 0, "accuracy_reward": 0}
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 1 and "'toy_verifiers:hangs_on_request' exceeded reward_config.verifier_timeout = 1 s " \
        "on completion 1" in messages[0]


def test_a_worker_that_dies_or_returns_a_value_it_cannot_send_costs_that_completion(caplog):
    names = ["toy_verifiers:dies_on_request", "toy_verifiers:returns_a_function_on_request"]
    with RewardScorer(names, verifier_parallel=1) as scorer, \
            caplog.at_level(logging.WARNING, logger="mindgrpo.rewards.scorer"):
        batch = scorer.score(["ab", "die", "function", "abcd"], ["0"] * 4)
    np.testing.assert_array_equal(batch.per_verifier[names[0]], [2.0, 0.0, 8.0, 4.0])
    np.testing.assert_array_equal(batch.per_verifier[names[1]], [2.0, 3.0, 0.0, 4.0])
    assert batch.failures == {names[0]: 1, names[1]: 1} and batch.timeouts == {names[0]: 0, names[1]: 0}
    messages = "\n".join(record.getMessage() for record in caplog.records)
    assert "'toy_verifiers:dies_on_request' ended its worker process (exit status 3) on completion 1" in messages
    assert "returned <function that cannot be sent between processes: " in messages


def test_a_verifier_the_workers_cannot_import_stops_with_its_name(registry, monkeypatch):
    """Importable here (in sys.modules) but not in a fresh interpreter: the worker says which verifier it is."""
    phantom = types.ModuleType("phantom_verifiers")

    def scored(completion, gold, **context):
        return 1.0

    scored.__module__, scored.__qualname__ = "phantom_verifiers", "scored"
    phantom.scored = scored
    monkeypatch.setitem(sys.modules, "phantom_verifiers", phantom)
    register_verifier("phantom")(scored)
    with RewardScorer(["phantom"], verifier_parallel=1) as scorer:
        with pytest.raises(VerifierError, match=r"could not start: verifier 'phantom' cannot be loaded in a worker "
                                                r"process: ModuleNotFoundError: No module named 'phantom_verifiers'"):
            scorer.score(["a"], ["1"])


@pytest.mark.parametrize("parallel", [0, 1])
def test_a_verifier_failing_on_every_completion_stops_the_run_with_its_name_and_first_exception(parallel):
    with RewardScorer(["accuracy_reward", "toy_verifiers:always_raises"], verifier_parallel=parallel) as scorer:
        with pytest.raises(VerifierError, match=r"verifier 'toy_verifiers:always_raises' failed on all 3 completions "
                                                r".*First failure: raised ValueError: broken verifier saw 'a' on "
                                                r"completion 0\. Fix the verifier") as caught:
            scorer.score(["a", "b", "c"], ["1"] * 3)
    cause = caught.value.__cause__
    if parallel:  # the worker's traceback is chained below
        assert type(cause).__name__ == "RemoteTraceback" and "ValueError: broken verifier saw 'a'" in str(cause)
    else:
        assert isinstance(cause, ValueError) and str(cause) == "broken verifier saw 'a'"


def test_junk_or_timeouts_on_every_completion_stop_the_run_too(registry):
    @register_verifier("always_nan")
    def always_nan(completion, gold, **context):
        return float("nan")

    with pytest.raises(VerifierError, match=r"'always_nan' failed on all 2 completions.*returned nan \(not a finite "
                                            r"number\) on completion 0"):
        RewardScorer(["always_nan"]).score(["a", "b"], ["1", "1"])
    with RewardScorer(["toy_verifiers:hangs_on_request"], verifier_timeout=0.5, verifier_parallel=2) as scorer:
        with pytest.raises(VerifierError, match=r"failed on all 2 completions.*exceeded reward_config.verifier_timeout"
                                                r" = 0.5 s on completion 0\. Raise reward_config.verifier_timeout"):
            scorer.score(["sleep", "sleep"], ["1", "1"])


def test_batch_verifiers_are_called_once_per_batch_beside_per_completion_ones(registry):
    calls = []

    @register_verifier("batch_digits", batch=True)
    def batch_digits(completions, golds, **context):
        calls.append((completions, golds, context))
        return np.array([sum(ch.isdigit() for ch in c) for c in completions], dtype=np.int64)

    @register_verifier("batch_nan_on_b", batch=True)
    def batch_nan_on_b(completions, golds, **context):
        return [float("nan") if c == "b" else True for c in completions]

    completions, golds = ["#### 72", "b", "so 12"], ["72", "72", "12"]
    scorer = RewardScorer(["accuracy_reward", "batch_digits", "batch_nan_on_b", "toy_verifiers:batch_length"],
                          [1.0, 0.5, 2.0, 0.01], fallback_last_number=True)
    batch = scorer.score(completions, golds, question=["q0", "q1", "q2"])
    assert calls == [(completions, golds, {"fallback_last_number": True, "question": ["q0", "q1", "q2"]})]
    np.testing.assert_array_equal(batch.per_verifier["batch_digits"], [2.0, 0.0, 2.0])
    np.testing.assert_array_equal(batch.per_verifier["batch_nan_on_b"], [1.0, 0.0, 1.0])  # NaN: that one fails
    np.testing.assert_array_equal(batch.per_verifier["toy_verifiers:batch_length"], [107.0, 1.0, 105.0])
    np.testing.assert_allclose(batch.total, [1 + 1.0 + 2.0 + 1.07, 0 + 0 + 0 + 0.01, 1 + 1.0 + 2.0 + 1.05],
                               rtol=1e-6)
    assert batch.failures == {"accuracy_reward": 0, "batch_digits": 0, "batch_nan_on_b": 1,
                              "toy_verifiers:batch_length": 0}


@pytest.mark.parametrize("parallel", [0, 2])
@pytest.mark.parametrize("spec, match", [
    ("toy_verifiers:batch_one_short", r"batch verifier 'toy_verifiers:batch_one_short' returned 2 scores for 3 "
                                      r"completions; it must return one number per completion"),
    ("toy_verifiers:batch_strings", r"batch verifier 'toy_verifiers:batch_strings' returned '1.0' \(str\) for "
                                    r"completion 0, not a number"),
])
def test_a_batch_verifier_returning_the_wrong_length_or_non_numbers_stops_the_run(spec, match, parallel):
    with RewardScorer(["accuracy_reward", spec], verifier_parallel=parallel) as scorer:
        with pytest.raises(VerifierError, match=match):
            scorer.score(["a", "b", "c"], ["1"] * 3)


@pytest.mark.parametrize("returned, match", [
    (0.5, r"returned 0.5 \(float\); it must return a list of 2 numbers"),
    (np.ones((2, 1)), r"returned an array of shape \(2, 1\); it must return a list of 2 numbers"),
    ([[1.0], [2.0]], r"returned \[1.0\] \(list\) for completion 0, not a number"),
    ([1.0, None], r"returned None \(NoneType\) for completion 1, not a number.*TRL's 'does not apply'"),
    ("12", r"returned '12' \(str\)"),
])
def test_batch_verifier_results_that_are_not_one_number_per_completion(registry, returned, match):
    register_verifier("batch_fixed", batch=True)(lambda completions, golds, **context: returned)
    with pytest.raises(VerifierError, match=r"batch verifier 'batch_fixed' " + match):
        RewardScorer(["batch_fixed"]).score(["a", "b"], ["1", "1"])


def test_a_batch_verifier_that_raises_fails_every_completion(registry):
    @register_verifier("batch_raises", batch=True)
    def batch_raises(completions, golds, **context):
        raise KeyError("answer")

    with pytest.raises(VerifierError, match=r"'batch_raises' failed on all 2 completions.*raised KeyError: 'answer' "
                                            r"on the whole batch\. Fix the verifier"):
        RewardScorer(["batch_raises"]).score(["a", "b"], ["1", "1"])


def test_parallel_scoring_equals_in_process_scoring():
    names = ["accuracy_reward", "format_reward", "hash_format_reward", "toy_verifiers:batch_length",
             "toy_verifiers:hangs_on_request"]
    weights = [1.0, 0.5, 0.25, 0.01, 0.001]
    completions = COMPLETIONS + [c for _, c in MATH_MATCHES] + [c for _, c in MATH_MISMATCHES]
    golds = GOLDS + [g for g, _ in MATH_MATCHES] + [g for g, _ in MATH_MISMATCHES]
    questions = [f"question {i}" for i in range(len(completions))]
    here = RewardScorer(names, weights).score(completions, golds, question=questions)
    for options in ({"verifier_parallel": 2}, {"verifier_parallel": 1, "verifier_timeout": 60.0}):
        with RewardScorer(names, weights, **options) as scorer:
            there = scorer.score(completions, golds, question=questions)
        np.testing.assert_array_equal(there.total, here.total)
        for name in names:
            np.testing.assert_array_equal(there.per_verifier[name], here.per_verifier[name])
        assert there.failures == here.failures and there.timeouts == here.timeouts
    assert 0 < here.per_verifier["accuracy_reward"].sum() < len(completions)  # a real mix of scores


def test_worker_options_are_checked(registry):
    def local(completion, gold, **context):
        return 0.0

    register_verifier("local_verifier")(local)
    with pytest.raises(VerifierSpecError, match=r"verifier_function\[1\] 'local_verifier' must run in a worker "
                                                r"process .* cannot be sent to one \(.*Can't pickle local "
                                                r"object"):
        RewardScorer(["accuracy_reward", "local_verifier"], verifier_timeout=5.0)
    RewardScorer(["accuracy_reward", "local_verifier"])  # in-process: fine
    local.__module__ = "__main__"
    with pytest.raises(VerifierSpecError, match=r"defined in the __main__ script or a notebook"):
        RewardScorer(["local_verifier"], verifier_parallel=2)
    for timeout in (-1.0, float("nan"), float("inf"), True, "5"):
        with pytest.raises(ValueError, match=r"reward_config.verifier_timeout = .*: must be a finite number"):
            RewardScorer(["accuracy_reward"], verifier_timeout=timeout)
    for parallel in (-1, 1.5, True):
        with pytest.raises(ValueError, match=r"reward_config.verifier_parallel = .*: must be a whole number >= 0"):
            RewardScorer(["accuracy_reward"], verifier_parallel=parallel)
    with pytest.raises(ValueError, match=r"reward_config.aggregation = 'mean': choose one of sum_then_normalize, "
                                         r"normalize_then_sum"):
        RewardScorer(["accuracy_reward"], aggregation="mean")
    with pytest.raises(ValueError, match=r"normalize_then_sum .*gate_accuracy_on_format multiplies accuracy by "
                                         r"format: choose one"):
        RewardScorer(["accuracy_reward", "format_reward"], aggregation="normalize_then_sum",
                     gate_accuracy_on_format=True)
    with pytest.raises(ValueError, match=r"3 completions, not whole groups of 2"):
        RewardScorer(["accuracy_reward"], aggregation="normalize_then_sum",
                     num_generations=2).score(["a"] * 3, ["1"] * 3)


def test_reward_config_keys_are_documented_and_validated():
    from mindgrpo.config import ConfigError, GRPOConfig, describe, validate

    lines = "\n".join(describe())
    for key in ("reward_config.aggregation (str, default 'sum_then_normalize')",
                "reward_config.verifier_timeout (float, default 0.0)",
                "reward_config.verifier_parallel (int, default 0)"):
        assert key in lines
    config = GRPOConfig()
    config.reward_config.verifier_timeout = -1.0
    config.reward_config.verifier_parallel = -2
    config.reward_config.aggregation = "mean"
    with pytest.raises(ConfigError) as caught:
        validate(config, check_paths=False)
    for expected in ("reward_config.verifier_timeout = -1.0: must be a finite number of seconds >= 0",
                     "reward_config.verifier_parallel = -2: must not be negative",
                     "reward_config.aggregation = 'mean': choose one of sum_then_normalize, normalize_then_sum"):
        assert expected in str(caught.value)
    config = GRPOConfig()
    config.reward_config.aggregation = "normalize_then_sum"
    config.reward_config.gate_accuracy_on_format = True
    with pytest.raises(ConfigError) as caught:
        validate(config, check_paths=False)
    assert "but rl_config.scale_rewards = 'group': set rl_config.scale_rewards: batch" in str(caught.value)
    assert "gate_accuracy_on_format multiplies accuracy by format: choose one" in str(caught.value)
    config.rl_config.scale_rewards, config.reward_config.gate_accuracy_on_format = "batch", False
    validate(config, check_paths=False)


# Two verifiers on two groups of 3, on different scales: accuracy-like 0/1 and a length-like score in the tens.
AGG_SCORES = {"a": (1.0, 10.0), "b": (0.0, 30.0), "c": (1.0, 20.0), "d": (0.0, 10.0), "e": (0.0, 11.0),
              "f": (1.0, 40.0)}
AGG_WEIGHTS = [1.0, 0.5]


def _trl_advantages(rewards_per_func: np.ndarray, weights: np.ndarray, num_generations: int,
                    aggregation: str) -> np.ndarray:
    """TRL 1.16's advantages, written out with numpy: trl/trainer/grpo_trainer.py,
    GRPOTrainer._generate_and_score_completions, the `multi_objective_aggregation` branches (scale_rewards "group"
    for sum_then_normalize; normalize_then_sum does not read scale_rewards), with `nanstd` from trl/trainer/utils.py
    (the unbiased std) and its 1e-4."""
    if aggregation == "sum_then_normalize":
        rewards = (rewards_per_func * weights[None, :]).sum(axis=1)
        grouped = rewards.reshape(-1, num_generations)
        mean = np.repeat(grouped.mean(axis=1), num_generations)
        std = np.repeat(grouped.std(axis=1, ddof=1), num_generations)
        return (rewards - mean) / (std + 1e-4)
    grouped = rewards_per_func.reshape(-1, num_generations, rewards_per_func.shape[1])
    mean_k = grouped.mean(axis=1, keepdims=True)
    std_k = grouped.std(axis=1, ddof=1, keepdims=True)
    reward_k = ((grouped - mean_k) / (std_k + 1e-4)).reshape(-1, rewards_per_func.shape[1])
    rewards = (reward_k * weights[None, :]).sum(axis=1)
    return (rewards - rewards.mean()) / (rewards.std(ddof=1) + 1e-4)


@pytest.fixture
def two_objectives(registry):
    register_verifier("objective_0")(lambda completion, gold, **context: AGG_SCORES[completion][0])
    register_verifier("objective_1")(lambda completion, gold, **context: AGG_SCORES[completion][1])
    return ["objective_0", "objective_1"]


def test_normalize_then_sum_by_hand(two_objectives):
    """One group of two: accuracy (1, 0) and a score (10, 30) weighted 0.5. Summed first, the score's range swamps
    accuracy, and the correct completion gets the lower reward; normalised first, each objective counts equally."""
    register_verifier("length_like")(lambda completion, gold, **context: {"a": 10.0, "b": 30.0}[completion])
    names = ["objective_0", "length_like"]
    summed = RewardScorer(names, AGG_WEIGHTS, num_generations=2).score(["a", "b"], ["", ""])
    np.testing.assert_array_equal(summed.aggregated, [6.0, 15.0])  # 1 + 0.5 * 10, 0 + 0.5 * 30
    scorer = RewardScorer(names, AGG_WEIGHTS, aggregation="normalize_then_sum", num_generations=2)
    batch = scorer.score(["a", "b"], ["", ""])
    # accuracy: mean 0.5, unbiased std sqrt(0.5); score: mean 20, unbiased std sqrt(200)
    accuracy = 0.5 / (math.sqrt(0.5) + 1e-4)
    score = 10.0 / (math.sqrt(200.0) + 1e-4)
    np.testing.assert_allclose(batch.aggregated, [accuracy - 0.5 * score, -accuracy + 0.5 * score], rtol=1e-6)
    assert batch.aggregated[0] > batch.aggregated[1]
    np.testing.assert_array_equal(batch.total, [6.0, 15.0])  # the logged reward is still the weighted sum
    single = RewardScorer(names, aggregation="normalize_then_sum", num_generations=1).score(["a", "b"], ["", ""])
    np.testing.assert_array_equal(single.aggregated, [0.0, 0.0])  # a group of one has no spread (as TRL)


@pytest.mark.parametrize("aggregation, scale_rewards", [("sum_then_normalize", "group"),
                                                        ("normalize_then_sum", "batch")])
def test_aggregations_give_trl_advantages(two_objectives, aggregation, scale_rewards):
    """The scorer's `aggregated` through mindgrpo's group advantages (with the rl_config.scale_rewards the config
    requires) equals TRL's advantages for the same per-function rewards."""
    from mindgrpo.algorithm import group_advantages

    completions = list(AGG_SCORES)
    scorer = RewardScorer(two_objectives, AGG_WEIGHTS, aggregation=aggregation, num_generations=3)
    batch = scorer.score(completions, [""] * len(completions))
    advantages = group_advantages(batch.aggregated, 3, scale_rewards=scale_rewards)
    per_func = np.array([AGG_SCORES[c] for c in completions], dtype=np.float64)
    expected = _trl_advantages(per_func, np.array(AGG_WEIGHTS), 3, aggregation)
    np.testing.assert_allclose(advantages.asnumpy(), expected, rtol=1e-5, atol=1e-5)


def test_trainer_counts_timeouts_and_stops_before_the_update_on_a_broken_verifier(tmp_path, demo_plain, monkeypatch):
    """In the trainer: one step with a verifier that hangs on about half the completions goes on, its metrics count
    the cut calls, those completions score 0 for it, and (normalize_then_sum) the step's advantages are TRL's for
    those per-verifier rewards. Then a verifier that raises on every completion stops train() with its own error
    before the update (the weights stay), unchanged even when a peer rank looks lost (train() names lost peers
    instead of passing most errors on: mindgrpo/train/peers.py)."""
    import dataclasses
    import json

    from conftest import small_run_config
    from mindgrpo.data import convert_dataset
    from mindgrpo.data.tokenizer import load_tokenizer
    from mindgrpo.models import state_dict_hf
    from mindgrpo.train import peers
    from mindgrpo.train.metrics import read_metrics
    from mindgrpo.train.trainer import GRPOTrainer

    source, dataset, run = tmp_path / "train.jsonl", tmp_path / "train.mindrecord", tmp_path / "run"
    source.write_text("".join(demo_plain.train_jsonl.read_text(encoding="utf-8").splitlines(keepends=True)[:8]),
                      encoding="utf-8")
    convert_dataset(source, dataset, load_tokenizer(demo_plain.model_dir), dataset_type="gsm8k",
                    prompt_template="gsm8k_hash", max_prompt_length=64, progress=False)
    cfg = small_run_config(run, dataset, demo_plain.model_dir, max_prompt_length=64, seq_length=80, max_tokens=8,
                           verifiers=["toy_verifiers:text_length", "toy_verifiers:hangs_on_even_length"], max_steps=2,
                           scale_rewards="batch", mode="pynative")  # PyNative compiles less; nothing here needs GRAPH
    cfg.reward_config.verifier_timeout, cfg.reward_config.verifier_parallel = 1.0, 2
    cfg.reward_config.aggregation, cfg.reward_config.verifier_weight = "normalize_then_sum", [1.0, 0.5]
    trainer = GRPOTrainer(cfg)
    import mindgrpo.train.trainer as trainer_module

    advantages, computed = trainer_module.generation_advantages, []
    monkeypatch.setattr(trainer_module, "generation_advantages",
                        lambda *args: computed.append(advantages(*args)) or computed[-1])
    trainer.train_step()
    row = read_metrics(run)[-1]
    records = [json.loads(line) for line in (run / "completions.jsonl").read_text(encoding="utf-8").splitlines()]
    hung = [len(r["completion"]) % 2 == 0 for r in records]
    assert 0 < sum(hung) < len(records) == 8
    assert row["grpo/verifier_timeouts/hangs_on_even_length"] == sum(hung)
    assert row["grpo/verifier_failures/hangs_on_even_length"] == sum(hung)
    assert row["grpo/verifier_timeouts/text_length"] == row["grpo/verifier_failures/text_length"] == 0
    assert [r["rewards"]["toy_verifiers:hangs_on_even_length"] for r in records] == \
        [0.0 if h else len(r["completion"]) / 64 for h, r in zip(hung, records)]
    per_func = np.array([[r["rewards"][name] for name in cfg.reward_config.verifier_function] for r in records])
    expected = _trl_advantages(per_func, np.array([1.0, 0.5]), 4, "normalize_then_sum")
    np.testing.assert_allclose(computed[0], expected, rtol=1e-5, atol=1e-5)

    before = state_dict_hf(trainer.worker.actor)
    trainer.scorer.close()
    trainer.scorer = RewardScorer(["toy_verifiers:always_raises"])
    trainer.dist = dataclasses.replace(trainer.dist, world_size=2)
    monkeypatch.setattr(peers, "lost_peers", lambda *args: [{"rank": 1, "pid": 1, "host": "elsewhere"}])
    with pytest.raises(VerifierError, match=r"verifier 'toy_verifiers:always_raises' failed on all 8 completions "
                                            r"of this batch.*raised ValueError: broken verifier saw"):
        trainer.train()
    after = state_dict_hf(trainer.worker.actor)
    assert all(np.array_equal(before[name], after[name]) for name in before)
    assert [r["step"] for r in read_metrics(run)] == [1]


# ---------------------------------------------------------------------------------------------- geo3k_reward
def verl_geo3k_score(acc: float, fmt: float) -> float:
    """verl/utils/reward_score/geo3k.py (volcengine/verl), compute_score with its default format_score=0.1:
    `(1.0 - format_score) * acc_reward(...) + format_score * format_reward(...)`."""
    format_score = 0.1
    return (1.0 - format_score) * acc + format_score * fmt


GEO3K_EQUAL = [  # (boxed answer, gold): the same value, spelled differently
    ("\\frac{40}{3}", "\\frac{40}{3}"), ("40/3", "\\frac{40}{3}"), ("\\dfrac{40}{3}", "\\frac{40}{3}"),
    ("\\frac12", "0.5"), ("\\frac{2}{4}", "\\frac{1}{2}"), ("3.0", "3"),                       # fractions
    ("60^\\circ", "60"), ("60^{\\circ}", "60"), ("60°", "60"), ("60", "60^\\circ"),               # degrees
    ("2\\pi", "2 \\pi"), ("\\frac{3}{4}\\pi", "0.75\\pi"), ("25\\pi \\text{ cm}^2", "25\\pi"),       # pi, units
    ("5\\text{ cm}", "5"), ("12 \\text{units}", "12"), ("x = 5", "5"),                          # units, x =
    ("\\sqrt{48}", "4\\sqrt{3}"), ("2\\sqrt3", "2\\sqrt{3}"), ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt3}{2}"),
]
GEO3K_DIFFERENT = [
    ("13.33", "\\frac{40}{3}"), ("3.14", "\\pi"), ("31.4", "10\\pi"), ("10.39", "6\\sqrt{3}"), ("4", "3"),
    ("\\frac{\\pi}{3}", "60^\\circ"), ("\\frac{3}{40}", "\\frac{40}{3}"), ("2\\sqrt{2}", "2\\sqrt{3}"),
]


@pytest.mark.parametrize("answer,gold", GEO3K_EQUAL)
def test_geo3k_reward_accepts_equal_latex(answer, gold):
    completion = f"<think>By the angle sum, the answer follows.</think> The answer is \\boxed{{{answer}}}."
    assert verifiers.geo3k_reward(completion, gold) == pytest.approx(verl_geo3k_score(1.0, 1.0))
    assert verifiers.geo3k_reward(f"\\boxed{{{answer}}}", gold) == pytest.approx(verl_geo3k_score(1.0, 0.0))


@pytest.mark.parametrize("answer,gold", GEO3K_DIFFERENT)
def test_geo3k_reward_refuses_different_values(answer, gold):
    completion = f"<think>...</think> \\boxed{{{answer}}}"
    assert verifiers.geo3k_reward(completion, gold) == pytest.approx(verl_geo3k_score(0.0, 1.0))


@pytest.mark.parametrize("completion,fmt", [
    ("<think>a</think>\\boxed{3}", 1.0),
    ("<think>\nline\n</think>\nSo x is \\boxed{3}.\n", 1.0),    # text around the box is fine
    ("<think>a</think> <answer>\\boxed{3}</answer>", 1.0),       # as verl: anything may hold the box
    (" <think>a</think>\\boxed{3}", 0.0),                        # must open with <think> (verl's fullmatch)
    ("I think \\boxed{3}", 0.0),                                  # no think block
    ("<think>a \\boxed{3}", 0.0),                                 # think never closed
    ("<think>\\boxed{3}</think> so 3", 0.0),                      # the box must follow </think>
    ("<think>a</think> the answer is 3", 0.0),                     # no box
])
def test_geo3k_reward_format_rule(completion, fmt):
    assert verifiers.geo3k_reward(completion, "3") == pytest.approx(verl_geo3k_score(1.0 if "boxed" in completion
                                                                                     else 0.0, fmt))


def test_geo3k_reward_grades_the_last_box():
    assert verifiers.last_boxed("\\boxed{1} then \\boxed{\\frac{a}{b}} end") == "\\frac{a}{b}"
    assert verifiers.last_boxed("\\boxed{1} then \\boxed{2") is None  # the last one is unclosed, as mathruler reads
    assert verifiers.geo3k_reward("<think>x</think>\\boxed{4} no, \\boxed{3}", "3") == pytest.approx(1.0)
    assert verifiers.geo3k_reward("<think>x</think>\\boxed{3} no, \\boxed{4}", "3") == pytest.approx(0.1)
    assert verifiers.geo3k_reward("<think>x</think>\\boxed{}", "3") == pytest.approx(0.1)
    assert verifiers.resolve_verifier("geo3k_reward") is verifiers.geo3k_reward
    assert not verifiers.is_format_verifier(verifiers.geo3k_reward)


# ---------------------------------------------------------------------------------------------- property tests

FRAGMENTS = [
    "####", "#####", "#### ", "<answer>", "</answer>", "<think>", "</think>", "\\boxed{", "\\boxed", "{", "}",
    "\\frac", "{,}", "\\text{", "\\$", "$", "0", "1", "7", "9", "42", "1,000", ",", ".", "-", "\u2212", "+", "e",
    "E5", "%", "/", " ", "\n", "\t", "**", "nan", "inf", "\u0663", "\u00a0",
]
arbitrary_text = st.one_of(
    st.text(max_size=200),
    st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=3)), max_size=40).map("".join),
)
valid_golds = st.one_of(st.sampled_from(["72", "1,000", "-3.5", "0", "$18.00"]), st.integers(-10**6, 10**6).map(str))


@FAST
@given(arbitrary_text, st.booleans())
def test_extract_answer_never_raises_and_returns_canonical(text, fallback):
    answer = extract_answer(text, fallback_last_number=fallback)
    assert answer is None or (isinstance(answer, str) and normalize_number(answer) == answer)
    if answer is not None:  # what extraction finds, accuracy rewards (same gold, same flag)
        assert accuracy_reward(text, answer, fallback_last_number=fallback) == 1.0


@FAST
@given(arbitrary_text)
def test_normalize_number_is_idempotent(text):
    normal = normalize_number(text)
    assert normal is None or normalize_number(normal) == normal


@pytest.mark.parametrize("name", sorted(verifiers.VERIFIERS))
@FAST
@given(completion=arbitrary_text, gold=st.one_of(valid_golds, arbitrary_text), prompt=arbitrary_text,
       fallback=st.booleans())
def test_every_verifier_is_total_on_arbitrary_text(name, completion, gold, prompt, fallback):
    score = verifiers.VERIFIERS[name](completion, gold, prompt=prompt, fallback_last_number=fallback, extra=object())
    assert isinstance(score, float) and score in ((0.0, 0.1, 0.9, 1.0) if name == "geo3k_reward" else (0.0, 1.0))


@FAST
@given(arbitrary_text)
def test_format_reward_implies_the_visible_shape(text):
    if format_reward(text, "0") == 1.0:
        stripped = text.strip()
        assert stripped.startswith("<think>") and stripped.endswith("</answer>")
        assert text.count("<think>") == text.count("</answer>") == 1


@FAST
@given(st.lists(arbitrary_text, min_size=1, max_size=6), st.booleans())
def test_scorer_total_is_finite_and_bounded(completions, gate):
    scorer = RewardScorer(["accuracy_reward", "format_reward", "hash_format_reward"], [1.0, 0.5, 0.25],
                          gate_accuracy_on_format=gate)
    batch = scorer.score(completions, ["72"] * len(completions))
    assert batch.total.shape == (len(completions),)
    assert all(math.isfinite(value) and 0.0 <= value <= 1.75 for value in batch.total.tolist())
    assert sum(batch.failures.values()) == 0


MATH_FRAGMENTS = FRAGMENTS + [
    "\\dfrac", "\\tfrac", "\\sqrt", "\\sqrt[", "\\left(", "\\right)", "\\left", "\\right]", "^\\circ", "^{\\circ}",
    "\\%", "x=", "y = ", "=", "(", ")", "[", "]", "\\mbox{", "\\mathrm{", "\\pi", "\\,", "\\!", "\\displaystyle",
    "x", "^", "_", "3/4", "\\infty", "\\text{ cm}", "\\leq", "\u00b0", "\\boxed{x = ",
]
math_text = st.lists(st.one_of(st.sampled_from(MATH_FRAGMENTS), st.text(max_size=3)), max_size=30).map("".join)


def fraction_spellings(value: Fraction, scale: int) -> list:
    """Ways a MATH answer may write `value`: LaTeX fractions, a slash, a reducible fraction, a terminating decimal."""
    p, q = value.numerator, value.denominator
    spellings = [f"\\frac{{{p}}}{{{q}}}", f"{p}/{q}", f"\\dfrac{{{scale * p}}}{{{scale * q}}}"]
    if p < 0:
        spellings.append(f"-\\frac{{{-p}}}{{{q}}}")
    if 0 <= p < 10 and q < 10:
        spellings.append(f"\\frac{p}{q}")  # `\frac34` shorthand
    if q == 1:
        spellings.append(str(p))
    if all(f in (2, 5) for f in _prime_factors(q)):
        spellings.append(str(Decimal(p) / Decimal(q)))
    return spellings


def _prime_factors(n: int) -> list:
    factors, d = [], 2
    while n > 1:
        while n % d == 0:
            factors.append(d)
            n //= d
        d += 1
    return factors


small_fractions = st.builds(Fraction, st.integers(-60, 60), st.integers(1, 40))


@FAST
@given(math_text)
def test_normalize_math_answer_never_raises_and_is_idempotent(text):
    normal = normalize_math_answer(text)
    assert normal is None or (isinstance(normal, str) and normal and normalize_math_answer(normal) == normal)


@FAST
@given(st.one_of(math_text, arbitrary_text), st.one_of(math_text, arbitrary_text))
def test_math_answers_equal_is_symmetric_and_reflexive(first, second):
    equal = math_answers_equal(first, second)
    assert isinstance(equal, bool) and equal == math_answers_equal(second, first)
    assert math_answers_equal(first, first) == (normalize_math_answer(first) is not None)


@FAST
@given(st.one_of(math_text, arbitrary_text), st.booleans())
def test_extract_answer_text_never_raises_and_is_rewarded(text, fallback):
    answer = extract_answer_text(text)
    assert answer is None or (isinstance(answer, str) and answer == answer.strip() and answer)
    if answer is not None and normalize_math_answer(answer) is not None:  # what extraction finds, accuracy rewards
        assert accuracy_reward(text, answer, fallback_last_number=fallback) == 1.0


@FAST
@given(completion=st.one_of(math_text, arbitrary_text), gold=math_text, fallback=st.booleans())
def test_accuracy_reward_is_total_on_math_text(completion, gold, fallback):
    assert accuracy_reward(completion, gold, fallback_last_number=fallback) in (0.0, 1.0)
    assert accuracy_reward(f"\\boxed{{{completion}}}", gold) in (0.0, 1.0)


@FAST
@given(small_fractions, small_fractions, st.integers(1, 5))
def test_fraction_spellings_match_exactly(value, other, scale):
    spellings, others = fraction_spellings(value, scale), fraction_spellings(other, scale)
    for gold in spellings:
        assert all(math_answers_equal(gold, answer) for answer in spellings)
        if other != value:  # never a near miss
            assert not any(math_answers_equal(gold, answer) for answer in others)
    for answer in spellings:  # and the same through extraction from a completion
        assert accuracy_reward(f"\\boxed{{{answer}}}", spellings[0]) == 1.0
        assert accuracy_reward(f"#### {answer}", spellings[-1]) == 1.0
        assert accuracy_reward(f"\\boxed{{{answer}}}", others[0]) == float(other == value)


@FAST
@given(st.lists(small_fractions, min_size=2, max_size=4), st.sampled_from(["()", "[]", "(]", "[)"]))
def test_tuples_match_element_wise(values, brackets):
    opening, closing = brackets
    gold = opening + ", ".join(f"\\frac{{{v.numerator}}}{{{v.denominator}}}" for v in values) + closing
    answer = f"\\left{opening}" + ",".join(f"{v.numerator}/{v.denominator}" for v in values) + f"\\right{closing}"
    assert accuracy_reward(f"\\boxed{{{answer}}}", gold) == 1.0
    swapped = "[" + answer[len("\\left("):] if opening == "(" else "(" + answer[len("\\left["):]
    assert accuracy_reward(f"\\boxed{{{swapped}}}", gold) == 0.0  # other bracket: another interval
    if values != values[::-1]:
        reversed_answer = opening + ",".join(str(v) for v in values[::-1]) + closing
        assert accuracy_reward(f"\\boxed{{{reversed_answer}}}", gold) == 0.0
