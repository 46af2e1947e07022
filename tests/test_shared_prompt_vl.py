"""The shared-prompt and packed forwards with Qwen2.5-VL prompts (tests/fixtures/make_qwen_vl.py): each distinct
prompt once, its image features merged at its <|image_pad|> tokens and its 3-row M-RoPE positions, the completions
at 1-row positions continuing from the prompt's rope_delta. Their completion log-probs and the gradient with respect
to the image features equal those of FullSequenceForward (checked against transformers in tests/test_mrope.py) over
every [prompt | completion] row, in PyNative and GRAPH mode."""
import numpy as np
import pytest

import mindgrpo  # noqa: F401  (before mindspore)
import mindspore as ms
from mindspore import Tensor, nn, ops

from mindgrpo.algorithm import token_logprobs
from mindgrpo.models import PackedPromptForward, SharedPromptForward, build_model
from mindgrpo.models.full_sequence import FullSequenceForward
from mindgrpo.models.image_tokens import image_source_rows
from mindgrpo.models.mrope import decode_position_ids, get_rope_index
from mindgrpo.train.packing import micro_batches
from mindgrpo.train.rollout_batch import RolloutBatch

MAX_POSITIONS = 128
G, T = 3, 6  # num_generations, completion width
PAD = 4093


@pytest.fixture(scope="module")
def ref(vl_reference):
    return vl_reference


@pytest.fixture(scope="module")
def model(vl_dir):
    return build_model(vl_dir)


def _i32(array):
    return Tensor(np.asarray(array, dtype=np.int32))


def prompts(model, ref):
    """The fixture's three prompts (image 0, image 1, text only; left-padded) with their M-RoPE positions, rope
    deltas and image feature rows."""
    spec = model.spec
    positions, deltas = get_rope_index(ref["input_ids"], ref["image_grid_thw"], ref["attention_mask"],
                                       image_token_id=spec.image_token_id,
                                       vision_start_token_id=spec.vision_start_token_id,
                                       spatial_merge_size=spec.spatial_merge_size)
    rows = image_source_rows(ref["input_ids"], spec.image_token_id, len(ref["image_embeds"]))
    return positions, deltas, rows


def completions(lengths, seed: int = 0):
    """Synthetic text completions of the given lengths (prompt-major, G per prompt, ids below the special tokens),
    right-padded to T."""
    rng = np.random.default_rng(seed)
    mask = (np.arange(T) < np.asarray(lengths)[:, None]).astype(np.int32)
    ids = np.where(mask > 0, rng.integers(0, 4000, mask.shape), PAD).astype(np.int32)
    return ids, mask


RAGGED = [T, 4, T] * 3  # completion 1 stops early


def feature_copies(model, ref, prompts_in_order):
    """Rows of the fixture's image_embeds read by the prompts in this order (a prompt's image features each time it
    appears): the features of a batch in which prompts repeat."""
    first, ranges = 0, []
    for row in ref["input_ids"]:
        count = int((row == model.spec.image_token_id).sum())
        ranges.append(np.arange(first, first + count))
        first += count
    return np.concatenate([ranges[i] for i in prompts_in_order]).astype(np.int32)


def full_rows(model, ref, completion_ids, completion_mask):
    """The unshared reference inputs: every prompt repeated G times before each of its completions, decode
    positions continuing from its rope_delta, and which fixture feature row each repeated image token reads
    (images repeat with their prompts, so the gradient of a feature sums over its copies)."""
    positions, deltas, _ = prompts(model, ref)
    num_prompts, length = ref["input_ids"].shape
    ids = np.concatenate([np.repeat(ref["input_ids"], G, 0), completion_ids], 1)
    mask = np.concatenate([np.repeat(ref["attention_mask"], G, 0), completion_mask], 1)
    full_positions = np.concatenate([np.repeat(positions, G, 1),
                                     decode_position_ids(np.repeat(deltas, G, 0), length, T)], 2)
    copies = feature_copies(model, ref, np.repeat(np.arange(num_prompts), G))
    rows = image_source_rows(ids, model.spec.image_token_id, len(copies))
    return ids, mask, full_positions, copies, rows


def full_sequence(model, ref, completion_ids, completion_mask, weights):
    """(log-probs [N, T], gradient of sum(log-probs * weights) w.r.t. the fixture's image features) of
    FullSequenceForward over the unshared rows."""
    ids, mask, positions, copies, rows = full_rows(model, ref, completion_ids, completion_mask)
    full = ms.value_and_grad(FullLoss(model, ref["input_ids"].shape[1], copies), 3, has_aux=True)
    (_, logprobs), grad = full(_i32(ids), _i32(mask), _i32(positions), Tensor(ref["image_embeds"]), _i32(rows),
                               _i32(completion_ids), Tensor(weights))
    return logprobs.asnumpy(), grad.asnumpy()


def assert_parity(logprobs, grad, expected_logprobs, expected_grad, completion_mask):
    """Real completion tokens' log-probs within 1e-5, image feature gradients within 1e-5 relative."""
    real = completion_mask.astype(bool)
    error = np.abs(logprobs - expected_logprobs)[real].max()
    assert error <= 1e-5, f"max |log-prob - full-sequence log-prob| = {error:.3g}"
    assert np.abs(expected_logprobs[real]).max() > 1.0  # a real comparison
    scale = np.abs(expected_grad).max()
    assert scale > 0 and np.all(np.abs(expected_grad).max(1) > 0)  # every image token's feature has a gradient
    error = np.abs(grad - expected_grad).max() / scale
    assert error <= 1e-5, f"image feature gradient: max |error| / max |full-sequence| = {error:.3g}"


class SharedLoss(nn.Cell):
    def __init__(self, model):
        super().__init__(auto_prefix=False)
        self.forward = SharedPromptForward(model, G, MAX_POSITIONS)

    def construct(self, prompt_ids, prompt_mask, completion_ids, positions, deltas, features, rows, weights):
        logprobs = token_logprobs(self.forward(prompt_ids, prompt_mask, completion_ids, positions, deltas, features,
                                               rows), completion_ids)
        return (logprobs * weights).sum(), logprobs


class FullLoss(nn.Cell):
    def __init__(self, model, prompt_length: int, copies):
        super().__init__(auto_prefix=False)
        self.forward = FullSequenceForward(model, MAX_POSITIONS)
        self.start = prompt_length - 1
        self.copies = _i32(copies)

    def construct(self, ids, mask, positions, features, rows, completion_ids, weights):
        logits = self.forward(ids, mask, positions, ops.gather(features, self.copies, 0), rows)
        logprobs = token_logprobs(logits[:, self.start:self.start + completion_ids.shape[1]], completion_ids)
        return (logprobs * weights).sum(), logprobs


def test_logprobs_and_image_gradients_equal_the_full_sequence_forward(model, ref, ms_mode):
    """Three prompts (two images, one text only) with three completions each, one stopping early."""
    positions, deltas, rows = prompts(model, ref)
    completion_ids, completion_mask = completions(RAGGED)
    weights = (np.random.default_rng(1).standard_normal(completion_ids.shape) * completion_mask).astype(np.float32)
    # grad_position 5: the image features; has_aux: the log-probs ride along
    shared = ms.value_and_grad(SharedLoss(model), 5, has_aux=True)
    (_, logprobs), grad = shared(_i32(ref["input_ids"]), _i32(ref["attention_mask"]), _i32(completion_ids),
                                 _i32(positions), _i32(deltas), Tensor(ref["image_embeds"]), _i32(rows),
                                 Tensor(weights))
    assert_parity(logprobs.asnumpy(), grad.asnumpy(),
                  *full_sequence(model, ref, completion_ids, completion_mask, weights), completion_mask)


class PackedLoss(nn.Cell):
    """sum(log-probs * weights) over the packed rows; the slots' image features are gathered from the fixture's
    (``copies``) so their gradient lands on them."""

    def __init__(self, model):
        super().__init__(auto_prefix=False)
        self.forward = PackedPromptForward(model, MAX_POSITIONS)

    def construct(self, prompt_ids, prompt_mask, completion_ids, positions, segments, row_prompt, source,
                  prompt_positions, features, copies, image_rows, weights):
        logits = self.forward(prompt_ids, prompt_mask, completion_ids, positions, segments, row_prompt, source,
                              prompt_positions, ops.gather(features, copies, 0), image_rows)
        logprobs = token_logprobs(logits, completion_ids)
        return (logprobs * weights).sum(), logprobs


def test_packed_logprobs_and_image_gradients_equal_the_full_sequence_forward(model, ref, ms_mode):
    """Three packed rows per forward (two completions share a row, one is empty) in three prompt slots: the first
    forward's slots hold both image prompts (and a spare), the second's an image prompt and the text one. The host
    shifts the packer's text positions (prompt length + t) to the prompt's rope_delta (P + rope_delta + t)."""
    positions, deltas, _ = prompts(model, ref)
    completion_ids, completion_mask = completions([T, 2, 3, T, 5, 0, 4, 2, T])
    weights = (np.random.default_rng(1).standard_normal(completion_ids.shape) * completion_mask).astype(np.float32)
    rollouts = RolloutBatch(ref["input_ids"].astype(np.int32), ref["attention_mask"].astype(np.int32),
                            completion_ids, completion_mask)
    shift = ref["input_ids"].shape[1] + deltas[:, 0] - rollouts.prompt_mask.sum(1)
    loss = ms.value_and_grad(PackedLoss(model), 8, has_aux=True)
    features = Tensor(ref["image_embeds"])
    logprobs, grad = np.zeros(completion_ids.shape, np.float32), np.zeros(features.shape, np.float32)
    for batch, expected_slots in zip(micro_batches(rollouts, 3, G), ([0, 1, 0], [1, 2, 1]), strict=True):
        slots = batch.prompts
        np.testing.assert_array_equal(slots, expected_slots)
        row_prompts = slots[batch.row_prompt]
        vl_positions = batch.positions + shift[row_prompts][:, None] * (batch.segments > 0)
        loss_rows, tokens = np.nonzero(batch.mask)
        packed_weights = np.zeros(batch.completion_ids.size, np.float32)
        packed_weights[batch.unpack[loss_rows, tokens]] = weights[batch.completions[loss_rows], tokens]
        copies = feature_copies(model, ref, slots)
        image_rows = image_source_rows(rollouts.prompt_ids[slots], model.spec.image_token_id, len(copies))
        (_, packed), batch_grad = loss(
            _i32(rollouts.prompt_ids[slots]), _i32(rollouts.prompt_mask[slots]), _i32(batch.completion_ids),
            _i32(vl_positions), _i32(batch.segments), _i32(batch.row_prompt), _i32(batch.source),
            _i32(positions[:, slots]), features, _i32(copies), _i32(image_rows),
            Tensor(packed_weights.reshape(batch.completion_ids.shape)))
        logprobs[batch.completions[loss_rows], tokens] = packed.asnumpy().reshape(-1)[batch.unpack[loss_rows, tokens]]
        grad += batch_grad.asnumpy()
    assert_parity(logprobs, grad, *full_sequence(model, ref, completion_ids, completion_mask, weights),
                  completion_mask)


def test_positions_and_features_matter(model, ref):
    """Guards against a parity that holds by accident: text positions (cumsum of the mask) or no image features
    change the log-probs of the image prompts, and leave the text-only prompt's (row 2) where they were."""
    positions, deltas, rows = prompts(model, ref)
    completion_ids, _ = completions([T] * 3 * G, seed=2)
    forward = SharedPromptForward(model, G, MAX_POSITIONS)
    inputs = (_i32(ref["input_ids"]), _i32(ref["attention_mask"]), _i32(completion_ids))
    targets = _i32(completion_ids)
    vl = token_logprobs(forward(*inputs, _i32(positions), _i32(deltas), Tensor(ref["image_embeds"]),
                                _i32(rows)), targets).asnumpy()
    text = token_logprobs(forward(*inputs), targets).asnumpy()
    no_image = token_logprobs(forward(*inputs, _i32(positions), _i32(deltas)), targets).asnumpy()
    for other in (text, no_image):
        assert np.abs(other[:2 * G] - vl[:2 * G]).max() > 1e-2
        np.testing.assert_allclose(other[2 * G:], vl[2 * G:], rtol=0, atol=1e-5)
