r"""The VL demo's task: count the coloured squares in a generated picture, answer in `\boxed{}`.

A picture is a 3 x 3 grid of 28-pixel cells on a noisy light background (84 x 84 pixels: 6 x 6 patches of 14, so
9 image tokens after the 2 x 2 merge, one per cell). Between 1 and MAX_SQUARES cells hold a red or blue square,
slightly smaller than its cell and jittered inside it. The answer is the number of squares. Each
image token then sees one cell, so the count is a sum over the image tokens: a task a tiny model learns in minutes,
and one a model without the picture cannot do better than chance at.

Rows are geo3k's parquet format (`images`, `problem` with an `<image>` tag, `answer`), so the data goes through the
same converter (`tools/rlhf_data.py --dataset_type geo3k`) as real geo3k.
"""
from __future__ import annotations

import io
from pathlib import Path
from typing import List, Tuple

import numpy as np

CELL, GRID = 28, 3
SIZE = CELL * GRID  # 84 pixels: smart_resize keeps it (a multiple of 28 within the demo's min/max pixels)
MAX_SQUARES = 4
QUESTION = "<image>How many squares are in the picture? Put the number in \\boxed{}."
NUM_TRAIN = 1024
COLOURS = ((220, 30, 30), (30, 60, 220))  # red or blue squares


def draw(cells: List[int], rng: np.random.Generator) -> bytes:
    """PNG bytes of a picture with squares in the given cells (0..8, row-major)."""
    from PIL import Image

    pixels = rng.integers(235, 256, size=(SIZE, SIZE, 3)).astype(np.uint8)  # noisy light background
    for cell in cells:
        row, col = divmod(cell, GRID)
        side = int(rng.integers(20, 25))
        top = row * CELL + int(rng.integers(1, CELL - side))
        left = col * CELL + int(rng.integers(1, CELL - side))
        pixels[top:top + side, left:left + side] = COLOURS[int(rng.integers(len(COLOURS)))]
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def make_rows(count: int, seed: int) -> List[Tuple[bytes, int]]:
    """`count` (PNG bytes, number of squares) pairs, the numbers uniform in 1..MAX_SQUARES."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(count):
        n = int(rng.integers(1, MAX_SQUARES + 1))
        rows.append((draw(sorted(rng.choice(GRID * GRID, n, replace=False).tolist()), rng), n))
    return rows


def write_parquet(path: Path, rows: List[Tuple[bytes, int]]) -> Path:
    """The rows as a geo3k parquet file (hiyouga/geometry3k's columns)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    image_type = pa.list_(pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    table = pa.table({"images": pa.array([[{"bytes": png, "path": f"{i}.png"}] for i, (png, _) in enumerate(rows)],
                                         type=image_type),
                      "problem": [QUESTION] * len(rows), "answer": [str(n) for _, n in rows]})
    pq.write_table(table, path)
    return path
