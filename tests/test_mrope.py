"""Qwen2.5-VL's language model against transformers (tests/fixtures/make_qwen_vl.py): config in both spellings,
weights in both layouts, M-RoPE positions (get_rope_index, decode positions) exactly, and full-sequence logits with
the fixture's image features in place of the <|image_pad|> tokens, in PyNative and GRAPH mode."""
import json

import numpy as np
import pytest

import mindgrpo  # noqa: F401  (before mindspore)
from mindspore import Tensor
from safetensors.numpy import load_file, save_file

from mindgrpo.models import CheckpointMismatchError, ModelConfigError, build_model, qwen2_spec, state_dict_hf
from mindgrpo.models.full_sequence import FullSequenceForward
from mindgrpo.models.image_tokens import image_source_rows
from mindgrpo.models.mrope import decode_position_ids, get_rope_index

MAX_POSITIONS = 128
NEW_TOKENS = 8  # the fixture's greedy_new_tokens per row


@pytest.fixture(scope="module")
def ref(vl_reference):
    return vl_reference


@pytest.fixture(scope="module")
def model(vl_dir):
    return build_model(vl_dir)


def _i32(array):
    return Tensor(np.asarray(array, dtype=np.int32))


def _rope_index(spec, input_ids, grids, mask):
    return get_rope_index(input_ids, grids, mask, image_token_id=spec.image_token_id,
                          vision_start_token_id=spec.vision_start_token_id,
                          spatial_merge_size=spec.spatial_merge_size)


# ------------------------------------------------------------------------------------------------ config
def test_both_config_spellings_give_the_same_spec(vl_dir, tiny_model_dir):
    nested = json.loads((vl_dir / "config.json").read_text())
    hub = json.loads((vl_dir / "config_hub_style.json").read_text())
    assert "text_config" in nested and hub["rope_scaling"]["type"] == "mrope"
    spec = qwen2_spec(nested)
    assert spec == qwen2_spec(hub)
    assert (spec.vocab_size, spec.hidden_size, spec.num_hidden_layers, spec.num_attention_heads,
            spec.num_key_value_heads, spec.head_dim, spec.rope_theta, spec.tie_word_embeddings) == (
        4100, 128, 2, 4, 2, 32, 1e6, False)
    assert spec.mrope_section == (4, 6, 6)
    assert (spec.image_token_id, spec.vision_start_token_id, spec.spatial_merge_size) == (4098, 4096, 2)
    text = qwen2_spec(json.loads((tiny_model_dir / "config.json").read_text()))
    assert text.mrope_section == () and text.image_token_id is None


def test_bad_vl_configs_are_errors(vl_dir):
    hub = json.loads((vl_dir / "config_hub_style.json").read_text())
    with pytest.raises(ModelConfigError, match="needs rope_scaling.mrope_section"):
        qwen2_spec({**hub, "rope_scaling": None})
    with pytest.raises(ModelConfigError, match=r"mrope_section=\[4, 6, 8\] must be three positive integers summing "
                                                "to head_dim / 2 = 16"):
        qwen2_spec({**hub, "rope_scaling": {"type": "mrope", "mrope_section": [4, 6, 8]}})
    # a text Qwen2 with M-RoPE scaling is not a model mindgrpo knows
    with pytest.raises(ModelConfigError, match="RoPE scaling"):
        qwen2_spec({**hub, "model_type": "qwen2"})


# ------------------------------------------------------------------------------------------------ weights
def test_newer_weight_layout_and_shards_load_the_same_language_model(tmp_path, vl_dir, model):
    """transformers >= 4.52 saves model.language_model.* / model.visual.*: same language model, shards and index
    too; the vision tower's tensors are left to the vision loader."""
    tensors = load_file(str(vl_dir / "model.safetensors"))
    assert any(name.startswith("visual.") for name in tensors)
    renamed = {("model.language_model." + name[len("model."):] if name.startswith("model.") else
                "model." + name if name.startswith("visual.") else name): value for name, value in tensors.items()}
    folder = tmp_path / "newer"
    folder.mkdir()
    (folder / "config.json").write_text((vl_dir / "config.json").read_text())
    names = sorted(renamed)
    parts = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, part in parts.items():
        save_file({name: renamed[name] for name in part}, str(folder / file), metadata={"format": "pt"})
    weight_map = {name: file for file, part in parts.items() for name in part}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))

    expected = state_dict_hf(model)
    assert set(expected) == {name for name in tensors if not name.startswith("visual.")}
    loaded = state_dict_hf(build_model(folder))
    assert set(loaded) == set(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(loaded[name], value, err_msg=name)

    both = {**tensors, "model.language_model.norm.weight": tensors["model.norm.weight"]}
    (folder / "model.safetensors.index.json").unlink()
    for file in parts:
        (folder / file).unlink()
    save_file(both, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointMismatchError, match="holds both model.language_model.norm.weight and "
                                                      "model.norm.weight"):
        build_model(folder)


# ------------------------------------------------------------------------------------------------ positions
def test_rope_index_equals_transformers(model, ref):
    positions, deltas = _rope_index(model.spec, ref["input_ids"], ref["image_grid_thw"], ref["attention_mask"])
    np.testing.assert_array_equal(positions, ref["position_ids"])
    np.testing.assert_array_equal(deltas, ref["rope_deltas"])
    # the t/h/w rows differ at the image tokens: not plain RoPE in disguise
    assert positions.shape == (3, *ref["input_ids"].shape) and not np.array_equal(positions[0], positions[1])

    # text only (no grids): transformers' rule, cumsum(mask) - 1 with padding at 1, in all three rows
    text_ids, text_mask = ref["input_ids"][2:], ref["attention_mask"][2:]
    positions, deltas = _rope_index(model.spec, text_ids, None, text_mask)
    plain = np.where(text_mask == 1, np.cumsum(text_mask, 1) - 1, 1)
    np.testing.assert_array_equal(positions, np.stack([plain] * 3))
    np.testing.assert_array_equal(deltas, ref["rope_deltas"][2:])


def test_rope_index_errors(model, ref):
    ids, grids, mask = ref["input_ids"], ref["image_grid_thw"], ref["attention_mask"]
    with pytest.raises(ValueError, match="image_grid_thw has 3 images but the prompts hold 2"):
        _rope_index(model.spec, ids, np.concatenate([grids, grids[:1]]), mask)
    with pytest.raises(ValueError, match="more images in the prompts than image_grid_thw rows"):
        _rope_index(model.spec, ids, grids[:1], mask)
    short = ids.copy()
    short[0, np.flatnonzero(ids[0] == model.spec.image_token_id)[-1]] = 13
    with pytest.raises(ValueError, match=r"row 0: image 0 \(grid \[1, 6, 8\]\) needs 12 <\|image_pad\|> tokens"):
        _rope_index(model.spec, short, grids, mask)
    video = ids.copy()
    video[0, np.flatnonzero(ids[0] == model.spec.image_token_id)[0]] = 4099
    with pytest.raises(ValueError, match="only images are supported"):
        _rope_index(model.spec, video, grids, mask)


def test_decode_positions_continue_from_rope_deltas():
    positions = decode_position_ids(np.array([[-18], [5]]), 69, 3)
    assert positions.shape == (3, 2, 3)
    np.testing.assert_array_equal(positions[1], [[51, 52, 53], [74, 75, 76]])
    np.testing.assert_array_equal(positions[0], positions[2])


def test_image_source_rows():
    ids = np.array([[7, 9, 9, 8], [9, 7, 7, 7]])
    np.testing.assert_array_equal(image_source_rows(ids, 9, 3), [0, 8, 9, 3, 10, 5, 6, 7])
    with pytest.raises(ValueError, match="3 <\\|image_pad\\|> tokens .* but the vision tower gave 4"):
        image_source_rows(ids, 9, 4)


# ------------------------------------------------------------------------------------------------ logits
def test_logits_equal_transformers(model, ref, ms_mode):
    """Every real position of the three prompts (two with an image, one text only, left-padded), with the
    fixture's image features and positions: max |error| <= 1e-4. Row 2 alone as plain text (1-row positions, no
    image features) equals transformers' text-only logits."""
    forward = FullSequenceForward(model, MAX_POSITIONS)
    rows = image_source_rows(ref["input_ids"], model.spec.image_token_id, len(ref["image_embeds"]))
    logits = forward(_i32(ref["input_ids"]), _i32(ref["attention_mask"]), _i32(ref["position_ids"]),
                     Tensor(ref["image_embeds"]), _i32(rows)).asnumpy()
    real = ref["attention_mask"].astype(bool)
    error = np.abs(logits - ref["logits"])[real].max()
    assert error <= 1e-4, f"max |logits - transformers| = {error:.3g}"
    assert np.abs(ref["logits"]).max() > 1.0  # a real comparison, not zeros against zeros

    mask = ref["attention_mask"][2:]
    text = forward(_i32(ref["input_ids"][2:]), _i32(mask), _i32(np.where(mask == 1, np.cumsum(mask, 1) - 1, 1)))
    error = np.abs(text.asnumpy() - ref["text_only_logits"])[mask.astype(bool)].max()
    assert error <= 1e-4, f"text only: max |logits - transformers| = {error:.3g}"


def test_mrope_with_equal_rows_is_plain_rope(model, ref, ms_mode):
    """M-RoPE with three equal position rows is the 1-row path, bit for bit."""
    forward = FullSequenceForward(model, MAX_POSITIONS)
    ids, mask = ref["input_ids"], ref["attention_mask"]
    plain = np.where(mask == 1, np.cumsum(mask, 1) - 1, 1)
    one_row = forward(_i32(ids), _i32(mask), _i32(plain)).asnumpy()
    three_rows = forward(_i32(ids), _i32(mask), _i32(np.stack([plain] * 3))).asnumpy()
    np.testing.assert_array_equal(three_rows, one_row)


def test_greedy_decoding_continues_from_rope_deltas(model, ref, ms_mode):
    """Greedy tokens as transformers' generate (KV cache, decode positions index + rope_delta): the rows are
    widened by the new tokens at once (static shape, causal attention ignores what comes later), and each step
    fills the next column. Positions that ignore the image's compression (counting tokens) change row 0's tokens,
    so this checks the rule."""
    forward = FullSequenceForward(model, MAX_POSITIONS)
    batch, length = ref["input_ids"].shape
    ids = np.full((batch, length + NEW_TOKENS), model.spec.pad_token_id, np.int64)
    ids[:, :length] = ref["input_ids"]
    mask = np.zeros_like(ids)
    mask[:, :length] = ref["attention_mask"]
    positions = np.concatenate([ref["position_ids"], decode_position_ids(ref["rope_deltas"], length, NEW_TOKENS)], 2)
    features = Tensor(ref["image_embeds"])
    rows = _i32(image_source_rows(ids, model.spec.image_token_id, len(ref["image_embeds"])))
    for step in range(NEW_TOKENS):
        logits = forward(_i32(ids), _i32(mask), _i32(positions), features, rows).asnumpy()
        ids[:, length + step] = logits[:, length + step - 1].argmax(-1)
        mask[:, length + step] = 1
    np.testing.assert_array_equal(ids[:, length:], ref["greedy_new_tokens"])


def test_three_row_positions_need_a_vl_model(tiny_model_dir):
    forward = FullSequenceForward(build_model(tiny_model_dir), 32)
    ids = np.arange(8, dtype=np.int32).reshape(1, 8)
    with pytest.raises(ValueError, match="no mrope_section"):
        forward(_i32(ids), _i32(np.ones_like(ids)), _i32(np.stack([ids] * 3)))
