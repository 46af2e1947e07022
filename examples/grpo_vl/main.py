"""GRPO on Qwen2.5-VL, embedded demo: a tiny Qwen2.5-VL made locally learns to count coloured squares in pictures.

    python examples/grpo_vl/main.py [rl_config.seed=1] [rl_config.max_steps=60] [rl_config.output_dir=...]
    python examples/grpo_vl/main.py --config examples/grpo_vl/grpo_qwen2_5_vl_7b_geo3k.yaml --actor_checkpoint_path ...

The same command line as examples/grpo/main.py and ``mindgrpo train`` (``--demo vl`` there): MindRLHF's flags and
``group.key=value`` overrides. Without ``--config``, mindgrpo.apps.demo_vl builds the model, the pictures (as geo3k
rows, through the geo3k converter) and a short supervised warm start in ``<output_dir>/demo`` (no download); then
the library's GRPOTrainer trains it (examples/grpo_vl/grpo_vl_demo.yaml; the vision tower frozen, run once per
prompt per step) and the accuracy of the sampled answers is printed for the first and last steps. For real data see
examples/grpo_vl/grpo_qwen2_5_vl_7b_geo3k.yaml and the README's Qwen2.5-VL section.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # train with this checkout's mindgrpo
from mindgrpo.apps.train_cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(prog=Path(__file__).name, demo="vl"))
