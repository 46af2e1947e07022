r"""The tool demo's task: products of a three-digit and a two-digit number, which the tiny model cannot work out in
its head, in GSM8K format.

"What is 347 * 82?" with `answer` `"347 * 82 = 28454\n#### 28454"`. With the ``calculator`` tool the model's
answer is two turns (Qwen2.5's tool format, :mod:`mindgrpo.data.tool_format`): a call, the tool's response appended by
the rollout, then ``#### 28454``. :func:`transcript` gives those turns' token ids exactly as a rollout holds them:
each model turn and the response tokenised on its own, never the whole text at once.
"""
from __future__ import annotations

import json
import random
from typing import List, Sequence, Tuple

from mindgrpo.data.tool_format import responses_text

NUM_TRAIN, NUM_TEST = 2000, 200

# The numbers end every question, so the call copies them from a fixed distance back: a 2-layer model learns that
# within a short warm start (with the numbers anywhere in the question, 600 steps got the first digit right only).
_QUESTIONS = ("What is {a} * {b}?", "Compute {a} * {b}?", "Work out {a} * {b}?", "How much is {a} * {b}?",
              "Calculate {a} * {b}?", "What do you get for {a} * {b}?")


def make_problems(seed: int = 0, num_train: int = NUM_TRAIN, num_test: int = NUM_TEST) -> Tuple[List[dict], List[dict]]:
    """(train, test) rows `{"question", "answer"}`: `a * b` with a in 100..999 and b in 11..99, no question in both."""
    rng = random.Random(seed)
    rows, seen = [], set()
    while len(rows) < num_train + num_test:
        a, b = rng.randint(100, 999), rng.randint(11, 99)
        question = rng.choice(_QUESTIONS).format(a=a, b=b)
        if question in seen:
            continue
        seen.add(question)
        rows.append({"question": question, "answer": f"{a} * {b} = {a * b}\n#### {a * b}"})
    return rows[:num_train], rows[num_train:]


def expression(row: dict) -> str:
    """The product the question asks for, as the calculator is called with it ("347 * 82")."""
    return row["answer"].split(" = ", 1)[0]


def gold(row: dict) -> str:
    return row["answer"].rsplit("####", 1)[1].strip()


def call_text(row: dict) -> str:
    """The model's first turn: one calculator call, as Qwen2.5 writes it (its `<|im_end|>` follows)."""
    call = {"name": "calculator", "arguments": {"expression": expression(row)}}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


def final_text(row: dict) -> str:
    return f"#### {gold(row)}"


def transcript(tok, row: dict) -> Tuple[List[int], List[int]]:
    """The completion of a tool prompt with the calculator used right, as a rollout holds it: token ids and a mask
    that is 1 on the model's tokens (its two turns, each ending with `<|im_end|>`) and 0 on the tool response."""
    call = tok.encode(call_text(row)) + [tok.eos_token_id]
    response = tok.encode(responses_text([gold(row)]))
    final = tok.encode(final_text(row)) + [tok.eos_token_id]
    return call + response + final, [1] * len(call) + [0] * len(response) + [1] * len(final)


def direct(tok, row: dict) -> Tuple[List[int], List[int]]:
    """The completion of a prompt without tools: the worked product and its `#### N` line, all the model's."""
    ids = tok.encode(row["answer"]) + [tok.eos_token_id]
    return ids, [1] * len(ids)


def corpus(rows: Sequence[dict]) -> List[str]:
    """Texts for the tokenizer beyond the prompts: the completions in both formats."""
    return [call_text(r) + responses_text([gold(r)]) + final_text(r) for r in rows]
