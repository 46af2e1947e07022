"""Plot training curves of one or more GRPO runs as PNGs: the same as ``mindgrpo plot``.

    python tools/plot_metrics.py output/demo                              # -> output/demo/plots/*.png

``--help`` lists the options; the code is mindgrpo.apps.plot_cli.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # plot with this checkout's mindgrpo
from mindgrpo.apps.plot_cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(prog=Path(__file__).name))
