"""mindgrpo.logprobs: per-token log-probs of a Hugging Face folder equal log_softmax of transformers' logits
(the fixtures' reference.npz) at the next tokens, for text Qwen2.5 and Qwen2.5-VL with images, in PyNative and
GRAPH mode; padding scores 0; bad inputs are clear errors."""
import numpy as np
import pytest

import mindgrpo
import mindspore as ms

from mindgrpo.models import scoring
from mindgrpo.models.scoring import PAD_LOGPROB, SequenceScorer

TOL = 1e-4
MODES = {"graph": ms.GRAPH_MODE, "pynative": ms.PYNATIVE_MODE}


def _reference(folder):
    data = np.load(folder / "reference.npz")
    return {key: data[key] for key in data.files}


def _next_token_logprobs(logits, input_ids):
    """log_softmax(logits)[:, t, input_ids[:, t+1]] in float64 numpy: the reference, independent of mindgrpo."""
    logits = logits.astype(np.float64)
    top = logits.max(-1, keepdims=True)
    log_p = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
    return np.take_along_axis(log_p[:, :-1], input_ids[:, 1:, None], -1)[..., 0]


def _check(out, ref, logits_key="logits"):
    """Within TOL of transformers where both tokens are real, exactly PAD_LOGPROB elsewhere; returns the error."""
    ids, mask = ref["input_ids"], ref["attention_mask"]
    real = (mask[:, :-1] * mask[:, 1:]).astype(bool)
    assert out.shape == (ids.shape[0], ids.shape[1] - 1) and out.dtype == np.float32
    error = np.abs(out - _next_token_logprobs(ref[logits_key], ids))[real].max()
    assert error <= TOL, f"max |log-prob - transformers| = {error:.3g}"
    assert np.all(out[~real] == PAD_LOGPROB) and (~real).any()  # the fixtures are left-padded
    assert out[real].min() < -1.0  # real log-probs, not zeros against zeros
    return error


@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_text_logprobs_equal_transformers(tiny_model_dir, mode):
    """The public call: one left-padded batch of the tiny text Qwen2.5; the caller's MindSpore mode is restored."""
    ref = _reference(tiny_model_dir)
    other = ms.PYNATIVE_MODE if MODES[mode] == ms.GRAPH_MODE else ms.GRAPH_MODE
    previous = ms.get_context("mode")
    ms.set_context(mode=other)
    try:
        out = mindgrpo.logprobs(tiny_model_dir, ref["input_ids"], ref["attention_mask"], mode=mode)
        assert ms.get_context("mode") == other
    finally:
        ms.set_context(mode=previous)
    error = _check(out, ref)
    print(f"text log-probs max |error| ({mode}): {error:.3g}")
    # the fixture's own token_logprobs (computed by torch in float32) agree too
    real = ref["token_logprobs_mask"].astype(bool)
    assert np.abs(out - ref["token_logprobs"])[real].max() <= TOL


@pytest.fixture(scope="module")
def vl_scorer(vl_dir):
    return SequenceScorer(vl_dir)


@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_vl_logprobs_with_images_equal_transformers(vl_scorer, vl_dir, mode):
    """Two prompts with an image each and one text-only prompt (left-padded), with the processor's pixel_values;
    then the text-only prompt alone without images, against transformers' text-only logits."""
    ref = _reference(vl_dir)
    out = vl_scorer(ref["input_ids"], ref["attention_mask"], ref["pixel_values"], ref["image_grid_thw"], mode=mode)
    error = _check(out, ref)
    print(f"Qwen2.5-VL log-probs max |error| ({mode}): {error:.3g}")
    text = {"input_ids": ref["input_ids"][2:], "attention_mask": ref["attention_mask"][2:],
            "text_only_logits": ref["text_only_logits"]}
    _check(vl_scorer(text["input_ids"], text["attention_mask"], mode=mode), text, "text_only_logits")


def test_vl_public_call_and_input_types(vl_dir):
    """mindgrpo.logprobs on a Qwen2.5-VL folder, with torch tensors and lists as inputs."""
    torch = pytest.importorskip("torch")
    ref = _reference(vl_dir)
    out = mindgrpo.logprobs(vl_dir, torch.tensor(ref["input_ids"]), ref["attention_mask"].tolist(),
                            pixel_values=torch.tensor(ref["pixel_values"]), image_grid_thw=ref["image_grid_thw"],
                            mode="pynative")
    _check(out, ref)


def test_right_padding_scores_the_same_tokens(tiny_model_dir):
    """A right-padded row gives the log-probs of the same tokens unpadded, and 0 after its end."""
    ref = _reference(tiny_model_dir)
    scorer = SequenceScorer(tiny_model_dir)
    ids = ref["input_ids"][:1]
    full = scorer(ids, np.ones_like(ids), mode="pynative")
    cut = 15
    padded = np.concatenate([ids[:, :cut], np.full((1, ids.shape[1] - cut), 4093)], 1)
    mask = (np.arange(ids.shape[1]) < cut).astype(np.int64)[None]
    out = scorer(padded, mask, mode="pynative")
    np.testing.assert_allclose(out[:, :cut - 1], full[:, :cut - 1], atol=1e-5)
    assert np.all(out[:, cut - 1:] == 0.0)


def test_bad_inputs_are_clear_errors(tiny_model_dir, vl_scorer, vl_dir):
    ref = _reference(tiny_model_dir)
    ids, mask = ref["input_ids"], ref["attention_mask"]
    text = SequenceScorer(tiny_model_dir)
    with pytest.raises(ValueError, match=r"input_ids must be \[batch, length\] with length >= 2"):
        text(ids[0], mask[0])
    with pytest.raises(ValueError, match="length >= 2"):
        text(ids[:, :1], mask[:, :1])
    with pytest.raises(ValueError, match=r"attention_mask has shape \(2, 23\), input_ids \(2, 24\)"):
        text(ids, mask[:, 1:])
    with pytest.raises(ValueError, match="only 0 .padding. and 1"):
        text(ids, mask * 2)
    with pytest.raises(ValueError, match="integer token ids"):
        text(ids.astype(np.float32), mask)
    with pytest.raises(ValueError, match=r"input_ids\[1, 3\] = 4096 is outside the vocabulary .* \(0 \.\. 4095\)"):
        bad = ids.copy()
        bad[1, 3] = 4096
        text(bad, mask)
    with pytest.raises(ValueError, match="mode='eager'"):
        mindgrpo.logprobs(tiny_model_dir, ids, mask, mode="eager")

    vl = _reference(vl_dir)
    with pytest.raises(ValueError, match="is a text model .model_type='qwen2'.: it has no vision tower"):
        text(ids, mask, vl["pixel_values"], vl["image_grid_thw"])
    with pytest.raises(ValueError, match="is a text model"):
        mindgrpo.logprobs(tiny_model_dir, ids, mask, image_grid_thw=vl["image_grid_thw"])
    vl_ids, vl_mask = vl["input_ids"], vl["attention_mask"]
    with pytest.raises(ValueError, match="input_ids hold <.image_pad.> tokens .4098. but no pixel_values"):
        vl_scorer(vl_ids, vl_mask)
    with pytest.raises(ValueError, match="come together .* got only pixel_values"):
        vl_scorer(vl_ids, vl_mask, pixel_values=vl["pixel_values"])
    with pytest.raises(ValueError, match=r"pixel_values has shape \(187, 1176\)"):
        vl_scorer(vl_ids, vl_mask, vl["pixel_values"][1:], vl["image_grid_thw"], mode="pynative")
    with pytest.raises(ValueError, match="image_grid_thw has 2 images but the prompts hold 1"):
        vl_scorer(vl_ids[1:], vl_mask[1:], vl["pixel_values"], vl["image_grid_thw"], mode="pynative")


def test_logprobs_is_a_lazy_package_attribute():
    assert "logprobs" in mindgrpo.__all__
    assert mindgrpo.logprobs is scoring.logprobs
