"""Qwen2.5-VL vision tower: parity with transformers (the fixture's reference and transformers' own tower), in
PyNative and GRAPH mode; strict loading of both checkpoint layouts; both config spellings."""
import json
import shutil

import numpy as np
import pytest

import mindgrpo  # noqa: F401  (before mindspore)
from mindspore import Tensor
from safetensors.numpy import load_file, save_file

from mindgrpo.models import CheckpointMismatchError, ModelConfigError
from mindgrpo.models.safetensors_io import bf16_bits_to_f32, f32_to_bf16_bits
from mindgrpo.hf_config import read_hf_config
from mindgrpo.models.vision import Qwen2_5VisionTower, load_vision_weights, vision_inputs, vision_parameters, vision_spec
from mindgrpo.models.weights import host_array

TOL = 1e-4


@pytest.fixture(scope="module")
def reference(vl_dir):
    ref = np.load(vl_dir / "reference.npz")
    return {key: ref[key] for key in ("pixel_values", "image_grid_thw", "image_embeds")}


def read_vision_spec(folder):
    return vision_spec(read_hf_config(folder), source=str(folder / "config.json"))


def build_vision_tower(folder):
    """The tower of a folder alone, with its weights (the model builds its own: build_model's model.vision)."""
    tower = Qwen2_5VisionTower(read_vision_spec(folder))
    load_vision_weights(tower, folder)
    return tower


@pytest.fixture(scope="module")
def tower(vl_dir):
    return build_vision_tower(vl_dir)


def _weights(tower):
    return {name: host_array(param) for name, param in vision_parameters(tower).items()}


def _copy_config(src, dst):
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src / "config.json", dst / "config.json")
    return dst


def test_image_embeds_match_transformers(tower, reference, ms_mode):
    out = tower.embed_images(reference["pixel_values"], reference["image_grid_thw"]).asnumpy()
    assert out.shape == reference["image_embeds"].shape == (47, 128)
    err = np.abs(out - reference["image_embeds"]).max()
    print(f"vision tower image_embeds max abs error ({ms_mode}): {err:.3g}")
    assert err <= TOL


def test_padding_to_a_bucket_changes_nothing(tower, reference, ms_mode):
    # one compiled shape for image batches of different sizes: padded patches must not leak into real ones
    out = tower.embed_images(reference["pixel_values"], reference["image_grid_thw"], pad_to=256).asnumpy()
    assert out.shape == (47, 128)
    assert np.abs(out - reference["image_embeds"]).max() <= TOL


def test_window_attention_is_exercised(tower, reference):
    """The fixture's images span several windows, so attending to the whole frame in every block changes the
    output: the parity test above does check the windows."""
    inputs = vision_inputs(tower.spec, reference["image_grid_thw"])
    assert len(np.unique(inputs.window_segments)) > len(reference["image_grid_thw"])
    tensors = list(inputs.tensors())
    tensors[3] = tensors[4]  # window segments := frame segments
    out = tower(Tensor(reference["pixel_values"]), *tensors).asnumpy()
    assert np.abs(out - reference["image_embeds"]).max() > 1e-3


def test_frames_and_exact_window_multiples_match_transformers_tower(vl_dir, tower):
    """Cases the fixture lacks: a 2-frame grid (t > 1: full attention per frame), a grid whose merged size is a
    whole number of windows (HF then pads a full empty window) and a one-window image, against transformers'
    own tower with the same weights."""
    torch = pytest.importorskip("torch")
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    config = json.loads((vl_dir / "config.json").read_text())["vision_config"]
    hf_config = Qwen2_5_VLVisionConfig(**config)
    hf_config._attn_implementation = "eager"
    hf = Qwen2_5_VisionTransformerPretrainedModel(hf_config).eval()
    state = {name[len("visual."):]: torch.from_numpy(value)
             for name, value in load_file(vl_dir / "model.safetensors").items() if name.startswith("visual.")}
    hf.load_state_dict(state, strict=True)
    grid = np.array([[2, 8, 12], [1, 4, 4], [1, 2, 6]])
    pixels = np.random.default_rng(0).standard_normal((int(np.prod(grid, 1).sum()), 1176)).astype(np.float32)
    with torch.no_grad():
        expected = hf(torch.from_numpy(pixels), grid_thw=torch.from_numpy(grid)).numpy()
    out = tower.embed_images(pixels, grid).asnumpy()
    assert out.shape == expected.shape
    assert np.abs(out - expected).max() <= TOL


def test_bad_image_inputs_are_refused(tower, reference):
    with pytest.raises(ValueError, match="pixel_values has shape"):
        tower.embed_images(reference["pixel_values"][:-4], reference["image_grid_thw"])
    with pytest.raises(ValueError, match="multiples of spatial_merge_size"):
        vision_inputs(tower.spec, [[1, 3, 4]])
    with pytest.raises(ValueError, match="pad_to=100"):
        vision_inputs(tower.spec, reference["image_grid_thw"], pad_to=100)


def test_both_config_spellings_give_one_spec(vl_dir):
    nested = json.loads((vl_dir / "config.json").read_text())
    hub = json.loads((vl_dir / "config_hub_style.json").read_text())
    spec = vision_spec(nested)
    assert spec == vision_spec(hub) == read_vision_spec(vl_dir)
    assert (spec.depth, spec.hidden_size, spec.num_heads, spec.window_size, spec.fullatt_block_indexes,
            spec.out_hidden_size) == (4, 64, 4, 56, (1, 3), 128)
    hub["vision_config"]["in_chans"] = hub["vision_config"].pop("in_channels")  # real hub checkpoints' key
    assert vision_spec(hub) == spec
    with pytest.raises(ModelConfigError, match="model_type='qwen2'"):
        vision_spec({**nested, "model_type": "qwen2"})
    del nested["vision_config"]["num_heads"]
    with pytest.raises(ModelConfigError, match="num_heads"):
        vision_spec(nested, source="cfg.json")


def test_newer_layout_sharded_loads_identical_tensors(vl_dir, tower, tmp_path):
    """transformers >= 4.52 saves `model.visual.*` (and `model.language_model.*`); here also sharded with an
    index, the vision tensors split across both shards."""
    tensors = load_file(vl_dir / "model.safetensors")
    renamed = {("model." + name if name.startswith("visual.")
                else name.replace("model.", "model.language_model.", 1) if name.startswith("model.") else name): value
               for name, value in tensors.items()}
    folder = _copy_config(vl_dir, tmp_path / "newer")
    names = sorted(renamed)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, part in shards.items():
        save_file({name: renamed[name] for name in part}, folder / file, metadata={"format": "pt"})
    weight_map = {name: file for file, part in shards.items() for name in part}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    newer = Qwen2_5VisionTower(read_vision_spec(folder))
    assert load_vision_weights(newer, folder) == "model.visual."
    expected, loaded = _weights(tower), _weights(newer)
    assert loaded.keys() == expected.keys() and len(loaded) == 4 * 12 + 6  # 12 a block; patch, ln_q, merger
    for name, value in expected.items():
        np.testing.assert_array_equal(loaded[name], value, err_msg=name)
    assert np.array_equal(loaded["patch_embed.proj.weight"], tensors["visual.patch_embed.proj.weight"])


def test_bf16_checkpoint_loads_rounded_weights(vl_dir, tmp_path):
    tensors = load_file(vl_dir / "model.safetensors")
    folder = _copy_config(vl_dir, tmp_path / "bf16")
    # safetensors.numpy cannot write bf16 (numpy has none): write raw bf16 bits through torch, as HF would
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file as save_torch
    save_torch({name: torch.from_numpy(f32_to_bf16_bits(value).view(np.int16)).view(torch.bfloat16)
                for name, value in tensors.items()}, folder / "model.safetensors", metadata={"format": "pt"})
    loaded = _weights(build_vision_tower(folder))
    for name, value in loaded.items():
        np.testing.assert_array_equal(value, bf16_bits_to_f32(f32_to_bf16_bits(tensors["visual." + name])),
                                      err_msg=name)


@pytest.mark.parametrize("change, message", [
    ("drop", "missing from the checkpoint: visual.blocks.2.mlp.up_proj.bias"),
    ("extra", "not in the vision tower: visual.blocks.4.norm1.weight"),
    ("reshape", r"visual.merger.ln_q.weight \(32,\) vs \(64,\)"),
    ("both_prefixes", "holds both 'visual.\\*' and 'model.visual.\\*'"),
    ("no_visual", "has no 'visual.\\*' or 'model.visual.\\*' tensors"),
])
def test_checkpoint_that_does_not_fit_is_refused_by_name(vl_dir, tmp_path, change, message):
    tensors = load_file(vl_dir / "model.safetensors")
    if change == "drop":
        del tensors["visual.blocks.2.mlp.up_proj.bias"]
    elif change == "extra":
        tensors["visual.blocks.4.norm1.weight"] = np.ones(64, np.float32)
    elif change == "reshape":
        tensors["visual.merger.ln_q.weight"] = np.ones(32, np.float32)
    elif change == "both_prefixes":
        tensors["model.visual.merger.ln_q.weight"] = tensors["visual.merger.ln_q.weight"]
    else:
        tensors = {name: value for name, value in tensors.items() if not name.startswith("visual.")}
    folder = _copy_config(vl_dir, tmp_path / change)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointMismatchError, match=message):
        build_vision_tower(folder)
