"""Tensor parallelism (Megatron-style, explicit collectives) under msrun with 2 CPU workers, against one rank.

* the slicing rule (pure numpy): every rank's slices assemble back to the full tensor, for split and replicated
  KV heads;
* ``tp_worker.py``: log-probs, entropies and gradients of the shared-prompt forward with model_parallel 2 equal the
  full model's, and greedy and sampled rollouts give the same tokens, in PyNative and GRAPH;
* (the trainer under tensor parallelism, its checkpoints, resharded resume and export:
  tests/test_data_tensor_parallel.py, at data_parallel 2 x model_parallel 2, against one process);
* examples/grpo/grpo_qwen2_5_7b.yaml trains on its CPU twin (Qwen2.5-7B's depth and vocabulary, bf16 weights) at
  model_parallel 2 (2 workers), and (slow) at its own 2 x 4 layout.
"""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from mindgrpo.parallel.layout import LayoutError, TPLayout, reshard

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from conftest import msrun_group  # noqa: E402
from msrun_jobs import msrun  # noqa: E402
from tiny_qwen import QWEN2_5_7B, make_skinny_qwen2, make_tiny_qwen2  # noqa: E402


# ---------------------------------------------------------------------------------------------- slicing rule
SHAPES = {"model.embed_tokens.weight": (64, 32), "model.layers.0.self_attn.q_proj.weight": (32, 32),
          "model.layers.0.self_attn.q_proj.bias": (32,), "model.layers.0.self_attn.k_proj.weight": (16, 32),
          "model.layers.0.self_attn.v_proj.bias": (16,), "model.layers.0.self_attn.o_proj.weight": (32, 32),
          "model.layers.0.mlp.down_proj.weight": (32, 48), "model.layers.0.mlp.up_proj.weight": (48, 32),
          "model.layers.0.input_layernorm.weight": (32,), "model.norm.weight": (32,)}


@pytest.mark.parametrize("tp,kv", [(1, 2), (2, 2), (4, 2), (2, 4), (4, 1)])
def test_slices_assemble_back_and_reshard(tp, kv):
    heads, d = 4, 8
    shapes = dict(SHAPES)
    shapes["model.layers.0.self_attn.k_proj.weight"] = (kv * d, 32)
    shapes["model.layers.0.self_attn.v_proj.bias"] = (kv * d,)
    layout = TPLayout(tp=tp, rank=0, num_heads=heads, num_kv_heads=kv, head_dim=d, vocab_size=64,
                      intermediate_size=48)
    rng = np.random.default_rng(0)
    for name, shape in shapes.items():
        full = rng.standard_normal(shape).astype(np.float32)
        pieces = [layout.with_rank(r).take(name, full) for r in range(tp)]
        assert all(p.shape == layout.with_rank(r).local_shape(name, shape) for r, p in enumerate(pieces))
        np.testing.assert_array_equal(layout.assemble(name, pieces, shape), full)
        one = TPLayout(1, 0, heads, kv, d, 64, 48)
        np.testing.assert_array_equal(reshard(name, pieces, shape, layout, one)[0], full)
    if kv < tp:  # rank r reads KV head r // (tp / kv): the query heads it holds map to it
        k = shapes["model.layers.0.self_attn.k_proj.weight"]
        for r in range(tp):
            part = layout.with_rank(r).shard("model.layers.0.self_attn.k_proj.weight", k)
            first_q_head = r * heads // tp
            assert part.start // d == first_q_head // (heads // kv)
        assert layout.gradient_owners("model.layers.0.self_attn.k_proj.weight") == tp // kv
    assert layout.gradient_owners("model.norm.weight") == tp


def test_layouts_the_model_cannot_take_are_named():
    with pytest.raises(LayoutError, match="does not divide the 28 attention heads"):
        TPLayout(8, 0, 28, 4, 128, 152064, 18944).validate()
    with pytest.raises(LayoutError, match="vocab_size"):
        TPLayout(2, 0, 4, 2, 8, 65, 48).validate()
    assert not TPLayout(4, 0, 28, 4, 128, 152064, 18944).problems()  # Qwen2.5-7B on 4 ranks


@pytest.mark.parametrize("tp,kv", [(2, 2), (4, 2), (2, 1)])
def test_lora_adapters_split_beside_their_weights_and_partial_gradients_sum(tp, kv):
    """A plain-numpy twin of the tensor-parallel LoRA math: with each rank's slices, B beside a column-parallel
    weight gives the rank's own output rows and A beside a row-parallel one a partial sum, so the layer adds no
    collective; the replicated halves' per-rank gradients sum to the full one (what ReduceAndClip does for the
    names ``sums_gradient_over_tp`` flags), and replicated KV heads' B sums over their replicas as k_proj does."""
    heads, d, hidden, inter, r, s = 4, 8, 32, 48, 3, 2.0
    layout = TPLayout(tp=tp, rank=0, num_heads=heads, num_kv_heads=kv, head_dim=d, vocab_size=64,
                      intermediate_size=inter)
    rng = np.random.default_rng(1)
    x, x_inner = rng.standard_normal((5, hidden)), rng.standard_normal((5, inter))
    for module, n_in, n_out, column in (("self_attn.q_proj", hidden, heads * d, True),
                                        ("self_attn.k_proj", hidden, kv * d, True),
                                        ("mlp.down_proj", inter, hidden, False)):
        a_name, b_name = (f"model.layers.0.{module}.lora_{h}.weight" for h in "AB")
        a, b = rng.standard_normal((r, n_in)), rng.standard_normal((n_out, r))
        inputs = x if column else x_inner
        full = s * (inputs @ a.T) @ b.T
        upstream = rng.standard_normal(full.shape)  # d loss / d output
        grad_a, grad_b = s * (upstream @ b).T @ inputs, s * upstream.T @ (inputs @ a.T)
        ranks = [layout.with_rank(i) for i in range(tp)]
        a_parts, b_parts = [lay.take(a_name, a) for lay in ranks], [lay.take(b_name, b) for lay in ranks]
        if column:  # B split by rows (KV heads as k_proj), A whole on every rank
            assert all(part.shape == a.shape for part in a_parts) and layout.sums_gradient_over_tp(a_name)
            assert not layout.sums_gradient_over_tp(b_name)
            out_parts = [layout.with_rank(i).take(b_name, full.T).T for i in range(tp)]
            rows = [s * (inputs @ a.T) @ bp.T for bp in b_parts]
            for got, want in zip(rows, out_parts):
                np.testing.assert_allclose(got, want, rtol=1e-12)
            ups = [layout.with_rank(i).take(b_name, upstream.T).T for i in range(tp)]
            replicated = layout.is_replicated_kv(b_name)
            if replicated:  # a replica receives the KV head's gradient through its own query heads only: a part
                assert module.endswith("k_proj") and layout.gradient_owners(b_name) == tp // kv
                for first in range(0, tp, layout.kv_replicas):
                    group = range(first, first + layout.kv_replicas)
                    parts = [rng.standard_normal(ups[first].shape) for _ in group]
                    parts[-1] = ups[first] - sum(parts[:-1])
                    for i, part in zip(group, parts):
                        ups[i] = part
            a_grads = [s * (up @ bp).T @ inputs for up, bp in zip(ups, b_parts)]
            np.testing.assert_allclose(sum(a_grads), grad_a, rtol=1e-10)
            b_grads = [s * up.T @ (inputs @ a.T) for up in ups]
            if replicated:  # summed over the replicas of each KV head (ReduceAndClip's KV slots)
                b_grads = [sum(b_grads[first:first + layout.kv_replicas]) for first in range(0, tp, layout.kv_replicas)
                           for _ in range(layout.kv_replicas)]
            np.testing.assert_allclose(layout.assemble(b_name, b_grads, b.shape), grad_b, rtol=1e-10)
        else:  # A split by columns, B whole on every rank: partial sums before the row-parallel AllReduce
            assert all(part.shape == b.shape for part in b_parts) and layout.sums_gradient_over_tp(b_name)
            assert not layout.sums_gradient_over_tp(a_name) and layout.gradient_owners(a_name) == 1
            x_parts = [layout.with_rank(i).take("model.layers.0.mlp.down_proj.weight", inputs) for i in range(tp)]
            downs = [xp @ ap.T for xp, ap in zip(x_parts, a_parts)]
            np.testing.assert_allclose(sum(s * dn @ b.T for dn in downs), full, rtol=1e-10)
            np.testing.assert_allclose(sum(s * upstream.T @ dn for dn in downs), grad_b, rtol=1e-10)
            np.testing.assert_allclose(layout.assemble(a_name, [s * (upstream @ b).T @ xp for xp in x_parts],
                                                       a.shape), grad_a, rtol=1e-10)
        assert layout.gradient_owners(a_name if column else b_name) == tp  # a replicated half counts once


# ---------------------------------------------------------------------------------------------- forward parity
@msrun_group
def test_tp2_logprobs_gradients_and_rollouts_equal_one_rank(tmp_path):
    """Tied embeddings with 2 KV heads in PyNative; untied with 1 KV head (replicated on both ranks) in GRAPH; both
    in one msrun launch."""
    runs = []
    for mode, tied, kv in (("pynative", True, 2), ("graph", False, 1)):
        runs += [mode, make_tiny_qwen2(tmp_path / f"model_{mode}", kv_heads=kv, tied=tied)]
    msrun([REPO / "tests" / "tp_worker.py", tmp_path, *runs], tmp_path / "log")
    for rank, mode in ((0, "pynative"), (1, "pynative"), (0, "graph"), (1, "graph")):
        result = json.loads((tmp_path / f"rank{rank}_{mode}.json").read_text())
        assert result["logp"] <= 1e-5, result
        assert result["entropy"] <= 2e-5, result
        assert result["grad_rel"] <= 1e-5, result
        assert result["unshared_logp"] <= 1e-5 and result["unshared_vs_shared"] <= 1e-5, result
        assert result["greedy_equal"] and result["sampled_equal"] and result["ragged_equal"], result
        assert len({tuple(row) for row in result["sampled_tokens"]}) > 1  # not a degenerate rollout
        lengths = sorted(result["ragged_lengths"])
        assert lengths[1] < lengths[-1], result  # two of the 4 rows end first: the batch is compacted to 2
        # about half the parameters per rank (norms are replicated)
        assert 0.5 <= result["shard_param_elements"] / result["full_param_elements"] <= 0.56, result


def run_7b_recipe_twin(tmp_path: Path, demo, prompts: Path, *, dp: int, mp: int, param_dtype: str) -> Path:
    """examples/grpo/grpo_qwen2_5_7b.yaml itself under msrun with ``dp x mp`` workers, on its CPU twin: a skinny
    model with Qwen2.5-7B's depth, heads and untied vocabulary (``tiny_qwen.make_skinny_qwen2``), with weights in
    ``param_dtype`` (bfloat16: the fp32 masters in the optimizer, the reference in bf16; the matmuls in float32,
    CPU's only), the demo's short prompts, 12-token completions, 2 steps, a checkpoint after step 2. Every key is the recipe's but those
    and the reward: a random model never answers a GSM8K problem, so the recipe's accuracy reward would give no
    advantage and a zero gradient; the completion's length gives every step a real one. Returns the run folder."""
    model = make_skinny_qwen2(tmp_path / "skinny_7b", demo.model_dir, **QWEN2_5_7B)
    recipe = REPO / "examples" / "grpo" / "grpo_qwen2_5_7b.yaml"
    overrides = [
        f"rl_config.dataset_file={prompts}", f"rl_config.output_dir={tmp_path / 'run'}", "rl_config.device_target=CPU",
        "rl_config.max_prompt_length=64", "rl_config.seq_length=80", "rl_config.max_steps=2",
        "rl_config.save_ckpt_interval=2", "rl_config.save_prompt_completions_interval=1",
        f"actor_config.load={model}", "actor_config.compute_dtype=float32", "ref_config.compute_dtype=float32",
        f"actor_config.param_dtype={param_dtype}",
        "generate_config.sampling_config.max_tokens=12",
        "reward_config.verifier_function=[toy_verifiers:text_length]", "reward_config.verifier_weight=[1.0]",
    ]
    for section in ("actor_config", "ref_config", "generate_config"):
        overrides += [f"{section}.parallel_config.data_parallel={dp}", f"{section}.parallel_config.model_parallel={mp}"]
    msrun([REPO / "examples" / "grpo" / "main.py", "--config", recipe, *overrides], tmp_path / "log",
          workers=dp * mp, timeout=3600)
    from mindgrpo.train.metrics import read_metrics

    run = tmp_path / "run"
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(np.isfinite(r["grad_norm"]) and r["grad_norm"] > 0 for r in rows), rows
    layout = json.loads((run / "checkpoints" / "step_00000002" / "optimizer" / "layout.json").read_text())
    assert (layout["tp"], layout["dp"]) == (mp, dp)
    exported = json.loads((run / "checkpoints" / "step_00000002" / "model" / "config.json").read_text())
    assert exported["torch_dtype"] == param_dtype  # the working weights, exported as they are
    from safetensors.numpy import load_file

    for shard in sorted((run / "checkpoints" / "step_00000002" / "optimizer").glob("rank_*.safetensors")):
        held = load_file(shard)
        owned = sum(key.startswith("exp_avg.") for key in held)  # the tensors whose state this rank keeps
        assert (owned == 28 * 12 + 3) if dp == 1 else (0 < owned < 28 * 12 + 3)  # ZeRO-1 shares them out
        # with bf16 weights, the fp32 master of each of them beside its moments
        assert sum(key.startswith("master.") for key in held) == (owned if param_dtype == "bfloat16" else 0), shard
    return run


@msrun_group
def test_the_7b_recipe_runs_as_a_cpu_twin_undermsrun(tmp_path, demo_plain, demo_prompts):
    """The 7B recipe's code path (shared prompt, the native engine on tensor-parallel slices, recompute, the
    reference model) trains and checkpoints at Qwen2.5-7B's depth and vocabulary, in GRAPH mode, under 2-worker
    msrun at model_parallel 2. Two workers, not the 2 x 2 of earlier sessions: on 2 cores four processes compiling
    28-layer graphs took 5 minutes of both cores, and nothing at this depth depends on the data-parallel degree
    (ZeRO-1 and the data-parallel reductions: tests/test_data_tensor_parallel.py at 2 x 2, and the 2 x 4 layout
    below). Resume at this depth: tests/test_depth.py."""
    run_7b_recipe_twin(tmp_path, demo_plain, demo_prompts, dp=1, mp=2, param_dtype="bfloat16")


@pytest.mark.slow
@msrun_group
def test_the_7b_recipe_runs_as_a_cpu_twin_at_its_own_layout(tmp_path, demo_plain, demo_prompts):
    """The same at the recipe's own 2 x 4 layout (8 workers on this CPU): ZeRO-1 over the data-parallel pair, 4-way
    tensor parallelism (one KV head per rank), with float32 weights: the 28-layer float32 GRPO step in GRAPH mode
    under tensor parallelism (the default-suite twin above is bf16)."""
    run_7b_recipe_twin(tmp_path, demo_plain, demo_prompts, dp=2, mp=4, param_dtype="float32")
