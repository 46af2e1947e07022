"""The KV cache of the fused decode kernels: memory the kernels own, outside MindSpore, resident only where written.

A KV cache held in MindSpore Parameters takes its full shape, ``rows x (S + max_tokens)`` positions per layer, for
as long as its compiled graphs live (the run: it also counts in the training phase's peak memory), whatever the
completions' lengths. A :class:`KvStore` is one anonymous memory mapping (``kernels/kv_store.h``): a page takes
memory when a kernel first writes into it, so the cache costs what the prompts and the tokens generated so far fill,
which grows with the live rows' lengths instead of the limit. :meth:`KvStore.release_rows` gives a finished row's
pages back while the others decode, :meth:`KvStore.release` the whole cache after a chunk, so between rollouts a
store holds no memory. Only the fused kernels (:mod:`mindgrpo.ops.decode_step`: CPU, float32) read it; the plain-ops
decode graph keeps its cache in Parameters.

The kernels name a store and layer by an int64 pair (:meth:`KvStore.layer_keys`), a constant of the graphs built
on it. Stores are created, released and destroyed from here through ``ctypes`` on the same shared library that
MindSpore loads for the kernels (the same file, so the same process-wide registry), always between graph runs.
"""
from __future__ import annotations

import ctypes
import functools
from typing import Sequence, Tuple

import numpy as np

from mindspore import Tensor

from mindgrpo.ops import build


@functools.lru_cache(maxsize=None)
def _library() -> ctypes.CDLL:
    library = ctypes.CDLL(str(build.build_cpu_kernel(build.DECODE_STEP_SOURCE)))
    int64, int32_p, float_p = ctypes.c_int64, ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_float)
    library.KvStoreCreate.argtypes = [int64] * 5 + [ctypes.POINTER(int64)]
    library.KvStoreRelease.argtypes = [int64, int32_p, int64]
    library.KvStoreRead.argtypes = [int64, int64, float_p, float_p]
    library.KvStoreDestroy.argtypes = [int64]
    return library


class KvStore:
    """Keys and values of ``layers`` layers for ``rows`` cache rows of ``length`` positions, ``kv_heads`` heads of
    ``head_dim`` each: logically ``[rows, kv_heads, length, head_dim]`` float32 per layer and kind."""

    def __init__(self, rows: int, kv_heads: int, length: int, head_dim: int, layers: int):
        self.shape = (rows, kv_heads, length, head_dim)
        self.layers = layers
        self._lib = _library()
        self.id = 0  # none yet (0 is never a store's id)
        store_id = ctypes.c_int64()
        if self._lib.KvStoreCreate(rows, kv_heads, length, head_dim, layers, ctypes.byref(store_id)) != 0:
            raise MemoryError(f"could not map a KV cache of {layers} layers x {self.shape} floats x 2")
        self.id = store_id.value

    def layer_keys(self) -> Tuple[Tensor, ...]:
        """Per layer, the int64 [2] tensor (store id, layer) by which the kernels find its cache."""
        return tuple(Tensor(np.array([self.id, layer], np.int64)) for layer in range(self.layers))

    def release_rows(self, rows: Sequence[int]) -> None:
        """Give back the memory of these rows (sequences that ended); they read as zeros until written again."""
        rows = np.ascontiguousarray(rows, np.int32)
        self._check(self._lib.KvStoreRelease(self.id, rows.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
                                             rows.size))

    def release(self) -> None:
        """Give back the memory of every row."""
        self._check(self._lib.KvStoreRelease(self.id, None, 0))

    def read(self, layer: int) -> Tuple[np.ndarray, np.ndarray]:
        """Copies of ``layer``'s keys and values, ``[rows, kv_heads, length, head_dim]`` each."""
        k, v = np.empty(self.shape, np.float32), np.empty(self.shape, np.float32)
        pointer = ctypes.POINTER(ctypes.c_float)
        self._check(self._lib.KvStoreRead(self.id, layer, k.ctypes.data_as(pointer), v.ctypes.data_as(pointer)))
        return k, v

    def close(self) -> None:
        """Unmap the store (no graph built on it may run afterwards)."""
        if self.id:
            self._lib.KvStoreDestroy(self.id)
            self.id = 0

    def __del__(self) -> None:
        self.close()

    def _check(self, status: int) -> None:
        if status != 0:
            raise RuntimeError(f"KV store {self.id} is closed or unknown (status {status})")

