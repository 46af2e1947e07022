"""Train a Qwen2.5 policy with GRPO: MindRLHF's entry point, the same as ``mindgrpo train``.

    python examples/grpo/main.py                                  # embedded demo: no downloads, a few minutes on CPU
    python examples/grpo/main.py --config grpo_config.yaml [--dataset_file ...] [rl_config.beta=0.0 ...]
    msrun ... examples/grpo/main.py --config grpo_config.yaml     # data parallel (CPU) / semi-auto (Ascend)

``python examples/grpo/main.py --help`` lists the flags; the code is mindgrpo.apps.train_cli.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # train with this checkout's mindgrpo
from mindgrpo.apps.train_cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(prog=Path(__file__).name))
