"""Rule-based rewards (verifiers) for GRPO on maths word problems, and the scorer the trainer calls.

Pure Python + numpy on purpose: rewards run on the host between rollout and the policy update, and must be testable
without MindSpore. One idea per module:

- `answers`: the model's final answer, found in a completion (`extract_answer`, `extract_answer_text`) and compared
  with the gold one (`normalize_number`, `normalize_math_answer`, `math_answers_equal`).
- `verifiers`: the registry of verifiers (`register_verifier`, `batch_verifier`, `resolve_verifier` for names and
  `package.module:function` specs) and the built-in ones (`accuracy_reward`, `format_reward`, `hash_format_reward`).
- `scorer`: `RewardScorer`, which runs the configured verifiers over a batch, weights (or gates) and aggregates their
  scores into a `RewardBatch`, and stops the run with `VerifierError` on a verifier that is broken, not unlucky.
- `workers`: the processes verifiers run in under a time limit or in parallel (`reward_config.verifier_timeout`,
  `verifier_parallel`).

The names below are re-exported so that `from mindgrpo.rewards import RewardScorer` and the like keep working.
"""
from mindgrpo.rewards.answers import (
    extract_answer,
    extract_answer_text,
    math_answers_equal,
    normalize_math_answer,
    normalize_number,
)
from mindgrpo.rewards.scorer import RewardBatch, RewardScorer, VerifierError, group_normalize
from mindgrpo.rewards.verifiers import (
    VerifierSpecError,
    accuracy_reward,
    batch_verifier,
    format_reward,
    hash_format_reward,
    register_verifier,
    resolve_verifier,
)

__all__ = [
    "RewardBatch",
    "RewardScorer",
    "VerifierError",
    "VerifierSpecError",
    "accuracy_reward",
    "batch_verifier",
    "extract_answer",
    "extract_answer_text",
    "format_reward",
    "group_normalize",
    "hash_format_reward",
    "math_answers_equal",
    "normalize_math_answer",
    "normalize_number",
    "register_verifier",
    "resolve_verifier",
]
