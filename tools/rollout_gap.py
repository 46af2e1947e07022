"""The rollout log-prob gap on the embedded demo: fused decode against plain decode.

The rollout engine's log-prob of each sampled token (``RolloutBatch.sampling_logp``) and the training forward's are
computed by different code: the native engine's KV-cache decode (``generate_config.decode_impl: fused``, C++
kernels, or ``plain``, MindSpore ops) and the shared-prompt training forward. For each decode implementation this
runs ``--steps`` GRPO steps of the demo (its config, ``--learning-rate`` 0 by default so both see the same weights)
and prints the trainer's own gap metrics over the steps: ``rollout/logprob_diff_mean`` and ``_max`` (|train -
sampling| over the active tokens) and ``rollout/is_ratio_mean`` (mean exp(train - sampling); 1 for no gap).

Usage:  python tools/rollout_gap.py [--steps 10] [--learning-rate 0] [--json]
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

import mindgrpo  # noqa: F401  (must precede MindSpore: configures logging)
from mindgrpo.apps.train_cli import DEMO_CONFIG, demo_flags
from mindgrpo.config import load_config

GAP_METRICS = ("rollout/logprob_diff_mean", "rollout/logprob_diff_max", "rollout/is_ratio_mean")


def measure(decode_impl: str, steps: int, learning_rate: float, work: Path) -> dict:
    """The gap metrics of ``steps`` demo steps with ``decode_impl``: the mean of each over the steps, and the
    largest ``logprob_diff_max``."""
    from mindgrpo.train.trainer import GRPOTrainer

    flags = demo_flags("text", work / "demo")
    config = load_config(DEMO_CONFIG, [f"rl_config.output_dir={work / decode_impl}", f"rl_config.max_steps={steps}",
                                       "rl_config.save_ckpt_interval=0", "rl_config.save_prompt_completions_data=false",
                                       f"generate_config.decode_impl={decode_impl}",
                                       f"actor_config.lr_schedule.learning_rate={learning_rate}"],
                         {"actor_checkpoint_path": flags["actor_checkpoint_path"],
                          "dataset_file": flags["dataset_file"]})
    trainer = GRPOTrainer(config)
    rows = []
    try:
        while trainer.step < trainer.total_steps:
            metrics = trainer.train_step()
            rows.append([metrics[name] for name in GAP_METRICS])
    finally:
        trainer.metrics.close()
        trainer.scorer.close()
    values = np.array(rows)
    return {"decode_impl": decode_impl, "steps": steps, "logprob_diff_mean": float(values[:, 0].mean()),
            "logprob_diff_max": float(values[:, 1].max()), "is_ratio_mean": float(values[:, 2].mean())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--learning-rate", type=float, default=0.0)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rollout_gap_") as tmp:
        results = [measure(impl, args.steps, args.learning_rate, Path(tmp)) for impl in ("fused", "plain")]
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    print(f"rollout log-prob gap on the demo, {args.steps} steps, lr {args.learning_rate:g} (float32, CPU)")
    print("| decode_impl | mean abs diff | max abs diff | mean IS ratio - 1 |")
    print("|---|---|---|---|")
    for r in results:
        print(f"| {r['decode_impl']} | {r['logprob_diff_mean']:.3e} | {r['logprob_diff_max']:.3e} | "
              f"{r['is_ratio_mean'] - 1:+.3e} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
