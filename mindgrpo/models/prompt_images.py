"""The vision side of a Qwen2.5-VL model: its frozen vision tower, run once per prompt, and what the rollout and the
forwards then read of it.

A :class:`~mindgrpo.models.qwen2.Qwen2Model` built from a Qwen2.5-VL folder holds a :class:`PromptVision` (its
``vision``). A GRPO step's ``B`` prompts are sampled ``num_generations`` times and scored three times (reference,
old policy, update), but an image's features do not depend on the completions, and with
``actor_config.freeze_vision_tower`` not on the update either: :class:`PromptVision` embeds each prompt's images
once (``Qwen2_5VisionTower.embed_images``) into a :class:`PromptImages`, which the rollout engine prefills once per
prompt and :class:`VisionBatch` hands to every forward of the step. The actor and the reference read the same
features: the reference holds no tower of its own. A chat embeds each picture once, on the message that brings it.

:class:`VisionBatch` holds, for the step's prompts left-padded to width ``P``, their M-RoPE positions and
``rope_delta`` (:func:`~mindgrpo.models.mrope.get_rope_index`); :meth:`VisionBatch.forward_inputs` makes the extra
inputs of a shared-prompt or packed forward over any selection of those prompts (a micro-batch's prompts, or a
packed forward's slots, where a prompt may repeat). The feature input always has as many rows as the selected
prompts have token slots (``S x P``), real features first, so its shape never depends on the images' sizes and
GRAPH mode compiles each forward once per prompt width, as for text.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np

from mindgrpo.data.dataset import PromptImagePixels
from mindgrpo.hf_config import Qwen2Spec
from mindgrpo.models.image_tokens import image_source_rows
from mindgrpo.models.mrope import get_rope_index
from mindgrpo.models.vision import Qwen2_5VisionTower


@dataclass(frozen=True, eq=False)
class PromptImages:
    """The images of one Qwen2.5-VL prompt, as its language model reads them. The caller runs the vision tower once
    per prompt (:meth:`PromptVision.embed`), not once per sample: the rollout engine prefills the prompt once and
    every one of its ``num_generations`` samples continues that prefill.

    The prompt holds each image as ``<|vision_start|>`` followed by one ``<|image_pad|>`` per merged patch; the
    engine puts the feature rows in place of those tokens, in order, and computes the M-RoPE positions from
    ``image_grid_thw`` (:func:`mindgrpo.models.mrope.get_rope_index`). Compared by identity (``eq=False``): a
    prompt's samples share one object."""
    features: np.ndarray
    """float [image tokens, hidden]: the vision tower's merged features of the prompt's images, in their order."""
    image_grid_thw: np.ndarray
    """int [images, 3]: each image's (t, h, w) patch grid, as the image processor gives it."""


class PromptVision:
    """The frozen vision tower of a Qwen2.5-VL model and the image token ids of its language model (``spec``)."""

    def __init__(self, tower: Qwen2_5VisionTower, spec: Qwen2Spec):
        tower.set_train(False)  # never trained (actor_config.freeze_vision_tower): no gradient, no optimizer state
        for param in tower.get_parameters():
            param.requires_grad = False
        self.tower = tower
        self.image_token_id, self.vision_start_token_id = spec.image_token_id, spec.vision_start_token_id
        self.merge, self.hidden_size = spec.spatial_merge_size, spec.hidden_size
        self.prompts_embedded = 0
        """Prompts whose images went through the tower so far (the benchmark checks: once per prompt per step)."""
        self.seconds = 0.0
        """Time spent in the tower so far."""

    def embed(self, images: Sequence[Optional[PromptImagePixels]]) -> List[Optional[PromptImages]]:
        """Each prompt's merged image features (None for a prompt without images), one tower call per prompt."""
        start = time.perf_counter()
        out: List[Optional[PromptImages]] = []
        for pixels in images:
            if pixels is None:
                out.append(None)
                continue
            features = self.tower.embed_images(pixels.pixel_values, pixels.image_grid_thw,
                                               pad_to=patch_bucket(len(pixels.pixel_values)))
            out.append(PromptImages(features.asnumpy().astype(np.float32), np.asarray(pixels.image_grid_thw)))
            self.prompts_embedded += 1
        self.seconds += time.perf_counter() - start
        return out

    def precompile(self, patch_counts: Sequence[int]) -> None:
        """Compile the tower for the patch buckets of these images (each once, on zero pixels)."""
        spec = self.tower.spec
        for bucket in sorted({patch_bucket(int(n)) for n in patch_counts}, reverse=True):
            grid = np.array([[1, spec.spatial_merge_size, bucket // spec.spatial_merge_size]], np.int64)
            self.tower.embed_images(np.zeros((bucket, spec.patch_features), np.float32), grid, pad_to=bucket)

    def batch(self, prompt_ids: np.ndarray, prompt_mask: np.ndarray,
              images: Sequence[Optional[PromptImages]]) -> "VisionBatch":
        """The :class:`VisionBatch` of a step's prompts ``[B, P]`` (left-padded) and their images."""
        grids = [entry.image_grid_thw for entry in images if entry is not None]
        positions, deltas = get_rope_index(
            prompt_ids, np.concatenate(grids) if grids else None, prompt_mask, image_token_id=self.image_token_id,
            vision_start_token_id=self.vision_start_token_id, spatial_merge_size=self.merge)
        features = [np.zeros((0, self.hidden_size), np.float32) if entry is None else entry.features
                    for entry in images]
        return VisionBatch(positions.astype(np.int32), deltas.reshape(-1).astype(np.int32), features,
                           self.image_token_id)

    def dummy_images(self, prompts: np.ndarray) -> List[PromptImages]:
        """Give each dummy prompt ``[count, width]`` (in place) one image of one merged patch, zero features, and
        return their :class:`PromptImages`: what precompiling the VL graphs of a width needs."""
        prompts[:, 0], prompts[:, 1] = self.vision_start_token_id, self.image_token_id
        grid = np.array([[1, self.merge, self.merge]], np.int64)
        return [PromptImages(np.zeros((1, self.hidden_size), np.float32), grid) for _ in range(len(prompts))]


def patch_bucket(patches: int) -> int:
    """The tower's compiled patch count for an image batch of ``patches``: the next power of two, at least 64, so
    images of many sizes (geo3k's diagrams) share a few graphs; padded patches attend only to each other."""
    return max(64, 1 << (int(patches) - 1).bit_length())


@dataclass(frozen=True)
class VisionBatch:
    """A step's Qwen2.5-VL prompts as the training forwards read them (prompt-major, like ``RolloutBatch``)."""
    positions: np.ndarray       # int32 [3, B, P]: M-RoPE positions of the left-padded prompts
    rope_deltas: np.ndarray     # int32 [B]: completion token t sits at position P + rope_delta + t
    features: List[np.ndarray]  # per prompt float32 [its image tokens, hidden] (0 rows without images)
    image_token_id: int

    def rows(self, prompts: slice) -> "VisionBatch":
        """The prompts ``prompts`` of the batch (one step's share of a generation)."""
        return VisionBatch(self.positions[:, prompts], self.rope_deltas[prompts], self.features[prompts],
                           self.image_token_id)

    def completion_starts(self, width: int) -> np.ndarray:
        """int [B]: the position of each prompt's first completion token (prompts padded to ``width``)."""
        return width + self.rope_deltas.astype(np.int64)

    def forward_inputs(self, prompts: np.ndarray, prompt_ids: np.ndarray, *, with_deltas: bool) -> dict:
        """The vision inputs of a forward over the prompts ``prompts`` (indices into the batch, repeats allowed),
        whose token rows are ``prompt_ids [S, P]``, by their names in the pass (:mod:`mindgrpo.train.step_batch`):
        M-RoPE ``prompt_positions [3, S, P]``, (the shared-prompt forward's) ``rope_deltas [S]``,
        ``image_features [S * P, hidden]`` (real rows first) and ``image_rows [S * P]``."""
        s, p = prompt_ids.shape
        real = np.concatenate([self.features[i] for i in prompts])
        features = np.zeros((s * p, real.shape[1]), np.float32)
        features[:len(real)] = real
        rows = image_source_rows(prompt_ids, self.image_token_id, len(real))
        deltas = {"rope_deltas": self.rope_deltas[prompts]} if with_deltas else {}
        return {"prompt_positions": np.ascontiguousarray(self.positions[:, prompts]), **deltas,
                "image_features": features, "image_rows": rows}
