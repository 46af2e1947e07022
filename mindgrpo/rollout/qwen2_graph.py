"""Qwen2 decoder math as compiled MindSpore Cells over the actor's own Parameters, with a static KV cache.

The native rollout engine never copies weights: :class:`Qwen2Weights` holds the very ``Parameter`` objects of
the actor (a MindFormers ``LlamaForCausalLM`` configured as Qwen2), so an optimizer step on the actor is visible
to the next rollout without any synchronisation. Two graphs per shape bucket read them:

* :class:`PrefillGraph` runs the distinct prompts of a batch (left-padded to one length), writes their keys and
  values into the cache rows of every sample drawn from them (the "fork": a prompt is computed once, its cache
  rows are repeated for its ``n`` samples) and returns the next-token logits of each prompt.
* :class:`DecodeGraph` feeds one token per sequence, writes its key/value into the cache
  (``ScatterNdUpdate`` on the cache Parameters) and returns the next-token logits. (Writing in a separate graph
  with an in-place ``ScatterUpdate`` on a flat cache was measured slower end to end on CPU, so we keep one graph.)

The math follows MindFormers' Qwen2 configuration exactly (RMSNorm in float32, RoPE tables built like
``FreqsMgr``, rotate-half RoPE, grouped-query attention with q/k/v bias and query head ``h`` reading KV head
``h // (heads / kv_heads)``, SwiGLU MLP, tied or untied ``lm_head``), so logits match the actor's full forward.
Masked attention scores use a large finite negative instead of ``-inf``: padding query rows would otherwise be
all ``-inf`` and produce NaNs that leak into later layers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

import numpy as np

import mindspore as ms
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops

_MASKED = -1e9  # additive bias for masked attention scores; exp() of it underflows to exactly 0 in float32

# Weights in the order the graphs index them: 3 global ones, then each layer's (biases only when present).
_GLOBAL_FIELDS = ("embedding", "norm_out", "lm_head")


def layer_fields(qkv_bias: bool) -> Tuple[str, ...]:
    if qkv_bias:
        return ("attention_norm", "wq", "bq", "wk", "bk", "wv", "bv", "wo", "ffn_norm", "w1", "w2", "w3")
    return ("attention_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w1", "w2", "w3")


@dataclass(frozen=True)
class DecoderSpec:
    """Shape and numerics of a Qwen2 decoder, read from the actor's MindFormers config."""
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    qkv_bias: bool

    @property
    def kv_groups(self) -> int:
        return self.num_heads // self.num_kv_heads


def find_causal_lm(actor: nn.Cell) -> nn.Cell:
    """The MindFormers ``LlamaForCausalLM`` inside ``actor`` (the actor itself, or a wrapper holding it)."""
    for _, cell in [("", actor)] + list(actor.cells_and_names()):
        body = getattr(cell, "model", None)
        if hasattr(cell, "lm_head") and body is not None and hasattr(body, "layers") \
                and hasattr(body, "tok_embeddings") and hasattr(body, "norm_out"):
            return cell
    raise TypeError(f"{type(actor).__name__} is not a MindFormers LlamaForCausalLM configured as Qwen2 (nor a "
                    "Cell containing one): the native rollout engine needs .model.layers, .model.tok_embeddings, "
                    ".model.norm_out and .lm_head.")


def decoder_weights(actor: nn.Cell) -> Tuple[DecoderSpec, List[Parameter]]:
    """The decoder's spec and its Parameters (the actor's own objects) in graph order."""
    lm = find_causal_lm(actor)
    cfg, body = lm.config, lm.model
    if getattr(cfg, "qkv_concat", False) or any(hasattr(layer.feed_forward, "w_gate_hidden")
                                                  for layer in body.layers):
        raise NotImplementedError("native rollout needs separate q/k/v and w1/w3 weights; build the actor with "
                                  "qkv_concat=False")
    if str(getattr(cfg, "extend_method", "None")) != "None":
        raise NotImplementedError(f"native rollout implements plain RoPE; the actor uses extend_method="
                                  f"{cfg.extend_method!r} (RoPE scaling)")
    attn0 = body.layers[0].attention
    if getattr(attn0.wo, "has_bias", False):
        raise NotImplementedError("native rollout expects Qwen2's bias-free o_proj (attn_proj_has_bias=False)")
    num_heads = int(cfg.num_heads)
    spec = DecoderSpec(
        vocab_size=int(cfg.vocab_size), hidden_size=int(cfg.hidden_size), num_layers=len(body.layers),
        num_heads=num_heads, num_kv_heads=int(cfg.n_kv_heads or num_heads),
        head_dim=int(cfg.hidden_size) // num_heads, rms_norm_eps=float(cfg.rms_norm_eps),
        rope_theta=float(cfg.theta), qkv_bias=bool(attn0.wq.has_bias))
    # a tied lm_head is the embedding Parameter itself, so the same object simply appears twice
    params = [body.tok_embeddings.embedding_weight, body.norm_out.weight, lm.lm_head.weight]
    for layer in body.layers:
        attn, ffn = layer.attention, layer.feed_forward
        by_field = {"attention_norm": layer.attention_norm.weight, "wq": attn.wq.weight, "wk": attn.wk.weight,
                    "wv": attn.wv.weight, "wo": attn.wo.weight, "ffn_norm": layer.ffn_norm.weight,
                    "w1": ffn.w1.weight, "w2": ffn.w2.weight, "w3": ffn.w3.weight}
        if spec.qkv_bias:
            by_field.update(bq=attn.wq.bias, bk=attn.wk.bias, bv=attn.wv.bias)
        params += [by_field[name] for name in layer_fields(spec.qkv_bias)]
    return spec, params


def rope_tables(head_dim: int, theta: float, length: int) -> Tuple[np.ndarray, np.ndarray]:
    """cos/sin tables [length, head_dim] computed exactly as MindFormers' ``FreqsMgr`` does (float32 numpy)."""
    freqs_base = np.arange(0, head_dim, 2)[: (head_dim // 2)].astype(np.float32)
    freqs = 1.0 / (theta ** (freqs_base / head_dim))
    angles = np.outer(np.arange(0, length, 1).astype(np.float32), freqs)
    emb = np.concatenate((angles, angles), axis=-1)
    return np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)


class Qwen2Weights:
    """The actor's Parameters plus the spec; shared (not copied) by every graph of the engine.

    Matmuls run in the actor's compute dtype; weights stored in another dtype (float32 master weights with a
    bfloat16 compute dtype on Ascend) are cast inside the graph at every use, the price of not keeping a copy.
    """

    def __init__(self, actor: nn.Cell):
        self.spec, params = decoder_weights(actor)
        self.params = ParameterTuple(params)
        self.param_dtype = params[0].dtype
        self.compute_dtype = getattr(find_causal_lm(actor).config, "compute_dtype", None) or self.param_dtype
        if not isinstance(self.compute_dtype, ms.Type):
            self.compute_dtype = getattr(ms, str(self.compute_dtype))


class _Qwen2Graph(nn.Cell):
    """Shared decoder blocks. ``auto_prefix=False`` so the actor's Parameter names are never rewritten."""

    def __init__(self, weights: Qwen2Weights, cache_len: int, kv_cache: ParameterTuple):
        super().__init__(auto_prefix=False)
        spec = weights.spec
        self.weights = weights.params
        self.kv_cache = kv_cache
        self.num_layers, self.hidden = spec.num_layers, spec.hidden_size
        self.heads, self.kv_heads, self.groups, self.head_dim = (spec.num_heads, spec.num_kv_heads,
                                                                 spec.kv_groups, spec.head_dim)
        self.half = spec.head_dim // 2
        self.eps, self.qkv_bias = spec.rms_norm_eps, spec.qkv_bias
        self.scale = 1.0 / float(np.sqrt(spec.head_dim))
        self.dtype = weights.compute_dtype
        self.cast_weights = weights.param_dtype != weights.compute_dtype
        self.cache_len = cache_len
        cos, sin = rope_tables(spec.head_dim, spec.rope_theta, cache_len)
        self.cos, self.sin = Tensor(cos), Tensor(sin)
        fields = layer_fields(spec.qkv_bias)
        self.stride = len(fields)
        # graph-constant offsets of each per-layer weight (the bias offsets are only read when qkv_bias)
        (self.f_norm1, self.f_wq, self.f_wk, self.f_wv, self.f_wo, self.f_norm2, self.f_w1, self.f_w2,
         self.f_w3) = (fields.index(n) for n in ("attention_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w1", "w2",
                                                 "w3"))
        self.f_bq, self.f_bk, self.f_bv = ((fields.index("bq"), fields.index("bk"), fields.index("bv"))
                                           if spec.qkv_bias else (0, 0, 0))
        self.low_precision = self.dtype != ms.float32  # casts are emitted only then: each op costs a launch
        zero, eye = np.zeros((self.half, self.half), np.float32), np.eye(self.half, dtype=np.float32)
        self.rotate = Tensor(np.block([[zero, eye], [-eye, zero]]))  # x @ rotate == concat(-x2, x1)
        self.bmm_t = ops.BatchMatMul(transpose_b=True)
        self.bmm = ops.BatchMatMul()

    # Layout: between attention blocks the hidden states are feature-major, hT [hidden, rows], so every weight
    # product is ``W @ hT`` with the [out, in] weight as stored. MindSpore's CPU MatMul with ``transpose_b`` (what
    # ``x @ W.T`` needs) is 2-3x slower at these shapes; transposing the small activations instead is cheap, and
    # the weights stay the actor's own. Blocks also use as few ops as the math allows (each op costs a launch):
    # SiLU, one RoPE for q and k together, rotate-half as one matmul.
    def _param(self, index: int):
        weight = self.weights[index]
        if self.cast_weights:
            weight = ops.cast(weight, self.dtype)
        return weight

    def _w(self, layer: int, field: int):
        return self._param(len(_GLOBAL_FIELDS) + layer * self.stride + field)

    def _embed_t(self, tokens):
        """Embeddings of tokens [rows], feature-major [hidden, rows]."""
        h = ops.gather(self.weights[0], tokens, 0)
        if self.cast_weights:
            h = ops.cast(h, self.dtype)
        return h.T

    def _f32(self, x):
        return ops.cast(x, ms.float32) if self.low_precision else x

    def _compute(self, x):
        return ops.cast(x, self.dtype) if self.low_precision else x

    def _rms_norm_t(self, x, weight):
        """RMSNorm of feature-major x [hidden, rows] (in float32, as MindFormers)."""
        h = self._f32(x)
        h = h * ops.rsqrt(ops.mean(ops.square(h), 0, keep_dims=True) + self.eps)
        return self._compute(h) * weight.reshape((-1, 1))

    def _linear_t(self, layer: int, weight: int, x, bias: int = -1):
        y = ops.matmul(self._w(layer, weight), x)
        if bias >= 0:
            y = y + self._w(layer, bias).reshape((-1, 1))
        return y

    def _qkv(self, layer: int, hT, cos, sin):
        """Attention inputs for feature-major hT: RoPE'd q [rows, heads, d], k [rows, kv_heads, d] and v
        [rows, kv_heads * d], row-major as attention needs them."""
        x = self._rms_norm_t(hT, self._w(layer, self.f_norm1))
        use_bias = self.qkv_bias
        qk = ops.concat((self._linear_t(layer, self.f_wq, x, self.f_bq if use_bias else -1),
                         self._linear_t(layer, self.f_wk, x, self.f_bk if use_bias else -1)), 0).T
        v = self._linear_t(layer, self.f_wv, x, self.f_bv if use_bias else -1).T
        rows = qk.shape[0]
        qk = self._rope(qk.reshape((rows, self.heads + self.kv_heads, self.head_dim)),
                        cos.reshape((rows, 1, self.head_dim)), sin.reshape((rows, 1, self.head_dim)))
        return qk[:, :self.heads], qk[:, self.heads:], v

    def _rope(self, x, cos, sin):
        """x [..., heads, head_dim] with cos/sin broadcastable: x*cos + rotate_half(x)*sin in float32."""
        x = self._f32(x)
        rotated = ops.matmul(x.reshape((-1, self.head_dim)), self.rotate).reshape(x.shape)
        return self._compute(x * cos + rotated * sin)

    def _attention_out(self, layer: int, hT, ctx):
        """hT + o_proj(ctx) for the row-major attention output ctx [rows, hidden]."""
        return hT + ops.matmul(self._w(layer, self.f_wo), ctx.T)

    def _mlp(self, layer: int, hT):
        x = self._rms_norm_t(hT, self._w(layer, self.f_norm2))
        gate = ops.matmul(self._w(layer, self.f_w1), x)
        return hT + ops.matmul(self._w(layer, self.f_w2), ops.silu(gate) * ops.matmul(self._w(layer, self.f_w3), x))

    def _logits(self, hT):
        """float32 logits [rows, vocab] of feature-major final hidden states hT [hidden, rows]."""
        x = self._rms_norm_t(hT, self._param(1))
        return self._f32(ops.matmul(self._param(2), x).T)

    def _attend(self, q, k, v, bias):
        """Grouped attention: q [b, kv_heads, groups*s, d], k/v [b, kv_heads, t, d], bias broadcast to scores."""
        scores = self._f32(self.bmm_t(q, k)) * self.scale + bias
        return self.bmm(self._compute(ops.softmax(scores, -1)), v)


class PrefillGraph(_Qwen2Graph):
    """Prompt pass: logits after each prompt and its keys/values written to the cache rows of its samples."""

    def construct(self, tokens, positions, key_valid, rows):
        """tokens/positions/key_valid: [P, S] (prompts left-padded to S; key_valid 1 on real tokens);
        rows: [B] index of the prompt each cache row (sample) continues. Returns logits [P, vocab]."""
        p, s = tokens.shape
        b = rows.shape[0]
        hT = self._embed_t(tokens.reshape((-1,)))  # [hidden, P*S]
        flat_pos = positions.reshape((-1,))
        cos = ops.gather(self.cos, flat_pos, 0)
        sin = ops.gather(self.sin, flat_pos, 0)
        causal = ops.tril(ops.ones((s, s), ms.float32))
        allowed = causal.reshape((1, s, s)) * key_valid.reshape((p, 1, s))
        bias = ((allowed - 1.0) * (-_MASKED)).reshape((p, 1, 1, s, s))
        bias = ops.broadcast_to(bias, (p, 1, self.groups, s, s)).reshape((p, 1, self.groups * s, s))
        tail = ops.zeros((b, self.kv_heads, self.cache_len - s, self.head_dim), self.dtype)
        writes = ()
        for i in range(self.num_layers):
            q, k, v = self._qkv(i, hT, cos, sin)
            # query head kv*groups + g reads kv head kv: fold the groups into the query length
            q = q.reshape((p, s, self.heads, self.head_dim)).transpose((0, 2, 1, 3))
            q = q.reshape((p, self.kv_heads, self.groups * s, self.head_dim))
            k = k.reshape((p, s, self.kv_heads, self.head_dim)).transpose((0, 2, 1, 3))
            v = v.reshape((p, s, self.kv_heads, self.head_dim)).transpose((0, 2, 1, 3))
            ctx = self._attend(q, k, v, bias)  # [P, kv_heads, groups*S, d]
            ctx = ctx.reshape((p, self.heads, s, self.head_dim)).transpose((0, 2, 1, 3))
            hT = self._mlp(i, self._attention_out(i, hT, ctx.reshape((p * s, self.hidden))))
            # fork: cache row r continues prompt rows[r]; the tail beyond S is filled by decoding
            writes += (ops.assign(self.kv_cache[2 * i], ops.concat((ops.gather(k, rows, 0), tail), 2)),
                       ops.assign(self.kv_cache[2 * i + 1], ops.concat((ops.gather(v, rows, 0), tail), 2)))
        last = hT.reshape((self.hidden, p, s))[:, :, s - 1]  # [hidden, P]: each prompt's last token
        return ops.depend(self._logits(last), writes)


class DecodeGraph(_Qwen2Graph):
    """One decoding step for every cache row, writing the new key/value into the cache in place."""

    def __init__(self, weights: Qwen2Weights, cache_len: int, kv_cache: ParameterTuple):
        super().__init__(weights, cache_len, kv_cache)
        b = kv_cache[0].shape[0]
        grid_b, grid_h = np.meshgrid(np.arange(b), np.arange(self.kv_heads), indexing="ij")
        self.row_index = Tensor(grid_b.astype(np.int32))
        self.head_index = Tensor(grid_h.astype(np.int32))
        self.key_index = Tensor(np.arange(cache_len, dtype=np.int32))
        self.scatter = ops.ScatterNdUpdate()

    def construct(self, tokens, positions, start, write_pos):
        """tokens/positions/start: [B] (start = cache index of each row's first real prompt token);
        write_pos: scalar cache index of this token (the same for all rows). Returns logits [B, vocab]."""
        b = tokens.shape[0]
        hT = self._embed_t(tokens)  # [hidden, B]
        cos = ops.gather(self.cos, positions, 0)
        sin = ops.gather(self.sin, positions, 0)
        valid = ops.logical_and(self.key_index.reshape((1, -1)) >= start.reshape((-1, 1)),
                                self.key_index.reshape((1, -1)) <= write_pos)
        bias = ((ops.cast(valid, ms.float32) - 1.0) * (-_MASKED)).reshape((b, 1, 1, -1))
        slot = ops.stack((self.row_index, self.head_index, ops.broadcast_to(write_pos, self.row_index.shape)), -1)
        for i in range(self.num_layers):
            q, k, v = self._qkv(i, hT, cos, sin)
            # write this token's key/value first (the cache is read right after, in the same graph)
            k_cache = ops.depend(self.kv_cache[2 * i], self.scatter(self.kv_cache[2 * i], slot, k))
            v = v.reshape((b, self.kv_heads, self.head_dim))
            v_cache = ops.depend(self.kv_cache[2 * i + 1], self.scatter(self.kv_cache[2 * i + 1], slot, v))
            ctx = self._attend(q.reshape((b, self.kv_heads, self.groups, self.head_dim)), k_cache, v_cache, bias)
            hT = self._mlp(i, self._attention_out(i, hT, ctx.reshape((b, self.hidden))))
        return self._logits(hT)


def new_kv_cache(weights: Qwen2Weights, batch: int, cache_len: int, tag: str) -> ParameterTuple:
    """Zeroed K and V cache Parameters [batch, kv_heads, cache_len, head_dim] per layer, uniquely named."""
    spec = weights.spec
    shape = (batch, spec.num_kv_heads, cache_len, spec.head_dim)
    return ParameterTuple([
        Parameter(Tensor(np.zeros(shape, np.float32), weights.compute_dtype),
                  name=f"rollout_kv_cache.{tag}.{kind}{layer}", requires_grad=False)
        for layer in range(spec.num_layers) for kind in ("k", "v")])
