"""Training TP=a -> vLLM TP=b resharding, checked against a line-by-line twin of vLLM's weight loaders, and the vllm
backend's weight sync into a fake served network (vllm-mindspore cannot run here)."""
import numpy as np
import pytest

import mindgrpo  # noqa: F401  (before mindspore)
from mindgrpo.parallel.layout import LayoutError, TPLayout
from mindgrpo.parallel.resharding import rank_to_vllm, to_vllm, vllm_groups

HEADS, HEAD_DIM, HIDDEN, INTER, LAYERS = 8, 4, 32, 48, 2
PAIRS = [(1, 2), (2, 1), (2, 4), (4, 2)]


def _full_weights(kv, vocab=64, tied=False, seed=0):
    rng = np.random.default_rng(seed)
    shapes = {"model.embed_tokens.weight": (vocab, HIDDEN), "model.norm.weight": (HIDDEN,)}
    if not tied:
        shapes["lm_head.weight"] = (vocab, HIDDEN)
    for n in range(LAYERS):
        pre = f"model.layers.{n}."
        shapes.update({
            pre + "self_attn.q_proj.weight": (HEADS * HEAD_DIM, HIDDEN),
            pre + "self_attn.q_proj.bias": (HEADS * HEAD_DIM,),
            pre + "self_attn.k_proj.weight": (kv * HEAD_DIM, HIDDEN), pre + "self_attn.k_proj.bias": (kv * HEAD_DIM,),
            pre + "self_attn.v_proj.weight": (kv * HEAD_DIM, HIDDEN), pre + "self_attn.v_proj.bias": (kv * HEAD_DIM,),
            pre + "self_attn.o_proj.weight": (HIDDEN, HEADS * HEAD_DIM),
            pre + "mlp.gate_proj.weight": (INTER, HIDDEN), pre + "mlp.up_proj.weight": (INTER, HIDDEN),
            pre + "mlp.down_proj.weight": (HIDDEN, INTER),
            pre + "input_layernorm.weight": (HIDDEN,), pre + "post_attention_layernorm.weight": (HIDDEN,)})
    return {name: rng.normal(size=shape).astype(np.float32) for name, shape in shapes.items()}


def _layout(kv, tp, rank=0, vocab=64):
    return TPLayout(tp=tp, rank=rank, num_heads=HEADS, num_kv_heads=kv, head_dim=HEAD_DIM, vocab_size=vocab,
                    intermediate_size=INTER)


def _training_pieces(full, layout):
    return {name: [layout.with_rank(r).take(name, value).copy() for r in range(layout.tp)]
            for name, value in full.items()}


# A twin of vLLM's loaders, written from vllm-mindspore's layers/linear.py and layers/vocab_parallel_embedding.py
# (QKVParallelLinear, MergedColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding .weight_loader), not
# from TPLayout: it fills each rank's zero parameter at vLLM's offsets.
def _vllm_reference(full, kv, tp, rank):
    num_heads = HEADS // tp
    if tp >= kv:
        num_kv_heads, replicas = 1, tp // kv
    else:
        num_kv_heads, replicas = kv // tp, 1
    out = {}
    for name, value in full.items():
        if ".q_proj." in name or ".k_proj." in name or ".v_proj." in name:
            merged = name.replace(".q_proj.", ".qkv_proj.").replace(".k_proj.", ".qkv_proj.").replace(
                ".v_proj.", ".qkv_proj.")
            param = out.setdefault(merged, np.zeros(((num_heads + 2 * num_kv_heads) * HEAD_DIM,) + value.shape[1:],
                                                    np.float32))
            if ".q_proj." in name:
                offset, size, shard_id = 0, num_heads * HEAD_DIM, rank
            elif ".k_proj." in name:
                offset, size, shard_id = num_heads * HEAD_DIM, num_kv_heads * HEAD_DIM, rank // replicas
            else:
                offset, size = (num_heads + num_kv_heads) * HEAD_DIM, num_kv_heads * HEAD_DIM
                shard_id = rank // replicas
            param[offset:offset + size] = value[shard_id * size:(shard_id + 1) * size]
        elif ".gate_proj." in name or ".up_proj." in name:
            merged = name.replace(".gate_proj.", ".gate_up_proj.").replace(".up_proj.", ".gate_up_proj.")
            param = out.setdefault(merged, np.zeros((2 * INTER // tp, HIDDEN), np.float32))
            index = 0 if ".gate_proj." in name else 1
            output_sizes = [INTER, INTER]
            offset, size = sum(output_sizes[:index]) // tp, output_sizes[index] // tp
            param[offset:offset + size] = value[rank * size:(rank + 1) * size]
        elif ".o_proj." in name or ".down_proj." in name:
            size = value.shape[1] // tp
            out[name] = value[:, rank * size:(rank + 1) * size]
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            vocab = value.shape[0]
            padded = (vocab + 63) // 64 * 64
            per_rank = padded // tp
            start, stop = min(rank * per_rank, vocab), min((rank + 1) * per_rank, vocab)
            param = np.zeros((per_rank, HIDDEN), np.float32)
            param[:stop - start] = value[start:stop]
            out[name] = param
        else:
            out[name] = value
    return out


@pytest.mark.parametrize("kv", [4, 2])
@pytest.mark.parametrize("a,b", PAIRS)
def test_to_vllm_matches_vllms_loaders(a, b, kv):
    full = _full_weights(kv)
    result = to_vllm(_training_pieces(full, _layout(kv, a)), _layout(kv, a), b)
    assert len(result) == b
    for rank, arrays in enumerate(result):
        expected = _vllm_reference(full, kv, b, rank)
        assert set(arrays) == set(expected)
        assert {"model.layers.1.self_attn.qkv_proj.bias", "model.layers.0.mlp.gate_up_proj.weight"} <= set(arrays)
        for name, value in expected.items():
            np.testing.assert_array_equal(arrays[name], value, err_msg=f"{name} rank {rank} of {b}")


@pytest.mark.parametrize("kv", [4, 2])
@pytest.mark.parametrize("a,b", PAIRS)
def test_vllm_pieces_concatenate_to_the_full_tensors_with_the_right_heads(a, b, kv):
    full = _full_weights(kv, seed=1)
    ranks = to_vllm(_training_pieces(full, _layout(kv, a)), _layout(kv, a), b)
    local_q, local_kv = HEADS // b, max(1, kv // b)
    q_rows, kv_rows = local_q * HEAD_DIM, local_kv * HEAD_DIM
    for n in range(LAYERS):
        pre = f"model.layers.{n}."
        for kind in ("weight", "bias"):
            qkv = [r[pre + f"self_attn.qkv_proj.{kind}"] for r in ranks]
            assert all(piece.shape[0] == q_rows + 2 * kv_rows for piece in qkv)
            q = [piece[:q_rows] for piece in qkv]
            k = [piece[q_rows:q_rows + kv_rows] for piece in qkv]
            v = [piece[q_rows + kv_rows:] for piece in qkv]
            np.testing.assert_array_equal(np.concatenate(q), full[pre + f"self_attn.q_proj.{kind}"])
            replicas = max(1, b // kv)  # replicated KV heads: one copy per group of `replicas` ranks
            np.testing.assert_array_equal(np.concatenate(k[::replicas]), full[pre + f"self_attn.k_proj.{kind}"])
            np.testing.assert_array_equal(np.concatenate(v[::replicas]), full[pre + f"self_attn.v_proj.{kind}"])
            # Grouped-query attention on a rank pairs its local query head i with local KV head
            # i // (local_q / local_kv); that must be the global KV head of the global query head.
            full_k = full[pre + f"self_attn.k_proj.{kind}"]
            for rank in range(b):
                for i in range(local_q):
                    head = rank * local_q + i
                    full_q = full[pre + f"self_attn.q_proj.{kind}"]
                    np.testing.assert_array_equal(q[rank][i * HEAD_DIM:(i + 1) * HEAD_DIM],
                                                  full_q[head * HEAD_DIM:(head + 1) * HEAD_DIM])
                    j = i // (local_q // local_kv)
                    global_kv = head // (HEADS // kv)
                    np.testing.assert_array_equal(k[rank][j * HEAD_DIM:(j + 1) * HEAD_DIM],
                                                  full_k[global_kv * HEAD_DIM:(global_kv + 1) * HEAD_DIM])
        gate_up = [r[pre + "mlp.gate_up_proj.weight"] for r in ranks]
        np.testing.assert_array_equal(np.concatenate([g[:INTER // b] for g in gate_up]),
                                      full[pre + "mlp.gate_proj.weight"])
        np.testing.assert_array_equal(np.concatenate([g[INTER // b:] for g in gate_up]),
                                      full[pre + "mlp.up_proj.weight"])
        for name in ("self_attn.o_proj.weight", "mlp.down_proj.weight"):  # row-parallel: split on the input dim
            np.testing.assert_array_equal(np.concatenate([r[pre + name] for r in ranks], axis=1), full[pre + name])
        for name in ("input_layernorm.weight", "post_attention_layernorm.weight"):
            assert all(np.array_equal(r[pre + name], full[pre + name]) for r in ranks)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        np.testing.assert_array_equal(np.concatenate([r[name] for r in ranks]), full[name])


def test_vocabulary_padding_and_tied_embeddings():
    """vLLM pads the vocabulary to a multiple of 64 and gives each rank padded/b rows (real rows first, zeros
    after); a tied model has no lm_head tensor (vLLM's lm_head is the embedding)."""
    full = _full_weights(kv=2, vocab=100, tied=True)
    ranks = to_vllm(_training_pieces(full, _layout(2, 2, vocab=100)), _layout(2, 2, vocab=100), 4)
    embed = full["model.embed_tokens.weight"]
    assert all(r["model.embed_tokens.weight"].shape == (32, HIDDEN) and "lm_head.weight" not in r for r in ranks)
    np.testing.assert_array_equal(ranks[2]["model.embed_tokens.weight"], embed[64:96])
    np.testing.assert_array_equal(ranks[3]["model.embed_tokens.weight"][:4], embed[96:])
    assert not ranks[3]["model.embed_tokens.weight"][4:].any()
    for rank, arrays in enumerate(ranks):
        for name, value in _vllm_reference(full, 2, 4, rank).items():
            np.testing.assert_array_equal(arrays[name], value, err_msg=name)


def test_layouts_vllm_cannot_serve_are_refused():
    full = _full_weights(kv=2)
    pieces = _training_pieces(full, _layout(2, 2))
    with pytest.raises(LayoutError, match="model_parallel = 3 does not divide the 8 attention heads"):
        to_vllm(pieces, _layout(2, 2), 3)
    partial = {k: v for k, v in pieces.items() if k != "model.layers.0.self_attn.k_proj.weight"}
    with pytest.raises(ValueError, match="model.layers.0.self_attn.k_proj.weight"):
        vllm_groups(list(partial))


@pytest.mark.parametrize("a,b", PAIRS)
def test_each_rank_reshards_its_own_share(a, b):
    """rank_to_vllm, what one process runs: its own training piece, a gather over the training group, its own vLLM
    rank out; the gathers run in the same order on every rank (they are collectives)."""
    kv = 2
    full = _full_weights(kv, seed=2)
    source = _layout(kv, a)
    pieces = _training_pieces(full, source)
    expected = to_vllm(pieces, source, b)
    orders = []
    for process in range(max(a, b)):  # colocated: process p is training rank p % a and vLLM rank p % b
        train_rank = process % a
        order = []

        def gather(name, piece):
            order.append(name)
            np.testing.assert_array_equal(piece, pieces[name][train_rank])  # it sends its own piece
            return pieces[name]

        local = {name: (lambda name=name: pieces[name][train_rank]) for name in full}
        out = dict(rank_to_vllm(local, gather, source.with_rank(train_rank), _layout(kv, b, process % b)))
        assert set(out) == set(expected[process % b])
        for name, value in expected[process % b].items():
            np.testing.assert_array_equal(out[name], value)
        orders.append(order)
    assert all(order == orders[0] for order in orders) and len(orders[0]) == len(full)


# ------------------------------------------------------------------------------------------- backend weight sync
class FakeServedModel:
    """Stands in for vllm-mindspore's native Qwen2 model: Parameters under vLLM's names, listed by
    get_params_dict() (a tied lm_head is the embedding's Parameter under a second name, as there)."""

    def __init__(self, shapes, dtype, tied):
        from mindspore import Parameter, Tensor

        self.params = {name: Parameter(Tensor(np.zeros(shape, np.float32)).astype(dtype), name=name,
                                       requires_grad=False) for name, shape in shapes.items()}
        if tied:
            self.params["lm_head.weight"] = self.params["model.embed_tokens.weight"]

    def get_params_dict(self):
        return dict(self.params)


def _actor_params(pieces, rank):
    from mindspore import Parameter, Tensor

    return {name: Parameter(Tensor(values[rank]), name=name) for name, values in pieces.items()}


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("a,b", [(2, 4), (4, 2)])
def test_vllm_backend_sync_writes_each_ranks_resharded_weights(a, b, tied):
    import mindspore as ms
    from mindgrpo.models import CheckpointMismatchError
    from mindgrpo.rollout.backends.vllm import sync_into_vllm

    kv = 2
    full = _full_weights(kv, tied=tied, seed=3)
    source = _layout(kv, a)
    pieces = _training_pieces(full, source)
    expected = to_vllm(pieces, source, b)
    for process in range(max(a, b)):
        train_rank, vllm_rank = process % a, process % b
        served = FakeServedModel({k: v.shape for k, v in expected[vllm_rank].items()}, ms.float16, tied)
        written = sync_into_vllm(_actor_params(pieces, train_rank), served, source=source.with_rank(train_rank),
                                 target=_layout(kv, b, vllm_rank), gather=lambda name, piece: pieces[name])
        assert written == len(expected[vllm_rank])
        for name, value in expected[vllm_rank].items():
            got = served.params[name].value().astype(ms.float32).asnumpy()
            np.testing.assert_array_equal(got, value.astype(np.float16).astype(np.float32), err_msg=name)

    def sync(served, target_tp=b):
        return sync_into_vllm(_actor_params(pieces, 0), served, source=source, target=_layout(kv, target_tp, 0),
                              gather=lambda name, piece: pieces[name])

    shapes = {k: v.shape for k, v in expected[0].items()}
    missing = FakeServedModel({k: s for k, s in shapes.items() if "qkv_proj.bias" not in k}, ms.float32, tied)
    with pytest.raises(CheckpointMismatchError, match=r"no parameter 'model\.layers\.0\.self_attn\.qkv_proj\.bias'"):
        sync(missing)
    other_tp = 2 if b == 4 else 4
    wrong = FakeServedModel({k: v.shape for k, v in to_vllm(pieces, source, other_tp)[0].items()}, ms.float32, tied)
    with pytest.raises(CheckpointMismatchError, match="must equal vLLM's tensor_parallel_size"):
        sync(wrong)
    extra = FakeServedModel({**shapes, "model.layers.0.mlp.extra_proj.weight": (4, 4)}, ms.float32, tied)
    with pytest.raises(CheckpointMismatchError, match="extra_proj.weight"):
        sync(extra)


# ------------------------------------------------------------------------------------------------ config check
def test_config_refuses_a_vllm_layout_the_resharding_cannot_serve(tmp_path):
    import json

    from mindgrpo.config import ConfigError, GRPOConfig, validate

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": 64, "hidden_size": HIDDEN,
        "intermediate_size": INTER, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
        "num_key_value_heads": 2, "hidden_act": "silu", "max_position_embeddings": 128, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "tie_word_embeddings": False}))
    config = GRPOConfig()
    config.actor_config.load = str(model)
    config.generate_config.backend = "vllm"
    for tp in (1, 2, 4, 8):  # 8 query heads; 2 KV heads, replicated for tp 4 and 8
        config.generate_config.parallel_config.model_parallel = tp
        validate(config, check_paths=False)
    config.generate_config.parallel_config.model_parallel = 3
    with pytest.raises(ConfigError, match=r"generate_config\.parallel_config\.model_parallel = 3 is vLLM's "
                                          r"tensor_parallel_size.*does not divide the 8 attention heads"):
        validate(config, check_paths=False)
    config.generate_config.backend = "native"  # the vllm check is for the vllm backend only
    try:
        validate(config, check_paths=False)
    except ConfigError as err:  # the native engine has checks of its own
        assert "vLLM" not in str(err)


def test_doctor_says_the_vllm_backend_has_not_run():
    from mindgrpo.apps import doctor
    from mindgrpo.config import GRPOConfig

    config = GRPOConfig()
    config.generate_config.backend = "vllm"
    lines = {check.name: check for check in doctor.check_backend(config, "Ascend")}
    assert lines["vllm backend"].status == "warn" and "never run" in lines["vllm backend"].detail
    config.generate_config.backend = "native"
    assert "vllm backend" not in {check.name for check in doctor.check_backend(config, "CPU")}
