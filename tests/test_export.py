"""Export to a Hugging Face folder (checked by transformers itself) and the safetensors reader/writer."""
import json
import os

import numpy as np
import pytest

import mindgrpo  # noqa: F401  (before mindspore)
from mindspore import Tensor

from mindgrpo.models import build_model, export_hf, load_state_dict_hf, read_hf_config, state_dict_hf
from mindgrpo.models import export as export_module
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
    return model.logits(model(ids, Tensor(ref["attention_mask"].astype(np.int32)))).asnumpy()


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
