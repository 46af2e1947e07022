"""Qwen2.5-VL image preprocessing (mindgrpo.data.images) against transformers' Qwen2VLImageProcessor: the fixture's
reference `pixel_values` / `image_grid_thw`, and the processor itself on images that exercise every resize branch."""
import io

import numpy as np
import pytest

from mindgrpo.data.images import (ImageError, ImageProcessorConfig, decode_image, image_grid_thw, image_token_count,
                                  preprocess_image, preprocess_images, smart_resize)

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402


def test_fixture_pixel_values(vl_dir):
    ref = np.load(vl_dir / "reference.npz")
    config = ImageProcessorConfig.from_pretrained(vl_dir)
    assert (config.min_pixels, config.max_pixels) == (3136, 50176)
    images = [decode_image((vl_dir / f"image_{i}.png").read_bytes()) for i in range(2)]
    pixel_values, grid = preprocess_images(images, config)
    np.testing.assert_array_equal(grid, ref["image_grid_thw"])
    assert pixel_values.shape == ref["pixel_values"].shape and pixel_values.dtype == np.float32
    err = float(np.abs(pixel_values - ref["pixel_values"]).max())
    print(f"pixel_values max abs error vs the fixture: {err:.3g}")
    assert err <= 1e-5
    assert [image_token_count(g, config.merge_size) for g in grid] == [12, 35]  # the fixture's reference_texts


def _random_image(width, height, mode, seed):
    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    pixels = rng.integers(0, 256, size=(height, width, channels), dtype=np.uint8)
    return Image.fromarray(pixels[:, :, 0] if channels == 1 else pixels, mode)


@pytest.mark.parametrize("width,height,mode", [
    (200, 150, "RGB"),   # rounded to 196x140: a slight bicubic resize
    (640, 480, "RGB"),   # above max_pixels: downscaled
    (30, 20, "RGB"),     # below min_pixels: upscaled
    (333, 97, "RGBA"),   # alpha dropped as transformers' convert_to_rgb does
    (120, 260, "L"),     # grey, portrait
])
def test_matches_transformers_processor(vl_dir, width, height, mode):
    transformers = pytest.importorskip("transformers")
    processor = transformers.Qwen2VLImageProcessor.from_pretrained(vl_dir)
    config = ImageProcessorConfig.from_pretrained(vl_dir)
    image = _random_image(width, height, mode, seed=width)
    ref = processor(images=[image], return_tensors="np")
    pixel_values, grid = preprocess_image(image, config)
    assert list(grid) == ref["image_grid_thw"][0].tolist()
    assert grid == image_grid_thw(height, width, config)
    np.testing.assert_allclose(pixel_values, ref["pixel_values"], rtol=0, atol=1e-5)


def test_smart_resize_bounds():
    for height, width in [(84, 112), (150, 200), (1080, 1920), (20, 30), (7, 900)]:
        h, w = smart_resize(height, width, 28, 3136, 50176)
        assert h % 28 == 0 and w % 28 == 0 and 3136 <= h * w <= 50176, (height, width, h, w)
    assert smart_resize(84, 112, 28, 3136, 50176) == (84, 112)  # already a multiple: kept
    assert smart_resize(3000, 28, 28, 3136, 50176) == (2296, 28)  # a side never drops below one window
    with pytest.raises(ImageError, match="aspect ratio"):
        smart_resize(10, 2100)


def test_smart_resize_matches_transformers():
    pytest.importorskip("transformers")
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize as reference

    rng = np.random.default_rng(0)
    for height, width in rng.integers(8, 4000, size=(300, 2)):
        if max(height, width) / min(height, width) <= 200:
            assert smart_resize(int(height), int(width), 28, 3136, 50176) == reference(
                int(height), int(width), 28, 3136, 50176)


def test_decode_errors():
    with pytest.raises(ImageError, match="cannot decode"):
        decode_image(b"\x89PNG\r\n\x1a\n not really a png")
    buf = io.BytesIO()
    _random_image(64, 64, "RGB", 0).save(buf, format="PNG")
    with pytest.raises(ImageError, match="cannot decode"):
        decode_image(buf.getvalue()[:60])  # truncated: the header parses, the pixels do not
    with pytest.raises(ImageError, match="empty"):
        decode_image(b"")


def test_config_errors(tmp_path):
    with pytest.raises(ImageError, match="preprocessor_config.json not found"):
        ImageProcessorConfig.from_pretrained(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text('{"min_pixels": 10, "max_pixels": 5}')
    with pytest.raises(ImageError, match="min_pixels <= max_pixels"):
        ImageProcessorConfig.from_pretrained(tmp_path)
