"""The embedded demo from the shell: `python -m mindgrpo.apps.demo --help`."""
from __future__ import annotations

import argparse
import json
from typing import Optional, Sequence

from mindgrpo.apps.demo.assets import DEFAULT_WARM_START_STEPS, default_demo_dir, make_demo


def main(argv: Optional[Sequence[str]] = None) -> None:
    """`python -m mindgrpo.apps.demo [OUT_DIR]`: build (or find) the demo and print where it is and what it scored."""
    parser = argparse.ArgumentParser(prog="python -m mindgrpo.apps.demo", description=main.__doc__)
    parser.add_argument("out_dir", nargs="?", default=None, help=f"default: {default_demo_dir()}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warm-start-steps", type=int, default=DEFAULT_WARM_START_STEPS)
    parser.add_argument("--force", action="store_true", help="rebuild even when a matching demo exists")
    args = parser.parse_args(argv)
    assets = make_demo(args.out_dir or default_demo_dir(), seed=args.seed, warm_start_steps=args.warm_start_steps,
                       force=args.force)
    print(json.dumps({"model_dir": str(assets.model_dir), "train_jsonl": str(assets.train_jsonl),
                      "test_jsonl": str(assets.test_jsonl), "facts": assets.facts}, indent=2))


if __name__ == "__main__":
    main()
