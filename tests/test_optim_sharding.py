"""ZeRO-1 over data parallel, tensor-parallel gradient reduction and clipping, and optimizer checkpoints moved
between layouts: pure numpy checks of the partition and the resharding, a one-process check of the norm weighting,
and a 2-worker msrun run (ZeRO on vs off, and a real TP=2 reduction) in PyNative and GRAPH."""
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import msrun_group
from msrun_jobs import free_port
from mindgrpo.train.checkpoint import save_arrays
from mindgrpo.parallel.layout import TPLayout
from mindgrpo.train.optim_state import layout_record, load_resharded, owner_ranks, rank_metadata

# A one-layer Qwen2 with 4 heads of 8, hidden 32, intermediate 64, vocabulary 64 (untied).
HIDDEN, HEAD_DIM, INTER, VOCAB = 32, 8, 64, 64


def hf_shapes(kv_heads: int) -> dict:
    layer = "model.layers.0."
    kv = kv_heads * HEAD_DIM
    return {"model.embed_tokens.weight": (VOCAB, HIDDEN), layer + "input_layernorm.weight": (HIDDEN,),
            layer + "self_attn.q_proj.weight": (4 * HEAD_DIM, HIDDEN), layer + "self_attn.q_proj.bias": (4 * HEAD_DIM,),
            layer + "self_attn.k_proj.weight": (kv, HIDDEN), layer + "self_attn.k_proj.bias": (kv,),
            layer + "self_attn.v_proj.weight": (kv, HIDDEN), layer + "self_attn.v_proj.bias": (kv,),
            layer + "self_attn.o_proj.weight": (HIDDEN, 4 * HEAD_DIM),
            layer + "post_attention_layernorm.weight": (HIDDEN,), layer + "mlp.gate_proj.weight": (INTER, HIDDEN),
            layer + "mlp.up_proj.weight": (INTER, HIDDEN), layer + "mlp.down_proj.weight": (HIDDEN, INTER),
            "model.norm.weight": (HIDDEN,), "lm_head.weight": (VOCAB, HIDDEN)}


def layout(kv_heads: int, tp: int, rank: int = 0) -> TPLayout:
    return TPLayout.for_hf_config({"model_type": "qwen2", "num_hidden_layers": 1, "num_attention_heads": 4,
                                   "num_key_value_heads": kv_heads, "head_dim": HEAD_DIM, "hidden_size": HIDDEN,
                                   "vocab_size": VOCAB, "intermediate_size": INTER}, tp, rank)


# ------------------------------------------------------------------------------------------------ owner partition
def test_owner_partition_is_balanced_deterministic_and_complete():
    rng = np.random.default_rng(0)
    sizes = [int(n) for n in rng.integers(1, 10_000, size=57)]
    for parts in (1, 2, 3, 8):
        owners = owner_ranks(sizes, parts)
        assert owners == owner_ranks(list(sizes), parts)  # every rank computes the same answer
        assert len(owners) == len(sizes) and set(owners) <= set(range(parts))
        loads = np.bincount(owners, weights=sizes, minlength=parts)
        assert loads.max() - loads.min() <= max(sizes)
    # Largest first, each onto the least-loaded rank, ties to the lower rank.
    assert owner_ranks([10, 50, 30, 20], 2) == [0, 0, 1, 1]
    assert owner_ranks([5], 3) == [0]
    with pytest.raises(ValueError, match="0 ranks"):
        owner_ranks([1], 0)


# ------------------------------------------------------------------------------------------------ resharding
def full_moments(shapes: dict, kv_heads: int) -> dict:
    """Full-model moments; a replicated KV head has equal moments on its ranks because its gradients were summed."""
    rng = np.random.default_rng(kv_heads)
    return {f"{m}.{name}": rng.normal(size=shape).astype(np.float32)
            for name, shape in shapes.items() for m in ("exp_avg", "exp_avg_sq")}


def owned_names(shapes: dict, lay: TPLayout, dp: int, dp_rank: int, zero: bool) -> list:
    """The names a rank keeps moments for: everything, or its ZeRO share of its local tensors."""
    names = list(shapes)
    if not zero:
        return names
    owners = owner_ranks([int(np.prod(lay.local_shape(n, shapes[n]))) for n in names], dp)
    return [n for n, owner in zip(names, owners) if owner == dp_rank]


def write_checkpoint(folder: Path, moments: dict, shapes: dict, kv_heads: int, tp: int, dp: int, zero: bool):
    """Per-rank files as the trainer writes them: each rank's slices of the moments it keeps."""
    folder.mkdir(parents=True)
    files = []
    for rank in range(tp * dp):
        lay = layout(kv_heads, tp, rank % tp)
        state = {"step_count": np.array(7, np.int64)}
        for name in owned_names(shapes, lay, dp, rank // tp, zero):
            for m in ("exp_avg", "exp_avg_sq"):
                state[f"{m}.{name}"] = np.ascontiguousarray(lay.take(name, moments[f"{m}.{name}"]))
        files.append(folder / f"rank_{rank:05d}.safetensors")
        save_arrays(files[-1], state, rank_metadata(tp_rank=rank % tp, dp_rank=rank // tp))
    record = layout_record(tp=tp, dp=dp, optimizer_shard=zero)
    return files, json.loads(json.dumps(record))  # as read back from layout.json


@pytest.mark.parametrize("kv_heads, source, target", [
    (2, (2, 1, False), (1, 1, False)),
    (2, (1, 2, True), (2, 1, False)),
    (2, (1, 1, False), (2, 1, False)),
    (2, (2, 2, True), (1, 2, True)),
    (2, (2, 2, False), (2, 2, True)),
    (1, (2, 1, False), (1, 1, False)),
    (1, (1, 1, False), (2, 1, False)),
    (1, (2, 2, True), (2, 1, False)),
])
def test_moments_reshard_between_layouts(tmp_path, kv_heads, source, target):
    shapes = hf_shapes(kv_heads)
    moments = full_moments(shapes, kv_heads)
    files, record = write_checkpoint(tmp_path / "ckpt", moments, shapes, kv_heads, *source)
    tp, dp, zero = target
    seen = set()
    for rank in range(tp * dp):
        lay = layout(kv_heads, tp, rank % tp)
        owned = owned_names(shapes, lay, dp, rank // tp, zero)
        state = load_resharded(files, record, lay, owned, shapes)
        assert set(state) == {"step_count"} | {f"{m}.{n}" for n in owned for m in ("exp_avg", "exp_avg_sq")}
        assert int(state["step_count"]) == 7
        for name in owned:
            for m in ("exp_avg", "exp_avg_sq"):
                np.testing.assert_array_equal(state[f"{m}.{name}"], lay.take(name, moments[f"{m}.{name}"]))
        seen |= {(rank % tp, name) for name in owned}
    assert seen == {(t, n) for t in range(tp) for n in shapes}  # every slice of every tensor has an owner


def test_same_layout_gives_the_written_moments_bit_for_bit(tmp_path):
    shapes = hf_shapes(1)
    moments = full_moments(shapes, 1)
    files, record = write_checkpoint(tmp_path / "ckpt", moments, shapes, 1, 2, 2, True)
    from safetensors.numpy import load_file

    for rank, path in enumerate(files):
        lay = layout(1, 2, rank % 2)
        written = load_file(str(path))
        state = load_resharded(files, record, lay, owned_names(shapes, lay, 2, rank // 2, True), shapes)
        assert set(state) == set(written)
        for key in written:
            assert state[key].tobytes() == written[key].tobytes() and state[key].dtype == written[key].dtype, key


def test_bad_optimizer_checkpoints_are_refused_with_the_reason(tmp_path):
    shapes = hf_shapes(2)
    moments = full_moments(shapes, 2)
    files, record = write_checkpoint(tmp_path / "ckpt", moments, shapes, 2, 2, 1, False)
    lay = layout(2, 1)
    with pytest.raises(ValueError, match="2 ranks, but 1 rank file"):
        load_resharded(files[:1], record, lay, list(shapes), shapes)
    with pytest.raises(ValueError, match="in the slot of rank 0"):
        load_resharded(files[::-1], record, lay, list(shapes), shapes)
    with pytest.raises(ValueError, match="holds 'exp_avg.model.layers.0.extra'"):
        load_resharded(files, record, lay, ["model.layers.0.extra"], {"model.layers.0.extra": (3,)})
    wrong = dict(shapes, **{"lm_head.weight": (VOCAB, HIDDEN + 2)})
    with pytest.raises(ValueError, match="lm_head.weight' has shape"):
        load_resharded(files, record, lay, ["lm_head.weight"], wrong)
    with pytest.raises(ValueError, match="format"):
        load_resharded(files, {"tp": 2, "dp": 1}, lay, list(shapes), shapes)
    other, _ = write_checkpoint(tmp_path / "other", moments, shapes, 2, 2, 1, False)
    save_arrays(other[1], {"step_count": np.array(8, np.int64)}, rank_metadata(tp_rank=1, dp_rank=0))
    with pytest.raises(ValueError, match="disagree on the step count"):
        load_resharded([files[0], other[1]], record, lay, list(shapes), shapes)


# ------------------------------------------------------------------------------------------------ one process
def test_optimizer_shard_is_a_no_op_without_data_parallel():
    from mindspore import Parameter, Tensor

    from mindgrpo.config import OptimizerConfig
    from mindgrpo.parallel.groups import DistInfo
    from mindgrpo.train.optim import AdamW

    params = [Parameter(Tensor(np.ones(s, np.float32)), name=f"w{i}") for i, s in enumerate([(3, 2), (4,)])]
    opt = AdamW(params, OptimizerConfig(), names=["a", "b"], dist=DistInfo(), optimizer_shard=True)
    assert not opt.sharded and opt.owned_names == ("a", "b")
    opt(tuple(Tensor(np.full(p.shape, 0.5, np.float32)) for p in params), *opt.hyper_tensors(0.1))
    assert sorted(opt.state_arrays()) == ["exp_avg.a", "exp_avg.b", "exp_avg_sq.a", "exp_avg_sq.b", "step_count"]


def test_tp_norm_counts_each_copy_once(ms_mode):
    """ReduceAndClip with a TP=4 layout (2 KV heads: each replicated on 2 ranks) on one process, its TP collective
    replaced by what a lone rank contributes (the others add zeros): the norm weights every tensor by 1 / number of
    ranks holding it, and a replicated KV gradient comes back from its own slot unchanged."""
    from mindspore import ParameterTuple, nn

    from mindgrpo.parallel.groups import DistInfo
    from mindgrpo.train.step_graphs import ReduceAndClip

    class LoneRank(nn.Cell):
        def construct(self, x):
            return x

    shapes = hf_shapes(2)
    lay = layout(2, 4, rank=3)
    names = list(shapes)
    rng = np.random.default_rng(1)
    grads = [rng.normal(size=lay.local_shape(n, shapes[n])).astype(np.float32) for n in names]
    acc = ParameterTuple([ms_param(g, f"acc.{n}") for g, n in zip(grads, names)])
    dist = DistInfo(rank=3, world_size=4, tp_size=4, tp_group="fake_tp")
    cell = ReduceAndClip(acc, 1.0, dist, lay, names)
    cell.tp_sum = LoneRank()
    norm = cell.reduce_and_clip()
    copies = {n: lay.gradient_owners(n) for n in names}
    assert copies["model.norm.weight"] == 4 and copies["model.layers.0.self_attn.k_proj.bias"] == 2
    assert copies["lm_head.weight"] == 1
    expected = np.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) / copies[n] for g, n in zip(grads, names)))
    assert norm == pytest.approx(expected, rel=1e-6)
    scale = min(1.0, 1.0 / (expected + 1e-6))
    for p, g in zip(acc, grads):
        np.testing.assert_allclose(p.asnumpy(), g * scale, rtol=1e-5, atol=1e-7, err_msg=p.name)
    with pytest.raises(ValueError, match="rank 3 of 4, but this process is rank 0 of 1"):
        ReduceAndClip(acc, 1.0, DistInfo(), lay, names)


def ms_param(value: np.ndarray, name: str):
    from mindspore import Parameter, Tensor

    return Parameter(Tensor(value), name=name)


def test_reduce_and_clip_without_parallelism_is_plain_clipping(ms_mode):
    from mindspore import ParameterTuple, Tensor

    from mindgrpo.parallel.groups import DistInfo
    from mindgrpo.train.optim import clip_by_global_norm
    from mindgrpo.train.step_graphs import ReduceAndClip

    rng = np.random.default_rng(2)
    grads = [rng.normal(size=s).astype(np.float32) for s in [(5, 3), (3,), (2, 4)]]
    acc = ParameterTuple([ms_param(g, f"plain.{i}") for i, g in enumerate(grads)])
    norm = ReduceAndClip(acc, 0.5, DistInfo()).reduce_and_clip()
    clipped, expected = clip_by_global_norm(tuple(Tensor(g) for g in grads), 0.5)
    assert norm == float(expected)
    for p, c in zip(acc, clipped):
        np.testing.assert_array_equal(p.asnumpy(), c.asnumpy())


# ------------------------------------------------------------------------------------------------ msrun, 2 workers
WORKER = r'''
import dataclasses, sys
import numpy as np
import mindgrpo
import mindspore as ms
from mindspore import Parameter, ParameterTuple, Tensor, nn
from mindgrpo.train.checkpoint import save_arrays
from mindgrpo.config import OptimizerConfig
from mindgrpo.parallel.groups import init_distributed
from mindgrpo.parallel.layout import TPLayout
from mindgrpo.train.optim import AdamW, clip_by_global_norm
from mindgrpo.train.optim_state import rank_metadata
from mindgrpo.train.step_graphs import ApplyGradients, ReduceAndClip, gradient_buffers

out = sys.argv[1]
dist = init_distributed(1)  # DP = 2
rank = dist.rank
SHAPES = {"model.embed_tokens.weight": (16, 8), "model.layers.0.self_attn.q_proj.weight": (8, 8),
          "model.layers.0.self_attn.q_proj.bias": (8,), "model.layers.0.mlp.down_proj.weight": (8, 12),
          "model.layers.0.input_layernorm.weight": (8,), "model.norm.weight": (8,)}
names = list(SHAPES)
init = {n: np.random.default_rng(0).normal(size=s).astype(np.float32) for n, s in SHAPES.items()}
cfg = OptimizerConfig(beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, max_grad_norm=1.0)
LRS = (1e-2, 2e-2, 1.5e-2)


def grads_of(step, r):
    rng = np.random.default_rng(100 + 10 * step + r)
    return [(rng.normal(size=s) * (3 if r else 0.5)).astype(np.float32) for s in SHAPES.values()]


class Step(nn.Cell):
    def __init__(self, opt):
        super().__init__()
        self.opt = opt

    def construct(self, grads, step_size, eps, decay):
        grads, norm = clip_by_global_norm(grads, cfg.max_grad_norm)
        self.opt(grads, step_size, eps, decay)
        return norm


results = {f"init.{n}": v for n, v in init.items()}
for mode in ("pynative", "graph"):
    ms.set_context(mode=ms.PYNATIVE_MODE if mode == "pynative" else ms.GRAPH_MODE)
    # The single-process reference: the mean of both ranks' gradients, clipped, one unsharded AdamW.
    ref = [Parameter(Tensor(init[n]), name=f"{mode}.ref.{n}") for n in names]
    ref_opt = AdamW(ref, cfg, names=names)
    ref_step = Step(ref_opt)
    for step, lr in enumerate(LRS):
        mean = [(a + b) * np.float32(0.5) for a, b in zip(grads_of(step, 0), grads_of(step, 1))]
        results[f"{mode}.ref_norm.{step}"] = ref_step(tuple(Tensor(g) for g in mean), *ref_opt.hyper_tensors(lr))
    for n, p in zip(names, ref):
        results[f"{mode}.ref.{n}"] = p
    for shard in (False, True):
        tag = f"{mode}.{'zero' if shard else 'full'}"
        params = [Parameter(Tensor(init[n]), name=f"{tag}.{n}") for n in names]
        opt = AdamW(params, cfg, names=names, dist=dist, optimizer_shard=shard)
        acc = ParameterTuple(params).clone(prefix="acc", init="zeros")
        reduce, apply = ReduceAndClip(acc, cfg.max_grad_norm, dist), ApplyGradients(acc, opt)
        for step, lr in enumerate(LRS):
            for a, g in zip(acc, grads_of(step, rank)):
                a.set_data(Tensor(g))
            results[f"{tag}.norm.{step}"] = reduce.reduce_and_clip()
            apply(*opt.hyper_tensors(lr))
        for n, p in zip(names, params):
            results[f"{tag}.param.{n}"] = p
        for key, value in opt.state_arrays().items():
            results[f"{tag}.state.{key}"] = value
        if shard and mode == "graph":
            save_arrays(f"{out}/rank_{rank:05d}.safetensors", opt.state_arrays(),
                        rank_metadata(tp_rank=0, dp_rank=rank))
        # bf16 working weights, fp32 masters in the optimizer (owned ones only under ZeRO-1), fp32 gradient buffers
        params = [Parameter(Tensor(init[n]).astype(ms.bfloat16), name=f"{tag}.bf16.{n}") for n in names]
        opt = AdamW(params, cfg, names=names, dist=dist, optimizer_shard=shard)
        acc = gradient_buffers(params, "float32")
        reduce, apply = ReduceAndClip(acc, cfg.max_grad_norm, dist), ApplyGradients(acc, opt)
        for step, lr in enumerate(LRS):
            for a, g in zip(acc, grads_of(step, rank)):
                a.set_data(Tensor(g))
            reduce.reduce_and_clip()
            apply(*opt.hyper_tensors(lr))
            opt.publish()
        for n, p in zip(names, params):
            results[f"{tag}.bf16.param.{n}"] = p.astype(ms.float32)
        for key, value in opt.state_arrays().items():
            results[f"{tag}.bf16.state.{key}"] = value

    # TP = 2 over the same two processes (DP = 1): 2 heads, 1 KV head replicated on both ranks.
    tp_dist = dataclasses.replace(dist, tp_size=2, tp_group=dist.world_group, dp_group="")
    lay = TPLayout(tp=2, rank=rank, num_heads=2, num_kv_heads=1, head_dim=4, vocab_size=8, intermediate_size=8)
    tp_shapes = {"model.embed_tokens.weight": (8, 8), "model.layers.0.self_attn.q_proj.weight": (8, 8),
                 "model.layers.0.self_attn.k_proj.weight": (4, 8), "model.layers.0.self_attn.v_proj.bias": (4,),
                 "model.layers.0.self_attn.o_proj.weight": (8, 8), "model.norm.weight": (8,)}
    tp_names = list(tp_shapes)
    local = []
    for i, n in enumerate(tp_names):  # norm gradients are equal on the TP ranks; the others differ
        rng = np.random.default_rng(200 + i + (0 if n == "model.norm.weight" else 50 * rank))
        local.append(rng.normal(size=lay.local_shape(n, tp_shapes[n])).astype(np.float32))
    acc = ParameterTuple([Parameter(Tensor(g), name=f"{mode}.tp.{n}") for g, n in zip(local, tp_names)])
    results[f"{mode}.tp_norm"] = ReduceAndClip(acc, 1.0, tp_dist, lay, tp_names).reduce_and_clip()
    for n, g, p in zip(tp_names, local, acc):
        results[f"{mode}.tp_in.{n}"] = g
        results[f"{mode}.tp_out.{n}"] = p

np.savez(f"{out}/result_{rank}.npz", **{k: np.asarray(v.asnumpy() if hasattr(v, "asnumpy") else v)
                                       for k, v in results.items()})
'''


@pytest.fixture(scope="module")
def msrun_results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("zero")
    script = tmp / "worker.py"
    script.write_text(WORKER)
    cmd = ["msrun", "--worker_num=2", "--local_worker_num=2", "--master_addr=127.0.0.1",
           f"--master_port={free_port()}", f"--log_dir={tmp / 'log'}", "--join=True", str(script), str(tmp)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=dict(os.environ), cwd=tmp)
    logs = "".join(p.read_text(errors="replace")[-3000:] for p in (tmp / "log").glob("*.log"))
    assert done.returncode == 0, logs
    return tmp, [dict(np.load(tmp / f"result_{r}.npz")) for r in range(2)]


@msrun_group
@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_zero1_equals_unsharded_data_parallel(msrun_results, mode):
    _, ranks = msrun_results
    r0, r1 = ranks
    params = [k for k in r0 if k.startswith(f"{mode}.full.param.")]
    assert len(params) == 6
    for key in params:
        zero = key.replace(".full.", ".zero.")
        for r in ranks:  # ZeRO on vs off, on both ranks
            assert np.abs(r[zero] - r[key]).max() <= 1e-7, key
        np.testing.assert_array_equal(r0[key], r1[key])
        np.testing.assert_array_equal(r0[zero], r1[zero])
        # DP = 2 equals one process stepping on the mean gradient.
        name = key.split(".param.", 1)[1]
        np.testing.assert_allclose(r0[key], r0[f"{mode}.ref.{name}"], rtol=0, atol=1e-6, err_msg=key)
        assert np.abs(r0[key] - r0[f"init.{name}"]).max() > 1e-3  # and it trained
    for step in range(3):
        for r in ranks:
            assert float(r[f"{mode}.full.norm.{step}"]) == pytest.approx(float(r0[f"{mode}.ref_norm.{step}"]),
                                                                       rel=1e-6)
            assert float(r[f"{mode}.zero.norm.{step}"]) == float(r[f"{mode}.full.norm.{step}"])
    # Each ZeRO rank keeps only its share of the moments, equal to the unsharded ones; together they cover all.
    owned = [{k.split(".state.", 1)[1] for k in r if k.startswith(f"{mode}.zero.state.exp_avg.")} for r in ranks]
    assert owned[0] and owned[1] and not owned[0] & owned[1]
    assert owned[0] | owned[1] == {k.split(".state.", 1)[1] for k in r0 if k.startswith(f"{mode}.full.state.exp_avg.")}
    for r, keys in zip(ranks, owned):
        for key in keys | {k.replace("exp_avg.", "exp_avg_sq.", 1) for k in keys}:
            np.testing.assert_array_equal(r[f"{mode}.zero.state.{key}"], r[f"{mode}.full.state.{key}"])
        assert int(r[f"{mode}.zero.state.step_count"]) == 3


@msrun_group
@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_zero1_with_bf16_weights_equals_unsharded(msrun_results, mode):
    """bf16 working weights: ZeRO-1 (each rank steps the fp32 masters it owns, the new weights summed over the
    data-parallel group from the host on CPU) gives every rank the unsharded run's bf16 weights exactly, each the
    cast of its fp32 master, and those masters track the float32 run."""
    _, ranks = msrun_results
    r0 = ranks[0]
    names = [k.split(".param.", 1)[1] for k in r0 if k.startswith(f"{mode}.full.param.")]
    for name in names:
        full = r0[f"{mode}.full.bf16.param.{name}"]
        for r in ranks:
            np.testing.assert_array_equal(r[f"{mode}.zero.bf16.param.{name}"], full, err_msg=name)
            np.testing.assert_array_equal(r[f"{mode}.full.bf16.param.{name}"], full, err_msg=name)
        master = r0[f"{mode}.full.bf16.state.master.{name}"]
        owner = next(r for r in ranks if f"{mode}.zero.bf16.state.master.{name}" in r)
        np.testing.assert_array_equal(owner[f"{mode}.zero.bf16.state.master.{name}"], master, err_msg=name)
        np.testing.assert_allclose(full, master, rtol=2.0 ** -8, atol=0, err_msg=name)  # one bf16 rounding
        np.testing.assert_allclose(master, r0[f"{mode}.full.param.{name}"], rtol=0, atol=2e-2, err_msg=name)
        assert np.abs(full - r0[f"init.{name}"]).max() > 1e-3
    owned = [{k for k in r if k.startswith(f"{mode}.zero.bf16.state.master.")} for r in ranks]
    assert owned[0] and owned[1] and not owned[0] & owned[1] and len(owned[0] | owned[1]) == len(names)


@msrun_group
def test_zero1_checkpoint_loads_into_one_unsharded_rank(msrun_results):
    tmp, ranks = msrun_results
    names = sorted({k.split(".param.", 1)[1] for k in ranks[0] if k.startswith("graph.full.param.")})
    shapes = {n: ranks[0][f"graph.full.param.{n}"].shape for n in names}
    lay = TPLayout(tp=1, rank=0, num_heads=2, num_kv_heads=2, head_dim=4, vocab_size=16, intermediate_size=12)
    files = [tmp / f"rank_{r:05d}.safetensors" for r in range(2)]
    state = load_resharded(files, layout_record(tp=1, dp=2, optimizer_shard=True), lay, names, shapes)
    assert int(state["step_count"]) == 3
    for n in names:
        for m in ("exp_avg", "exp_avg_sq"):
            np.testing.assert_array_equal(state[f"{m}.{n}"], ranks[0][f"graph.full.state.{m}.{n}"])


@msrun_group
@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_tp2_gradients_and_norm_under_msrun(msrun_results, mode):
    """Real TP=2 collectives: the replicated KV head's gradients are summed, split ones stay local, and the norm is
    the full model's, counting the replicated norm scale once."""
    _, ranks = msrun_results
    names = [k.split(".tp_in.", 1)[1] for k in ranks[0] if k.startswith(f"{mode}.tp_in.")]
    lay = TPLayout(tp=2, rank=0, num_heads=2, num_kv_heads=1, head_dim=4, vocab_size=8, intermediate_size=8)
    full = {}
    for n in names:
        pieces = [r[f"{mode}.tp_in.{n}"].astype(np.float64) for r in ranks]
        if lay.is_replicated_kv(n):
            full[n] = pieces[0] + pieces[1]
        elif lay.gradient_owners(n) == 2:
            np.testing.assert_array_equal(pieces[0], pieces[1])
            full[n] = pieces[0]
        else:
            shard = lay.shard(n, (8, 8))
            full[n] = np.concatenate(pieces, axis=shard.axis)
    norm = np.sqrt(sum(float(np.sum(g ** 2)) for g in full.values()))
    scale = min(1.0, 1.0 / (norm + 1e-6))
    for rank, r in enumerate(ranks):
        assert float(r[f"{mode}.tp_norm"]) == pytest.approx(norm, rel=1e-6)
        for n in names:
            expected = lay.with_rank(rank).take(n, full[n]) if lay.shard(n, full[n].shape) else full[n]
            np.testing.assert_allclose(r[f"{mode}.tp_out.{n}"], expected * scale, rtol=1e-5, atol=1e-7, err_msg=n)
    assert any(lay.is_replicated_kv(n) for n in names)
