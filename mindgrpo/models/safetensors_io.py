"""Minimal safetensors reader/writer in numpy, one tensor at a time, with bfloat16 support.

Why not ``safetensors.numpy``: numpy has no bfloat16, so its loader refuses the format most Qwen2.5 checkpoints
are stored in, and its writer needs every array in memory at once. The format is simple (8-byte little-endian
header length, a JSON header of dtype/shape/byte offsets, then raw little-endian data), so we read each tensor
straight into a numpy array of its storage type and widen it, and we stream tensors to disk while writing.
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Tuple, Union

import numpy as np

PathLike = Union[str, Path]

# safetensors dtype code -> numpy storage dtype (bfloat16 is stored as its 16 raw bits)
_STORAGE = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
            "I8": "i1", "U8": "u1", "BOOL": "?"}
_CODE = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
_MAX_HEADER = 100 << 20  # the reference implementation's own limit; guards against reading a random file


class SafetensorsError(ValueError):
    """A .safetensors file is malformed or holds a tensor we cannot use; the message names the file."""


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """Widen raw bfloat16 bits (uint16) to float32 exactly: bf16 is the top half of an f32."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 bits, nearest-even (what torch's ``.to(torch.bfloat16)`` does); NaN stays NaN."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    rounded[np.isnan(values)] = 0x7FC0
    return rounded


class SafetensorsReader:
    """Header of one file plus on-demand reads of single tensors as float32 (or their integer type)."""

    def __init__(self, path: PathLike):
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"{self.path} not found")
        size = self.path.stat().st_size
        with open(self.path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise SafetensorsError(f"{self.path}: file too short ({size} bytes) to be safetensors")
            (length,) = struct.unpack("<Q", head)
            if length > min(size - 8, _MAX_HEADER):
                raise SafetensorsError(f"{self.path}: header length {length} does not fit a {size}-byte file; "
                                       "the file is truncated or not safetensors")
            try:
                header = json.loads(f.read(length))
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                raise SafetensorsError(f"{self.path}: unreadable JSON header ({err})") from err
        self._data_start = 8 + length
        self.metadata = header.pop("__metadata__", None) or {}
        self._entries: Dict[str, dict] = header
        for name, entry in header.items():
            self._check_entry(name, entry, size)

    def _check_entry(self, name: str, entry: dict, size: int) -> None:
        dtype = entry.get("dtype")
        if dtype not in _STORAGE:
            raise SafetensorsError(f"{self.path}: tensor {name!r} has dtype {dtype!r}, which mindgrpo cannot read")
        begin, end = entry["data_offsets"]
        expected = int(np.prod(entry["shape"], dtype=np.int64)) * np.dtype(_STORAGE[dtype]).itemsize
        if end - begin != expected or begin < 0 or self._data_start + end > size:
            raise SafetensorsError(f"{self.path}: tensor {name!r} (shape {entry['shape']}, {dtype}) has byte range "
                                   f"[{begin}, {end}) that does not match its size or the file; the file is damaged")

    def keys(self) -> List[str]:
        return list(self._entries)

    def shape(self, name: str) -> Tuple[int, ...]:
        return tuple(self._entries[name]["shape"])

    def dtype(self, name: str) -> str:
        return self._entries[name]["dtype"]

    def read(self, name: str, part=None) -> np.ndarray:
        """A fresh (writable, not file-backed) array: float32 for float tensors, the stored type otherwise.

        ``part`` (a :class:`~mindgrpo.parallel.layout.Shard`) reads only that slice of the tensor, through a
        memory map, so a tensor-parallel rank never holds a full tensor it does not need (as
        ``safe_open(...).get_slice`` does)."""
        entry = self._entries[name]
        begin, end = entry["data_offsets"]
        if part is not None:
            mapped = np.memmap(self.path, dtype=_STORAGE[entry["dtype"]], mode="r", offset=self._data_start + begin,
                               shape=tuple(entry["shape"]))
            stored = np.array(part.take(mapped))  # copies only the slice's bytes out of the map
            del mapped
        else:
            stored = np.empty(entry["shape"], dtype=_STORAGE[entry["dtype"]])
            with open(self.path, "rb") as f:
                f.seek(self._data_start + begin)
                if stored.size and f.readinto(memoryview(stored.reshape(-1)).cast("B")) != end - begin:
                    raise SafetensorsError(f"{self.path}: tensor {name!r} is cut short; the file is truncated")
        if entry["dtype"] == "BF16":
            return bf16_bits_to_f32(stored)
        if entry["dtype"] in ("F16", "F64"):
            return stored.astype(np.float32)
        return stored


def write_safetensors(path: PathLike, shapes: Mapping[str, Tuple[int, ...]], fetch: Callable[[str], np.ndarray],
                      dtype: str = "float32", metadata: Optional[Mapping[str, str]] = None) -> None:
    """Write float tensors ``fetch(name)`` (any float dtype, converted to ``dtype``) one by one to ``path``.

    ``shapes`` fixes the names, order and shapes up front because the header precedes the data; a fetched array of
    another shape is an error. The caller makes the write atomic (we write to whatever path we are given).
    """
    code = _CODE.get(dtype)
    if code is None:
        raise ValueError(f"dtype={dtype!r}: expected one of {', '.join(_CODE)}")
    itemsize = 2 if code in ("F16", "BF16") else 4
    header: Dict[str, object] = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    for name, shape in shapes.items():
        nbytes = int(np.prod(shape, dtype=np.int64)) * itemsize
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-len(blob) % 8)  # data starts 8-byte aligned, as the reference writer does
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        for name, shape in shapes.items():
            array = np.asarray(fetch(name))
            if tuple(array.shape) != tuple(shape):
                raise ValueError(f"{path}: tensor {name!r} has shape {array.shape}, header says {tuple(shape)}")
            f.write(_encode(array, code).tobytes())
        f.flush()
        os.fsync(f.fileno())


def _encode(array: np.ndarray, code: str) -> np.ndarray:
    if code == "BF16":
        return f32_to_bf16_bits(array.astype(np.float32, copy=False))
    with np.errstate(over="ignore"):  # values beyond float16's range become inf, as torch's cast does
        return np.ascontiguousarray(array, dtype="<f2" if code == "F16" else "<f4")

