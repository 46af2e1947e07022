"""The native rollout engine's Qwen2: prefill and decode graphs with a KV cache, built on the actor's own Parameters.

This is one of mindgrpo's three Qwen2s (the table is in :mod:`mindgrpo.models`): compiled MindSpore Cells made of
:class:`~mindgrpo.models.qwen2_blocks.Qwen2Blocks`, run only for rollouts with the default ``native`` backend
(:mod:`mindgrpo.rollout.backends.native` builds one prefill graph and a few decode graphs per shape bucket).

The native rollout engine never copies weights: :class:`Qwen2Weights` holds the very ``Parameter`` objects of
the actor (a :class:`~mindgrpo.models.qwen2.Qwen2Model`), so an optimizer step on the actor is visible
to the next rollout without any synchronisation. The graphs of a shape bucket read them:

* :class:`PrefillGraph` runs the distinct prompts of a batch (left-padded to one length), writes their keys and
  values into the cache rows of every sample drawn from them (the "fork": a prompt is computed once, its cache
  rows are repeated for its ``n`` samples) and returns the next-token logits of each prompt. For Qwen2.5-VL
  prompts it also reads the images' features in place of their ``<|image_pad|>`` tokens and rotates by M-RoPE's
  three position rows.
* :class:`DecodeGraph` feeds one token per sequence, writes its key/value into the cache
  (``ScatterNdUpdate`` on the cache Parameters) and returns the next-token logits, transposed ([vocab, B]: the host
  reads them through a transposed view, cheaper than an in-graph Transpose). (Writing in a separate graph with an
  in-place ``ScatterUpdate`` on a flat cache was measured slower end to end on CPU, so we keep one graph.) Its
  batch may be smaller than the cache's: each column names the cache row it continues, so the live sequences of a
  chunk keep decoding in the chunk's cache, without the finished ones and without moving any row.
  :class:`FusedDecodeGraph` is the same step on the fused CPU kernels of :mod:`mindgrpo.ops.decode_step`, whose
  cache is not a Parameter but a :class:`~mindgrpo.ops.kv_store.KvStore` (memory only where written), filled by
  :class:`FusedPrefillGraph`.

The math (:mod:`mindgrpo.models.qwen2_blocks`) follows MindFormers' Qwen2 configuration exactly, so logits match
the actor's full forward.
"""
from __future__ import annotations

import numpy as np

import mindspore as ms
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops

from mindgrpo.models.image_tokens import merge_image_features
from mindgrpo.models.attention_bias import mask_bias
from mindgrpo.models.qwen2_blocks import Qwen2Blocks, Qwen2Weights, reused_layer
from mindgrpo.ops.kv_store import KvStore

__all__ = ["DecodeGraph", "FusedDecodeGraph", "FusedPrefillGraph", "PrefillGraph", "Qwen2Weights", "new_kv_cache"]


class PrefillLayer(Qwen2Blocks):
    """A decoder layer of the prompt pass, over its layer's Parameters (:meth:`Qwen2Weights.layer`), compiled once
    for every layer (:func:`~mindgrpo.models.qwen2_blocks.reused_layer`): ``(x [P*S, hidden], cos, sin, bias
    [P, S*groups, S])`` -> the layer's output and its keys/values ``k, v [P*S, kv_heads, d]``. It writes nothing:
    the cache writes (side effects on one layer's cache) stay in :class:`PrefillGraph`."""

    @reused_layer
    def __init__(self, weights: Qwen2Weights):
        super().__init__(weights, 1, ParameterTuple(()))
        self.graph_key = weights.graph_key()

    def construct(self, x, cos, sin, bias):
        p, s = bias.shape[0], bias.shape[2]
        q, k, v = self._qkv_rows(0, x, cos, sin)  # layer 0 of the Cell's own weights
        x = self._mlp_rows(0, self._attention_out_rows(0, x, self._causal_attention_rows(q, k, v, bias, p, s)))
        return x, k, v


class PrefillGraph(Qwen2Blocks):
    """Prompt pass: logits after each prompt and its keys/values written to the cache rows of its samples.
    Row-major, table-free blocks (many tokens: see :class:`~mindgrpo.models.qwen2_blocks.Qwen2Blocks`)."""

    def __init__(self, weights: Qwen2Weights, cache_len: int, kv_cache: ParameterTuple):
        super().__init__(weights, cache_len, kv_cache)
        self.layers = nn.CellList([PrefillLayer(weights.layer(i)) for i in range(self.num_layers)],
                                  auto_prefix=False)

    def construct(self, tokens, positions, key_valid, rows, image_features=None, image_rows=None):
        """tokens/positions/key_valid: [P, S] (prompts left-padded to S; key_valid 1 on real tokens);
        rows: [B] index of the prompt each cache row (sample) continues. Returns logits [P, vocab].

        Qwen2.5-VL prompts (text calls pass neither, and compile the graph they always did): positions [3, P, S]
        (M-RoPE t/h/w rows), image_features [P*S, hidden] (real rows first; P*S, every token of the batch, is
        the most a bucket can hold, so the shape never changes within a bucket) and image_rows [P*S] from
        :func:`~mindgrpo.models.image_tokens.image_source_rows`. Decoding needs no M-RoPE: generated tokens are
        text, whose three rows are equal (the engine passes 1-row decode positions shifted by each prompt's
        ``rope_delta``)."""
        p, s = tokens.shape
        if positions.ndim == 3:
            cos, sin = self._mrope_rows(positions.reshape((3, p * s)))
        else:
            cos, sin = self._rope_rows(positions.reshape((-1,)))
        table, head = self._table_and_head()
        x = self._embed_rows(tokens.reshape((-1,)), table)  # [P*S, hidden]
        if image_features is not None:
            x = merge_image_features(x, self._compute(image_features), image_rows)
        bias = self._causal_bias_rows(key_valid, s)
        writes = ()
        for i, layer in enumerate(self.layers):
            x, k, v = layer(x, cos, sin, bias)
            writes += self._write_cache(i, k, v, rows, p, s)
        last = x.reshape((p, s, self.hidden))[:, s - 1]  # each prompt's last token
        # the sampler needs every column: gather the vocabulary slices of the P prompts' last tokens
        return ops.depend(self.comm.gather_slots(self._logits_rows(last, head), 1), writes)

    def _write_cache(self, layer: int, k, v, rows, p: int, s: int):
        """Write the prompts' keys/values k, v [P*S, kv_heads, d] of ``layer`` into the cache Parameters (layout
        [rows, kv_heads, len, d], built one KV head at a time: no transpose). The fork: cache row r continues
        prompt rows[r]; the tail beyond S, filled by decoding, is zeroed."""
        b, d = rows.shape[0], self.head_dim
        k_heads, v_heads = (), ()
        for h in range(self.kv_heads):
            k_heads += (k[:, h].reshape((p, 1, s, d)),)
            v_heads += (v[:, h].reshape((p, 1, s, d)),)
        tail = ops.zeros((b, self.kv_heads, self.cache_len - s, d), self.dtype)
        k_cache = ops.concat((ops.gather(ops.concat(k_heads, 1), rows, 0), tail), 2)
        v_cache = ops.concat((ops.gather(ops.concat(v_heads, 1), rows, 0), tail), 2)
        return ops.assign(self.kv_cache[2 * layer], k_cache), ops.assign(self.kv_cache[2 * layer + 1], v_cache)


class FusedPrefillGraph(PrefillGraph):
    """:class:`PrefillGraph` writing into the fused kernels' :class:`~mindgrpo.ops.kv_store.KvStore`: one kernel
    per layer copies the prompt positions into each cache row (nothing beyond them is touched)."""

    def __init__(self, weights: Qwen2Weights, cache_len: int, store: KvStore):
        super().__init__(weights, cache_len, ParameterTuple(()))
        from mindgrpo.ops.decode_step import decode_step_ops  # noqa: PLC0415  (compiles the kernels once)

        self.store_write_op = decode_step_ops().store_write
        self.store_keys = store.layer_keys()

    def _write_cache(self, layer: int, k, v, rows, p: int, s: int):
        shape = (p, s, self.kv_heads, self.head_dim)
        return (self.store_write_op(k.reshape(shape), v.reshape(shape), rows, self.store_keys[layer]),)


class DecodeGraph(Qwen2Blocks):
    """One decoding step for ``batch`` sequences, each continuing its own row of the KV cache, writing the new
    key/value into the cache in place. ``batch`` may be smaller than the cache's rows (a compacted chunk): the
    graph then reads the rows it decodes out of the cache, so its attention costs ``batch`` rows, not all of them.
    With ``batch`` equal to the cache's rows it reads the cache as it is, so column ``i`` must decode row ``i``."""

    def __init__(self, weights: Qwen2Weights, cache_len: int, kv_cache: ParameterTuple, batch: int):
        super().__init__(weights, cache_len, kv_cache)
        self.compacted = batch < kv_cache[0].shape[0]
        self.head_index = Tensor(np.broadcast_to(np.arange(self.kv_heads, dtype=np.int32), (batch, self.kv_heads)))
        self.key_index = Tensor(np.arange(cache_len, dtype=np.int32))
        self.scatter = ops.ScatterNdUpdate()

    def construct(self, tokens, positions, start, write_pos, rows):
        """tokens/positions/start/rows: [batch] (start = cache index of each sequence's first real prompt token,
        rows = its cache row, distinct); write_pos: scalar cache index of this token (the same for all rows).
        Returns float32 logits transposed, [vocab, batch]."""
        b = tokens.shape[0]
        table, head = self._table_and_head()
        hT = self._embed_t(tokens, table)  # [hidden, B]
        cos = ops.gather(self.cos, positions, 0)
        sin = ops.gather(self.sin, positions, 0)
        valid = ops.logical_and(self.key_index.reshape((1, -1)) >= start.reshape((-1, 1)),
                                self.key_index.reshape((1, -1)) <= write_pos)
        bias = mask_bias(ops.cast(valid, ms.float32)).reshape((b, 1, 1, -1))
        row_index = ops.broadcast_to(rows.reshape((-1, 1)), self.head_index.shape)
        slot = ops.stack((row_index, self.head_index, ops.broadcast_to(write_pos, row_index.shape)), -1)
        for i in range(self.num_layers):
            q, k, v = self._qkv(i, hT, cos, sin)
            # write this token's key/value first (the cache is read right after, in the same graph)
            k_cache = ops.depend(self.kv_cache[2 * i], self.scatter(self.kv_cache[2 * i], slot, k))
            v = v.reshape((b, self.kv_heads, self.head_dim))
            v_cache = ops.depend(self.kv_cache[2 * i + 1], self.scatter(self.kv_cache[2 * i + 1], slot, v))
            if self.compacted:
                k_cache, v_cache = ops.gather(k_cache, rows, 0), ops.gather(v_cache, rows, 0)
            ctx = self._attend(q.reshape((b, self.kv_heads, self.groups, self.head_dim)), k_cache, v_cache, bias)
            hT = self._mlp(i, self._attention_out(i, hT, ctx.reshape((b, self.context_width))))
        return self._logits_t(hT, head)


class FusedDecodeGraph(Qwen2Blocks):
    """:class:`DecodeGraph`'s math on the fused CPU kernels of :mod:`mindgrpo.ops.decode_step`, with the cache in
    their :class:`~mindgrpo.ops.kv_store.KvStore`: per layer, three q/k/v products, one attention kernel (bias,
    RoPE, cache write, attention over each row's valid keys), the o_proj product, a residual add + RMSNorm kernel,
    the three MLP products around one SwiGLU kernel, and the next residual add + RMSNorm. Any ``batch`` up to the
    store's rows, in any order of rows. CPU, float32, q/k/v biases (Qwen2's)."""

    def __init__(self, weights: Qwen2Weights, cache_len: int, store: KvStore):
        super().__init__(weights, cache_len, ParameterTuple(()))
        from mindgrpo.ops.decode_step import decode_step_ops  # noqa: PLC0415  (compiles the kernels once)

        # one attribute per op: GRAPH mode does not read a NamedTuple's fields
        kernels = decode_step_ops()
        self.attention_op, self.rms_norm_op = kernels.attention, kernels.rms_norm
        self.add_rms_norm_op, self.silu_mul_op = kernels.add_rms_norm, kernels.silu_mul
        self.eps_tensor = Tensor([self.eps], ms.float32)
        self.store_keys = store.layer_keys()

    def construct(self, tokens, positions, start, write_pos, rows):
        """As :meth:`DecodeGraph.construct`."""
        table, head = self._table_and_head()
        hT = self._embed_t(tokens, table)  # [hidden, B]
        x = self.rms_norm_op(hT, self._w(0, self.f_norm1), self.eps_tensor)
        for i in range(self.num_layers):
            ctx = self.attention_op(self._proj_t(i, self.f_wq, x), self._proj_t(i, self.f_wk, x),
                                    self._proj_t(i, self.f_wv, x), self._w(i, self.f_bq),
                                    self._w(i, self.f_bk), self._w(i, self.f_bv), self.cos, self.sin, positions,
                                    start, write_pos, rows, self.store_keys[i])  # [hidden, B]
            hT, x = self.add_rms_norm_op(hT, self.comm.reduce_no_grad(self._proj_t(i, self.f_wo, ctx)),
                                         self._w(i, self.f_norm2), self.eps_tensor)
            up = self.silu_mul_op(self._proj_t(i, self.f_w1, x), self._proj_t(i, self.f_w3, x))
            # the next layer's input norm, or the final norm after the last layer
            norm = self._w(i + 1, self.f_norm1) if i + 1 < self.num_layers else self._param(1)
            hT, x = self.add_rms_norm_op(hT, self.comm.reduce_no_grad(self._proj_t(i, self.f_w2, up)), norm,
                                         self.eps_tensor)
        return self.comm.gather_slots(ops.matmul(self._head(head), x), 0)  # float32 logits [vocab, B], as DecodeGraph


def new_kv_cache(weights: Qwen2Weights, batch: int, cache_len: int, tag: str) -> ParameterTuple:
    """Zeroed K and V cache Parameters [batch, kv_heads, cache_len, head_dim] per layer, uniquely named."""
    spec = weights.spec
    shape = (batch, spec.local_kv_heads, cache_len, spec.head_dim)
    return ParameterTuple([
        Parameter(Tensor(np.zeros(shape, np.float32), weights.compute_dtype),
                  name=f"rollout_kv_cache.{tag}.{kind}{layer}", requires_grad=False)
        for layer in range(spec.num_layers) for kind in ("k", "v")])
