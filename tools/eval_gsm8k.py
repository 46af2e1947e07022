#!/usr/bin/env python
"""GSM8K accuracy of a model folder (greedy pass@1, sampled maj@k): the same as ``mindgrpo eval``.

    python tools/eval_gsm8k.py MODEL DATA [--limit 100] [--samples 8 --temperature 0.7] [--output eval.jsonl]

``--help`` lists the options; the code is mindgrpo.apps.eval_cli.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # evaluate with this checkout's mindgrpo
from mindgrpo.apps.eval_cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(prog=Path(__file__).name))
