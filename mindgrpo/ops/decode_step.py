"""The native rollout's decode step as fused CPU kernels: attention with the KV-cache write, RMSNorm (with the
residual add) and the SwiGLU product, and the prompt pass's cache write. The cache is a
:class:`~mindgrpo.ops.kv_store.KvStore`, memory the kernels own.

Decoding one token for a few dozen rows is bound by kernel launches, not arithmetic. With these kernels a layer's
step is 11 launches (the 7 weight products stay on MindSpore's MatMul) instead of about 50; attention also reads
only each row's valid keys. ``kernels/decode_step_cpu.cc`` writes out the math. The plain-ops decode graph
(:class:`mindgrpo.rollout.backends.native_graphs.DecodeGraph`) is the reference twin: ``tests/test_rollout.py``
checks one against the other, and each kernel against numpy.

CPU, float32 and Qwen2's q/k/v biases only: the native engine uses them there (``generate_config.decode_impl:
fused``) and the plain ops on any other device, dtype or architecture.
"""
from __future__ import annotations

from typing import NamedTuple

import mindspore as ms
from mindspore import ops

from mindgrpo.ops import build


def fused_decode_available(device_target: str, compute_dtype, param_dtype, qkv_bias: bool) -> bool:
    """Whether the kernels can run a model with these compute and weight dtypes (and q/k/v biases or not, as in
    Qwen2) on ``device_target``. The kernels read float32 activations, norms and biases: bfloat16 weights are cast
    to the float32 compute dtype at every use, as in the plain graphs."""
    return (device_target == "CPU" and compute_dtype == ms.float32 and param_dtype in (ms.float32, ms.bfloat16)
            and qkv_bias)


class DecodeStepOps(NamedTuple):
    """The kernels as MindSpore custom ops (shapes in the kernel source). A Cell must keep each op in its own
    attribute: GRAPH mode does not read a NamedTuple's fields."""
    attention: ops.Custom
    """``(q_t, k_t, v_t, bq, bk, bv, cos, sin, positions, start, write_pos, rows, cache) -> ctx_t`` (column ``b``
    decodes cache row ``rows[b]`` of the store layer ``cache``, a ``KvStore.layer_keys()`` entry)"""
    store_write: ops.Custom
    """``(k, v, rows, cache) -> done[1]``: prompt keys/values ``[P, S, kv_heads, head_dim]``, prompt ``rows[r]``
    written to positions ``0..S-1`` of cache row ``r``"""
    rms_norm: ops.Custom
    """``(x, weight, eps) -> y``"""
    add_rms_norm: ops.Custom
    """``(x, delta, weight, eps) -> (x + delta, rms_norm(x + delta))``"""
    silu_mul: ops.Custom
    """``(gate, up) -> silu(gate) * up``"""


def decode_step_ops() -> DecodeStepOps:
    """The custom ops, compiling the kernels on first use."""
    library = build.build_cpu_kernel(build.DECODE_STEP_SOURCE)

    def custom(name: str, shape, dtype) -> ops.Custom:
        return ops.Custom(f"{library}:{name}", out_shape=shape, out_dtype=dtype, func_type="aot")

    def first(x, *_):
        return x

    def first_twice(x, *_):
        return x, x

    return DecodeStepOps(attention=custom("DecodeAttention", first, first),
                         store_write=custom("KvStoreWrite", lambda *_: [1], lambda x, *_: x),
                         rms_norm=custom("RmsNormT", first, first),
                         add_rms_norm=custom("AddRmsNormT", first_twice, first_twice),
                         silu_mul=custom("SiluMul", first, first))
