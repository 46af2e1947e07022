"""A dense verifier for trainer tests: the random tiny fixture never answers GSM8K, so accuracy is always 0 and
GRPO would have no signal; the share of digits in a completion varies within every group."""


def digit_share(completion: str, gold: str, **context) -> float:
    return sum(ch.isdigit() for ch in completion) / max(1, len(completion))
