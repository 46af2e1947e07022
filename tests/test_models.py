"""Qwen2 build, strict Hugging Face weight loading and log-prob parity with transformers (tests/fixtures/)."""
import contextlib
import json
import shutil

import numpy as np
import pytest

import mindgrpo  # noqa: F401  (before mindspore)
import mindspore as ms
from mindspore import Tensor, nn, ops
from safetensors.numpy import load_file, save_file

from mindgrpo.models import (CheckpointMismatchError, ModelConfigError, Qwen2Model, build_mindformers_model,
                             build_model, hf_parameters, hf_to_ms_name, load_state_dict_hf, ms_to_hf_name, qwen2_spec,
                             read_hf_config, state_dict_hf, sync_weights)

MODEL_FILES = ("config.json", "model.safetensors")


class TokenLogProbs(nn.Cell):
    """log p(token t+1 | tokens <= t) from the model's full-sequence pass, compiled whole in GRAPH mode."""

    def __init__(self, model, max_positions=64):
        super().__init__(auto_prefix=False)  # as the trainer's cells: the model's Parameter names stay its own
        self.forward = model.full_sequence(max_positions)

    def construct(self, input_ids, attention_mask, position_ids=None):
        logp = ops.log_softmax(self.forward(input_ids, attention_mask, position_ids)[:, :-1], -1)
        return ops.gather_elements(logp, 2, ops.expand_dims(input_ids[:, 1:], -1)).squeeze(-1)


def _reference(model_dir):
    ref = np.load(model_dir / "reference.npz")
    return {key: ref[key] for key in ref.files}


def _int32(array):
    return Tensor(np.asarray(array, dtype=np.int32))


def _copy_model(src, dst, files=MODEL_FILES):
    dst.mkdir(parents=True, exist_ok=True)
    for name in files:
        shutil.copyfile(src / name, dst / name)
    return dst


@contextlib.contextmanager
def _mode(mode):
    """MindSpore execution mode for one block (for tests whose GRAPH variant is slow; others use ms_mode)."""
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    try:
        yield
    finally:
        ms.set_context(mode=previous)


PYNATIVE_AND_SLOW_GRAPH = pytest.mark.parametrize("mode", ["pynative", pytest.param("graph", marks=pytest.mark.slow)])


@pytest.fixture(params=["tied", "untied"])
def either_model_dir(request, tiny_model_dir, tiny_untied_model_dir):
    return tiny_model_dir if request.param == "tied" else tiny_untied_model_dir


# ------------------------------------------------------------------------------------------------ names, config
def test_name_mapping_agrees_with_mindformers_and_inverts(tiny_untied_model_dir):
    from mindformers.models.llama import LlamaForCausalLM

    names = list(load_file(str(tiny_untied_model_dir / "model.safetensors")))
    assert len(names) == 4 * 12 + 3
    for name in names:
        assert hf_to_ms_name(name) == LlamaForCausalLM.convert_name(name)
        assert ms_to_hf_name(hf_to_ms_name(name)) == name
    assert hf_to_ms_name("model.layers.0.self_attn.rotary_emb.inv_freq") is None
    assert ms_to_hf_name("model.layers.0.attention.infer_attention.key_cache") is None


def test_read_hf_config_errors(tmp_path, tiny_model_dir):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_hf_config(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="config.json not found"):
        read_hf_config(tmp_path)
    good = json.loads((tiny_model_dir / "config.json").read_text())

    def write(**changes):
        config = {k: v for k, v in {**good, **changes}.items() if v is not None}
        (tmp_path / "config.json").write_text(json.dumps(config, indent=1))

    (tmp_path / "config.json").write_text('{"model_type": "qwen2",\n "vocab_size": }')
    with pytest.raises(ModelConfigError, match="line 2"):
        read_hf_config(tmp_path)
    write(model_type="llama")
    with pytest.raises(ModelConfigError, match="model_type='llama'"):
        read_hf_config(tmp_path)
    write(intermediate_size=None)
    with pytest.raises(ModelConfigError, match="missing key.*intermediate_size"):
        read_hf_config(tmp_path)
    v5 = {"rope_type": "default", "rope_theta": good["rope_theta"]}  # transformers 5's spelling of the same theta
    write(rope_theta=10000.0, rope_parameters=v5)
    with pytest.raises(ModelConfigError, match="rope_theta=10000.0 and rope_parameters.rope_theta=1000000.0"):
        read_hf_config(tmp_path)
    write(use_sliding_window=True)
    with pytest.raises(ModelConfigError, match="use_sliding_window"):
        read_hf_config(tmp_path)
    # transformers 5 writes only rope_parameters; 4.x (and real Qwen2.5) only rope_theta: both must give 1e6
    for changes in ({"rope_theta": None, "rope_parameters": v5}, {"rope_theta": 1e6, "rope_parameters": v5}, {}):
        write(**changes)
        assert qwen2_spec(read_hf_config(tmp_path)).rope_theta == 1e6


# ------------------------------------------------------------------------------------------------ parity
def test_token_logprobs_match_transformers(ms_mode, either_model_dir):
    """Per-token log-probs vs transformers' within 1e-4 on real tokens, with the fixture's positions (0..23 for the
    padded row too, as TRL scores) and with the default mask-derived ones (cumsum - 1), which agree."""
    ref = _reference(either_model_dir)
    scorer = TokenLogProbs(build_model(either_model_dir))
    ids, mask = _int32(ref["input_ids"]), _int32(ref["attention_mask"])
    real = ref["token_logprobs_mask"].astype(bool)
    with_fixture_positions = scorer(ids, mask, _int32(ref["position_ids"])).asnumpy()
    with_mask_positions = scorer(ids, mask).asnumpy()
    for got in (with_fixture_positions, with_mask_positions):
        assert np.abs(got - ref["token_logprobs"])[real].max() < 1e-4
    assert np.abs(with_fixture_positions - with_mask_positions)[real].max() < 1e-5


class MaskedMeanNLL(nn.Cell):
    def __init__(self, model):
        super().__init__()
        self.scorer = TokenLogProbs(model)

    def construct(self, input_ids, attention_mask, loss_mask):
        return -(self.scorer(input_ids, attention_mask) * loss_mask).sum() / loss_mask.sum()


@PYNATIVE_AND_SLOW_GRAPH
def test_gradients_match_torch(tiny_model_dir, mode):
    """d(masked mean NLL)/d(every weight) vs torch autograd on the same loss (tied: embedding gets both uses)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    ref = _reference(tiny_model_dir)
    with _mode(mode):
        model = build_model(tiny_model_dir)
        grad_fn = ms.value_and_grad(MaskedMeanNLL(model), None, model.trainable_params())
        loss, grads = (ms.jit(grad_fn) if mode == "graph" else grad_fn)(
            _int32(ref["input_ids"]), _int32(ref["attention_mask"]),
            Tensor(ref["token_logprobs_mask"].astype(np.float32)))
    by_param = {id(p): g.asnumpy() for p, g in zip(model.trainable_params(), grads)}

    hf = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32,
                                                            attn_implementation="eager")
    ids = torch.tensor(ref["input_ids"])
    logits = hf(ids, attention_mask=torch.tensor(ref["attention_mask"])).logits
    logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
    loss_mask = torch.tensor(ref["token_logprobs_mask"], dtype=torch.float32)
    torch_loss = -(logp * loss_mask).sum() / loss_mask.sum()
    torch_loss.backward()
    assert abs(float(loss.asnumpy()) - torch_loss.item()) < 1e-5
    torch_params = dict(hf.named_parameters())
    ours = hf_parameters(model)
    assert len(ours) == len(by_param) == 50
    for name, param in ours.items():
        expected = torch_params[name].grad.numpy()
        np.testing.assert_allclose(by_param[id(param)], expected, atol=1e-5 * np.abs(expected).max(), err_msg=name)


def test_left_padding_matches_unpadded(tiny_model_dir):
    ref = _reference(tiny_model_dir)
    scorer = TokenLogProbs(build_model(tiny_model_dir))
    pad = int((ref["attention_mask"][1] == 0).sum())
    assert pad == 7 and ref["attention_mask"][1, :pad].sum() == 0  # the fixture's row 1 is left-padded
    padded = scorer(_int32(ref["input_ids"]), _int32(ref["attention_mask"])).asnumpy()[1, pad:]
    alone = ref["input_ids"][1:2, pad:]
    unpadded = scorer(_int32(alone), _int32(np.ones_like(alone))).asnumpy()[0]
    assert np.abs(unpadded - padded).max() < 1e-5
    right_padded = np.concatenate([alone, np.full((1, pad), 4093)], 1)  # right padding changes nothing either
    mask = np.concatenate([np.ones_like(alone), np.zeros((1, pad), np.int64)], 1)
    assert np.abs(scorer(_int32(right_padded), _int32(mask)).asnumpy()[0, :-pad] - unpadded).max() < 1e-5


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_sources_load(tmp_path, tiny_untied_model_dir, dtype):
    """bf16/fp16 safetensors load exactly (bit-equal to torch's widening) and score like transformers does on the
    same rounded weights; they stay close to the fp32 original."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_file as load_torch, save_file as save_torch

    folder = _copy_model(tiny_untied_model_dir, tmp_path / dtype, files=("config.json",))
    source = load_torch(str(tiny_untied_model_dir / "model.safetensors"))
    rounded = {name: value.to(getattr(torch, dtype)) for name, value in source.items()}
    save_torch(rounded, str(folder / "model.safetensors"), metadata={"format": "pt"})

    model = build_model(folder)
    loaded = state_dict_hf(model)
    for name, tensor in rounded.items():
        np.testing.assert_array_equal(loaded[name], tensor.float().numpy(), err_msg=name)

    ref = _reference(tiny_untied_model_dir)
    real = ref["token_logprobs_mask"].astype(bool)
    got = TokenLogProbs(model)(_int32(ref["input_ids"]), _int32(ref["attention_mask"])).asnumpy()
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                            attn_implementation="eager").eval()
    with torch.no_grad():
        logits = hf(torch.tensor(ref["input_ids"]), attention_mask=torch.tensor(ref["attention_mask"])).logits
    hf_logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, torch.tensor(ref["input_ids"][:, 1:, None]))[..., 0]
    assert np.abs(got - hf_logp.numpy())[real].max() < 1e-4
    drift = np.abs(got - ref["token_logprobs"])[real].max()
    assert 0 < drift < (2e-2 if dtype == "bfloat16" else 5e-3)  # nonzero: the rounding really happened


# ------------------------------------------------------------------------------------------------ roles
def test_roles(tiny_model_dir):
    actor = build_model(tiny_model_dir)
    reference = build_model(tiny_model_dir, role="reference")
    inference = build_model(tiny_model_dir, role="inference")
    assert all(isinstance(model, Qwen2Model) for model in (actor, reference, inference))
    assert (actor.role, reference.role, inference.role) == ("actor", "reference", "inference")
    assert actor.layout.tp == 1 and actor.group == "" and actor.spec.num_hidden_layers == 4
    assert len(actor.trainable_params()) == 4 * 12 + 2  # tied: lm_head is the embedding Parameter
    assert actor.lm_head.weight is actor.model.tok_embeddings.embedding_weight
    for frozen in (reference, inference):
        assert frozen.trainable_params() == [] and not frozen.training
        assert all(not p.requires_grad for p in frozen.get_parameters())
    assert set(hf_parameters(actor)) == set(load_file(str(tiny_model_dir / "model.safetensors")))
    names = [p.name for p in actor.get_parameters()]
    TokenLogProbs(actor)  # a pass reads the Parameters without renaming them
    assert [p.name for p in actor.get_parameters()] == names
    with pytest.raises(ValueError, match="role='critic'"):
        build_model(tiny_model_dir, role="critic")
    with pytest.raises(ValueError, match="compute_dtype='fp32'"):
        build_model(tiny_model_dir, compute_dtype="fp32")


def test_float16_compute(tiny_model_dir):
    """Half-precision compute (bfloat16 is Ascend-only: CPU has no bf16 MatMul): the actor keeps fp32 params,
    the frozen roles store them in the compute dtype; both score close to the fp32 reference."""
    ref = _reference(tiny_model_dir)
    real = ref["token_logprobs_mask"].astype(bool)
    for role, param_dtype in (("actor", ms.float32), ("reference", ms.float16)):
        model = build_model(tiny_model_dir, role=role, compute_dtype="float16")
        assert model.model.layers[0].attention.wq.weight.dtype == param_dtype
        got = TokenLogProbs(model)(_int32(ref["input_ids"]), _int32(ref["attention_mask"])).asnumpy()
        assert got.dtype == np.float32
        assert 0 < np.abs(got - ref["token_logprobs"])[real].max() < 1e-2


def test_build_does_not_litter_cwd(tmp_path, monkeypatch, tiny_model_dir):
    monkeypatch.chdir(tmp_path)
    TokenLogProbs(build_model(tiny_model_dir))(_int32([[1, 2, 3]]), _int32([[1, 1, 1]]))
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------------------ strict loading
def _rewrite(folder, change):
    tensors = load_file(str(folder / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def test_missing_unexpected_and_misshapen_tensors_are_errors(tmp_path, tiny_model_dir):
    missing = _copy_model(tiny_model_dir, tmp_path / "missing")
    _rewrite(missing, lambda t: t.pop("model.layers.2.mlp.up_proj.weight"))
    with pytest.raises(CheckpointMismatchError, match=r"missing from the checkpoint: model\.layers\.2\.mlp\.up_proj"
                                                      r"\.weight \(.*missing/model\.safetensors\)"):
        build_model(missing)

    extra = _copy_model(tiny_model_dir, tmp_path / "extra")
    _rewrite(extra, lambda t: t.update({"model.layers.9.mlp.up_proj.weight": np.zeros((2, 2), np.float32)}))
    with pytest.raises(CheckpointMismatchError, match=r"not in the network: model\.layers\.9\.mlp\.up_proj\.weight"):
        build_model(extra)

    vocab = _copy_model(tiny_model_dir, tmp_path / "vocab")
    config = json.loads((vocab / "config.json").read_text())
    (vocab / "config.json").write_text(json.dumps({**config, "vocab_size": 4000}))
    with pytest.raises(CheckpointMismatchError, match=r"shape mismatch: model\.embed_tokens\.weight \(4096, 128\) in "
                                                      r".*vocab/model\.safetensors vs \(4000, 128\)"):
        build_model(vocab)

    with pytest.raises(FileNotFoundError, match="no model.safetensors or model.safetensors.index.json"):
        build_model(_copy_model(tiny_model_dir, tmp_path / "nofile", files=("config.json",)))
    with pytest.raises(FileNotFoundError, match="config.json not found"):
        build_model(_copy_model(tiny_model_dir, tmp_path / "noconfig", files=("model.safetensors",)))


def test_tied_checkpoint_may_store_a_copy_of_lm_head(tmp_path, tiny_model_dir):
    copy = _copy_model(tiny_model_dir, tmp_path / "copy")
    _rewrite(copy, lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"].copy()}))
    build_model(copy)
    _rewrite(copy, lambda t: t.update({"lm_head.weight": t["lm_head.weight"] + 1}))
    with pytest.raises(CheckpointMismatchError, match="tie_word_embeddings=true, but lm_head.weight differs"):
        build_model(copy)


def _shard(src, dst):
    """Split the fixture into two shards plus an index, as save_pretrained does for large models."""
    _copy_model(src, dst, files=("config.json",))
    tensors = load_file(str(src / "model.safetensors"))
    names = sorted(tensors)
    parts = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, part in parts.items():
        save_file({n: tensors[n] for n in part}, str(dst / file), metadata={"format": "pt"})
    weight_map = {n: file for file, part in parts.items() for n in part}
    (dst / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return tensors


def test_sharded_checkpoint(tmp_path, tiny_untied_model_dir):
    tensors = _shard(tiny_untied_model_dir, tmp_path / "sharded")
    loaded = state_dict_hf(build_model(tmp_path / "sharded"))
    assert set(loaded) == set(tensors)
    for name, value in tensors.items():
        np.testing.assert_array_equal(loaded[name], value, err_msg=name)

    (tmp_path / "sharded" / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"index\.json lists shard\(s\) model-00002-of-00002\.safetensors"):
        build_model(tmp_path / "sharded")


def test_state_dict_roundtrip_is_strict(tiny_model_dir):
    model = build_model(tiny_model_dir)
    state = state_dict_hf(model)
    original = load_file(str(tiny_model_dir / "model.safetensors"))
    assert set(state) == set(original) and "lm_head.weight" not in state
    for name in original:
        np.testing.assert_array_equal(state[name], original[name])
    changed = {name: value * 0.5 for name, value in state.items()}
    load_state_dict_hf(model, changed)
    assert all(np.array_equal(v, changed[k]) for k, v in state_dict_hf(model).items())
    changed["model.norm.weight"][:] = 7  # the model holds its own copy
    assert not np.any(state_dict_hf(model)["model.norm.weight"] == 7)
    del changed["model.norm.weight"]
    with pytest.raises(CheckpointMismatchError, match=r"missing from the checkpoint: model\.norm\.weight"):
        load_state_dict_hf(model, changed)


# ------------------------------------------------------------------------------------------------ weight sync
def test_sync_weights_to_mindformers_model(tiny_untied_model_dir, tiny_model_dir):
    """MindFormers' LlamaForCausalLM (the mindformers rollout backend's) computes transformers' logits, and after
    sync_weights from a trained Qwen2Model it computes ours: the one MindFormers path, held to ours."""
    actor = build_model(tiny_untied_model_dir)
    ref = _reference(tiny_untied_model_dir)
    ids = ref["input_ids"][:1]  # unpadded row: MindFormers' own forward derives its mask from pad ids
    # ...and, unless ENFORCE_EAGER=true, expects exactly seq_length tokens (its generate() pads to it)
    inference = build_mindformers_model(tiny_untied_model_dir, seq_length=ids.shape[1])
    forward = actor.full_sequence(ids.shape[1])

    def actor_logits():
        return forward(_int32(ids), _int32(np.ones_like(ids))).asnumpy()

    def inference_logits():
        return inference(_int32(ids))[0].asnumpy()  # eval mode: (logits, tokens, mask)

    np.testing.assert_allclose(inference_logits(), ref["logits"][:1], atol=1e-4)
    rng = np.random.default_rng(0)
    load_state_dict_hf(actor, {k: v + rng.normal(0, 0.02, v.shape) for k, v in state_dict_hf(actor).items()})
    assert np.abs(inference_logits() - actor_logits()).max() > 1e-2
    assert sync_weights(actor, inference) == 4 * 12 + 3
    assert np.abs(inference_logits() - actor_logits()).max() < 1e-4
    assert sync_weights(actor, actor) == 0

    tied = build_model(tiny_model_dir, load_weights=False)
    with pytest.raises(CheckpointMismatchError, match="only in src: \\['lm_head.weight'\\]"):
        sync_weights(actor, tied)
