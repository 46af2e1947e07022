"""The README's first command: the embedded demo converts its data, trains, checkpoints, and the reward rises."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from mindgrpo.train.metrics import read_metrics

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))

from demo_seeds import held_out_accuracy  # noqa: E402  (the measurement the docstring's figures come from)


def run_demo(cwd: Path, *overrides: str) -> list:
    env = {**os.environ, "MINDGRPO_CACHE": os.environ.get("MINDGRPO_CACHE", "")}
    env = {k: v for k, v in env.items() if v}
    done = subprocess.run([sys.executable, str(REPO / "examples" / "grpo" / "main.py"), *overrides], cwd=cwd,
                          capture_output=True, text=True, timeout=1800, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Metrics:" in done.stdout and "checkpoints:" in done.stdout
    out = cwd / "output" / "demo"
    assert (out / "data" / "train.mindrecord").is_file()
    assert sorted(p.name for p in (out / "checkpoints").glob("step_*"))
    return read_metrics(out / "metrics.jsonl")


def accuracy(rows, first: slice) -> float:
    return float(np.mean([r["grpo/rewards/accuracy_reward"] for r in rows[first]]))


MIN_HELD_OUT_GAIN = 0.06  # 12 of the 200 held-out problems


def test_demo_learns_on_problems_it_never_saw(tmp_path):
    """The README's demo as shipped (100 steps, seed 0), then greedy pass@1 on the demo's 200 held-out test problems
    (`mindgrpo eval`) of its final checkpoint against the warm-started model it began from: the gain must reach
    MIN_HELD_OUT_GAIN.

    Measured on this 2-core machine (`python tools/demo_seeds.py --configs grpo --seeds 0 1 2`), with the demo's
    recipe version 2 (the warm start on mindgrpo's own forward, stopping at exact match 0.20; it scores 0.235):
    - GRPO as shipped, seeds 0-2: +0.200, +0.155, +0.235 (mean 0.197). MIN_HELD_OUT_GAIN is under half their
      smallest gain; a change that alters the numerics re-draws seed 0's gain as a new seed would.
    - Recipe version 1 (MindFormers' forward, stopping at 0.22, scoring 0.295), seeds 0-6: +0.115, +0.130, +0.180,
      +0.150, +0.225, +0.175, +0.130 (mean 0.158, sd 0.037). The same forward stopping at 0.22 on mindgrpo's
      forward scored 0.355 and left seeds 0-2 only +0.030, +0.110, +0.055: a warm start too strong leaves GRPO
      little to learn, which is why the target moved.
    - The same trained on another reward, the completion's length (the weights move; nothing rewards the answers),
      seeds 0-2 under recipe version 1: -0.295 each (it stops answering).
    - With the learning rate at 0 the weights, and so the gain, stay exactly unchanged (0).
    The sampled accuracy during training, which an earlier version of this test averaged over five seeds, is far
    noisier: a run that learns nothing moves it by a few hundredths either way (`tools/demo_seeds.py --configs
    nolearn`), so one seed could not tell learning from none; the held-out greedy accuracy is the same 200 problems
    before and after, decoded without sampling.
    """
    from mindgrpo.apps import demo

    rows = run_demo(tmp_path, "rl_config.seed=0")
    assert [r["step"] for r in rows] == list(range(1, 101))
    print(f"sampled accuracy: first 20 steps {accuracy(rows, slice(0, 20)):.3f}, "
          f"last 20 {accuracy(rows, slice(80, 100)):.3f}")
    assets = demo.make_demo(demo.default_demo_dir())
    before = held_out_accuracy(assets.model_dir, assets.test_jsonl)
    after = held_out_accuracy(tmp_path / "output" / "demo", assets.test_jsonl)
    print(f"held-out greedy accuracy: warm start {before:.3f}, after 100 GRPO steps {after:.3f}")
    assert after - before >= MIN_HELD_OUT_GAIN, (before, after)


MIN_LORA_HELD_OUT_GAIN = 0.06


def test_lora_demo_learns_on_problems_it_never_saw(tmp_path):
    """examples/grpo/lora_demo.yaml (rank-8 adapters on every linear of the frozen warm-started demo model, 100 steps,
    seed 0): its final checkpoint is a PEFT adapter folder, and the base plus those adapters must gain
    MIN_LORA_HELD_OUT_GAIN of greedy pass@1 on the 200 held-out problems over the warm start.

    Measured here (`python tools/demo_seeds.py --configs lora --seeds 0 1 2`, warm start 0.270 on this machine's
    tokenizer build): learning rate 1e-3 (as shipped) +0.150, +0.120, +0.155; 2e-3 +0.025, +0.065, +0.160; 5e-3
    +0.015, -0.080, -0.035 (too high: the policy degrades). MIN_LORA_HELD_OUT_GAIN is half the smallest gain as
    shipped."""
    from demo_seeds import command
    from mindgrpo.apps import demo
    from mindgrpo.apps.train_cli import demo_flags
    from mindgrpo.models.lora import is_adapter_folder

    flags = demo_flags("text", tmp_path / "demo")
    run_dir = tmp_path / "lora"
    done = subprocess.run(command("lora", 0, run_dir, flags), cwd=tmp_path, capture_output=True, text=True,
                          timeout=1800, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              filter(None, [str(REPO), str(REPO / "tools"), os.environ.get("PYTHONPATH")]))})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 101))
    # the adapters reached the rollout every step: the fused decode kernels against the training forward differ by
    # float32 summation order only (measured max over the 100 steps: 4.4e-5; a stale adapter is 1e-2 and more)
    assert all(r["rollout/logprob_diff_max"] <= 1e-4 for r in rows)
    assert is_adapter_folder(sorted((run_dir / "checkpoints").glob("step_*"))[-1] / "model")
    assets = demo.make_demo(demo.default_demo_dir())
    before = held_out_accuracy(assets.model_dir, assets.test_jsonl)
    after = held_out_accuracy(run_dir, assets.test_jsonl)
    print(f"held-out greedy accuracy: warm start {before:.3f}, after 100 LoRA GRPO steps {after:.3f}")
    assert after - before >= MIN_LORA_HELD_OUT_GAIN, (before, after)
