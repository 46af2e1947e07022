"""Toy verifiers for tests, all top-level functions so that verifier worker processes can import them by name.

Dense ones for trainer tests: the random tiny fixture never answers GSM8K, so accuracy is always 0 and GRPO would
have no signal; a completion's length in characters varies within every group. (The share of digits did not: on a
machine whose tokenizer build made another fixture, two steps of its completions held no digit at all.) Misbehaving ones (hanging, raising,
crashing, batch verifiers returning the wrong thing) for tests/test_rewards.py."""
import os
import re
import time

from mindgrpo.rewards.verifiers import batch_verifier


def text_length(completion: str, gold: str, **context) -> float:
    """Dense for the random demo model (tests/test_faults.py), whose completions hold few digits: the completion's
    length in characters varies within every group, so every step has advantages and moves the weights."""
    return len(completion) / 64.0


POISON = {"on": False}  # tests flip this to make `poisonable` return rewards whose advantages overflow the loss


def poisonable(completion: str, gold: str, **context) -> float:
    """text_length, or 3e38 for half the completions while POISON["on"]: advantages that large overflow the
    gradients to inf (with rl_config.scale_rewards: none), which is how a broken reward reaches the update."""
    if POISON["on"]:
        return 3e38 if len(completion) % 2 else 0.0
    return text_length(completion, gold)


# ---- misbehaving verifiers ---------------------------------------------------------------------------------------

_CATASTROPHIC = re.compile(r"(a+)+$")  # nested quantifiers: exponential backtracking on "aaa...ab", inside C code


def hangs_on_request(completion: str, gold: str, **context) -> float:
    """Hangs on completions that ask for it: `sleep` in Python (interruptible), `regex` in C (which no signal can
    interrupt: re holds the GIL for the whole match); otherwise the completion's length."""
    if "sleep" in completion:
        time.sleep(600)
    if "regex" in completion:
        _CATASTROPHIC.match("a" * 64 + "b")
    return float(len(completion))


def hangs_on_even_length(completion: str, gold: str, **context) -> float:
    """text_length, but hangs on completions of an even number of characters: for the trainer-level timeout test,
    where the random demo model writes about as many of each."""
    if len(completion) % 2 == 0:
        time.sleep(600)
    return text_length(completion, gold)


def always_raises(completion: str, gold: str, **context) -> float:
    raise ValueError(f"broken verifier saw {completion!r}")


def dies_on_request(completion: str, gold: str, **context) -> float:
    """Ends its process on `die` (a crash in C code looks the same to the scorer); otherwise the length."""
    if "die" in completion:
        os._exit(3)
    return float(len(completion))


def returns_a_function_on_request(completion: str, gold: str, **context) -> float:
    """On `function`, a value that cannot even be pickled back from a worker; otherwise the length."""
    if "function" in completion:
        return lambda: 1.0
    return float(len(completion))


@batch_verifier
def batch_length(completions, golds, **context):
    """TRL style: one call per batch, one float per completion (its length, plus 100 when it contains its gold)."""
    return [len(c) + (100.0 if g and g in c else 0.0) for c, g in zip(completions, golds)]


@batch_verifier
def batch_one_short(completions, golds, **context):
    return [1.0] * (len(completions) - 1)


@batch_verifier
def batch_strings(completions, golds, **context):
    return ["1.0" for _ in completions]


def flat_when_gold_even(completion: str, gold: str, **context) -> float:
    """0 for every completion of a prompt whose gold answer is even (a group with no signal, which dynamic
    sampling drops), else text_length."""
    return 0.0 if int(float(gold)) % 2 == 0 else text_length(completion, gold)


def constant(completion: str, gold: str, **context) -> float:
    """1 for everything: every group has equal rewards, so dynamic sampling never fills a batch."""
    return 1.0
