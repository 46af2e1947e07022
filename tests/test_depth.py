"""Qwen2.5's real depth and vocabulary, on "skinny" models (``tiny_qwen.make_skinny_qwen2``: the real
layer count, heads and untied 152,064-row vocabulary, hidden 4 per head, intermediate 32), made locally.

A compiled loop over every parameter unrolls into nested calls, and MindSpore stops compiling at a call depth of
1000: Qwen2.5-0.5B's 290 parameters already failed in the gradient reduce-and-clip graph. So:

* Qwen2.5-7B's shape (28 layers, 28/4 heads, 339 parameters) in one process, float32: a GRPO step (rollout,
  update, checkpoint), then a second trainer resumes from that checkpoint with the first's exact state (weights,
  AdamW moments, step, data position), both in PyNative (the steps after a resume run the same code as step 1).
  GRAPH mode at this depth, with bf16 weights, is the model_parallel 2 msrun twin's (``tests/test_tensor_parallel.py``:
  the same layer code; compiling the 28-layer graphs again here would add minutes to the default suite);
* Qwen2.5-32B's depth (64 layers, 40/8 heads, 771 parameters): the update graphs (accumulation, clipping, AdamW)
  over all of its parameters, with float32 and with bf16 weights, against numpy; and (slow: a 64-layer forward
  and backward take minutes to compile) one GRPO step.
"""
import sys
from pathlib import Path

import numpy as np
import pytest

import mindgrpo  # noqa: F401  (before MindSpore: it configures MindSpore's logging)
import mindspore as ms
from mindspore import ParameterTuple, Tensor, nn, ops

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
    """The largest change of any weight between two Hugging Face folders (float32 or bf16: read widened)."""
    from mindgrpo.models.safetensors_io import SafetensorsReader

    old, new = (SafetensorsReader(folder / "model.safetensors") for folder in (before, after))
    assert set(new.keys()) == set(old.keys())
    return max(float(np.abs(new.read(k).astype(np.float64) - old.read(k)).max()) for k in old.keys())


def _state(trainer) -> dict:
    """Everything a resume must restore: the weights, both AdamW moments and (bf16 weights) the fp32 masters, by
    parameter, the step and the data position."""
    worker, opt = trainer.worker, trainer.worker.optimizer
    arrays = {f"param/{i}": p.astype(ms.float32).asnumpy() for i, p in enumerate(worker.params)}
    for kind, params in (("exp_avg", opt.exp_avg), ("exp_avg_sq", opt.exp_avg_sq), ("master", opt.master)):
        arrays.update({f"{kind}/{i}": m.asnumpy() for i, m in enumerate(params)})
    return {"arrays": arrays, "step": trainer.step, "data": trainer.dataset.state_dict()}


def test_qwen2_5_7b_depth_and_vocabulary_train_checkpoint_and_resume(tmp_path, demo_plain, demo_prompts):
    """A GRPO step (rollout, update) with float32 weights and its checkpoint; then a new trainer resumes from it with
    every weight, moment, the step and the data position exactly as the first left them. No reference model (beta
    0): its forward is the actor's code, run here by the update. bf16 weights at this depth: the tensor-parallel
    twin (tests/test_tensor_parallel.py, with the bf16 reference), so the skinny 7B trains in both dtypes."""
    from mindgrpo.train.trainer import GRPOTrainer

    model = make_skinny_qwen2(tmp_path / "skinny_7b", demo_plain.model_dir, **QWEN2_5_7B)
    run = tmp_path / "run"

    def config(**rl):
        return skinny_config(run, demo_prompts, model, save_ckpt_interval=1, mode="pynative", beta=0.0, **rl)

    first = GRPOTrainer(config(max_steps=1))
    metrics = first.train()
    assert np.isfinite(metrics["grad_norm"]) and metrics["grad_norm"] > 0
    assert largest_change(model, checkpoint(run, 1)) > 1e-5  # the update ran
    saved = _state(first)
    assert len(first.worker.params) == 28 * 12 + 3  # every parameter of Qwen2.5-7B's layout, untied
    resumed = GRPOTrainer(config(max_steps=2, resume_training=True))
    loaded = _state(resumed)
    assert (loaded["step"], loaded["data"]) == (saved["step"], saved["data"])
    assert loaded["arrays"].keys() == saved["arrays"].keys()
    for name, array in saved["arrays"].items():
        np.testing.assert_array_equal(loaded["arrays"][name], array, err_msg=name)
    assert any(array.any() for name, array in saved["arrays"].items() if name.startswith("exp_avg/"))


_square_sum = ops.MultitypeFuncGraph("square_sum")


@_square_sum.register("Tensor")
def _square_sum_of(param):
    """In float32 (CPU has no bf16 AddN): the gradient reaching a bf16 weight is its dtype's, as a model's is."""
    value = param.astype(ms.float32)
    return (value * value).sum()


class SquaresLoss(nn.Cell):
    """A loss over every parameter, ``scale * sum(p^2)``, whose gradient ``2 * scale * p`` is known exactly (also in
    bf16, for scale 1/4: a power of two times a bf16 value): the update graphs' numbers are checked against numpy
    without compiling a 64-layer forward."""

    def __init__(self, params):
        super().__init__(auto_prefix=False)
        self.params, self.hyper_map = ParameterTuple(params), ops.HyperMap()

    def construct(self, scale):
        loss = ops.addn(self.hyper_map(_square_sum, self.params)) * scale
        return loss, loss, loss, loss  # the update graph's (loss, metrics, entropy, rollout gap)


@pytest.mark.parametrize("param_dtype", ["float32", "bfloat16"])
def test_qwen2_5_32b_depth_update_graphs_compile_and_step(tmp_path, demo_plain, param_dtype):
    """The three update graphs over every parameter of a 64-layer model (771 tensors, each of which an unrolled
    loop would visit) in GRAPH mode: gradient accumulation, global-norm clipping and the AdamW step, against numpy.
    With bf16 weights (``actor_config.param_dtype``) as the trainer builds them: float32 gradient buffers, the
    optimizer's 771 fp32 masters stepped, then the bf16 weights written from them."""
    from mindgrpo.config import OptimizerConfig
    from mindgrpo.models import build_model
    from mindgrpo.parallel.groups import DistInfo
    from mindgrpo.train.optim import AdamW
    from mindgrpo.train.step_graphs import AccumulateGradients, ApplyGradients, ReduceAndClip, gradient_buffers

    ms.set_context(mode=ms.GRAPH_MODE)
    model = build_model(make_skinny_qwen2(tmp_path / "skinny_32b", demo_plain.model_dir, **QWEN2_5_32B),
                        param_dtype=param_dtype)
    params = model.trainable_params()
    assert len(params) == 64 * 12 + 3  # every layer's 12 tensors, the final norm, embedding and lm_head
    assert {p.dtype for p in params if "norm" not in p.name} == {getattr(ms, param_dtype)}
    before = [p.astype(ms.float32).asnumpy().astype(np.float64) for p in params]
    accumulators = gradient_buffers(params, "float32")
    optimizer = AdamW(params, OptimizerConfig(max_grad_norm=1.0))
    assert len(optimizer.master) == (len(params) if param_dtype == "bfloat16" else 0)
    accumulate = AccumulateGradients(SquaresLoss(params), params, accumulators)
    for _ in range(2):  # two micro-batches through the one compiled graph: the accumulators add up
        accumulate(Tensor(0.25, ms.float32))
    grads = before  # twice the gradient of 0.25 p^2: p
    norm = ReduceAndClip(accumulators, 1.0, DistInfo()).reduce_and_clip()
    expected = np.sqrt(sum(float(np.sum(g ** 2)) for g in grads))
    assert norm == pytest.approx(expected, rel=1e-5)
    scale = min(1.0, 1.0 / (expected + 1e-6))
    for acc, g in zip(list(accumulators)[::97], grads[::97]):
        np.testing.assert_allclose(acc.asnumpy(), g * scale, rtol=1e-5, atol=1e-8, err_msg=acc.name)
    ApplyGradients(accumulators, optimizer)(*optimizer.hyper_tensors(1e-3))
    optimizer.publish()
    assert all(not acc.asnumpy().any() for acc in accumulators)  # reset for the next step
    # AdamW's first step (no weight decay) moves an entry by lr * |g| / (|g| + eps): lr, but for the tiniest entries.
    # Under mixed precision that is the fp32 master's step, and each bf16 weight is its master rounded.
    stepped = list(optimizer.master) if param_dtype == "bfloat16" else params
    for p, master, old in zip(params[::97], stepped[::97], before[::97]):
        step = np.abs(master.asnumpy() - old)
        assert np.all(step <= 1.0001e-3) and np.median(step) == pytest.approx(1e-3, rel=1e-3), p.name
        np.testing.assert_array_equal(p.astype(ms.float32).asnumpy(),
                                      master.astype(p.dtype).astype(ms.float32).asnumpy(), err_msg=p.name)


@pytest.mark.slow
def test_qwen2_5_32b_depth_grpo_step(tmp_path, demo_plain, demo_prompts):
    """One GRPO step at 32B's depth (GRAPH: the 64-layer forward and backward compile, minutes on CPU); no reference
    model (beta 0), as above."""
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
