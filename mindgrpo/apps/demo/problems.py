r"""The demo's task: one-digit addition and subtraction word problems in GSM8K format.

"Tom has 3 apples and buys 4 more. How many apples does Tom have now?" with `answer` `"3 + 4 = 7\n#### 7"`.
"""
from __future__ import annotations

import random
from typing import List, Tuple

MAX_OPERAND = 9
NUM_TRAIN, NUM_TEST = 2000, 200

_NAMES = ("Tom", "Anna", "Ben", "Mia", "Sam", "Lily", "Max", "Emma", "Leo", "Zoe", "Jack", "Nina")
_THINGS = (("apple", "apples"), ("pen", "pens"), ("book", "books"), ("marble", "marbles"), ("coin", "coins"),
           ("card", "cards"), ("shell", "shells"), ("cookie", "cookies"), ("ball", "balls"), ("flower", "flowers"))
# {n}: name, {a}/{b}: operands, {A}/{B}: "<a> <thing(s)>" with the right number, {T}: plural thing.
_ADD = (
    "What is {a} plus {b}?",
    "What is {a} + {b}?",
    "What is the sum of {a} and {b}?",
    "{n} has {A} and buys {b} more. How many {T} does {n} have now?",
    "{n} has {A}. A friend gives {n} {B}. How many {T} does {n} have?",
    "There are {A} in a box. {n} puts in {b} more. How many {T} are in the box?",
    "{n} found {A} and then {B}. How many {T} did {n} find in all?",
)
_SUB = (
    "What is {a} minus {b}?",
    "What is {a} - {b}?",
    "What is {b} less than {a}?",
    "{n} has {A} and gives {b} away. How many {T} does {n} have left?",
    "{n} had {A} and lost {B}. How many {T} does {n} have now?",
    "There are {A} in a box. {n} takes out {b}. How many {T} are left in the box?",
    "{n} made {A} and sold {B}. How many {T} does {n} still have?",
)


def _question(template: str, name: str, thing: Tuple[str, str], a: int, b: int) -> str:
    def count(k: int) -> str:
        return f"{k} {thing[0] if k == 1 else thing[1]}"

    return template.format(n=name, a=a, b=b, A=count(a), B=count(b), T=thing[1])


def make_problems(seed: int = 0, num_train: int = NUM_TRAIN, num_test: int = NUM_TEST) -> Tuple[List[dict], List[dict]]:
    """(train, test) rows `{"question", "answer"}`: one-digit sums and non-negative differences, GSM8K style.

    Half the rows add `a + b` (a, b in 1..MAX_OPERAND), half subtract `a - b` (1 <= b <= a <= MAX_OPERAND). Every
    question is unique, so the splits share none; they do share operand pairs (there are only 126): the model has
    to learn to read the question, and the facts.
    """
    rng = random.Random(seed)
    rows: List[dict] = []
    seen = set()
    while len(rows) < num_train + num_test:
        subtract = len(rows) % 2 == 1
        a = rng.randint(1, MAX_OPERAND)
        b = rng.randint(1, a) if subtract else rng.randint(1, MAX_OPERAND)
        template = rng.choice(_SUB if subtract else _ADD)
        question = _question(template, rng.choice(_NAMES), rng.choice(_THINGS), a, b)
        if question in seen:
            continue
        seen.add(question)
        result = a - b if subtract else a + b
        rows.append({"question": question, "answer": f"{a} {'-' if subtract else '+'} {b} = {result}\n#### {result}"})
    rng.shuffle(rows)
    return rows[:num_train], rows[num_train:]
