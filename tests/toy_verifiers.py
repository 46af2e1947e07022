"""A dense verifier for trainer tests: the random tiny fixture never answers GSM8K, so accuracy is always 0 and
GRPO would have no signal; the share of digits in a completion varies within every group."""


def digit_share(completion: str, gold: str, **context) -> float:
    return sum(ch.isdigit() for ch in completion) / max(1, len(completion))


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
