"""Training metrics: JSON lines, TensorBoard scalars, a console summary, and sampled completions.

Files in `out_dir` (rank 0 only; other ranks log nothing, since every rank sees the same reduced metrics):

- `metrics.jsonl`: one JSON object per step, `{"step": 12, "time": <unix seconds>, "<name>": value, ...}`.
- `completions.jsonl`: one JSON object per completion, `{"step", "reward", "rewards", "gold", "prompt",
  "completion", ...}`, written with real Unicode (not `\\u` escapes) so `grep -i "wait, let me"` just works.
- `tensorboard/`: tensorboardX event files with every scalar of `metrics.jsonl`.

Non-finite numbers are written as the strings `"nan"`, `"inf"` and `"-inf"`: JSON has no NaN/Infinity literals
(Python's `json` would emit them, and jq, browsers and most JSON readers reject the line), `null` would hide
whether the loss was NaN or diverged to inf, and `float("nan")`/`float("inf")` parse the strings back directly,
which is what `read_metrics` does.

A resumed run first calls `truncate_after(resumed_step)`: records of the steps it will redo are dropped from both
JSONL files and TensorBoard is told to discard its events from those steps too, so nothing is counted twice.

Renamed metrics. Two of MindRLHF's names describe what the default (native) rollout backend does not do, so they
were renamed after what they measure. For one release, every `metrics.jsonl` record also carries each such value
under its old name, so scripts written for MindRLHF's logs keep working (TensorBoard and the console use the new
names only); `mindgrpo.apps.plotting` reads both. The whole list is `METRIC_ALIASES`:

| name                 | old MindRLHF name (alias in metrics.jsonl) | what it is                                  |
| -------------------- | ------------------------------------------ | ------------------------------------------- |
| `rollout_tps`        | `vllm_tps`                                 | throughput of the rollout, any backend      |
| `timing/weight_sync` | `timing/resharding_to_infer`               | seconds giving the engine the new weights   |
"""
from __future__ import annotations

import json
import math
import os
import secrets
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Mapping, Sequence, TextIO

from mindgrpo._io import NO_SPACE_ERRNOS, atomic_open

METRIC_NAMES: tuple[str, ...] = (
    "timing/all",                  # seconds for the whole step
    "timing/rollout",              # seconds generating completions
    "timing/reference_model",      # seconds computing reference-model log-probs
    "timing/old_log_p",            # seconds computing the rollout policy's log-probs
    "timing/update",               # seconds in forward/backward/optimizer
    "timing/weight_sync",          # seconds giving the rollout engine the trained weights
    "memory/peak_rss_gib",         # the process's peak resident memory so far (GiB): what `plan --device cpu` predicts
    "actor/pg_loss",               # clipped policy-gradient (surrogate) loss
    "actor/kl_loss",               # KL(policy || reference) term, before the beta coefficient
    "actor/entropy",               # mean token entropy of the policy
    "actor/pg_clipfrac",           # fraction of tokens whose ratio was clipped
    "actor/ppo_kl",                # approximate KL(old policy || policy) over the update
    "grad_norm",                   # global gradient norm before clipping
    "grpo/lr",                     # learning rate used this step
    "grpo/rewards/mean",           # total reward over all completions of the step
    "grpo/rewards/max",
    "grpo/rewards/min",
    "response_length/mean",        # completion tokens per sample
    "response_length/max",
    "response_length/min",
    "prompt_length/mean",          # prompt tokens per sample
    "prompt_length/max",
    "prompt_length/min",
    "e2e_tps",                     # throughput_tps() over timing/all
    "update_tps",                  # throughput_tps() over timing/update
    "rollout_tps",                 # throughput_tps() over timing/rollout
)
"""Standard metric names. The trainer adds `grpo/rewards/<verifier>` (mean reward of each verifier), counters, and:

- DAPO's length figures: `grpo/truncated_frac` (share of completions that reached max_tokens without EOS) and
  `grpo/overlong_penalty/mean` (the mean overlong penalty added to the rewards, 0 when off).
- Dynamic sampling (`rl_config.dynamic_sampling`): `grpo/generation_batches` (rounds of generation of the step's
  generation, the same on every rank; 1 without dynamic sampling) and `grpo/unfilled_groups` (slots of the batch,
  over all ranks, filled with dropped groups left out of the loss because `max_generation_batches` was reached; 0
  when the batch filled). The reward figures (`grpo/rewards/*`, `grpo/zero_std_groups`: groups whose rewards are all
  equal) describe the first round's share of the step, a plain sample of the policy, so they mean the same with and
  without dynamic sampling (the kept groups are biased by the filter: they never have zero std); lengths and
  `grpo/truncated_frac` describe the trained batch.
- The rollout log-prob gap, when the engine returns log-probs (all backends): `rollout/logprob_diff_mean` and
  `rollout/logprob_diff_max` (|training forward log-prob - rollout engine's log-prob| over the step's active tokens,
  all data-parallel ranks) and `rollout/is_ratio_mean` (mean exp(train - sampling): the token importance ratio
  between the two; 1 when they agree). The training log-probs are those of the update's first pass, taken in the
  loss graph (no extra forward); on the later steps of a generation (`steps_per_generation` > 1) the weights have
  moved since sampling, so the gap also holds that change; both are of the temperature-scaled distribution, so top-k, top-p, min_tokens and
  repetition penalty, which the engine applies and the training forward does not, show up as a gap.
- `timing/vision`: seconds in the Qwen2.5-VL vision tower, run once per prompt before the rollout (0 for text)."""

METRIC_ALIASES: dict[str, str] = {
    "rollout_tps": "vllm_tps",
    "timing/weight_sync": "timing/resharding_to_infer",
}
"""New metric name -> the old MindRLHF name `metrics.jsonl` also writes it under, for one release (see above)."""

# Console summary: (metric name, label), in this fixed order; metrics absent from a step are left out.
_CONSOLE_FIELDS = (
    ("grpo/rewards/mean", "reward"),
    ("actor/pg_loss", "pg_loss"),
    ("actor/kl_loss", "kl"),
    ("response_length/mean", "resp_len"),
    ("timing/all", "step_s"),
    ("e2e_tps", "e2e_tps"),
)
_RESERVED = ("step", "time")


def peak_rss_gib() -> float:
    """The process's peak resident set so far, in GiB (Linux reports ``ru_maxrss`` in KiB, macOS in bytes)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (2**30 if sys.platform == "darwin" else 2**20)


def throughput_tps(prompt_tokens: float, response_tokens: float, num_prompts: int, num_samples: int,
                   world_size: int, seconds: float) -> float:
    """Tokens per second per device, MindRLHF's formula.

        tps = (prompt_tokens + response_tokens) * num_prompts * num_samples / world_size / seconds

    `prompt_tokens`/`response_tokens` are per-sample *average* lengths in tokens (e.g. `prompt_length/mean`,
    `response_length/mean`), `num_prompts` the prompts per step, `num_samples` the completions per prompt (GRPO
    group size), `world_size` the number of devices sharing the work and `seconds` the wall time of the phase
    measured (`timing/all` for `e2e_tps`, `timing/update` for `update_tps`, `timing/rollout` for `rollout_tps`).
    """
    if min(prompt_tokens, response_tokens) < 0 or num_prompts < 0 or num_samples < 0:
        raise ValueError("throughput_tps: token lengths, num_prompts and num_samples must be >= 0, got "
                         f"{prompt_tokens}, {response_tokens}, {num_prompts}, {num_samples}")
    if world_size < 1:
        raise ValueError(f"throughput_tps: world_size must be >= 1, got {world_size}")
    if not seconds > 0:
        raise ValueError(f"throughput_tps: seconds must be > 0, got {seconds}")
    return (prompt_tokens + response_tokens) * num_prompts * num_samples / world_size / seconds


def _json_number(name: str, value: Any) -> int | float | str:
    """int/float for JSON; non-finite floats become "nan"/"inf"/"-inf" (see the module docstring)."""
    # Integer counters stay integers; numpy integer/bool scalars too. Anything else (MindSpore tensors included,
    # whose dtype has no `.kind`) goes through float().
    if isinstance(value, int) or (getattr(getattr(value, "dtype", None), "kind", None) in ("b", "i", "u")
                                  and getattr(value, "ndim", None) == 0):
        return int(value)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"metric {name!r} must be a scalar number, got {type(value).__name__}: {value!r:.80}") from None
    if math.isfinite(number):
        return number
    return "nan" if math.isnan(number) else ("inf" if number > 0 else "-inf")


def _sanitize(value: Any) -> Any:
    """Make completion-record values JSON-valid: non-finite floats as strings, numpy scalars as Python values."""
    if isinstance(value, Mapping):
        return {str(k): _sanitize(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_sanitize(v) for v in value]
    if isinstance(value, (str, bool)) or value is None:
        return value
    if hasattr(value, "tolist"):  # numpy / MindSpore arrays and scalars
        return _sanitize(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return _json_number("", value)
    return value


def _compact(value: Any) -> str:
    """4 significant digits, but whole numbers from 1000 up (throughputs) rather than `1.235e+04`."""
    if not isinstance(value, (int, float)):
        return str(value)  # "nan" / "inf" strings
    return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def _restore_number(value: Any) -> Any:
    return float(value) if value in ("nan", "inf", "-inf") else value


def _parse_line(path: Path, lineno: int, line: str) -> dict[str, Any] | None:
    """The JSON object on `line`, or None (with a warning) for a blank or unreadable line, e.g. a torn write."""
    if not line.strip():
        return None
    try:
        record = json.loads(line)
    except ValueError as e:
        warnings.warn(f"{path}:{lineno}: skipping unreadable line ({e})", stacklevel=4)
        return None
    if not isinstance(record, dict):
        warnings.warn(f"{path}:{lineno}: skipping line that is not a JSON object", stacklevel=4)
        return None
    return record


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Records of a `metrics.jsonl` (a file, or the folder holding it), "nan"/"inf" strings turned back to floats."""
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no metrics file; pass the run's output folder or its metrics.jsonl")
    with open(path, encoding="utf-8", errors="replace") as f:
        records = [_parse_line(path, lineno, line) for lineno, line in enumerate(f, 1)]
    return [{k: _restore_number(v) for k, v in r.items()} for r in records if r is not None]


def _drop_torn_tail(path: Path) -> None:
    """Cut a partial last line (the process was killed mid-write) so the next append starts on a fresh line."""
    if not path.is_file():
        return
    with open(path, "r+b") as f:
        end = f.seek(0, 2)
        if end == 0:
            return
        f.seek(end - 1)
        if f.read(1) == b"\n":
            return
        pos = end
        while pos > 0:  # scan back block by block for the last newline
            start = max(0, pos - 65536)
            f.seek(start)
            block = f.read(pos - start)
            newline = block.rfind(b"\n")
            if newline >= 0:
                pos = start + newline + 1
                break
            pos = start
        f.truncate(pos)
    warnings.warn(f"{path}: removed a partial last line left by an interrupted run", stacklevel=3)


def _append_lines(path: Path, text: str) -> None:
    """Append whole lines or nothing: a write that fails part-way (disk full) is cut back to the file's previous
    end, so the file stays valid line by line. Opened per call: one short write per step, nothing buffered to lose,
    and truncate_after can rewrite the file freely."""
    data = text.encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        end = os.lseek(fd, 0, os.SEEK_END)
        try:
            written = 0
            while written < len(data):
                written += os.write(fd, data[written:])
        except OSError as err:
            os.ftruncate(fd, end)
            reason = err.strerror
            if err.errno in NO_SPACE_ERRNOS:
                reason = "no space left: disk full, over quota or over a file-size limit"
            raise OSError(err.errno, f"{path}: could not append ({reason}); the file was left as it was before "
                                     "this write. Free space, then resume with --resume_training") from err
    finally:
        os.close(fd)


class MetricsLogger:
    """Per-step metrics to `metrics.jsonl`, TensorBoard and the console; sampled completions to JSONL.

    Only `rank` 0 writes anything. `total_steps` is shown as `step/total` and sizes the progress bar, which is
    drawn only when `stream` (default stdout) is a terminal; otherwise (CI, `nohup`) one plain line per step.
    """

    def __init__(self, out_dir: str | Path, *, rank: int = 0, tensorboard: bool = True, console: bool = True,
                 total_steps: int | None = None, stream: TextIO | None = None):
        self.out_dir = Path(out_dir)
        self.enabled = rank == 0
        self.tensorboard = tensorboard
        self.console = console
        self.total_steps = total_steps
        self.stream = stream if stream is not None else sys.stdout
        self.metrics_path = self.out_dir / "metrics.jsonl"
        self.completions_path = self.out_dir / "completions.jsonl"
        self._writer = None    # tensorboardX SummaryWriter, created on first log (importing it takes ~2 s)
        self._purge_step: int | None = None
        self._bar = None
        if self.enabled:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            _drop_torn_tail(self.metrics_path)
            _drop_torn_tail(self.completions_path)

    def truncate_after(self, step: int) -> None:
        """On resume from the checkpoint of `step`: keep records with step <= `step`, drop the later ones.

        Applies to `metrics.jsonl` and `completions.jsonl` (rewritten atomically) and to TensorBoard (events at
        steps > `step` are purged when the run logs again), so redone steps do not appear twice.
        """
        if not self.enabled:
            return
        for path in (self.metrics_path, self.completions_path):
            if not path.is_file():
                continue
            # Streamed, and kept lines are copied verbatim: completions.jsonl can reach hundreds of MB.
            with open(path, encoding="utf-8", errors="replace") as src, atomic_open(path, "w") as dst:
                for lineno, line in enumerate(src, 1):
                    record = _parse_line(path, lineno, line)
                    if record is not None and isinstance(record.get("step"), int) and record["step"] <= step:
                        dst.write(line if line.endswith("\n") else line + "\n")
        self._purge_step = step + 1
        if self._writer is not None:  # purge_step only takes effect when a writer is opened
            self._writer.close()
            self._writer = None

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Record the scalar `metrics` of `step` (see METRIC_NAMES) everywhere this logger writes."""
        if not self.enabled:
            return
        record: dict[str, Any] = {"step": int(step), "time": time.time()}
        for name, value in metrics.items():
            if not isinstance(name, str) or name in _RESERVED:
                raise ValueError(f"metric name {name!r} is invalid: names are strings other than {_RESERVED}")
            record[name] = _json_number(name, value)
        aliases = {old: record[new] for new, old in METRIC_ALIASES.items() if new in record and old not in record}
        self._append(self.metrics_path, {**record, **aliases})
        if self.tensorboard:
            writer = self._tensorboard_writer()
            for name, value in record.items():
                if name not in _RESERVED:
                    writer.add_scalar(name, float(value), global_step=step)
            writer.flush()  # a step takes seconds to minutes: flushing each one costs nothing and survives crashes
        if self.console:
            self._print(step, record)

    def log_completions(self, step: int, records: Sequence[Mapping[str, Any]]) -> None:
        """Append one line per completion to `completions.jsonl`.

        Each record needs `prompt` and `completion`; `gold` (reference answer), `reward` (total) and `rewards`
        (verifier name -> reward) are optional, and any other keys (group index, advantage, ...) are kept as is.
        """
        if not self.enabled:
            return
        lines = []
        for i, record in enumerate(records):
            missing = [k for k in ("prompt", "completion") if k not in record]
            if missing:
                raise ValueError(f"log_completions(step={step}): record {i} lacks {missing}; each record needs "
                                 "'prompt' and 'completion' (and optionally 'gold', 'reward', 'rewards')")
            out = {"step": int(step), "reward": record.get("reward"), "rewards": record.get("rewards", {}),
                   "gold": record.get("gold"), "prompt": record["prompt"], "completion": record["completion"]}
            out.update({k: v for k, v in record.items() if k not in out})
            lines.append(json.dumps(_sanitize(out), ensure_ascii=False, allow_nan=False) + "\n")
        _append_lines(self.completions_path, "".join(lines))

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _append(self, path: Path, record: Mapping[str, Any]) -> None:
        _append_lines(path, json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n")

    def _tensorboard_writer(self):
        if self._writer is None:
            from tensorboardX import SummaryWriter

            # tensorboardX names event files by the second and host only: a writer reopened within the same
            # second (truncate_after, a quick restart) would overwrite the previous file without a unique suffix.
            self._writer = SummaryWriter(logdir=str(self.out_dir / "tensorboard"), purge_step=self._purge_step,
                                         filename_suffix=f".{os.getpid()}.{secrets.token_hex(3)}")
        return self._writer

    def summary_line(self, step: int, metrics: Mapping[str, Any]) -> str:
        """Compact one-line summary, e.g. `step 12/100 | reward 0.512 | pg_loss -0.0123 | ... | e2e_tps 1234`."""
        parts = [f"step {step}/{self.total_steps}" if self.total_steps else f"step {step}"]
        for name, label in _CONSOLE_FIELDS:
            if name in metrics:
                value = metrics[name]
                parts.append(f"{label} {_compact(value)}")
        return " | ".join(parts)

    def _print(self, step: int, record: Mapping[str, Any]) -> None:
        line = self.summary_line(step, record)
        if not self.stream.isatty():
            print(line, file=self.stream, flush=True)
            return
        from tqdm import tqdm

        if self._bar is None:  # a resumed run starts the bar where it left off
            self._bar = tqdm(total=self.total_steps, initial=max(step - 1, 0), file=self.stream, unit="step",
                             dynamic_ncols=True)
        self._bar.update(max(step - self._bar.n, 0))
        self._bar.write(line, file=self.stream)
