"""GRPO on Qwen2.5-VL, embedded demo: a tiny Qwen2.5-VL made locally learns to count coloured squares in pictures.

    python examples/grpo_vl/main.py [--out output/demo_vl] [--steps 180] [--seed 0]

No download: mindgrpo.apps.demo_vl builds the model, the pictures (as geo3k rows, through the geo3k converter) and a
short supervised warm start; then the library's GRPOTrainer trains it (vision tower frozen, run once per prompt per
step) and the accuracy of the sampled answers is printed for the first and last steps. For real data see
examples/grpo_vl/grpo_qwen2_5_vl_7b_geo3k.yaml and the README's Qwen2.5-VL section.
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # train with this checkout's mindgrpo


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog=Path(__file__).name, description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="output/demo_vl", help="folder for the demo and the run (replaced)")
    parser.add_argument("--steps", type=int, default=180, help="GRPO steps")
    parser.add_argument("--seed", type=int, default=0, help="rl_config.seed (data order and sampling)")
    args = parser.parse_args(argv)

    from mindgrpo.apps.demo_vl import demo_config, make_vl_demo
    from mindgrpo.train.metrics import read_metrics
    from mindgrpo.train.trainer import GRPOTrainer

    out = Path(args.out)
    demo = make_vl_demo(out / "demo")
    print(f"VL demo built in {out / 'demo'}: {demo.facts}", flush=True)
    trainer = GRPOTrainer(demo_config(demo, out / "run", steps=args.steps, seed=args.seed))
    trainer.precompile()
    trainer.train()
    rows = read_metrics(out / "run" / "metrics.jsonl")
    accuracy = [r["grpo/rewards/accuracy_reward"] for r in rows]
    window = max(1, len(accuracy) // 3)
    first, last = sum(accuracy[:window]) / window, sum(accuracy[-window:]) / window
    print(f"Accuracy of sampled answers: first {window} steps {first:.3f}, last {window} steps {last:.3f}")
    print(f"Metrics: {out / 'run' / 'metrics.jsonl'}; checkpoints: {out / 'run' / 'checkpoints'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
