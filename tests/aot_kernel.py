"""Call an entry point of a mindgrpo AOT kernel library directly, with MindSpore's argument layout."""
import ctypes

import numpy as np

_DTYPES = {np.dtype(np.float32): b"float32", np.dtype(np.int32): b"int32", np.dtype(np.int64): b"int64",
           np.dtype(np.float16): b"float16"}


class AotKernel:
    """``AotKernel(library, name)(*arrays)`` passes the arrays (inputs, then outputs) as MindSpore does and returns
    the kernel's status code. Each array's dtype is reported as its own, or as ``dtype`` for all when given."""

    def __init__(self, library: ctypes.CDLL, name: str):
        self.fn = getattr(library, name)

    def __call__(self, *arrays: np.ndarray, dtype: bytes = None) -> int:
        count = len(arrays)
        shapes = [np.array(a.shape, np.int64) for a in arrays]  # kept alive for the call
        dtypes = [dtype or _DTYPES[a.dtype] for a in arrays]
        return self.fn(count, (ctypes.c_void_p * count)(*[a.ctypes.data for a in arrays]),
                       (ctypes.c_int * count)(*[a.ndim for a in arrays]),
                       (ctypes.POINTER(ctypes.c_int64) * count)(
                           *[s.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)) for s in shapes]),
                       (ctypes.c_char_p * count)(*dtypes), None, None)
