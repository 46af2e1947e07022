"""Image preprocessing for Qwen2.5-VL: transformers' `Qwen2VLImageProcessor` in numpy and Pillow.

An image becomes `pixel_values` rows (one per 14x14 patch, each holding 3 channels x 2 frames x 14 x 14 values) and
its `image_grid_thw` (frames, patch rows, patch columns), exactly as the Hugging Face processor makes them, without
importing transformers or torch:

1. `smart_resize`: the nearest size whose sides are multiples of 28 (patch 14 x merge 2) with a pixel count within
   [min_pixels, max_pixels], keeping the aspect ratio;
2. Pillow's resize with the configured filter (bicubic), on the 8-bit RGB image, as transformers calls it;
3. rescale by 1/255 (in float64, then float32), normalise with image_mean/std (float32);
4. the still image repeated to `temporal_patch_size` frames, cut into patches and flattened in the processor's
   order: merge windows (2x2 patches) are contiguous, so the vision tower's patch merger reads neighbours in a row.

The language model sees one `<|image_pad|>` per merged patch: `grid_t * grid_h * grid_w / merge_size**2`.
"""
from __future__ import annotations

import io
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence, Union

import numpy as np

if TYPE_CHECKING:
    from PIL import Image as PILImage

PathLike = Union[str, os.PathLike]
IMAGE_PROCESSOR_FILE = "preprocessor_config.json"
MAX_ASPECT_RATIO = 200  # the processor refuses longer strips: a 1-patch side would lose the image


class ImageError(ValueError):
    """An image that cannot be decoded or preprocessed; the message says why."""


@dataclass(frozen=True)
class ImageProcessorConfig:
    """The settings of `preprocessor_config.json` that shape `pixel_values` (defaults: Qwen2.5-VL's)."""
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    image_mean: tuple[float, ...] = (0.48145466, 0.4578275, 0.40821073)  # OpenAI CLIP's
    image_std: tuple[float, ...] = (0.26862954, 0.26130258, 0.27577711)
    rescale_factor: float = 1 / 255
    resample: int = 3  # PIL.Image.Resampling.BICUBIC
    do_resize: bool = True
    do_rescale: bool = True
    do_normalize: bool = True
    do_convert_rgb: bool = True

    @property
    def factor(self) -> int:
        """Both resized sides are multiples of this: one merge window of patches."""
        return self.patch_size * self.merge_size

    @classmethod
    def from_pretrained(cls, folder: PathLike) -> "ImageProcessorConfig":
        """Read `preprocessor_config.json` from a model folder. As in transformers, top-level `min_pixels` and
        `max_pixels` override `size.shortest_edge` / `size.longest_edge`."""
        path = Path(folder) / IMAGE_PROCESSOR_FILE
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ImageError(f"{path} not found: a Qwen2.5-VL model folder ships its image processor settings "
                             "there") from None
        except json.JSONDecodeError as err:
            raise ImageError(f"{path}:{err.lineno}: invalid JSON ({err.msg})") from err
        size = raw.get("size") or {}
        values = {"min_pixels": raw.get("min_pixels", size.get("shortest_edge")),
                  "max_pixels": raw.get("max_pixels", size.get("longest_edge"))}
        for key in ("patch_size", "temporal_patch_size", "merge_size", "rescale_factor", "resample", "do_resize",
                    "do_rescale", "do_normalize", "do_convert_rgb"):
            values[key] = raw.get(key)
        for key in ("image_mean", "image_std"):
            values[key] = tuple(raw[key]) if raw.get(key) is not None else None
        config = cls(**{k: v for k, v in values.items() if v is not None})
        if not 0 < config.min_pixels <= config.max_pixels:
            raise ImageError(f"{path}: need 0 < min_pixels <= max_pixels, got {config.min_pixels} and "
                             f"{config.max_pixels}")
        return config


def smart_resize(height: int, width: int, factor: int = 28, min_pixels: int = 56 * 56,
                 max_pixels: int = 28 * 28 * 1280) -> tuple[int, int]:
    """(height, width) rounded to multiples of `factor`, scaled to hold between min_pixels and max_pixels, the aspect
    ratio kept as closely as possible (transformers' `smart_resize`, Python's round-half-to-even included)."""
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ImageError(f"image is {width}x{height}: the aspect ratio must be below {MAX_ASPECT_RATIO}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def decode_image(data: bytes) -> "PILImage.Image":
    """A PIL image from encoded bytes (PNG, JPEG, ...), fully decoded now so a truncated file fails here."""
    from PIL import Image, UnidentifiedImageError

    if not isinstance(data, (bytes, bytearray)) or not data:
        raise ImageError(f"image bytes are {'empty' if data is not None else 'missing'}")
    try:
        image = Image.open(io.BytesIO(bytes(data)))
        image.load()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as err:
        raise ImageError(f"cannot decode image ({err})") from None
    return image


def image_grid_thw(height: int, width: int, config: ImageProcessorConfig) -> tuple[int, int, int]:
    """(grid_t, grid_h, grid_w) of a still image of this size: one frame group, patches per column and row."""
    if config.do_resize:
        height, width = smart_resize(height, width, config.factor, config.min_pixels, config.max_pixels)
    elif height % config.factor or width % config.factor:
        raise ImageError(f"image is {width}x{height}; without resizing both sides must be multiples of "
                         f"{config.factor}")
    return 1, height // config.patch_size, width // config.patch_size


def image_token_count(grid_thw: Sequence[int], merge_size: int = 2) -> int:
    """`<|image_pad|>` tokens the language model reserves for an image: one per merged (merge x merge) patch."""
    t, h, w = (int(x) for x in grid_thw)
    return t * h * w // (merge_size * merge_size)


def preprocess_image(image: "PILImage.Image", config: ImageProcessorConfig) -> tuple[np.ndarray, tuple[int, int, int]]:
    """`pixel_values` [grid_t * grid_h * grid_w, channels * temporal_patch_size * patch_size**2] (float32) and
    `image_grid_thw` of one image, equal to `Qwen2VLImageProcessor`'s."""
    from PIL import Image

    if config.do_convert_rgb and image.mode != "RGB":
        image = image.convert("RGB")  # what transformers' convert_to_rgb does (alpha dropped, not composited)
    grid_t, grid_h, grid_w = image_grid_thw(image.height, image.width, config)
    height, width = grid_h * config.patch_size, grid_w * config.patch_size
    if config.do_resize:
        # transformers resizes the 8-bit image with Pillow (reducing_gap None), so the rounding to uint8 is part of
        # the reference: resizing floats instead would differ by up to half a grey level.
        image = image.resize((width, height), resample=Image.Resampling(config.resample), reducing_gap=None)
    pixels = np.asarray(image)
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    if config.do_rescale:
        pixels = (pixels.astype(np.float64) * config.rescale_factor).astype(np.float32)
    if config.do_normalize:
        pixels = pixels.astype(np.float32)
        pixels = (pixels - np.asarray(config.image_mean, np.float32)) / np.asarray(config.image_std, np.float32)
    frames = np.repeat(pixels.astype(np.float32).transpose(2, 0, 1)[None], config.temporal_patch_size * grid_t, 0)
    p, m, c = config.patch_size, config.merge_size, frames.shape[1]
    patches = frames.reshape(grid_t, config.temporal_patch_size, c, grid_h // m, m, p, grid_w // m, m, p)
    # -> (t, merge row, merge column, row in window, column in window, channel, frame, y, x): the processor's order
    patches = patches.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return (np.ascontiguousarray(patches.reshape(grid_t * grid_h * grid_w, c * config.temporal_patch_size * p * p)),
            (grid_t, grid_h, grid_w))


def preprocess_images(images: Sequence["PILImage.Image"],
                      config: ImageProcessorConfig) -> tuple[np.ndarray, np.ndarray]:
    """`pixel_values` of several images concatenated along the patches, and `image_grid_thw` [num_images, 3]
    (int64), as `Qwen2VLImageProcessor(images=...)` returns them."""
    if not images:
        raise ImageError("no images to preprocess")
    results = [preprocess_image(image, config) for image in images]
    return (np.concatenate([patches for patches, _ in results]),
            np.asarray([grid for _, grid in results], dtype=np.int64))
