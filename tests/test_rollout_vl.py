"""The native rollout engine on Qwen2.5-VL prompts (tests/fixtures/make_qwen_vl.py): images in the prefill, M-RoPE
positions, decode positions continuing from each prompt's rope_delta, on the plain and the fused decode paths.

References: transformers' greedy ``generate`` with a KV cache (``greedy_new_tokens``) and its logits after each
prompt, both in the fixture; the decode steps' logits against the full-sequence forward
(:class:`~mindgrpo.models.full_sequence.FullSequenceForward`, itself held to transformers by tests/test_mrope.py),
which recomputes every position with no cache. The image features are the fixture's reference ``image_embeds``
(the vision tower is tested in tests/test_vision.py). The engine's graphs always run in GRAPH mode; the greedy test
calls it from a PyNative and a GRAPH-mode process alike. The engines are module-scoped: 3 prompts x
num_generations=2 make one bucket (prompt batch 4, batch 8, prompt length 80, 32 new tokens) per decode path.
"""
import numpy as np
import pytest

import mindgrpo  # noqa: F401  (before mindspore)
from mindspore import Tensor

from mindgrpo.models import build_model
from mindgrpo.models.full_sequence import FullSequenceForward
from mindgrpo.models.image_tokens import image_source_rows
from mindgrpo.models.mrope import decode_position_ids
from mindgrpo.rollout import SamplingParams, build_rollout_engine
from mindgrpo.rollout.api import PromptImages, refuse_images

EOS, PAD = 4095, 4093
IMAGE_PAD = 4098
NEW_TOKENS = 8  # the fixture's greedy_new_tokens per row
GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, num_generations=2)
ENGINE = dict(eos_token_id=EOS, pad_token_id=PAD, max_prompt_length=80, max_batch_size=8,  # fixture width 76
              prompt_length_buckets=(80,), min_decode_batch=2)


@pytest.fixture(scope="module")
def ref(vl_reference):
    return vl_reference


@pytest.fixture(scope="module")
def model(vl_dir):
    return build_model(vl_dir)


@pytest.fixture(scope="module")
def engines(model):
    """decode_impl -> engine on the fixture's language model, built on first use."""
    built = {}

    def get(impl):
        if impl not in built:
            built[impl] = build_rollout_engine("native", model, decode_impl=impl, **ENGINE)
            assert built[impl].fused_decode == (impl == "fused")
        return built[impl]
    return get


def fixture_prompts(ref):
    """The three prompts without their left padding, and their images: row 0 has image 0 (12 tokens), row 1
    image 1 (35), row 2 none."""
    prompts = [row[mask == 1].tolist() for row, mask in zip(ref["input_ids"], ref["attention_mask"])]
    grids, embeds = ref["image_grid_thw"], ref["image_embeds"]
    images = [PromptImages(embeds[:12], grids[:1]), PromptImages(embeds[12:], grids[1:]), None]
    assert [p.count(IMAGE_PAD) for p in prompts] == [12, 35, 0]
    return prompts, images


@pytest.mark.parametrize("impl", ["plain", "fused"])
def test_greedy_rollout_reproduces_transformers(engines, ref, impl, ms_mode):
    """Greedy completions of the fixture's prompts (two with an image, one text only, decoded together) equal
    transformers' generate token for token, for every sample of each group. Each prompt is prefilled once (3
    prompts -> prompt batch 4 for 8 rows); a second rollout in the same bucket, with the prompts in another order
    (other image sizes at each prompt row), compiles nothing."""
    engine = engines(impl)
    prompts, images = fixture_prompts(ref)
    result = engine.generate(prompts, GREEDY, images=images)
    expected = np.repeat(ref["greedy_new_tokens"], GREEDY.num_generations, axis=0)
    np.testing.assert_array_equal(result.completion_ids, expected)
    assert result.completion_mask.all() and result.finish_reasons == ["length"] * 6
    key, = engine.buckets_built
    assert (key.vision, key.prompt_batch, key.batch, key.prompt_len) == (True, 4, 8, ENGINE["max_prompt_length"])

    compiled = engine.compiled_graphs()
    order = [1, 2, 0]
    again = engine.generate([prompts[i] for i in order], GREEDY, images=[images[i] for i in order])
    np.testing.assert_array_equal(again.completion_ids, np.repeat(ref["greedy_new_tokens"][order], 2, axis=0))
    assert engine.compiled_graphs() == compiled, "a second rollout of the same bucket compiled graphs"


def full_sequence_logits(model, ref, continuations):
    """float32 [3, NEW_TOKENS, vocab]: the full-sequence forward's logits after each prompt and each of its first
    NEW_TOKENS - 1 continuation tokens (the fixture's padded rows widened by the continuation; no cache)."""
    batch, length = ref["input_ids"].shape
    ids = np.full((batch, length + NEW_TOKENS - 1), PAD, np.int32)
    ids[:, :length], ids[:, length:] = ref["input_ids"], continuations[:, :NEW_TOKENS - 1]
    mask = np.ones_like(ids)
    mask[:, :length] = ref["attention_mask"]
    positions = np.concatenate([ref["position_ids"], decode_position_ids(ref["rope_deltas"], length, NEW_TOKENS - 1)],
                               2)
    rows = image_source_rows(ids, IMAGE_PAD, len(ref["image_embeds"]))
    logits = FullSequenceForward(model, 128)(Tensor(ids), Tensor(mask), Tensor(positions.astype(np.int32)),
                                             Tensor(ref["image_embeds"]), Tensor(rows)).asnumpy()
    return logits[:, length - 1:]


@pytest.mark.parametrize("impl", ["plain", "fused"])
def test_prefill_and_decode_logits(engines, model, ref, impl):
    """The logits a rollout samples from: after each prompt within 1e-4 of transformers' (the image features and
    M-RoPE in the prefill), and after each continuation token within 1e-4 of the full-sequence forward (the KV
    cache and the decode positions index + rope_delta)."""
    engine = engines(impl)
    prompts, images = fixture_prompts(ref)
    continuations = ref["greedy_new_tokens"]
    forced = np.stack(engine.forced_logits(prompts, [c[:NEW_TOKENS - 1].tolist() for c in continuations],
                                           images=images))  # [3, NEW_TOKENS, vocab]
    prefill_error = np.abs(forced[:, 0] - ref["logits"][:, -1]).max()
    decode_error = np.abs(forced - full_sequence_logits(model, ref, continuations)).max()
    print(f"{impl}: prefill |logits - transformers| {prefill_error:.3g}, decode |logits - full forward| "
          f"{decode_error:.3g}")
    assert prefill_error <= 1e-4 and decode_error <= 1e-4
    assert np.abs(forced).max() > 1.0  # a real comparison, not zeros against zeros


def test_text_only_calls_on_a_vl_model(engines, ref):
    """Without ``images`` a VL model's prompts take the text path (1-row positions, its own bucket): the text-only
    prompt gives transformers' tokens. A prompt holding <|image_pad|> tokens then needs its images."""
    engine = engines("fused")
    prompts, images = fixture_prompts(ref)
    result = engine.generate([prompts[2]], GREEDY)
    np.testing.assert_array_equal(result.completion_ids, np.repeat(ref["greedy_new_tokens"][2:], 2, axis=0))
    assert not engine.buckets_built[-1].vision
    with pytest.raises(ValueError, match=r"prompt 0 holds 12 <\|image_pad\|> tokens \(4098\) but no images were given"):
        engine.generate(prompts[:1], GREEDY)
    with pytest.raises(ValueError, match=r"prompt 1 holds 35 <\|image_pad\|> tokens \(4098\) but no images were given"):
        engine.generate(prompts, GREEDY, images=[images[0], None, None])


def test_prompts_with_other_images_are_not_merged(engines, ref):
    """Identical prompt tokens with other images are other prompts (each gets its own prefill); a prompt's
    samples share one. The images reach the rows they belong to: rows continuing the fixture's image see
    transformers' logits, rows of the other image do not."""
    engine = engines("fused")
    prompts, images = fixture_prompts(ref)
    other = PromptImages(images[0].features[::-1].copy(), images[0].image_grid_thw)
    forced = engine.forced_logits([prompts[0]] * 3, [[]] * 3, images=[other, images[0], other])
    assert np.abs(forced[1][0] - ref["logits"][0, -1]).max() <= 1e-4
    assert np.abs(forced[0][0] - ref["logits"][0, -1]).max() > 1e-3  # 1000x the parity error above
    np.testing.assert_array_equal(forced[0], forced[2])


def test_vl_rollouts_in_chunks(model, ref):
    """More rows than max_batch_size: each chunk prefills its own prompts' images (4 rows, then 2)."""
    engine = build_rollout_engine("native", model, **{**ENGINE, "max_batch_size": 4})
    prompts, images = fixture_prompts(ref)
    result = engine.generate(prompts, GREEDY, images=images)
    np.testing.assert_array_equal(result.completion_ids, np.repeat(ref["greedy_new_tokens"], 2, axis=0))
    assert [(k.prompt_batch, k.batch) for k in engine.buckets_built] == [(2, 4), (1, 2)]


def test_bad_images_are_refused(engines, ref, tiny_model_dir):
    engine = engines("fused")
    prompts, images = fixture_prompts(ref)
    features, grid = images[0].features, images[0].image_grid_thw
    with pytest.raises(ValueError, match="3 prompts but 2 images entries"):
        engine.generate(prompts, GREEDY, images=images[:2])
    with pytest.raises(ValueError, match=r"prompt 0 holds 12 <\|image_pad\|> tokens \(4098\) but its images have 11 "
                                         "feature rows"):
        engine.generate(prompts[:1], GREEDY, images=[PromptImages(features[:11], grid)])
    with pytest.raises(ValueError, match=r"prompt 0: image features must be \[image tokens, hidden_size=128\]"):
        engine.generate(prompts[:1], GREEDY, images=[PromptImages(features[:, :64], grid)])
    with pytest.raises(ValueError, match=r"prompt 0: image_grid_thw \[\[1, 4, 8\]\] makes 8 image tokens but the "
                                         r"prompt holds 12 <\|image_pad\|> tokens"):
        engine.generate(prompts[:1], GREEDY, images=[PromptImages(features, [[1, 4, 8]])])
    with pytest.raises(ValueError, match=r"prompt 0: row 0: image 0 \(grid \[1, 8, 8\]\) needs 16 <\|image_pad\|>"):
        engine.generate(prompts[:1], GREEDY, images=[PromptImages(features, [[1, 8, 8]])])
    text_engine = build_rollout_engine("native", build_model(tiny_model_dir), **ENGINE)
    with pytest.raises(ValueError, match="images need a Qwen2.5-VL actor"):
        text_engine.generate([[1, 2, 3]], GREEDY, images=[images[0]])
    with pytest.raises(NotImplementedError, match="the mindformers rollout backend takes text prompts only"):
        refuse_images([None, images[0]], "mindformers")
    refuse_images([None], "mindformers")  # text prompts are fine
