"""The fused decode-step kernels (mindgrpo.ops.decode_step) against numpy: called directly through their C entry
points (every head size path, bad input), and as MindSpore custom ops in both modes.

The engine-level check, fused decoding against the plain-ops graph and a full forward, is in test_rollout.py."""
import ctypes

import numpy as np
import pytest

import mindgrpo  # noqa: F401  (before MindSpore)
import mindspore as ms
from mindspore import Parameter, Tensor, nn

from aot_kernel import AotKernel
from mindgrpo.ops import build
from mindgrpo.ops.decode_step import decode_step_ops

EPS = 1e-6


@pytest.fixture(scope="module")
def library():
    return ctypes.CDLL(str(build.build_cpu_kernel(build.DECODE_STEP_SOURCE)))


# ----------------------------------------------------------------------------------------------- numpy references
def rms_norm_t(x, weight, eps=EPS):
    x64 = x.astype(np.float64)
    return x64 / np.sqrt((x64 ** 2).mean(0, keepdims=True) + eps) * weight[:, None]


def rope(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + np.concatenate([-x[..., half:], x[..., :half]], -1) * sin


def attention_case(rng, heads, kv_heads, head_dim, batch=5, cache_len=24, table_len=40):
    """Inputs of DecodeAttention, in its argument order (the caches filled with noise)."""
    def normal(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    angles = normal(table_len, head_dim)
    write_pos = np.array(17, np.int32)
    return dict(q_t=normal(heads * head_dim, batch), k_t=normal(kv_heads * head_dim, batch),
                v_t=normal(kv_heads * head_dim, batch), bq=normal(heads * head_dim), bk=normal(kv_heads * head_dim),
                bv=normal(kv_heads * head_dim), cos=np.cos(angles), sin=np.sin(angles),
                positions=rng.integers(0, table_len, batch).astype(np.int32),
                start=np.array([0, 3, 17, 9, 16][:batch], np.int32), write_pos=write_pos,
                k_cache=normal(batch, kv_heads, cache_len, head_dim),
                v_cache=normal(batch, kv_heads, cache_len, head_dim))


def attention_reference(case):
    """(ctx_t, k_cache, v_cache) after one step, in float64."""
    c = {k: v.astype(np.float64) if v.dtype == np.float32 else v for k, v in case.items()}
    batch, kv_heads, _, d = c["k_cache"].shape
    heads = c["q_t"].shape[0] // d
    w = int(c["write_pos"])
    k_cache, v_cache = c["k_cache"].copy(), c["v_cache"].copy()
    ctx_t = np.zeros((heads * d, batch))
    for b in range(batch):
        cos, sin = c["cos"][c["positions"][b]], c["sin"][c["positions"][b]]
        k_cache[b, :, w] = rope((c["k_t"][:, b] + c["bk"]).reshape(kv_heads, d), cos, sin)
        v_cache[b, :, w] = (c["v_t"][:, b] + c["bv"]).reshape(kv_heads, d)
        q = rope((c["q_t"][:, b] + c["bq"]).reshape(heads, d), cos, sin)
        for h in range(heads):
            g = h // (heads // kv_heads)
            keys, values = k_cache[b, g, c["start"][b]:w + 1], v_cache[b, g, c["start"][b]:w + 1]
            scores = keys @ q[h] / np.sqrt(d)
            p = np.exp(scores - scores.max())
            ctx_t[h * d:(h + 1) * d, b] = (p / p.sum()) @ values
    return ctx_t, k_cache, v_cache


# ----------------------------------------------------------------------------------------------- C entry points
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 2, 16), (2, 2, 32), (8, 2, 64), (4, 1, 128), (6, 3, 10)])
def test_attention_matches_numpy_and_writes_only_the_new_cache_slot(library, heads, kv_heads, head_dim):
    """Each head size path (32, 64, 128 unrolled, others generic), 1 to 4 query heads per KV head; rows whose
    valid keys start anywhere, down to the new key alone (start == write_pos)."""
    case = attention_case(np.random.default_rng(head_dim), heads, kv_heads, head_dim)
    expected_ctx, expected_k, expected_v = attention_reference(case)
    ctx_t = np.full((heads * head_dim, case["q_t"].shape[1]), np.nan, np.float32)
    assert AotKernel(library, "DecodeAttention")(*case.values(), ctx_t) == 0
    np.testing.assert_allclose(ctx_t, expected_ctx, rtol=0, atol=2e-6)
    np.testing.assert_allclose(case["k_cache"], expected_k, rtol=0, atol=1e-6)  # every other slot kept exactly
    np.testing.assert_array_equal(case["v_cache"], expected_v.astype(np.float32))


def test_norms_and_silu_match_numpy(library):
    rng = np.random.default_rng(0)
    x, delta = rng.standard_normal((2, 48, 7)).astype(np.float32) * 3
    weight = (1 + 0.1 * rng.standard_normal(48)).astype(np.float32)
    eps = np.array([EPS], np.float32)
    y = np.empty_like(x)
    assert AotKernel(library, "RmsNormT")(x, weight, eps, y) == 0
    np.testing.assert_allclose(y, rms_norm_t(x, weight), rtol=2e-6, atol=1e-6)
    total, normed = np.empty_like(x), np.empty_like(x)
    assert AotKernel(library, "AddRmsNormT")(x, delta, weight, eps, total, normed) == 0
    np.testing.assert_array_equal(total, x + delta)
    np.testing.assert_allclose(normed, rms_norm_t(x + delta, weight), rtol=2e-6, atol=1e-6)
    gate = np.linspace(-90, 90, 48 * 7, dtype=np.float32).reshape(48, 7)  # saturating tails included
    out = np.empty_like(gate)
    assert AotKernel(library, "SiluMul")(gate, x, out) == 0
    g = gate.astype(np.float64)
    np.testing.assert_allclose(out, g / (1 + np.exp(-g)) * x, rtol=1e-6, atol=1e-30)


def test_kernels_reject_bad_input(library):
    case = attention_case(np.random.default_rng(1), 4, 2, 16)
    attention = AotKernel(library, "DecodeAttention")
    ctx_t = np.zeros((64, 5), np.float32)

    def call(**changes):
        return attention(*{**case, **changes}.values(), ctx_t)

    assert attention(*case.values()) == 1  # no output
    assert call(v_cache=case["v_cache"][:, :, :-1]) == 2  # caches differ
    assert call(k_t=case["k_t"][:, :4]) == 3
    assert call(bq=case["bq"][:-1]) == 4
    assert call(sin=case["sin"][:-1]) == 5
    assert call(start=case["start"][:4]) == 6
    assert call(positions=case["positions"].astype(np.float32)) == 7
    assert attention(*case.values(), np.zeros((64, 4), np.float32)) == 8
    assert call(write_pos=np.array(24, np.int32)) == 9  # past the cache
    assert call(start=np.array([0, 3, 18, 9, 16], np.int32)) == 9  # a row starting after the new key
    assert call(positions=np.array([0, 1, 40, 2, 3], np.int32)) == 9  # past the RoPE tables
    x = np.zeros((8, 3), np.float32)
    assert AotKernel(library, "RmsNormT")(x, np.ones(7, np.float32), np.ones(1, np.float32), x.copy()) == 4
    assert AotKernel(library, "AddRmsNormT")(x, np.zeros((8, 2), np.float32), np.ones(8, np.float32),
                                             np.ones(1, np.float32), x.copy(), x.copy()) == 3
    assert AotKernel(library, "SiluMul")(x, x, np.zeros((3, 8), np.float32)) == 8
    assert AotKernel(library, "SiluMul")(x, x, x.copy(), dtype=b"float16") == 7


# ----------------------------------------------------------------------------------------------- as MindSpore ops
class OneStep(nn.Cell):
    """The attention op on cache Parameters, as the decode graph uses it."""

    def __init__(self, k_cache, v_cache):
        super().__init__()
        self.attention = decode_step_ops().attention
        self.k_cache = Parameter(Tensor(k_cache), name="k_cache", requires_grad=False)
        self.v_cache = Parameter(Tensor(v_cache), name="v_cache", requires_grad=False)

    def construct(self, q_t, k_t, v_t, bq, bk, bv, cos, sin, positions, start, write_pos):
        return self.attention(q_t, k_t, v_t, bq, bk, bv, cos, sin, positions, start, write_pos, self.k_cache,
                              self.v_cache)


def test_attention_op_writes_the_cache_parameters_in_place_in_graph_mode():
    """What the rollout relies on: under GRAPH mode the kernel receives the cache Parameters' own buffers."""
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        case = attention_case(np.random.default_rng(2), 4, 2, 32)
        expected_ctx, expected_k, expected_v = attention_reference(case)
        step = OneStep(case.pop("k_cache"), case.pop("v_cache"))
        ctx_t = step(*(Tensor(v) for v in case.values())).asnumpy()
        np.testing.assert_allclose(ctx_t, expected_ctx, rtol=0, atol=2e-6)
        np.testing.assert_allclose(step.k_cache.asnumpy(), expected_k, rtol=0, atol=1e-6)
        np.testing.assert_allclose(step.v_cache.asnumpy(), expected_v, rtol=0, atol=1e-6)
    finally:
        ms.set_context(mode=previous)


def test_norm_and_silu_ops_match_numpy(ms_mode):
    ops_ = decode_step_ops()
    rng = np.random.default_rng(3)
    x, delta = rng.standard_normal((2, 32, 6)).astype(np.float32)
    weight = (1 + 0.1 * rng.standard_normal(32)).astype(np.float32)
    eps = Tensor([EPS], ms.float32)
    np.testing.assert_allclose(ops_.rms_norm(Tensor(x), Tensor(weight), eps).asnumpy(), rms_norm_t(x, weight),
                               rtol=2e-6, atol=1e-6)
    total, normed = ops_.add_rms_norm(Tensor(x), Tensor(delta), Tensor(weight), eps)
    np.testing.assert_array_equal(total.asnumpy(), x + delta)
    np.testing.assert_allclose(normed.asnumpy(), rms_norm_t(x + delta, weight), rtol=2e-6, atol=1e-6)
    silu = ops_.silu_mul(Tensor(x), Tensor(delta)).asnumpy()
    np.testing.assert_allclose(silu, x / (1 + np.exp(-x.astype(np.float64))) * delta, rtol=1e-6, atol=1e-7)
