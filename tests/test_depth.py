"""Qwen2.5's real depth and vocabulary in GRAPH mode, on "skinny" models (``tiny_qwen.make_skinny_qwen2``: the real
layer count, heads and untied 152,064-row vocabulary, hidden 4 per head, intermediate 32), made locally.

A compiled loop over every parameter unrolls into nested calls, and MindSpore stops compiling at a call depth of
1000: Qwen2.5-0.5B's 290 parameters already failed in the gradient reduce-and-clip graph. So:

* Qwen2.5-7B's shape (28 layers, 28/4 heads, 339 parameters): a GRPO step (rollout, reference, update, checkpoint),
  then a second trainer resumes from that checkpoint and runs step 2;
* Qwen2.5-32B's depth (64 layers, 40/8 heads, 771 parameters): one GRPO step, whose update compiles and moves the
  weights.

The 7B twin under msrun with tensor parallelism is in ``tests/test_tensor_parallel.py``.
"""
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from conftest import small_run_config  # noqa: E402
from tiny_qwen import QWEN2_5_7B, QWEN2_5_32B, make_skinny_qwen2  # noqa: E402


def skinny_config(out: Path, prompts: Path, model: Path, **rl):
    """2 prompts x 4 completions of 8 tokens, rewarded by their length (the random model's completions differ in
    length, so every step has advantages): one micro-batch's vocabulary projection is [4 x 8, 152,064] float32,
    19 MB."""
    return small_run_config(out, prompts, model, max_prompt_length=64, seq_length=80, max_tokens=8,
                            verifiers=["toy_verifiers:text_length"], **rl)


def checkpoint(run: Path, step: int) -> Path:
    return run / "checkpoints" / f"step_{step:08d}" / "model"


def largest_change(before: Path, after: Path) -> float:
    """The largest change of any weight between two Hugging Face folders."""
    from safetensors.numpy import load_file

    old, new = load_file(before / "model.safetensors"), load_file(after / "model.safetensors")
    assert set(new) == set(old)
    return max(float(np.abs(new[k] - old[k]).max()) for k in old)


def test_qwen2_5_7b_depth_and_vocabulary_train_checkpoint_and_resume(tmp_path, demo_plain, demo_prompts):
    from mindgrpo.train.metrics import read_metrics
    from mindgrpo.train.trainer import GRPOTrainer

    model = make_skinny_qwen2(tmp_path / "skinny_7b", demo_plain.model_dir, **QWEN2_5_7B)
    run = tmp_path / "run"
    GRPOTrainer(skinny_config(run, demo_prompts, model, max_steps=1, save_ckpt_interval=1)).train()
    assert largest_change(model, checkpoint(run, 1)) > 1e-5  # the update ran
    GRPOTrainer(skinny_config(run, demo_prompts, model, max_steps=2, save_ckpt_interval=1,
                              resume_training=True)).train()
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(np.isfinite(r["grad_norm"]) and r["grad_norm"] > 0 for r in rows)
    assert largest_change(checkpoint(run, 1), checkpoint(run, 2)) > 1e-5


def test_qwen2_5_32b_depth_compiles_its_update_and_steps(tmp_path, demo_plain, demo_prompts):
    from mindgrpo.train.metrics import read_metrics
    from mindgrpo.train.trainer import GRPOTrainer

    model = make_skinny_qwen2(tmp_path / "skinny_32b", demo_plain.model_dir, **QWEN2_5_32B)
    run = tmp_path / "run"
    trainer = GRPOTrainer(skinny_config(run, demo_prompts, model, max_steps=1, save_ckpt_interval=1, beta=0.0))
    assert len(trainer.worker.params) == 64 * 12 + 3  # every layer's 12 tensors, the final norm, embedding, lm_head
    trainer.train()
    [row] = read_metrics(run / "metrics.jsonl")
    assert np.isfinite(row["grad_norm"]) and row["grad_norm"] > 0
    assert largest_change(model, checkpoint(run, 1)) > 1e-5
