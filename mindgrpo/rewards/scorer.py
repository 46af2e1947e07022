"""`RewardScorer`: the configured verifiers over a batch of completions, weighted into the reward.

The verifiers run in the trainer's process or (with a time limit per call, or several at once) in worker processes
(`mindgrpo.workers`). A verifier that crashes, hangs or returns junk on one completion costs that completion
its score (and is counted), never the training run; one that fails on every completion of a batch, or a batch
verifier that does not return one number per completion, is a bug: `VerifierError` stops the run, naming it.
"""
from __future__ import annotations

import hashlib
import logging
import math
import numbers
import pickle
import reprlib
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Set, Tuple, Union

import numpy as np

from mindgrpo.choices import REWARD_AGGREGATIONS
from mindgrpo.rewards.verifiers import (
    Verifier,
    VerifierSpecError,
    is_batch_verifier,
    is_format_verifier,
    resolve_verifier,
)
from mindgrpo.workers import CallOutcome, WorkerPool, WorkerStartError

_log = logging.getLogger(__name__)

_FLOAT32_MAX = float(np.finfo(np.float32).max)


class VerifierError(RuntimeError):
    """A verifier that is broken, not unlucky: it failed on every completion of a batch, or (a batch verifier) did
    not return one number per completion. Rewards of 0 from it would train the policy on nothing, silently, so the
    trainer stops with this error before the update (`GRPOTrainer.train` lets it through unchanged)."""


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


# Added to each group's std by `normalize_then_sum`: TRL's 1e-4, the same as mindgrpo.algorithm.advantages'
# DEFAULT_STD_EPS (not imported: that module loads MindSpore, and rewards must not).
GROUP_STD_EPS = 1e-4


def group_normalize(scores: np.ndarray, num_generations: int, eps: float = GROUP_STD_EPS) -> np.ndarray:
    """`(r - group mean) / (group std + eps)` over consecutive groups of `num_generations` scores, float64 [N].

    The std is the unbiased one (TRL's `nanstd`); a group of one has no spread and gives 0, as in TRL."""
    grouped = np.asarray(scores, np.float64).reshape(-1, num_generations)
    centered = grouped - grouped.mean(axis=1, keepdims=True)
    if num_generations == 1:
        return centered.reshape(-1)
    std = np.sqrt((centered * centered).sum(axis=1, keepdims=True) / (num_generations - 1))
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
    each verifier's scores normalised within its group of `num_generations` consecutive completions
    (`group_normalize`), so a verifier with a wide range cannot drown out the others.

    `fallback_last_number` is passed to every verifier as a keyword (accuracy_reward honours it; others ignore it).

    `shuffle_rewards` (`reward_config.shuffle_rewards`, a control experiment) permutes what the advantages are computed
    from across the batch's completions: the same values and mean, no relation to the completion each lands on. The
    permutation is drawn from the batch's own text (`_content_rng`), so a resumed run draws the same one. `total`,
    the logged reward, stays the real one: the control's curve shows what its policy really scores.

    With `verifier_timeout > 0` or `verifier_parallel > 0` the verifiers run in `max(1, verifier_parallel)` worker
    processes (`mindgrpo.workers`), which must be able to import each verifier by name; a call that takes
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
        num_generations: int = 1,
        verifier_timeout: float = 0.0,
        verifier_parallel: int = 0,
        shuffle_rewards: bool = False,
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
        self.gates = [name for name, fn in self.functions.items() if is_format_verifier(fn)]
        self.batched = {name for name, fn in self.functions.items() if is_batch_verifier(fn)}
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
        self.aggregation, self.num_generations = self._check_aggregation(aggregation, num_generations)
        self.verifier_timeout, processes = self._check_workers(verifier_timeout, verifier_parallel)
        self._pool: Optional[WorkerPool] = None
        if processes:
            for index, (name, fn) in enumerate(self.functions.items()):
                _check_sendable(name, fn, index)
            self._pool = WorkerPool(self.functions, processes, timeout=self.verifier_timeout)
        self._warned: Set[Tuple[str, bool]] = set()
        self.shuffle_rewards = bool(shuffle_rewards)

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

    def _check_aggregation(self, aggregation: str, num_generations: int) -> Tuple[str, int]:
        if aggregation not in REWARD_AGGREGATIONS:
            raise ValueError(f"reward_config.aggregation = {aggregation!r}: choose one of "
                             f"{', '.join(REWARD_AGGREGATIONS)}")
        if aggregation == "normalize_then_sum" and self.gate_accuracy_on_format:
            raise ValueError(
                "reward_config.aggregation = normalize_then_sum normalises each verifier on its own, and "
                "reward_config.gate_accuracy_on_format multiplies accuracy by format: choose one of them"
            )
        if isinstance(num_generations, bool) or not isinstance(num_generations, numbers.Integral) \
                or num_generations < 1:
            raise ValueError(f"RewardScorer num_generations = {num_generations!r}: must be a whole number >= 1 (the "
                             "completions per prompt, rl_config.num_generations)")
        return aggregation, int(num_generations)

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
        if self.aggregation == "normalize_then_sum" and count % self.num_generations:
            raise ValueError(f"RewardScorer.score got {count} completions, not whole groups of {self.num_generations} "
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
        aggregated = self._aggregated(per_verifier, total)
        if self.shuffle_rewards:
            aggregated = aggregated[_content_rng(completions, golds).permutation(count)]
        return RewardBatch(total, per_verifier, {name: t.failed for name, t in tallies.items()},
                           {name: t.timed_out for name, t in tallies.items()}, aggregated)

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
            summed += self.weights[name] * group_normalize(scores, self.num_generations)
        return summed.astype(np.float32)


def _content_rng(completions: Sequence[str], golds: Sequence[str]) -> np.random.Generator:
    """A generator seeded by the batch's completions and golds: the same batch always draws the same numbers."""
    digest = hashlib.sha256("\0".join(list(completions) + list(golds)).encode("utf-8", "surrogatepass")).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


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
