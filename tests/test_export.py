"""Export to a Hugging Face folder (checked by transformers itself) and the safetensors reader/writer."""
import json
import os

import numpy as np
import pytest

import mindgrpo  # noqa: F401  (before mindspore)
from mindspore import Tensor

from mindgrpo.models import (build_model, export_hf, hf_parameters, load_hf_weights, load_state_dict_hf,
                             read_hf_config, state_dict_hf)
from mindgrpo.models import export as export_module
from mindgrpo.models.export import export_hf_arrays, parse_size, plan_shards
from mindgrpo.models.safetensors_io import SafetensorsError, SafetensorsReader, write_safetensors

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _hf_logits(folder, ref):
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    assert not any(info.values()), info  # no missing / unexpected / mismatched keys
    with torch.no_grad():
        return model.eval()(torch.tensor(ref["input_ids"]),
                            attention_mask=torch.tensor(ref["attention_mask"])).logits.numpy()


def _ms_logits(model, ref):
    ids = Tensor(ref["input_ids"].astype(np.int32))
    return model.full_sequence(ids.shape[1])(ids, Tensor(ref["attention_mask"].astype(np.int32))).asnumpy()


@pytest.mark.parametrize("tied", [True, False])
def test_export_loads_in_transformers_with_same_logits(tmp_path, tiny_model_dir, tiny_untied_model_dir, tied):
    """Export after changing the weights: transformers loads the folder strictly and computes the MindSpore logits,
    not the original ones (so the file holds the live weights); the unchanged model reproduces the original."""
    source = tiny_model_dir if tied else tiny_untied_model_dir
    ref = dict(np.load(source / "reference.npz"))
    real = ref["attention_mask"].astype(bool)
    model = build_model(source)

    out = export_hf(model, tmp_path / "same", hf_config=read_hf_config(source), tokenizer_dir=source)
    assert np.abs(_hf_logits(out, ref) - ref["logits"])[real].max() < 1e-4
    expected = {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
                "tokenizer_config.json", "vocab.json", "merges.txt"}
    assert {p.name for p in out.iterdir()} == expected
    assert ("lm_head.weight" in SafetensorsReader(out / "model.safetensors").keys()) is not tied
    assert json.loads((out / "generation_config.json").read_text()) == \
        json.loads((source / "generation_config.json").read_text())

    rng = np.random.default_rng(1)
    load_state_dict_hf(model, {k: v + rng.normal(0, 0.02, v.shape) for k, v in state_dict_hf(model).items()})
    out = export_hf(model, tmp_path / "changed", hf_config=read_hf_config(source))
    mindspore_logits, hf_logits = _ms_logits(model, ref), _hf_logits(out, ref)
    assert np.abs(hf_logits - mindspore_logits)[real].max() < 1e-4
    assert np.abs(hf_logits - ref["logits"])[real].max() > 1e-2
    assert not (out / "tokenizer.json").exists()


def test_export_bfloat16_rounds_like_torch(tmp_path, tiny_untied_model_dir):
    model = build_model(tiny_untied_model_dir)
    out = export_hf(model, tmp_path / "bf16", hf_config=read_hf_config(tiny_untied_model_dir), dtype="bfloat16")
    config = json.loads((out / "config.json").read_text())
    assert config["torch_dtype"] == "bfloat16" and config["dtype"] == "bfloat16"
    reader = SafetensorsReader(out / "model.safetensors")
    assert {reader.dtype(name) for name in reader.keys()} == {"BF16"}
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    hf_state = hf.state_dict()
    for name, value in state_dict_hf(model).items():
        expected = torch.from_numpy(value).to(torch.bfloat16).float().numpy()
        np.testing.assert_array_equal(hf_state[name].numpy(), expected, err_msg=name)


def test_export_is_atomic(tmp_path, tiny_model_dir, monkeypatch):
    model = build_model(tiny_model_dir)
    config = read_hf_config(tiny_model_dir)
    out = export_hf(model, tmp_path / "out", hf_config=config)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        export_hf(model, out, hf_config=config)

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(export_module, "write_safetensors", crash)
    with pytest.raises(OSError, match="disk full"):
        export_hf(model, out, hf_config=config, overwrite=True)
    assert sorted(os.listdir(tmp_path)) == ["out"]  # no temporary folder left, old export intact
    assert (out / "model.safetensors").is_file()
    with pytest.raises(ValueError, match="vocab_size=4000"):
        export_hf(model, tmp_path / "bad", hf_config={**config, "vocab_size": 4000})
    with pytest.raises(ValueError, match="tie_word_embeddings=False"):
        export_hf(model, tmp_path / "bad", hf_config={**config, "tie_word_embeddings": False})
    assert sorted(os.listdir(tmp_path)) == ["out"]
    monkeypatch.undo()
    export_hf(model, out, hf_config=config, overwrite=True)
    assert sorted(os.listdir(tmp_path)) == ["out"]


# ------------------------------------------------------------------------------------------------ sharded export
@pytest.fixture(scope="module")
def random_qwen2_dir(tmp_path_factory):
    """A tiny random Qwen2 (untied, GQA) saved by transformers itself: needs no ../shared fixtures."""
    config = transformers.Qwen2Config(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      tie_word_embeddings=False, use_sliding_window=False, rms_norm_eps=1e-6)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("random-qwen2")
    model = transformers.Qwen2ForCausalLM(config)
    with torch.no_grad():  # HF initialises biases to zero; make them count
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0, 0.02)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def _ids():
    rng = np.random.default_rng(3)
    return {"input_ids": rng.integers(0, 96, (2, 7)), "attention_mask": np.ones((2, 7), np.int64)}


def test_large_export_is_sharded_with_an_index_that_transformers_loads(tmp_path, random_qwen2_dir):
    from huggingface_hub import split_torch_state_dict_into_shards

    model = build_model(random_qwen2_dir)
    config = read_hf_config(random_qwen2_dir)
    single = export_hf(model, tmp_path / "single", hf_config=config)
    sharded = export_hf(model, tmp_path / "sharded", hf_config=config, max_shard_size="20KB")
    assert not (single / "model.safetensors.index.json").exists()

    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    files = sorted(p.name for p in sharded.glob("*.safetensors"))
    count = len(files)
    assert count >= 3 and files == [f"model-{k:05d}-of-{count:05d}.safetensors" for k in range(1, count + 1)]
    weights = state_dict_hf(model)
    assert set(index["weight_map"]) == set(weights) and set(index["weight_map"].values()) == set(files)
    assert index["metadata"]["total_size"] == sum(v.size * 4 for v in weights.values())
    for file in files:  # each shard holds what the index says, within the limit (no tensor here exceeds it)
        reader = SafetensorsReader(sharded / file)
        assert set(reader.keys()) == {k for k, f in index["weight_map"].items() if f == file}
        assert sum(reader.read(k).size * 4 for k in reader.keys()) <= 20_000
    # the same split as save_pretrained's (huggingface_hub), given the same tensors in the same order
    hub = split_torch_state_dict_into_shards({k: torch.from_numpy(v) for k, v in weights.items()},
                                             max_shard_size="20KB")
    assert hub.tensor_to_filename == index["weight_map"]

    ids = _ids()
    np.testing.assert_array_equal(_hf_logits(sharded, ids), _hf_logits(single, ids))
    torch_model = transformers.AutoModelForCausalLM.from_pretrained(random_qwen2_dir, dtype=torch.float32,
                                                                   attn_implementation="eager")
    with torch.no_grad():
        original = torch_model(torch.tensor(ids["input_ids"])).logits.numpy()
    assert np.abs(_hf_logits(sharded, ids) - original).max() < 1e-5

    fresh = build_model(random_qwen2_dir, load_weights=False)
    assert any(not np.array_equal(v, weights[k]) for k, v in state_dict_hf(fresh).items())
    load_hf_weights(fresh, sharded)  # mindgrpo's own loader reads the index back
    for name, value in state_dict_hf(fresh).items():
        np.testing.assert_array_equal(value, weights[name], err_msg=name)


def test_export_hf_arrays_fetches_each_tensor_once_in_order(tmp_path, random_qwen2_dir):
    """The lower-level writer, as a tensor-parallel run uses it: full shapes plus a fetch per tensor (there a
    collective, so the order and count of calls matter)."""
    config = read_hf_config(random_qwen2_dir)
    weights = state_dict_hf(build_model(random_qwen2_dir))
    calls = []

    def fetch(name):
        calls.append(name)
        return weights[name].astype(np.float64)  # any float dtype is converted to the storage dtype

    shapes = {k: v.shape for k, v in weights.items()}
    out = export_hf_arrays(tmp_path / "out", shapes, fetch, hf_config=config, max_shard_size=10_000,
                           dtype="bfloat16")
    assert calls == list(shapes)
    assert len(list(out.glob("model-*-of-*.safetensors"))) >= 3
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).state_dict()
    for name, value in weights.items():
        expected = torch.from_numpy(value).to(torch.bfloat16).float().numpy()
        np.testing.assert_array_equal(hf[name].numpy(), expected, err_msg=name)

    calls.clear()
    with pytest.raises(ValueError, match="num_hidden_layers=2"):
        export_hf_arrays(tmp_path / "bad", {k: v for k, v in shapes.items() if ".layers.1." not in k}, fetch,
                         hf_config=config)
    assert calls == [] and not (tmp_path / "bad").exists()


def test_max_shard_size_parsing_and_plan():
    assert parse_size("5GB") == 5 * 10 ** 9 and parse_size("20KB") == 20_000 and parse_size(" 2 MiB") == 2 << 20
    assert parse_size(4096) == 4096 and parse_size("4096") == 4096 and parse_size("1.5mb") == 1_500_000
    for bad in ("5 parsecs", "GB", -1, 0, 1.5, True):
        with pytest.raises(ValueError, match="max_shard_size"):
            parse_size(bad)
    # a tensor above the limit sits alone; otherwise fill in order, a new shard when the next one overflows
    assert plan_shards({"a": 6, "b": 5, "big": 30, "c": 4, "d": 1}, 10) == [["a"], ["big"], ["b", "c", "d"]]
    assert plan_shards({"a": 3, "b": 3}, 10) == [["a", "b"]]


# ------------------------------------------------------------------------------------------------ safetensors io
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_safetensors_roundtrip_against_the_reference_library(tmp_path, dtype):
    from safetensors.torch import load_file as load_torch, save_file as save_torch

    rng = np.random.default_rng(0)
    values = {"a": rng.normal(0, 3, (5, 7)).astype(np.float32),
              # rounding ties, subnormals, overflow and non-finite values
              "b": np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 1e-40, 3.4e38, np.inf, -np.inf, np.nan],
                            dtype=np.float32),
              "empty": np.zeros((0, 3), np.float32)}
    torch_dtype = getattr(torch, dtype)
    ours = tmp_path / "ours.safetensors"
    write_safetensors(ours, {k: v.shape for k, v in values.items()}, values.__getitem__, dtype=dtype)
    for name, tensor in load_torch(str(ours)).items():  # the reference library reads our file...
        expected = torch.from_numpy(values[name]).to(torch_dtype)
        assert tensor.dtype == torch_dtype
        torch.testing.assert_close(tensor, expected, equal_nan=True, rtol=0, atol=0)
    theirs = tmp_path / "theirs.safetensors"
    save_torch({k: torch.from_numpy(v).to(torch_dtype) for k, v in values.items()}, str(theirs))
    reader = SafetensorsReader(theirs)  # ...and we read its file, widened to float32 exactly
    for name, value in values.items():
        expected = torch.from_numpy(value).to(torch_dtype).float().numpy()
        np.testing.assert_array_equal(reader.read(name), expected)


def test_safetensors_reader_rejects_damaged_files(tmp_path):
    path = tmp_path / "w.safetensors"
    write_safetensors(path, {"w": (4, 4)}, lambda _: np.ones((4, 4), np.float32))
    data = path.read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[:-8])
    with pytest.raises(SafetensorsError, match=r"cut\.safetensors: tensor 'w'.*damaged"):
        SafetensorsReader(tmp_path / "cut.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(SafetensorsError, match=r"junk\.safetensors: header length"):
        SafetensorsReader(tmp_path / "junk.safetensors")


# ------------------------------------------------------------------------------------------------ Qwen2.5-VL export
def _vl_logits(folder, ref):
    model, info = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    assert not any(info.values()), info  # no missing (e.g. a random vision tower) / unexpected / mismatched keys
    with torch.no_grad():
        return model.eval()(input_ids=torch.tensor(ref["input_ids"]),
                            attention_mask=torch.tensor(ref["attention_mask"]),
                            pixel_values=torch.tensor(ref["pixel_values"]),
                            image_grid_thw=torch.tensor(ref["image_grid_thw"])).logits.numpy()


def _vl_model(vl_dir):
    from mindgrpo.models.scoring import SequenceScorer

    return SequenceScorer(vl_dir)  # the folder's model (.model), which holds its vision tower (.model.vision)


@pytest.mark.parametrize("spelling", ["config.json", "config_hub_style.json"])
def test_vl_export_loads_in_transformers_with_same_logits(tmp_path, spelling):
    """A Qwen2.5-VL model (language model + vision tower) exported with either config spelling: transformers'
    Qwen2_5_VLForConditionalGeneration loads it strictly and, with images, gives the original folder's logits;
    the processor files come along, so the image processor reproduces the fixture's pixel_values."""
    from PIL import Image

    from conftest import generated_fixture

    vl_dir = generated_fixture("tiny-qwen2.5-vl")
    ref = dict(np.load(vl_dir / "reference.npz"))
    real = ref["attention_mask"].astype(bool)
    scorer = _vl_model(vl_dir)
    config = json.loads((vl_dir / spelling).read_text())
    out = export_hf(scorer.model, tmp_path / "vl", hf_config=config, tokenizer_dir=vl_dir)

    assert {p.name for p in out.iterdir()} == {
        "config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
        "vocab.json", "merges.txt", "special_tokens_map.json", "added_tokens.json", "chat_template.jinja",
        "preprocessor_config.json"}
    names = set(SafetensorsReader(out / "model.safetensors").keys())
    assert names == set(SafetensorsReader(vl_dir / "model.safetensors").keys())  # the hub layout, every tensor
    assert json.loads((out / "config.json").read_text()) == {**config, "torch_dtype": "float32"}

    exported, original = _vl_logits(out, ref), _vl_logits(vl_dir, ref)
    error = np.abs(exported - original)[real].max()
    print(f"Qwen2.5-VL export ({spelling}): max |logits - original folder's| = {error:.3g}")
    assert error <= 1e-5
    assert np.abs(original - ref["logits"])[real].max() <= 1e-4  # and the original is the fixture's reference

    processor = transformers.AutoImageProcessor.from_pretrained(out, use_fast=False)
    images = [Image.open(vl_dir / f"image_{k}.png").convert("RGB") for k in range(2)]
    pixels = processor(images=images, return_tensors="np")
    np.testing.assert_array_equal(pixels["image_grid_thw"], ref["image_grid_thw"])
    np.testing.assert_allclose(pixels["pixel_values"], ref["pixel_values"], atol=1e-6)


def test_vl_export_writes_the_live_weights_and_refuses_a_missing_tower(tmp_path):
    """After changing the language model's and the vision tower's weights, transformers' log-probs of the export
    are mindgrpo's (so the live weights of both are written), not the original folder's. A Qwen2.5-VL config needs
    the tower, a text config refuses one, and a tower the config does not describe is refused."""
    from conftest import generated_fixture
    from mindgrpo.models.vision import vision_parameters
    from mindgrpo.models.weights import host_array

    vl_dir = generated_fixture("tiny-qwen2.5-vl")
    ref = dict(np.load(vl_dir / "reference.npz"))
    scorer = _vl_model(vl_dir)
    config = read_hf_config(vl_dir)
    rng = np.random.default_rng(2)
    load_state_dict_hf(scorer.model, {k: v + rng.normal(0, 0.02, v.shape)
                                      for k, v in state_dict_hf(scorer.model).items()})
    for param in vision_parameters(scorer.model.vision.tower).values():
        value = host_array(param)
        param.set_data(Tensor(value + rng.normal(0, 0.02, value.shape).astype(np.float32)))
    out = export_hf(scorer.model, tmp_path / "changed", hf_config=config)

    logits = _vl_logits(out, ref)
    top = logits.max(-1, keepdims=True)
    log_p = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
    theirs = np.take_along_axis(log_p[:, :-1], ref["input_ids"][:, 1:, None], -1)[..., 0]
    ours = scorer(ref["input_ids"], ref["attention_mask"], ref["pixel_values"], ref["image_grid_thw"],
                  mode="pynative")
    real = ref["token_logprobs_mask"].astype(bool)
    assert np.abs(theirs - ours)[real].max() <= 1e-4
    assert np.abs(theirs - ref["token_logprobs"])[real].max() > 1e-2

    with pytest.raises(ValueError, match="Qwen2.5-VL model but there are no vision tower weights: export a model "
                                         "built with its tower"):
        export_hf(build_model(vl_dir, vision=False), tmp_path / "bad", hf_config=config)
    with pytest.raises(ValueError, match="vision_config does not describe this vision tower: it says depth=3"):
        export_hf(scorer.model, tmp_path / "bad", hf_config={**config, "vision_config": {
            **config["vision_config"], "depth": 3, "fullatt_block_indexes": [1]}})
    text_dir = generated_fixture("tiny-qwen2.5")
    text_shapes = {name: tuple(p.shape) for name, p in hf_parameters(build_model(text_dir)).items()}
    with pytest.raises(ValueError, match="describes a text model .model_type='qwen2'. but the weights hold a vision"):
        export_hf_arrays(tmp_path / "bad", {**text_shapes, "visual.patch_embed.proj.weight": (8, 3, 2, 14, 14)},
                         lambda name: None, hf_config=read_hf_config(text_dir))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["changed"]
