#!/usr/bin/env python
"""Convert a prompt dataset into a mindgrpo MindRecord with MindRLHF's flags: the same as ``mindgrpo data``.

    python tools/rlhf_data.py --help                    # the flags; the code is mindgrpo.apps.data_cli
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # convert with this checkout's mindgrpo
from mindgrpo.apps.data_cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(prog=Path(__file__).name))
