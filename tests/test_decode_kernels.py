"""The fused decode-step kernels (mindgrpo.ops.decode_step) and their KV store (mindgrpo.ops.kv_store) against
numpy: called directly through their C entry points (every head size path, bad input, the store's memory), and as
MindSpore custom ops in both modes.

The engine-level check, fused decoding against the plain-ops graph and a full forward, is in test_rollout.py."""
import ctypes

import numpy as np
import pytest

import mindgrpo  # noqa: F401  (before MindSpore)
import mindspore as ms
from mindspore import Tensor, nn, ops

from aot_kernel import AotKernel
from mindgrpo.ops import build
from mindgrpo.ops.decode_step import decode_step_ops
from mindgrpo.ops.kv_store import KvStore

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


def attention_case(library, rng, heads, kv_heads, head_dim, batch=5, cache_len=24, table_len=40, rows=None,
                   cache_rows=None, layers=2, layer=1):
    """Inputs of DecodeAttention in its argument order, then the caches of the store they name (layer ``layer`` of
    a store of ``layers``, filled with noise) and the store. ``rows``: the cache row of each column (default: column
    b decodes row b, with as many cache rows as columns)."""
    def normal(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    rows = np.arange(batch, dtype=np.int32) if rows is None else np.asarray(rows, np.int32)
    cache_rows = cache_rows or batch
    store = KvStore(cache_rows, kv_heads, cache_len, head_dim, layers)
    key = np.array([store.id, layer], np.int64)
    k_cache, v_cache = (normal(cache_rows, kv_heads, cache_len, head_dim) for _ in range(2))
    as_prompts = [np.ascontiguousarray(c.transpose(0, 2, 1, 3)) for c in (k_cache, v_cache)]  # [rows, len, kv, d]
    assert AotKernel(library, "KvStoreWrite")(*as_prompts, np.arange(cache_rows, dtype=np.int32), key,
                                              np.zeros(1, np.float32)) == 0
    angles = normal(table_len, head_dim)
    case = dict(q_t=normal(heads * head_dim, batch), k_t=normal(kv_heads * head_dim, batch),
                v_t=normal(kv_heads * head_dim, batch), bq=normal(heads * head_dim), bk=normal(kv_heads * head_dim),
                bv=normal(kv_heads * head_dim), cos=np.cos(angles), sin=np.sin(angles),
                positions=rng.integers(0, table_len, batch).astype(np.int32),
                start=np.array([0, 3, 17, 9, 16][:batch], np.int32), write_pos=np.array(17, np.int32), rows=rows,
                cache=key)
    return case, k_cache, v_cache, store


def attention_reference(case, k_cache, v_cache):
    """(ctx_t, k_cache, v_cache) after one step, in float64."""
    c = {k: v.astype(np.float64) if v.dtype == np.float32 else v for k, v in case.items()}
    k_cache, v_cache = k_cache.astype(np.float64), v_cache.astype(np.float64)
    _, kv_heads, _, d = k_cache.shape
    heads, batch = c["q_t"].shape[0] // d, c["q_t"].shape[1]
    w = int(c["write_pos"])
    ctx_t = np.zeros((heads * d, batch))
    for b in range(batch):
        r = c["rows"][b]
        if r == -1:  # a column without a row
            continue
        cos, sin = c["cos"][c["positions"][b]], c["sin"][c["positions"][b]]
        k_cache[r, :, w] = rope((c["k_t"][:, b] + c["bk"]).reshape(kv_heads, d), cos, sin)
        v_cache[r, :, w] = (c["v_t"][:, b] + c["bv"]).reshape(kv_heads, d)
        q = rope((c["q_t"][:, b] + c["bq"]).reshape(heads, d), cos, sin)
        for h in range(heads):
            g = h // (heads // kv_heads)
            keys, values = k_cache[r, g, c["start"][b]:w + 1], v_cache[r, g, c["start"][b]:w + 1]
            scores = keys @ q[h] / np.sqrt(d)
            p = np.exp(scores - scores.max())
            ctx_t[h * d:(h + 1) * d, b] = (p / p.sum()) @ values
    return ctx_t, k_cache, v_cache


def resident_mib():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096 / 2 ** 20


# ----------------------------------------------------------------------------------------------- C entry points
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 2, 16), (2, 2, 32), (8, 2, 64), (4, 1, 128), (6, 3, 10)])
def test_attention_matches_numpy_and_writes_only_the_new_cache_slot(library, heads, kv_heads, head_dim):
    """Each head size path (32, 64, 128 unrolled, others generic), 1 to 4 query heads per KV head; rows whose
    valid keys start anywhere, down to the new key alone (start == write_pos). The store's other layer is left
    unwritten (zeros)."""
    case, k_cache, v_cache, store = attention_case(library, np.random.default_rng(head_dim), heads, kv_heads, head_dim)
    expected_ctx, expected_k, expected_v = attention_reference(case, k_cache, v_cache)
    ctx_t = np.full((heads * head_dim, case["q_t"].shape[1]), np.nan, np.float32)
    assert AotKernel(library, "DecodeAttention")(*case.values(), ctx_t) == 0
    np.testing.assert_allclose(ctx_t, expected_ctx, rtol=0, atol=2e-6)
    k_after, v_after = store.read(1)
    np.testing.assert_allclose(k_after, expected_k, rtol=0, atol=1e-6)  # every other slot kept exactly
    np.testing.assert_array_equal(v_after, expected_v.astype(np.float32))
    assert not any(c.any() for c in store.read(0))


def test_attention_decodes_the_cache_rows_it_is_given(library):
    """A compacted batch: 4 columns decoding cache rows 6, none, 1 and 4 of 8 read and write those rows only (the
    column without a row yields zeros); the other rows' caches are left exactly as they were."""
    case, k_cache, v_cache, store = attention_case(library, np.random.default_rng(5), 4, 2, 64, batch=4,
                                                   rows=[6, -1, 1, 4], cache_rows=8)
    expected_ctx, expected_k, expected_v = attention_reference(case, k_cache, v_cache)
    ctx_t = np.full((4 * 64, 4), np.nan, np.float32)
    assert AotKernel(library, "DecodeAttention")(*case.values(), ctx_t) == 0
    np.testing.assert_allclose(ctx_t, expected_ctx, rtol=0, atol=2e-6)
    assert not ctx_t[:, 1].any()
    k_after, v_after = store.read(1)
    np.testing.assert_allclose(k_after, expected_k, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(v_after, expected_v.astype(np.float32))
    untouched = [0, 2, 3, 5, 7]
    for after, before in ((k_after, k_cache), (v_after, v_cache)):
        np.testing.assert_array_equal(after[untouched], before[untouched])


CHILD = """
import sys, numpy as np
sys.path.insert(0, sys.argv[1])
import test_decode_kernels as t
case, *_ = t.attention_case(t.ctypes.CDLL(str(t.build.build_cpu_kernel(t.build.DECODE_STEP_SOURCE))),
                            np.random.default_rng(7), 8, 2, 64, batch=5, cache_len=300, table_len=320)
ctx_t = np.zeros((8 * 64, 5), np.float32)
assert t.AotKernel(t.ctypes.CDLL(str(t.build.build_cpu_kernel(t.build.DECODE_STEP_SOURCE))),
                   "DecodeAttention")(*case.values(), ctx_t) == 0
np.save(sys.argv[2], ctx_t)
"""


@pytest.mark.parametrize("threads", ["1", "3"])
def test_attention_is_the_same_on_any_number_of_threads(library, tmp_path, threads):
    """The row loop runs on MINDGRPO_DECODE_THREADS threads (by default every processor): each row's arithmetic is
    the same on any thread, so the result is bit-identical to this process's default."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    case, *_ = attention_case(library, np.random.default_rng(7), 8, 2, 64, batch=5, cache_len=300, table_len=320)
    ctx_t = np.zeros((8 * 64, 5), np.float32)
    assert AotKernel(library, "DecodeAttention")(*case.values(), ctx_t) == 0
    out = tmp_path / "ctx.npy"
    subprocess.run([sys.executable, "-c", CHILD, str(Path(__file__).parent), str(out)], check=True, timeout=300,
                   env={**os.environ, "MINDGRPO_DECODE_THREADS": threads})
    np.testing.assert_array_equal(np.load(out), ctx_t)


def test_store_write_forks_prompts_and_memory_follows_what_is_written(library):
    """KvStoreWrite copies prompt rows[r]'s S positions into cache row r and nothing beyond; a store takes memory
    only where written, and release_rows / release give it back (the rows then read as zeros)."""
    rng = np.random.default_rng(6)
    prompts_k, prompts_v = rng.standard_normal((2, 2, 5, 3, 8)).astype(np.float32)  # [P, S, kv, d]
    store = KvStore(4, 3, 12, 8, 1)
    rows = np.array([1, 0, 1, 1], np.int32)
    done = np.zeros(1, np.float32)
    assert AotKernel(library, "KvStoreWrite")(prompts_k, prompts_v, rows, np.array([store.id, 0], np.int64),
                                              done) == 0
    k, v = store.read(0)
    assert done[0] == 1
    np.testing.assert_array_equal(k[:, :, :5], prompts_k[rows].transpose(0, 2, 1, 3))
    np.testing.assert_array_equal(v[:, :, :5], prompts_v[rows].transpose(0, 2, 1, 3))
    assert not k[:, :, 5:].any() and not v[:, :, 5:].any()
    store.release_rows([2])
    k_after, _ = store.read(0)
    assert not k_after[2].any() and np.array_equal(k_after[[0, 1, 3]], k[[0, 1, 3]])
    store.close()

    half = np.ones((32, 512, 2, 64), np.float32)
    before = resident_mib()
    big = KvStore(64, 2, 1024, 64, 4)  # 256 MiB of address space
    assert resident_mib() - before < 8  # nothing written yet
    for layer in range(4):
        assert AotKernel(library, "KvStoreWrite")(half, half, np.arange(64, dtype=np.int32) % 32,
                                                  np.array([big.id, layer], np.int64), done) == 0
    grown = resident_mib() - before
    assert 128 - 8 < grown < 128 + 16  # half of each row written: half of the store
    big.release_rows(np.arange(32))
    assert abs(resident_mib() - before - grown / 2) < 8
    big.release()
    assert resident_mib() - before < 8
    big.close()


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
    case, _, _, store = attention_case(library, np.random.default_rng(1), 4, 2, 16)
    attention = AotKernel(library, "DecodeAttention")
    ctx_t = np.zeros((64, 5), np.float32)

    def call(**changes):
        return attention(*{**case, **changes}.values(), ctx_t)

    assert attention(*case.values()) == 1  # no output
    assert call(cache=np.array([store.id + 1000, 1], np.int64)) == 2  # no such store
    assert call(cache=np.array([store.id, 2], np.int64)) == 2  # no such layer
    assert call(k_t=case["k_t"][:, :4]) == 3
    assert call(bq=case["bq"][:-1]) == 4
    assert call(sin=case["sin"][:-1]) == 5
    assert call(start=case["start"][:4]) == 6
    assert call(rows=case["rows"][:4]) == 6
    assert call(positions=case["positions"].astype(np.float32)) == 7
    assert call(rows=case["rows"].astype(np.float32)) == 7
    assert attention(*case.values(), np.zeros((64, 4), np.float32)) == 8
    assert call(write_pos=np.array(24, np.int32)) == 9  # past the cache
    assert call(start=np.array([0, 3, 18, 9, 16], np.int32)) == 9  # a row starting after the new key
    assert call(positions=np.array([0, 1, 40, 2, 3], np.int32)) == 9  # past the RoPE tables
    assert call(rows=np.array([0, 1, 2, 3, 5], np.int32)) == 10  # past the cache's rows
    assert call(rows=np.array([0, 1, 2, 1, 4], np.int32)) == 10  # a row decoded twice
    prompts = np.zeros((2, 24, 2, 16), np.float32)
    write = AotKernel(library, "KvStoreWrite")
    done = np.zeros(1, np.float32)
    assert write(prompts, prompts, np.array([0, 1, 1, 0, 0], np.int32), case["cache"], done) == 0
    assert write(prompts, prompts, np.array([0, 1, 2, 0, 0], np.int32), case["cache"], done) == 10  # no prompt 2
    assert write(prompts, prompts, np.zeros(4, np.int32), case["cache"], done) == 6  # one row per cache row
    assert write(np.zeros((2, 25, 2, 16), np.float32), np.zeros((2, 25, 2, 16), np.float32), np.zeros(5, np.int32),
                 case["cache"], done) == 2  # longer than the cache
    store.close()
    assert call() == 2  # a closed store
    x = np.zeros((8, 3), np.float32)
    assert AotKernel(library, "RmsNormT")(x, np.ones(7, np.float32), np.ones(1, np.float32), x.copy()) == 4
    assert AotKernel(library, "AddRmsNormT")(x, np.zeros((8, 2), np.float32), np.ones(8, np.float32),
                                             np.ones(1, np.float32), x.copy(), x.copy()) == 3
    assert AotKernel(library, "SiluMul")(x, x, np.zeros((3, 8), np.float32)) == 8
    assert AotKernel(library, "SiluMul")(x, x, x.copy(), dtype=b"float16") == 7


# ----------------------------------------------------------------------------------------------- as MindSpore ops
class OneStep(nn.Cell):
    """The prompt write and one attention step on a store, as the rollout's prefill and decode graphs use them."""

    def __init__(self, key):
        super().__init__()
        kernels = decode_step_ops()
        self.attention, self.store_write = kernels.attention, kernels.store_write
        self.key = Tensor(key)

    def construct(self, prompt_k, prompt_v, q_t, k_t, v_t, bq, bk, bv, cos, sin, positions, start, write_pos, rows):
        done = self.store_write(prompt_k, prompt_v, ops.arange(0, prompt_k.shape[0], dtype=ms.int32), self.key)
        return ops.depend(self.attention(q_t, k_t, v_t, bq, bk, bv, cos, sin, positions, start, write_pos, rows,
                                         ops.depend(self.key, done)), done)


def test_store_ops_write_and_read_the_store_in_graph_mode(library):
    """What the rollout relies on: in a GRAPH-mode Cell the ops find the store that ctypes created (one registry in
    the process), the write lands before the attention that depends on it, and both act on the store in place
    (here a compacted batch, 3 columns on 3 of the 6 cache rows)."""
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        case, k_cache, v_cache, store = attention_case(library, np.random.default_rng(2), 4, 2, 32, batch=3,
                                                       rows=[4, 0, 2], cache_rows=6)
        expected_ctx, expected_k, expected_v = attention_reference(case, k_cache, v_cache)
        store.release()  # the graph writes the prompts again
        prompts = [Tensor(np.ascontiguousarray(c.transpose(0, 2, 1, 3))) for c in (k_cache, v_cache)]
        step = OneStep(case.pop("cache"))
        ctx_t = step(*prompts, *(Tensor(v) for v in case.values())).asnumpy()
        np.testing.assert_allclose(ctx_t, expected_ctx, rtol=0, atol=2e-6)
        k_after, v_after = store.read(1)
        np.testing.assert_allclose(k_after, expected_k, rtol=0, atol=1e-6)
        np.testing.assert_allclose(v_after, expected_v, rtol=0, atol=1e-6)
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
