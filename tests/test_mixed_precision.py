"""Mixed precision (``actor_config.param_dtype: bfloat16``): bf16 working weights, fp32 master weights and moments
in the optimizer only, against torch running the same recipe (fp32 master AdamW, its weights cast to bf16), in
PyNative and GRAPH: the optimizer alone, and three whole GRPO updates of the ModelWorker against a torch twin of
the recipe on transformers' Qwen2, in one process and at tensor parallel 2 under msrun."""
import sys
from pathlib import Path

import numpy as np
import pytest

import mindspore as ms
from mindspore import Parameter, Tensor

from mindgrpo.config import OptimizerConfig
from mindgrpo.parallel.groups import DistInfo
from mindgrpo.train.optim import AdamW
from mindgrpo.train.step_graphs import ApplyGradients, ReduceAndClip, gradient_buffers

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
from bf16_twin import TWIN_STEPS, TWIN_VOCAB, check_against_twin, twin_config, twin_inputs  # noqa: E402
from conftest import msrun_group, small_run_config  # noqa: E402
from msrun_jobs import msrun  # noqa: E402

SHAPES = [(6, 5), (5,), (3, 6)]


def bf16_values(torch, array):
    """float32 values exactly representable in bfloat16 (torch's round-to-nearest-even)."""
    return torch.tensor(array).to(torch.bfloat16).float().numpy()


def test_bf16_weights_step_as_torch_with_fp32_master_adamw(ms_mode):
    """Three steps: the bf16 working weights equal torch's fp32 master AdamW weights cast to bf16 (within one bf16
    step where the two masters straddle a rounding boundary: they agree to float32 rounding), the masters to 1e-5,
    and the clip uses the fp32 gradients' global norm."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    init = [bf16_values(torch, rng.normal(size=s).astype(np.float32)) for s in SHAPES]
    params = [Parameter(Tensor(a).astype(ms.bfloat16), name=f"p{i}") for i, a in enumerate(init)]
    cfg = OptimizerConfig(beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, max_grad_norm=1.0)
    opt = AdamW(params, cfg)
    accumulators = gradient_buffers(params, "float32")
    reduce, apply = ReduceAndClip(accumulators, cfg.max_grad_norm, DistInfo()), ApplyGradients(accumulators, opt)
    assert not opt.publishes_in_graph  # CPU has no bf16 Assign: the host writes the bf16 weights after each step
    master = [torch.tensor(a, requires_grad=True) for a in init]
    topt = torch.optim.AdamW([{"params": [master[0], master[2]], "weight_decay": 0.1},
                              {"params": [master[1]], "weight_decay": 0.0}], lr=0.01, betas=(0.9, 0.95), eps=1e-8)
    for _ in range(3):
        # Two micro-batches' gradients, each in the weights' dtype (as the backward of bf16 weights gives them),
        # summed in the float32 buffers.
        micro = [[bf16_values(torch, 2 * rng.normal(size=s).astype(np.float32)) for s in SHAPES] for _ in range(2)]
        grads = [a + b for a, b in zip(*micro)]
        for acc, g in zip(accumulators, grads):
            acc.set_data(Tensor(g))
        for p, g in zip(master, grads):
            p.grad = torch.tensor(g)
        torch_norm = torch.nn.utils.clip_grad_norm_(master, 1.0)
        topt.step()
        assert reduce.reduce_and_clip() == pytest.approx(float(torch_norm), rel=1e-6)
        apply(*opt.hyper_tensors(0.01))
        opt.publish()
    for mine, weight, theirs, start in zip(opt.master, params, master, init):
        want = theirs.detach()
        np.testing.assert_allclose(mine.asnumpy(), want.numpy(), rtol=1e-5, atol=1e-7)
        assert weight.dtype == ms.bfloat16
        got, bf16 = weight.astype(ms.float32).asnumpy(), want.to(torch.bfloat16).float().numpy()
        step = np.abs(bf16) * 2.0 ** -7  # one bfloat16 step (8 significant bits) at each value
        assert (np.abs(got - bf16) <= step).all()
        assert (got == bf16).mean() > 0.9, (got == bf16).mean()
        assert np.abs(got - start).max() > 1e-3  # the weights moved


def test_master_weights_are_optimizer_state_only_and_round_trip():
    """The fp32 masters live in the optimizer (named master.<name> in its state, fp32) and restore exactly; a new
    run from bf16 weights starts its masters from them."""
    params = [Parameter(Tensor(np.full(s, 0.5, np.float32)).astype(ms.bfloat16), name=f"p{i}")
              for i, s in enumerate(SHAPES)]
    opt = AdamW(params, OptimizerConfig(), names=["a", "b", "c"])
    state = opt.state_arrays()
    assert sorted(k for k in state if k.startswith("master.")) == ["master.a", "master.b", "master.c"]
    assert all(state[f"master.{n}"].dtype == np.float32 for n in "abc")
    state["master.a"] = np.full(SHAPES[0], 0.123456789, np.float32)
    opt.load_state_arrays(state)
    np.testing.assert_array_equal(opt.master[0].asnumpy(), state["master.a"])
    params[0].set_data(Tensor(np.full(SHAPES[0], 0.25, np.float32)).astype(ms.bfloat16))
    opt.sync_master_from_weights()
    np.testing.assert_array_equal(opt.master[0].asnumpy(), np.full(SHAPES[0], 0.25, np.float32))
    fp32 = AdamW([Parameter(Tensor(np.ones(s, np.float32)), name=f"q{i}") for i, s in enumerate(SHAPES)],
                 OptimizerConfig())
    assert not fp32.mixed and not any(k.startswith("master.") for k in fp32.state_arrays())


def test_bf16_grpo_step_exports_bf16_and_resumes_exactly(tmp_path, demo_plain, demo_prompts):
    """A GRPO step with bf16 weights (rollout over them, the reference model, the update through the fp32 masters),
    its checkpoint written in bf16 (which transformers loads), then a second trainer resuming from it with the
    exact bf16 weights, fp32 masters, moments and step. The reference is stored in bf16 as the actor's first
    weights, so step 1's KL is exactly 0 (with a float32 reference read from the float32 folder it was the bf16
    rounding's, 6.7e-8 here)."""
    from mindgrpo.train.trainer import GRPOTrainer

    def config(**rl):
        cfg = small_run_config(tmp_path / "run", demo_prompts, demo_plain.model_dir, max_prompt_length=64,
                               seq_length=80, max_tokens=8, verifiers=["toy_verifiers:text_length"],
                               save_ckpt_interval=1, **rl)
        cfg.actor_config.param_dtype = "bfloat16"
        return cfg

    def state(trainer):
        opt = trainer.worker.optimizer
        arrays = {f"param/{i}": p.astype(ms.float32).asnumpy() for i, p in enumerate(trainer.worker.params)}
        for kind, params in (("master", opt.master), ("exp_avg", opt.exp_avg), ("exp_avg_sq", opt.exp_avg_sq)):
            arrays.update({f"{kind}/{i}": p.asnumpy() for i, p in enumerate(params)})
        return arrays, trainer.step

    first = GRPOTrainer(config(max_steps=1))
    assert all(p.dtype == ms.bfloat16 for p in first.worker.params if len(p.shape) == 2)  # MindFormers keeps norms fp32
    metrics = first.train()
    assert np.isfinite(metrics["grad_norm"]) and metrics["grad_norm"] > 0
    print(f"step 1 KL: {metrics['actor/kl_loss']:.3e}")
    assert metrics["actor/kl_loss"] == 0.0
    reference = [p for p in first.worker.reference.get_parameters() if len(p.shape) == 2]
    assert reference and all(p.dtype == ms.bfloat16 for p in reference)
    saved, step = state(first)
    masters = [saved[f"master/{i}"] for i in range(len(first.worker.params))]
    weights = [saved[f"param/{i}"] for i in range(len(first.worker.params))]
    assert any(np.abs(m - w).max() > 0 for m, w in zip(masters, weights))  # the masters hold more than bf16 does
    folder = tmp_path / "run" / "checkpoints" / "step_00000001" / "model"
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(folder, torch_dtype="auto")
    assert loaded.dtype == torch.bfloat16  # stored as BF16 and declared so in config.json
    embed = loaded.get_input_embeddings().weight.float().detach().numpy()
    np.testing.assert_array_equal(embed, weights[0])

    resumed = GRPOTrainer(config(max_steps=2, resume_training=True))
    loaded_state, loaded_step = state(resumed)
    assert loaded_step == step == 1 and loaded_state.keys() == saved.keys()
    for name, array in saved.items():
        np.testing.assert_array_equal(loaded_state[name], array, err_msg=name)


# ------------------------------------------------------------------------------------------------ a whole GRPO step
def test_bf16_grpo_steps_equal_a_torch_twin(tmp_path, ms_mode):
    """Three GRPO updates of mindgrpo's ModelWorker with bf16 weights (the shared-prompt forward, two micro-batches,
    the k3 KL, clipping, fp32-master AdamW) against :class:`bf16_twin.TorchGRPOTwin` on the same rollouts
    (tolerances: :func:`bf16_twin.check_against_twin`). At tensor parallel 2: tests/test_tensor_parallel.py."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tiny_qwen import make_tiny_qwen2

    from mindgrpo.models import hf_parameters
    from mindgrpo.train.model_worker import ModelWorker

    folder = make_tiny_qwen2(tmp_path / "model", layers=2, vocab=TWIN_VOCAB, tied=False)
    config = twin_config(folder, ms_mode)
    worker = ModelWorker(config, DistInfo(), eos_token_id=TWIN_VOCAB - 1, pad_token_id=TWIN_VOCAB - 3)
    twin, rollouts, advantages, ref_logp = twin_inputs(torch, transformers, folder, config)
    steps = []
    for _ in range(TWIN_STEPS):
        metrics = worker.update(rollouts, advantages, None, ref_logp, total_steps=TWIN_STEPS)
        steps.append((metrics["actor/loss"], metrics["grad_norm"]))
    opt, name_of = worker.optimizer, {id(p): n for n, p in hf_parameters(worker.actor).items()}
    masters = {name_of[id(p)]: (opt.master[slot].asnumpy() if slot >= 0 else p.asnumpy())
               for p, slot in zip(opt.params, opt.slots)}
    weights = {name: p.astype(ms.float32).asnumpy() for name, p in hf_parameters(worker.actor).items()}
    check_against_twin(torch, twin, advantages, ref_logp, steps, masters, weights)


@msrun_group
def test_bf16_grpo_steps_equal_a_torch_twin_at_tensor_parallel_2(tmp_path):
    """The same three updates at model_parallel 2 under msrun (tests/bf16_twin_job.py), in PyNative and GRAPH: each
    rank steps the fp32 masters of its slices after the gradients' tensor-parallel reductions, and the gathered
    masters and bf16 weights equal the torch twin's within the tolerances of one process."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tiny_qwen import make_tiny_qwen2

    folder = make_tiny_qwen2(tmp_path / "model", layers=2, vocab=TWIN_VOCAB, tied=False)
    config = twin_config(folder, "pynative")
    _, _, _, ref_logp = twin_inputs(torch, transformers, folder, config)
    np.save(tmp_path / "ref_logp.npy", ref_logp)
    modes = ("pynative", "graph")
    msrun([TESTS / "bf16_twin_job.py", tmp_path, folder, tmp_path / "ref_logp.npy", *modes], tmp_path / "log",
          workers=2)
    for mode in modes:
        saved = np.load(tmp_path / f"{mode}.npz")
        arrays = {key: saved[key] for key in saved.files}
        sliced = [key for key in arrays if key.startswith("shard/")
                  and tuple(arrays[key]) != arrays["weight/" + key[len("shard/"):]].shape]
        assert "shard/model.layers.0.self_attn.q_proj.weight" in sliced, mode  # each rank held half the heads
        twin, _, advantages, _ = twin_inputs(torch, transformers, folder, config)
        masters = {key[len("master/"):]: value for key, value in arrays.items() if key.startswith("master/")}
        weights = {key[len("weight/"):]: value for key, value in arrays.items() if key.startswith("weight/")}
        check_against_twin(torch, twin, advantages, ref_logp, [tuple(row) for row in arrays["steps"]], masters,
                           weights)
