"""Image features in place of the ``<|image_pad|>`` tokens: Qwen2.5-VL's language model reads the vision tower's
merged features [num_image_tokens, hidden] where the prompt holds ``<|image_pad|>`` placeholders (transformers'
``inputs_embeds.masked_scatter(image_mask, image_embeds)``).

Which row reads what is decided on the host (:func:`image_source_rows`), so the graph has static shapes and no
data-dependent scatter: :func:`merge_image_features` stacks the token embeddings on top of the image features and
gathers one source row per token. Gather's gradient flows to both sources, so a trainable vision tower (and the
embedding table) get their gradients.
"""
from __future__ import annotations

import numpy as np

from mindspore import ops


def image_source_rows(input_ids, image_token_id: int, num_features: int) -> np.ndarray:
    """int32 [B * L]: for every token of ``input_ids [B, L]`` (flattened row-major) the row of
    ``concat(token_embeddings [B * L, H], image_features)`` it reads: itself, or for the ``k``-th ``<|image_pad|>``
    token of the batch the ``k``-th image feature row (images in batch order, as the vision tower emits them).
    ``num_features`` is how many real feature rows there are; the features tensor may carry padding rows after
    them (a static bucket), which no token reads."""
    flat = np.asarray(input_ids).reshape(-1)
    is_image = flat == image_token_id
    count = int(is_image.sum())
    if count != num_features:
        raise ValueError(f"the prompts hold {count} <|image_pad|> tokens ({image_token_id}) but the vision tower gave "
                         f"{num_features} feature rows; each image needs one token per merged patch "
                         "(t * h * w / spatial_merge_size**2)")
    rows = np.arange(flat.size, dtype=np.int32)
    rows[is_image] = flat.size + np.arange(count, dtype=np.int32)
    return rows


def merge_image_features(token_embeds, image_features, source_rows):
    """Token embeddings [B * L, H] with the ``<|image_pad|>`` rows replaced by image features [N, H] (same dtype),
    as :func:`image_source_rows` maps them."""
    return ops.gather(ops.concat((token_embeds, image_features), 0), source_rows, 0)
