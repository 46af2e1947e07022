"""Train a Qwen2.5 policy with GRPO.

    python examples/grpo/main.py                                  # embedded demo: no downloads, a few minutes on CPU
    python examples/grpo/main.py --config grpo_config.yaml [--dataset_file ...] [rl_config.beta=0.0 ...]
    msrun --worker_num=2 --local_worker_num=2 --master_addr=127.0.0.1 --master_port=8118 \\
        examples/grpo/main.py --config grpo_config.yaml             # data parallel (CPU) / semi-auto (Ascend)

Flags are MindRLHF's; any config key can be overridden as ``group.key=value``. ``--help-config`` lists every key.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import mindgrpo
from mindgrpo.config import CLI_FLAGS, ConfigError, describe, load_config
from mindgrpo.data import DataError

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="grpo_config.yaml; omit to run the embedded demo")
    for flag, key in CLI_FLAGS.items():
        if flag == "resume_training":
            parser.add_argument("--resume_training", action="store_true", default=None, help=f"sets {key}")
        else:
            parser.add_argument(f"--{flag}", help=f"sets {key}")
    parser.add_argument("--help-config", action="store_true", help="print every config key with its documentation")
    parser.add_argument("overrides", nargs="*", metavar="group.key=value", help="config overrides")
    return parser.parse_args(argv)


def prepare_demo(run_dir: Path) -> dict:
    """Make the demo model and data (cached) and convert the data with tools/rlhf_data.py."""
    from mindgrpo.apps.demo import make_demo
    from mindgrpo._env import cache_dir

    assets = make_demo(Path(cache_dir()) / "demo")
    dataset = run_dir / "data" / "train.mindrecord"
    if not dataset.exists():
        cmd = [sys.executable, str(REPO / "tools" / "rlhf_data.py"), "--tokenizer_dir", str(assets.model_dir),
               "--file_path", str(assets.train_jsonl), "--output_path", str(dataset), "--dataset_type", "gsm8k",
               "--prompt_template", "gsm8k_hash", "--max_prompt_length", "64", "--no_progress"]
        print("[demo] converting the demo data:", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
    return {"actor_checkpoint_path": str(assets.model_dir), "dataset_file": str(dataset)}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.help_config:
        print("\n".join(describe()))
        return 0
    flags = {flag: getattr(args, flag) for flag in CLI_FLAGS}
    overrides = list(args.overrides)
    config_path = args.config
    if config_path is None:
        config_path = HERE / "grpo_demo.yaml"
        run_dir = Path("output") / "demo"
        demo_flags = prepare_demo(run_dir)
        for flag, value in demo_flags.items():
            flags[flag] = flags[flag] or value
        overrides.insert(0, f"rl_config.output_dir={run_dir.resolve()}")
    try:
        config = load_config(config_path, overrides, flags)
        from mindgrpo.train.trainer import GRPOTrainer

        trainer = GRPOTrainer(config)
    except (ConfigError, DataError) as err:  # bad config or data: the message says what to change
        print(f"error: {err}", file=sys.stderr)
        return 2
    from mindgrpo.train.trainer import PeerLostError

    try:
        trainer.train()
    except PeerLostError as err:
        # The collectives are broken, and MindSpore's teardown then may crash (a SIGSEGV was seen here after this
        # message): say why and leave at once, with a status that tells a launcher the run failed.
        print(f"error: {err}", file=sys.stderr, flush=True)
        os._exit(1)
    if trainer.dist.is_main:
        out = Path(config.rl_config.output_dir)
        print(f"[mindgrpo] done: {trainer.step} steps. Metrics: {out / 'metrics.jsonl'} (TensorBoard: "
              f"tensorboard --logdir {out / 'tensorboard'}); completions: {out / 'completions.jsonl'}; "
              f"checkpoints: {config.checkpoint_dir}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
