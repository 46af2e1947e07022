"""Plot training curves of one or more GRPO runs as PNGs: a dashboard and one image per panel.

    mindgrpo plot output/demo                                       # -> output/demo/plots/*.png
    mindgrpo plot runs/w1 runs/w05 --labels "acc+fmt 1.0,acc+fmt 0.5" --smooth 0.9 --out cmp
    mindgrpo plot runs/*/ --only reward,pg_loss --no-dashboard

``python tools/plot_metrics.py`` takes the same arguments. Each RUN is a run folder (rl_config.output_dir) or its
metrics.jsonl. Several runs are overlaid in every panel, one colour each, for ablations (reward weights,
num_generations, step counts). Panels: reward (mean, min..max band), one per verifier, pg_loss, kl, entropy,
response_length, grad_norm, e2e_tps, timing (seconds per phase). Needs matplotlib: pip install "mindgrpo[plot]".
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional, Sequence

import mindgrpo  # noqa: F401  (quiet logging set-up, as for every mindgrpo entry point)
from mindgrpo.apps.plotting import MetricsFileError, parse_smooth, plot_runs


def parse_args(argv: Optional[Sequence[str]] = None, prog: Optional[str] = "mindgrpo plot") -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", metavar="RUN", help="run folder or metrics.jsonl (several to overlay)")
    parser.add_argument("--out", help="output folder (default: RUN/plots for one run, ./plots for several)")
    parser.add_argument("--labels", help="comma-separated legend labels, one per run (default: folder names)")
    parser.add_argument("--smooth", type=_smooth, default=None,
                        help="EMA weight in [0, 1) like 0.9, or a moving-average window like 10 (raw stays faint)")
    parser.add_argument("--only", help="comma-separated panel names to draw, e.g. reward,pg_loss")
    parser.add_argument("--no-dashboard", action="store_true", help="skip dashboard.png")
    parser.add_argument("--no-panels", action="store_true", help="skip the one-PNG-per-panel images")
    parser.add_argument("--dpi", type=int, default=110, help="image resolution (default 110)")
    return parser.parse_intermixed_args(argv)  # RUNs may stand before, between or after the options


def _smooth(text: str):
    try:
        return parse_smooth(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _split(text: Optional[str]) -> Optional[List[str]]:
    return None if text is None else [part.strip() for part in text.split(",")]


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = "mindgrpo plot") -> int:
    args = parse_args(argv, prog)
    out = Path(args.out) if args.out else (
        (Path(args.runs[0]) if Path(args.runs[0]).is_dir() else Path(args.runs[0]).parent) / "plots"
        if len(args.runs) == 1 else Path("plots"))
    try:
        written = plot_runs(args.runs, out, _split(args.labels), smooth=args.smooth,
                            dashboard=not args.no_dashboard, per_panel=not args.no_panels,
                            only=_split(args.only), dpi=args.dpi)
    except (MetricsFileError, FileNotFoundError, ValueError, ImportError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0
