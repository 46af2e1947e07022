"""Training curves as PNG: one or several runs' ``metrics.jsonl`` as a dashboard and one image per panel.

    from mindgrpo.apps.plotting import plot_runs
    plot_runs(["output/demo", "output/demo_beta0"], "plots", smooth=0.9)   # -> [plots/dashboard.png, ...]

Several runs are overlaid in each panel (one colour per run, labelled by its folder name or ``labels``), which is
how ablations (reward weights, ``num_generations``, step counts) are compared. Panels whose metrics no run logged
are left out; a run that lacks a metric another run has is named in that panel's footnote.

Figures are drawn with matplotlib's object-oriented API on the Agg canvas, never through ``pyplot``: that needs no
display, and it does not switch the backend of a notebook that imports this module. Every PNG is written under a
temporary name and renamed, so a viewer refreshing the folder never shows half an image.
"""
from __future__ import annotations

import json
import math
import os
import secrets
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from mindgrpo.train.metrics import METRIC_ALIASES

PathLike = Union[str, os.PathLike]
Smoothing = Union[None, int, float]

INSTALL_HINT = 'pip install "mindgrpo[plot]"'
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}  # how MetricsLogger writes them
_REWARD_PREFIX = "grpo/rewards/"
_REWARD_AGGREGATES = {"mean", "min", "max", "std"}
_PHASE_LABELS = {"timing/rollout": "rollout", "timing/reference_model": "reference log-probs",
                 "timing/old_log_p": "old log-probs", "timing/update": "update",
                 "timing/weight_sync": "weight sync"}
# Runs logged before the renaming (or by MindRLHF) have only the old names; newer ones both (see METRIC_ALIASES).
_NEW_NAMES = {old: new for new, old in METRIC_ALIASES.items()}


class MetricsFileError(ValueError):
    """A line of a metrics.jsonl that cannot be read; the message names ``file:line``."""


@dataclass
class Run:
    """One run's metrics, one row per logged step (sorted; a step logged twice keeps its last record)."""

    label: str
    path: Path                       # the metrics.jsonl it came from
    steps: np.ndarray                # int [S]
    values: Dict[str, np.ndarray]    # metric name -> float [S], NaN where the step did not log it
    non_finite: Dict[str, int]       # metric name -> how many steps logged it as nan/inf (a diverged run)


@dataclass(frozen=True)
class Panel:
    """One plot: ``key`` over steps, with an optional min..max band."""

    name: str                        # file stem of its PNG
    title: str
    ylabel: str
    key: str
    band: Optional[Tuple[str, str]] = None


def _panels(runs: Sequence[Run]) -> List[Panel]:
    """Panels in dashboard order; per-verifier panels come from the reward names the runs logged."""
    verifiers = sorted({name[len(_REWARD_PREFIX):] for run in runs for name in run.values
                        if name.startswith(_REWARD_PREFIX) and "/" not in name[len(_REWARD_PREFIX):]
                        and name[len(_REWARD_PREFIX):] not in _REWARD_AGGREGATES})
    panels = [Panel("reward", "Reward", "reward", "grpo/rewards/mean",
                    ("grpo/rewards/min", "grpo/rewards/max"))]
    panels += [Panel(f"reward_{v}", f"Verifier {v} (unweighted mean)", "reward", _REWARD_PREFIX + v)
               for v in verifiers]
    panels += [
        Panel("pg_loss", "Policy-gradient loss", "loss", "actor/pg_loss"),
        Panel("kl", "KL to the reference (before beta)", "KL", "actor/kl_loss"),
        Panel("entropy", "Token entropy of the policy", "nats", "actor/entropy"),
        Panel("response_length", "Response length", "tokens",
              "response_length/mean", ("response_length/min", "response_length/max")),
        Panel("grad_norm", "Gradient norm (before clipping)", "global norm", "grad_norm"),
        Panel("e2e_tps", "End-to-end throughput", "tokens/s per device", "e2e_tps"),
    ]
    return panels


# ----------------------------------------------------------------------------------------------------------------
# Reading

def metrics_file(run: PathLike) -> Path:
    """The metrics.jsonl of ``run``: the file itself, or the run folder holding it."""
    path = Path(run)
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no metrics file; pass a run's output folder (rl_config.output_dir, "
                                "which holds metrics.jsonl) or the metrics.jsonl itself")
    return path


def _number(path: Path, lineno: int, name: str, value: object) -> float:
    if isinstance(value, str) and value in _NON_FINITE:
        return _NON_FINITE[value]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise MetricsFileError(f"{path}:{lineno}: metric {name!r} is {value!r}, not a number; fix or delete this line")


def load_run(run: PathLike, label: Optional[str] = None) -> Run:
    """Read one run strictly: an unreadable line is a :class:`MetricsFileError` naming ``file:line``.

    The one exception is an unreadable *last* line without its newline: the run is still writing it (or was
    killed mid-write, which MetricsLogger repairs on resume), so it is skipped with a warning.
    """
    path = metrics_file(run)
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")
    records: Dict[int, Dict[str, float]] = {}
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as err:
            if lineno == len(lines):  # no newline after it: a write in progress
                warnings.warn(f"{path}:{lineno}: skipping the unfinished last line", stacklevel=2)
                continue
            raise MetricsFileError(f"{path}:{lineno}: not valid JSON ({err}); fix or delete this line") from None
        if not isinstance(record, dict):
            raise MetricsFileError(f"{path}:{lineno}: expected a JSON object per line, got "
                                   f"{type(record).__name__}; fix or delete this line")
        step = record.pop("step", None)
        if not isinstance(step, int) or isinstance(step, bool):
            raise MetricsFileError(f"{path}:{lineno}: 'step' is {step!r}, expected an integer; fix or delete "
                                   "this line")
        record.pop("time", None)
        values = {name: _number(path, lineno, name, value) for name, value in record.items()}
        for old, new in _NEW_NAMES.items():  # one curve per metric, under its new name
            if old in values:
                values.setdefault(new, values.pop(old))
        records[step] = values
    steps = sorted(records)
    names = sorted({name for record in records.values() for name in record})
    values = {name: np.array([records[s].get(name, math.nan) for s in steps], dtype=np.float64) for name in names}
    non_finite = {name: sum(1 for s in steps if name in records[s] and not math.isfinite(records[s][name]))
                  for name in names}
    return Run(label or _folder_label(path), path, np.array(steps, dtype=np.int64), values, non_finite)


def _folder_label(path: Path) -> str:
    return path.parent.name or str(path.parent)


def _distinct_labels(paths: Sequence[Path]) -> List[str]:
    """Folder names; where two runs share one (runs/a/demo, runs/b/demo), theirs gain parent folders until they
    differ ("a/demo", "b/demo"), the others stay short."""
    folders = [p.parent.resolve().parts for p in paths]
    depth = [1] * len(folders)
    while True:
        labels = ["/".join(parts[-d:]) for parts, d in zip(folders, depth)]
        clashing = [i for i, label in enumerate(labels) if labels.count(label) > 1 and depth[i] < len(folders[i])]
        if not clashing:
            return labels
        for i in clashing:
            depth[i] += 1


def load_runs(runs: Sequence[PathLike], labels: Optional[Sequence[str]] = None) -> List[Run]:
    """Read several runs; default labels are their folder names, made unique."""
    if isinstance(runs, (str, os.PathLike)):
        runs = [runs]
    if not runs:
        raise ValueError("no runs given: pass one or more run folders or metrics.jsonl files")
    if labels is not None and len(labels) != len(runs):
        raise ValueError(f"{len(labels)} label(s) for {len(runs)} run(s): give one label per run")
    paths = [metrics_file(r) for r in runs]
    names = list(labels) if labels is not None else _distinct_labels(paths)
    return [load_run(p, name) for p, name in zip(paths, names)]


# ----------------------------------------------------------------------------------------------------------------
# Smoothing

def smooth_values(values: np.ndarray, smooth: Smoothing) -> np.ndarray:
    """Smoothed copy of ``values`` (NaNs stay gaps and do not poison their neighbours).

    ``smooth`` in [0, 1): exponential moving average with that weight on the past, debiased like TensorBoard's
    slider (so the curve does not start near zero). An integer >= 2: trailing moving average over that many logged
    steps. None, 0 or 1: unchanged.
    """
    kind = smoothing_kind(smooth)
    out = np.array(values, dtype=np.float64)
    if kind is None:
        return out
    finite = np.isfinite(out)
    if kind == "ema":
        average, weight_sum = 0.0, 0.0
        for i in np.flatnonzero(finite):
            average = smooth * average + (1 - smooth) * out[i]
            weight_sum = smooth * weight_sum + (1 - smooth)
            out[i] = average / weight_sum
        return out
    window = int(smooth)
    filled = np.where(finite, out, 0.0)
    sums = np.convolve(filled, np.ones(window), mode="full")[:len(out)]
    counts = np.convolve(finite.astype(np.float64), np.ones(window), mode="full")[:len(out)]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(finite & (counts > 0), sums / counts, np.nan)


def smoothing_kind(smooth: Smoothing) -> Optional[str]:
    """``"ema"``, ``"window"`` or None for a ``smooth`` value; a ValueError says what is accepted."""
    if isinstance(smooth, bool):  # a bool is an int to Python, but True is no window size
        raise ValueError("smooth must be a number: an EMA weight in [0, 1) or a window of >= 2 steps")
    if smooth is None:
        return None
    if isinstance(smooth, float) and not smooth.is_integer():
        if not 0 <= smooth < 1:
            raise ValueError(f"smooth = {smooth}: an EMA weight must be in [0, 1) (e.g. 0.9); a window is an "
                             "integer number of steps (e.g. 10)")
        return "ema" if smooth > 0 else None
    window = int(smooth)
    if window < 0:
        raise ValueError(f"smooth = {smooth}: must not be negative")
    return "window" if window >= 2 else None


def parse_smooth(text: str) -> Smoothing:
    """Command-line ``--smooth``: ``0.9`` is an EMA weight, ``10`` a window of 10 steps."""
    try:
        value: Smoothing = int(text)
    except ValueError:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"--smooth {text!r}: give an EMA weight like 0.9 or a window like 10") from None
    smoothing_kind(value)
    return value


# ----------------------------------------------------------------------------------------------------------------
# Drawing

def _matplotlib():
    try:
        import matplotlib
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError as err:
        raise ImportError(f"plotting needs matplotlib, which is not installed: {INSTALL_HINT} ({err})") from err
    return matplotlib, Figure, MaxNLocator


def _colors(n: int) -> List[tuple]:
    matplotlib, _, _ = _matplotlib()
    palette = matplotlib.colormaps["tab10"]
    return [palette(i % 10) for i in range(n)]


def _finite(values: np.ndarray) -> np.ndarray:
    return np.where(np.isfinite(values), values, np.nan)  # inf would wreck the autoscale; show it as a gap


def _footnote(ax, parts: Iterable[str]) -> None:
    text = "; ".join(p for p in parts if p)
    if text:
        ax.text(0.01, 0.01, text, transform=ax.transAxes, fontsize=7, color="0.35", va="bottom", ha="left")


def _draw_line_panel(ax, panel: Panel, runs: Sequence[Run], colors, smooth: Smoothing, legend: bool) -> None:
    _, _, MaxNLocator = _matplotlib()
    smoothed = smoothing_kind(smooth) is not None
    # Overlapping min..max bands of several runs bury the means being compared: bands only for a single run.
    band = panel.band is not None and len(runs) == 1
    missing, non_finite, all_zero = [], 0, True
    for run, color in zip(runs, colors):
        if panel.key not in run.values:
            missing.append(run.label)
            continue
        non_finite += run.non_finite[panel.key]
        shown = _finite(run.values[panel.key])
        all_zero = all_zero and not np.any(np.nan_to_num(shown))
        if band and all(k in run.values for k in panel.band):
            ax.fill_between(run.steps, _finite(run.values[panel.band[0]]), _finite(run.values[panel.band[1]]),
                            color=color, alpha=0.12, linewidth=0)
        if smoothed:
            ax.plot(run.steps, shown, color=color, alpha=0.3, linewidth=0.8)
            ax.plot(run.steps, smooth_values(shown, smooth), color=color, linewidth=1.8, label=run.label)
        else:
            ax.plot(run.steps, shown, color=color, linewidth=1.5, label=run.label,
                    marker="o" if len(run.steps) <= 20 else None, markersize=3)
    ax.set_title(panel.title + (" (line: mean, band: min..max)" if band else " (mean)" if panel.band else ""),
                 fontsize=10)
    ax.set_xlabel("step")
    ax.set_ylabel(panel.ylabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.ticklabel_format(axis="y", useOffset=False)
    ax.grid(True, alpha=0.3)
    _footnote(ax, [f"not logged by {', '.join(missing)}" if missing else "",
                   f"{non_finite} non-finite value(s) not drawn" if non_finite else "",
                   # a flat zero KL puzzles readers: say why
                   "all zero: rl_config.beta = 0 skips the KL term" if panel.key == "actor/kl_loss" and all_zero
                   else ""])
    if legend and len(runs) - len(missing) > 1:
        ax.legend(fontsize=8, loc="best")


def _phases(runs: Sequence[Run]) -> List[str]:
    known = [k for k in _PHASE_LABELS if any(k in r.values for r in runs)]
    others = sorted({k for r in runs for k in r.values if k.startswith("timing/") and k != "timing/all"}
                    - set(_PHASE_LABELS))
    return known + others


def _phase_means(run: Run, phases: Sequence[str]) -> Dict[str, float]:
    """Mean seconds per phase, leaving out step 1 (it includes graph compilation) when there are later steps;
    ``other`` is the rest of ``timing/all`` (scoring, advantages, logging)."""
    rows = slice(1, None) if len(run.steps) > 1 else slice(None)
    means = {}
    for phase in phases:
        if phase in run.values and np.isfinite(run.values[phase][rows]).any():
            means[phase] = float(np.nanmean(run.values[phase][rows]))
    if "timing/all" in run.values and means and np.isfinite(run.values["timing/all"][rows]).any():
        means["other"] = max(0.0, float(np.nanmean(run.values["timing/all"][rows])) - sum(means.values()))
    return means


def _duration(seconds: float) -> str:
    if not np.isfinite(seconds):
        return ""
    if seconds >= 1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1000:.0f} ms" if seconds >= 0.001 else "<1 ms"


def _draw_timing_panel(ax, runs: Sequence[Run], colors, legend: bool) -> None:
    phases = _phases(runs)
    keys = phases + ["other"]
    labels = [_PHASE_LABELS.get(p, p[len("timing/"):]) for p in phases] + ["other"]
    present = [run for run in runs if any(p in run.values for p in phases)]
    height = 0.8 / max(1, len(present))
    y = np.arange(len(keys))
    for i, run in enumerate(present):
        means = _phase_means(run, phases)
        widths = np.array([means.get(k, math.nan) for k in keys])
        bars = ax.barh(y + (i - (len(present) - 1) / 2) * height, np.nan_to_num(widths), height=height,
                       color=colors[runs.index(run)], label=run.label)
        if len(present) <= 3:  # numbers, because sub-millisecond phases have no visible bar
            ax.bar_label(bars, [_duration(w) for w in widths], fontsize=7, padding=2)
    ax.set_xlim(right=ax.get_xlim()[1] * 1.15)  # room for the numbers
    ax.set_yticks(y, labels, fontsize=8)
    ax.invert_yaxis()  # phases top-down in the order they run
    ax.set_xlabel("seconds per step")
    several_steps = any(len(r.steps) > 1 for r in present)
    ax.set_title("Time per phase (mean of steps 2+; step 1 compiles)" if several_steps else "Time per phase",
                 fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)
    missing = [r.label for r in runs if r not in present]
    _footnote(ax, [f"not logged by {', '.join(missing)}" if missing else ""])
    if legend and len(present) > 1:
        ax.legend(fontsize=8, loc="lower right")


def _drawable(runs: Sequence[Run], only: Optional[Sequence[str]]) -> List[Union[Panel, str]]:
    """Panels with data in at least one run; the timing panel is the string "timing"."""
    items: List[Union[Panel, str]] = [p for p in _panels(runs) if any(p.key in r.values for r in runs)]
    if _phases(runs):
        items.append("timing")
    if only is not None:
        names = {p.name if isinstance(p, Panel) else p: p for p in items}
        unknown = [n for n in only if n not in names]
        if unknown:
            raise ValueError(f"unknown or empty panel(s) {', '.join(unknown)}; these runs have: "
                             f"{', '.join(names)}")
        items = [names[n] for n in only]
    return items


def _draw(ax, item, runs, colors, smooth, legend) -> None:
    if item == "timing":
        _draw_timing_panel(ax, runs, colors, legend)
    else:
        _draw_line_panel(ax, item, runs, colors, smooth, legend)


def _smoothing_note(smooth: Smoothing) -> str:
    kind = smoothing_kind(smooth)
    if kind == "ema":
        return f"smoothed: EMA {smooth:g} (faint: raw)"
    if kind == "window":
        return f"smoothed: mean of {int(smooth)} steps (faint: raw)"
    return ""


def dashboard_figure(runs: Sequence[Run], *, smooth: Smoothing = None, only: Optional[Sequence[str]] = None,
                     columns: int = 3):
    """A matplotlib Figure with every panel in a grid and one legend of the runs above it."""
    _, Figure, _ = _matplotlib()
    items = _drawable(runs, only)
    if not items:
        raise ValueError(f"nothing to plot: {', '.join(str(r.path) for r in runs)} hold no known metrics")
    cols = min(columns, len(items))
    rows = -(-len(items) // cols)
    fig = Figure(figsize=(5.0 * cols, 3.4 * rows + 0.7), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    colors = _colors(len(runs))
    for ax, item in zip(axes, items):
        _draw(ax, item, runs, colors, smooth, legend=False)
    for ax in axes[len(items):]:
        ax.set_visible(False)
    note = _smoothing_note(smooth)
    if len(runs) == 1:
        fig.suptitle(f"GRPO training: {runs[0].label}" + (f"   [{note}]" if note else ""), fontsize=12)
    else:  # the legend of the runs takes the title's place (both at the top would overlap)
        from matplotlib.lines import Line2D

        handles = [Line2D([], [], color=c, linewidth=2.5) for c in colors]
        fig.legend(handles, [r.label for r in runs], loc="outside upper center", ncols=min(len(runs), 6),
                   fontsize=10, frameon=False, title=f"GRPO training runs   [{note}]" if note else "GRPO training runs",
                   title_fontsize=11)
    return fig


def panel_figure(runs: Sequence[Run], item: Union[Panel, str], *, smooth: Smoothing = None):
    """A matplotlib Figure with one panel and its own legend."""
    _, Figure, _ = _matplotlib()
    fig = Figure(figsize=(7.0, 4.2), layout="constrained")
    ax = fig.subplots()
    _draw(ax, item, runs, _colors(len(runs)), smooth, legend=True)
    # A lone panel carries its provenance: the run (a single run has no legend) and the smoothing.
    header = [runs[0].label] if len(runs) == 1 else []
    header += [_smoothing_note(smooth)] if smoothing_kind(smooth) else []
    if header:
        fig.suptitle("   ".join(header), fontsize=8, color="0.35", x=0.99, ha="right")
    return fig


def save_figure(fig, path: PathLike, dpi: int = 110) -> Path:
    """Write ``fig`` as a PNG atomically (temporary name in the same folder, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.{secrets.token_hex(4)}.tmp.png")
    try:
        fig.savefig(tmp, format="png", dpi=dpi)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def plot_runs(runs: Sequence[PathLike], out_dir: PathLike, labels: Optional[Sequence[str]] = None, *,
              smooth: Smoothing = None, dashboard: bool = True, per_panel: bool = True,
              only: Optional[Sequence[str]] = None, dpi: int = 110) -> List[Path]:
    """Plot one or more runs into ``out_dir``; returns the PNGs written.

    Args:
        runs: run folders (``rl_config.output_dir``) or their ``metrics.jsonl`` files.
        out_dir: folder for ``dashboard.png`` and one ``<panel>.png`` per panel (``reward``, ``reward_<verifier>``,
            ``pg_loss``, ``kl``, ``entropy``, ``response_length``, ``grad_norm``, ``e2e_tps``, ``timing``).
        labels: one legend label per run (default: folder names).
        smooth: EMA weight in [0, 1) such as 0.9, or a window of >= 2 steps such as 10; the raw curve stays faint
            behind the smoothed one. None plots raw values.
        dashboard, per_panel: which images to write.
        only: panel names to draw (default: every panel some run has data for).
    """
    smoothing_kind(smooth)  # reject a bad value before reading anything
    loaded = load_runs(runs, labels)
    empty = [str(r.path) for r in loaded if not len(r.steps)]
    if len(empty) == len(loaded):
        raise ValueError(f"no steps logged yet in {', '.join(empty)}")
    for path in empty:
        warnings.warn(f"{path}: no steps logged yet; left out of the plots", stacklevel=2)
    loaded = [r for r in loaded if len(r.steps)]
    out = Path(out_dir)
    written: List[Path] = []
    if dashboard:
        written.append(save_figure(dashboard_figure(loaded, smooth=smooth, only=only), out / "dashboard.png", dpi))
    if per_panel:
        for item in _drawable(loaded, only):
            name = item if isinstance(item, str) else item.name
            written.append(save_figure(panel_figure(loaded, item, smooth=smooth), out / f"{name}.png", dpi))
    return written
