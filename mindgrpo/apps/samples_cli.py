"""``mindgrpo samples RUN [filters]``: the completions of a run that match, printed or as one HTML page.

    mindgrpo samples output/demo --grep "wait|let me check|recheck" --reward 1 1
    mindgrpo samples output/demo --first 1 --last 1 --limit 20      # each prompt's earliest and latest completion
    mindgrpo samples output/demo --steps 90 100 --verifier accuracy 0 0 --html wrong.html
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from mindgrpo._io import atomic_write
from mindgrpo.apps.samples import Filters, SamplesError, completions_file, format_html, format_text, read_samples, \
    select


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="mindgrpo samples", description=__doc__.split("\n", 1)[0],
                                     epilog=__doc__.split("\n", 2)[2], formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("run", help="a run's output folder (rl_config.output_dir) or its completions.jsonl")
    parser.add_argument("--steps", nargs=2, type=int, metavar=("FROM", "TO"), help="inclusive step range")
    parser.add_argument("--reward", nargs=2, type=float, metavar=("LOW", "HIGH"), help="total reward range")
    parser.add_argument("--verifier", nargs=3, metavar=("NAME", "LOW", "HIGH"),
                        help="one verifier's reward range, e.g. --verifier accuracy 1 1")
    parser.add_argument("--length", nargs=2, type=int, metavar=("MIN", "MAX"), help="completion length in characters")
    parser.add_argument("--grep", help="regular expression searched case-insensitively in each completion")
    parser.add_argument("--first", type=int, default=0, metavar="N", help="each prompt's earliest N matches")
    parser.add_argument("--last", type=int, default=0, metavar="N", help="each prompt's latest N matches")
    parser.add_argument("--limit", type=int, default=20, help="at most this many (0: all; default 20)")
    parser.add_argument("--html", metavar="FILE", help="write one self-contained HTML page instead of printing")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:
        verifier = None
        if args.verifier:
            name, low, high = args.verifier
            try:
                verifier = (name, float(low), float(high))
            except ValueError:
                raise SamplesError(f"--verifier {' '.join(args.verifier)}: LOW and HIGH must be numbers") from None
        if min(args.first, args.last, args.limit) < 0:
            raise SamplesError("--first, --last and --limit must be >= 0")
        filters = Filters(steps=tuple(args.steps) if args.steps else None,
                          reward=tuple(args.reward) if args.reward else None, verifier=verifier,
                          length=tuple(args.length) if args.length else None, grep=args.grep)
        path = completions_file(args.run)
        records = select(list(read_samples(path)), filters, first=args.first, last=args.last, limit=args.limit)
    except SamplesError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.html:
        atomic_write(args.html, format_html(records, title=f"{path}: {len(records)} completions",
                                                 grep=args.grep))
        print(f"{len(records)} completions -> {args.html}")
    else:
        print(format_text(records) if records else f"no completion of {path} matches")
    return 0
