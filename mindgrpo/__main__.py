"""``python -m mindgrpo COMMAND``: the command line of :mod:`mindgrpo.cli` (installed as ``mindgrpo``)."""
import sys

from mindgrpo.cli import main

if __name__ == "__main__":
    sys.exit(main())
