"""Qwen2.5-VL's multimodal RoPE positions, computed on the host in numpy: what transformers'
``Qwen2_5_VLModel.get_rope_index`` computes for images, and the rule for decode positions.

The language model gives every token three position ids (rows t, h, w; :mod:`mindgrpo.models.qwen2_blocks` rotates
each row's ``mrope_section`` share of the rotary dims by it). Text tokens get the same id in all three rows,
counting up as in plain RoPE. The ``t * h * w`` ``<|image_pad|>`` tokens of an image (its patch grid after the
``spatial_merge_size`` x ``spatial_merge_size`` merge) all get the text position ``p`` where the image starts, plus
their grid coordinates: t + 0 (an image is a single frame), h + row, w + column. The text after the image
continues from ``max + 1``, so an image of ``n`` tokens advances the positions by ``max(grid_h, grid_w)``, not by
``n``. Padding (``attention_mask == 0``) gets position 1, as in transformers.

A row's ``rope_delta`` is its last position + 1 minus its padded length. Decoding continues from it: the token at
index ``c`` of the padded row (its cache position) has position ``c + rope_delta`` in all three rows
(:func:`decode_position_ids`), exactly what transformers' ``generate`` uses with a KV cache.

Only images are supported: a ``<|vision_start|>`` followed by anything but ``<|image_pad|>`` (a video) is an error.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

# transformers fills the position ids of padding with ones
PAD_POSITION = 1


def get_rope_index(input_ids, image_grid_thw=None, attention_mask=None, *, image_token_id: int,
                   vision_start_token_id: int, spatial_merge_size: int) -> Tuple[np.ndarray, np.ndarray]:
    """M-RoPE position ids ``[3, B, L]`` and ``rope_deltas`` ``[B, 1]`` (int64) of token rows ``input_ids [B, L]``.

    ``image_grid_thw [num_images, 3]`` is the vision tower's patch grid of each image, in the order the images
    appear in the batch (row-major: row 0's images first); ``attention_mask [B, L]`` is 1 on real tokens (left or
    right padding; None: every token is real). Every image must appear as ``<|vision_start|>`` followed by its
    ``t * h * w / spatial_merge_size**2`` ``<|image_pad|>`` tokens, and every grid must be used.
    """
    ids = np.asarray(input_ids)
    if ids.ndim != 2:
        raise ValueError(f"input_ids must be [batch, length], got shape {ids.shape}")
    batch, length = ids.shape
    real = np.ones_like(ids, dtype=bool) if attention_mask is None else np.asarray(attention_mask) == 1
    if real.shape != ids.shape:
        raise ValueError(f"attention_mask {real.shape} and input_ids {ids.shape} differ in shape")
    grids = np.zeros((0, 3), np.int64) if image_grid_thw is None else np.asarray(image_grid_thw, np.int64)
    if grids.ndim != 2 or grids.shape[1] != 3:
        raise ValueError(f"image_grid_thw must be [num_images, 3] (t, h, w), got shape {grids.shape}")
    positions = np.full((3, batch, length), PAD_POSITION, np.int64)
    deltas = np.zeros((batch, 1), np.int64)
    used = 0
    for row in range(batch):
        tokens = ids[row][real[row]]
        row_positions, used = _row_positions(tokens, grids, used, image_token_id, vision_start_token_id,
                                             spatial_merge_size, row)
        positions[:, row, real[row]] = row_positions
        last = int(row_positions.max()) if row_positions.size else PAD_POSITION
        deltas[row, 0] = last + 1 - length
    if used != len(grids):
        raise ValueError(f"image_grid_thw has {len(grids)} images but the prompts hold {used} "
                         "(<|vision_start|><|image_pad|>... groups)")
    return positions, deltas


def _row_positions(tokens: np.ndarray, grids: np.ndarray, first_image: int, image_token_id: int,
                   vision_start_token_id: int, merge: int, row: int) -> Tuple[np.ndarray, int]:
    """Positions [3, n] of one row's real tokens, and the index of the next unused image grid."""
    starts = np.flatnonzero(tokens == vision_start_token_id)
    if starts.size and (starts[-1] + 1 >= tokens.size or np.any(tokens[starts + 1] != image_token_id)):
        raise ValueError(f"row {row}: a <|vision_start|> token ({vision_start_token_id}) is not followed by "
                         f"<|image_pad|> ({image_token_id}); only images are supported (no videos)")
    pieces, next_position, text_start, image = [], 0, 0, first_image
    for start in starts:
        if image >= len(grids):
            raise ValueError(f"row {row}: more images in the prompts than image_grid_thw rows ({len(grids)})")
        t, h, w = (int(n) for n in grids[image])
        if h % merge or w % merge:
            raise ValueError(f"image_grid_thw[{image}] = {[t, h, w]}: h and w must be multiples of "
                             f"spatial_merge_size={merge}")
        h, w = h // merge, w // merge
        first = int(start) + 1
        count = t * h * w
        if first + count > tokens.size or np.any(tokens[first:first + count] != image_token_id):
            raise ValueError(f"row {row}: image {image} (grid {list(grids[image])}) needs {count} <|image_pad|> "
                             f"tokens after its <|vision_start|>; the prompt holds fewer")
        text = np.arange(first - text_start) + next_position
        pieces.append(np.stack([text] * 3))
        # every token of the image: the image's start position plus its (frame, row, column) in the merged grid;
        # the frame index is 0 for images (transformers scales it by seconds per frame, which is 0 for images)
        grid_h, grid_w = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        image_start = next_position + first - text_start
        pieces.append(np.stack([np.zeros(count, np.int64), np.tile(grid_h.reshape(-1), t),
                                np.tile(grid_w.reshape(-1), t)]) + image_start)
        next_position = int(pieces[-1].max()) + 1
        text_start = first + count
        image += 1
    pieces.append(np.stack([np.arange(tokens.size - text_start) + next_position] * 3))
    return np.concatenate(pieces, axis=1).astype(np.int64), image


def decode_position_ids(rope_deltas, cache_position: int, length: int = 1) -> np.ndarray:
    """Position ids ``[3, B, length]`` of the tokens at indices ``cache_position .. cache_position + length - 1``
    of the padded rows (decode steps after a prefill of ``cache_position`` tokens): ``index + rope_delta``, the
    same in all three rows (generated text has no grid)."""
    deltas = np.asarray(rope_deltas, np.int64).reshape(-1, 1)
    rows = np.arange(cache_position, cache_position + length, dtype=np.int64)[None, :] + deltas
    return np.broadcast_to(rows, (3,) + rows.shape).copy()
