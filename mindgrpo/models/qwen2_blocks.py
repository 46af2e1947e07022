"""mindgrpo's Qwen2 decoder math, as MindSpore ops over the Parameters of a
:class:`~mindgrpo.models.qwen2.Qwen2Model` (:meth:`~mindgrpo.models.qwen2.Qwen2Model.decoder_weights`).

The blocks own no Parameters and no forward of their own. They are the model's passes
(:meth:`~mindgrpo.models.qwen2.Qwen2Model.full_sequence`, ``completions``, ``shared_prompt``, ``packed``) and the
native rollout engine's prefill and decode graphs (:mod:`mindgrpo.rollout.backends.native_graphs`), at every
tensor-parallel degree.

:class:`Qwen2Weights` holds the model's very ``Parameter`` objects (no copy: an optimizer step on the actor is seen
by every Cell built on them, and gradients flow back to them). :class:`Qwen2Blocks` is the math as MindSpore ops:
RMSNorm in float32, RoPE tables built like MindFormers' ``FreqsMgr``, rotate-half RoPE, grouped-query attention
with q/k/v bias and query head ``h`` reading KV head ``h // (heads / kv_heads)``, SwiGLU MLP, tied or untied
``lm_head``, so results match transformers' Qwen2 and MindFormers' ``LlamaForCausalLM`` (``tests/test_models.py``).
For Qwen2.5-VL's language model (``DecoderSpec.mrope_section`` set) the blocks also take multimodal RoPE: 3-row
t/h/w position ids, each row rotating its ``mrope_section`` share of the rotary dims (:meth:`Qwen2Blocks._mrope_rows`,
as transformers' ``apply_multimodal_rotary_pos_emb``); 1-row positions keep the plain path unchanged.
Masked attention scores get :data:`~mindgrpo.models.attention_bias.MASKED_SCORE`
(:func:`~mindgrpo.models.attention_bias.mask_bias`).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import List, Sequence, Tuple

import numpy as np

import mindspore as ms
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops

from mindgrpo.models.attention_bias import mask_bias
from mindgrpo.parallel.layers import TPComm, embed_lookup
from mindgrpo.parallel.layout import TPLayout

# Weights in the order the graphs index them: 3 global ones, then each layer's (biases only when present).
_GLOBAL_FIELDS = ("embedding", "norm_out", "lm_head")


def layer_fields(qkv_bias: bool, lora_fields: Tuple[str, ...] = ()) -> Tuple[str, ...]:
    """A layer's weights in graph order: the backbone's, then each adapted weight's LoRA A and B
    (``wq.lora_a``, ``wq.lora_b``, ...)."""
    if qkv_bias:
        base = ("attention_norm", "wq", "bq", "wk", "bk", "wv", "bv", "wo", "ffn_norm", "w1", "w2", "w3")
    else:
        base = ("attention_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w1", "w2", "w3")
    return base + tuple(f"{field}.{part}" for field in lora_fields for part in ("lora_a", "lora_b"))


@dataclass(frozen=True)
class DecoderSpec:
    """Shape and numerics of a Qwen2 decoder as the graphs need them (a Qwen2Model's ``decoder_weights``)."""
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    qkv_bias: bool
    tp_layout: TPLayout
    """This rank's tensor-parallel slice of the heads and vocabulary (``tp == 1``: the whole model)."""
    tp_group: str = ""
    mrope_section: Tuple[int, ...] = ()
    """Qwen2.5-VL's M-RoPE: rotary half-dims of the t/h/w position rows (empty: a text model, 1-row positions)."""
    lora_fields: Tuple[str, ...] = ()
    """The weights whose LoRA adapters the graphs add (``wq``, ``w1``, ...; empty: the backbone alone)."""
    lora_scale: float = 0.0
    """LoRA's alpha / rank."""

    @property
    def tp_size(self) -> int:
        return self.tp_layout.tp

    @property
    def tp_rank(self) -> int:
        return self.tp_layout.rank

    @property
    def local_heads(self) -> int:
        return self.tp_layout.local_heads

    @property
    def local_kv_heads(self) -> int:
        return self.tp_layout.local_kv_heads

    @property
    def kv_groups(self) -> int:
        """Query heads per KV head on this rank."""
        return self.local_heads // self.local_kv_heads

    @property
    def vocab_start(self) -> int:
        return self.tp_layout.vocab_start


def rope_tables(head_dim: int, theta: float, length: int) -> Tuple[np.ndarray, np.ndarray]:
    """cos/sin tables [length, head_dim] computed exactly as MindFormers' ``FreqsMgr`` does (float32 numpy)."""
    freqs_base = np.arange(0, head_dim, 2)[: (head_dim // 2)].astype(np.float32)
    freqs = 1.0 / (theta ** (freqs_base / head_dim))
    angles = np.outer(np.arange(0, length, 1).astype(np.float32), freqs)
    emb = np.concatenate((angles, angles), axis=-1)
    return np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)


def mrope_chunks(mrope_section) -> List[Tuple[int, int, int]]:
    """(position row, first rotary dim, width) of each chunk of the rotary dims under M-RoPE: the t/h/w sections of
    the first half, then the same sections of the second half (transformers splits by ``mrope_section * 2`` and
    gives chunk ``i`` row ``i % 3``)."""
    chunks, start = [], 0
    for i, width in enumerate(tuple(mrope_section) * 2):
        chunks.append((i % 3, start, int(width)))
        start += int(width)
    return chunks


class Qwen2Weights:
    """A model's Parameters in graph order (:func:`layer_fields`) plus the spec; shared (not copied) by every graph
    built on them. A tied lm_head is the embedding Parameter itself, so the same object appears twice in ``params``.

    Matmuls run in ``compute_dtype``; weights stored in another dtype (float32 master weights with a bfloat16
    compute dtype on Ascend) are cast inside the graph at every use, the price of not keeping a copy.
    """

    def __init__(self, spec: DecoderSpec, params: Sequence[Parameter], compute_dtype: str):
        self.spec = spec
        self.params = ParameterTuple(params)
        self.layer_base = len(_GLOBAL_FIELDS)  # index of layer 0's first weight in ``params``
        # A tied lm_head is read through the embedding's index: one Parameter read twice in a graph makes MindSpore
        # copy it (TensorMove), which CPU has no bfloat16 kernel for.
        self.lm_head_index = 0 if params[2] is params[0] else 2
        self.param_dtype = params[0].dtype
        self.compute_dtype = getattr(ms, compute_dtype)
        # The dtype the embedding table is gathered in: MindSpore's CPU Gather has no bfloat16 kernel, so there a bf16
        # table is cast to the compute dtype first (a transient copy of the table per forward); Ascend gathers bf16.
        self.table_dtype = (self.compute_dtype if self.param_dtype == ms.bfloat16
                            and ms.get_context("device_target") == "CPU" else self.param_dtype)

    def layer(self, index: int) -> "Qwen2Weights":
        """Decoder layer ``index``'s Parameters alone (the same objects), addressed as layer 0: a layer Cell that
        holds nothing else compiles to the same graph for every layer (see :func:`reused_layer`)."""
        stride = len(layer_fields(self.spec.qkv_bias, self.spec.lora_fields))
        view = copy.copy(self)
        start = self.layer_base + index * stride
        view.params = ParameterTuple(self.params[start:start + stride])
        view.layer_base = 0
        return view

    def graph_key(self) -> str:
        """Everything but the weights' values that a layer's graph depends on."""
        return repr((self.spec, str(self.param_dtype), str(self.compute_dtype), str(self.table_dtype),
                     tuple((tuple(p.shape), str(p.dtype)) for p in self.params)))


def reused_layer(init):
    """Decorates a decoder-layer Cell's ``__init__`` (a Cell holding one :meth:`Qwen2Weights.layer`): MindSpore
    parses the layer's graph once and inlines it at every layer (``lazy_inline``, policy ``front``; the default
    policy keeps sub-graphs, which the CPU backend cannot run). The layer's Parameters become the sub-graph's
    inputs, so layers share the parse but not weights. At Qwen2.5-7B's depth this cuts the compile of the
    shared-prompt forward 3.7x and of its forward and backward 2.4x (``python tools/bench_compile.py``).

    Layers are reused by ``graph_key``, which the Cell sets from everything its graph depends on other than the
    Parameters (a layer holding another one's constants would silently compute with them)."""
    return ms.lazy_inline(init, attrs=["graph_key"], policy="front")


class Qwen2Blocks(nn.Cell):
    """Decoder building blocks over a :class:`Qwen2Weights` (``auto_prefix=False``: the actor's Parameter names
    are never rewritten). ``cache_len`` sizes the RoPE tables; ``kv_cache`` is the rollout graphs' cache (empty for
    the training-side forward)."""

    def __init__(self, weights: Qwen2Weights, cache_len: int, kv_cache: ParameterTuple):
        super().__init__(auto_prefix=False)
        spec = weights.spec
        self.weights = weights.params
        self.layer_base = weights.layer_base
        self.kv_cache = kv_cache
        self.num_layers, self.hidden = spec.num_layers, spec.hidden_size
        # this rank's heads (all of them without tensor parallelism)
        self.heads, self.kv_heads, self.groups, self.head_dim = (spec.local_heads, spec.local_kv_heads,
                                                                 spec.kv_groups, spec.head_dim)
        self.context_width = self.heads * self.head_dim  # attention output width on this rank
        self.comm = TPComm(spec.tp_group, spec.tp_size, spec.tp_rank)
        self.vocab_start = spec.vocab_start
        self.half = spec.head_dim // 2
        self.eps, self.qkv_bias = spec.rms_norm_eps, spec.qkv_bias
        self.scale = 1.0 / float(np.sqrt(spec.head_dim))
        self.dtype = weights.compute_dtype
        # per weight: the RMSNorm scales stay float32 whatever the others are stored in (Qwen2Model)
        self.cast_at = tuple(param.dtype != weights.compute_dtype for param in weights.params)
        self.cast_table = weights.table_dtype != weights.param_dtype
        self.lm_head = weights.lm_head_index
        self.cache_len = cache_len
        cos, sin = rope_tables(spec.head_dim, spec.rope_theta, cache_len)
        self.cos, self.sin = Tensor(cos), Tensor(sin)
        # M-RoPE: (t/h/w row, first dim, width) of each rotary-dim chunk; the half-dim sections come twice, as the
        # tables hold each frequency in both halves
        self.mrope_chunks = tuple(mrope_chunks(spec.mrope_section))
        fields = layer_fields(spec.qkv_bias, spec.lora_fields)
        self.stride = len(fields)
        # per backbone field: the offsets of its LoRA A and B, or -1 (graph constants: no adapter, no product)
        self.lora_a_at = tuple(fields.index(f"{f}.lora_a") if f"{f}.lora_a" in fields else -1 for f in fields)
        self.lora_b_at = tuple(fields.index(f"{f}.lora_b") if f"{f}.lora_b" in fields else -1 for f in fields)
        self.lora_scale = spec.lora_scale
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
        self.matmul_t = ops.MatMul(transpose_b=True)  # x [rows, in] @ W[out, in]^T with W as stored
        self.softmax = Softmax()
        self.head_outside = False  # a training-side pass may return the normed states instead (``_pass_output``)

    # Layout: between attention blocks the hidden states are feature-major, hT [hidden, rows], so every weight
    # product is ``W @ hT`` with the [out, in] weight as stored. MindSpore's CPU MatMul with ``transpose_b`` (what
    # ``x @ W.T`` needs) is 2-3x slower at these shapes; transposing the small activations instead is cheap, and
    # the weights stay the actor's own. Blocks also use as few ops as the math allows (each op costs a launch):
    # SiLU, one RoPE for q and k together, rotate-half as one matmul.
    def _param(self, index: int, after=None):
        """Weight ``index`` in the compute dtype. A weight stored in another dtype is cast at use; with ``after``
        (the activation it multiplies) the cast waits for it, so a graph holds one layer's cast weights at a time
        instead of casting every weight up front (they depend on nothing else): a bf16 Qwen2.5-7B cast whole to
        float32 would need 30 GB beside its 15 GB of weights."""
        weight = self.weights[index]
        if self.cast_at[index]:
            if after is not None:
                weight = ops.depend(weight, after)
            weight = ops.cast(weight, self.dtype)
        return weight

    def _w(self, layer: int, field: int, after=None):
        return self._param(self.layer_base + layer * self.stride + field, after)

    def _table_and_head(self):
        """The embedding table and the lm_head weight, each read once for the whole graph; a tied head is the
        table's own read, cast once. Reading one Parameter twice across a graph's KV-cache writes makes MindSpore
        copy it for each read (TensorMove: the whole table; CPU has no bfloat16 TensorMove), and casting it twice
        makes the backward add two bfloat16 gradients (CPU has no bfloat16 AddN): once, the float32 gradients add
        up before the one cast back."""
        table = self.weights[0]
        if self.lm_head != 0:
            return table, self.weights[self.lm_head]
        if self.cast_at[0]:
            table = ops.cast(table, self.dtype)
        return table, table

    def _embed_t(self, tokens, table):
        """Embeddings of tokens [rows], feature-major [hidden, rows] (``table``: see :meth:`_embed_rows`)."""
        return self._embed_rows(tokens, table).T

    def _f32(self, x):
        return ops.cast(x, ms.float32) if self.low_precision else x

    def _compute(self, x):
        return ops.cast(x, self.dtype) if self.low_precision else x

    def _rms_norm_t(self, x, weight):
        """RMSNorm of feature-major x [hidden, rows] (in float32, as MindFormers)."""
        h = self._f32(x)
        h = h * ops.rsqrt(ops.mean(ops.square(h), 0, keep_dims=True) + self.eps)
        return self._compute(h) * weight.reshape((-1, 1))

    def _proj_t(self, layer: int, weight: int, x):
        """W x for feature-major x [in, rows], plus the weight's LoRA term s B (A x) when it has adapters."""
        y = ops.matmul(self._w(layer, weight, x), x)
        if self.lora_a_at[weight] >= 0:
            down = ops.matmul(self._w(layer, self.lora_a_at[weight]), x) * self.lora_scale  # [rank, rows]
            y = y + ops.matmul(self._w(layer, self.lora_b_at[weight]), down)
        return y

    def _proj_rows(self, layer: int, weight: int, x):
        """x W^T for row-major x [rows, in], plus the weight's LoRA term s (x A^T) B^T when it has adapters."""
        y = self.matmul_t(x, self._w(layer, weight, x))
        if self.lora_a_at[weight] >= 0:
            down = self.matmul_t(x, self._w(layer, self.lora_a_at[weight])) * self.lora_scale  # [rows, rank]
            y = y + self.matmul_t(down, self._w(layer, self.lora_b_at[weight]))
        return y

    def _linear_t(self, layer: int, weight: int, x, bias: int = -1):
        y = self._proj_t(layer, weight, x)
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
        """hT + o_proj(ctx) for the row-major attention output ctx [rows, heads * head_dim of this rank]."""
        return hT + self.comm.reduce_no_grad(self._proj_t(layer, self.f_wo, ctx.T))

    def _mlp(self, layer: int, hT):
        x = self._rms_norm_t(hT, self._w(layer, self.f_norm2))
        gate = self._proj_t(layer, self.f_w1, x)
        return hT + self.comm.reduce_no_grad(
            self._proj_t(layer, self.f_w2, ops.silu(gate) * self._proj_t(layer, self.f_w3, x)))

    def _logits_t(self, hT, head):
        """float32 logits over the whole vocabulary, feature-major [vocab, rows], of feature-major final hidden
        states hT [hidden, rows] (gathered over tensor-parallel ranks: the sampler needs every column; only the
        rows being decoded, never [tokens, vocab]). The caller transposes on the host: on CPU MindSpore's
        Transpose of [vocab, rows] costs as much as the product."""
        x = self._rms_norm_t(hT, self._param(1))
        return self.comm.gather_slots(self._f32(ops.matmul(self._head(head), x)), 0)

    def _head(self, head):
        """The lm_head weight as :meth:`_table_and_head` read it, in the compute dtype."""
        return ops.cast(head, self.dtype) if head.dtype != self.dtype else head

    def _attend(self, q, k, v, bias):
        """Grouped attention: q [b, kv_heads, groups*s, d], k/v [b, kv_heads, t, d], bias broadcast to scores."""
        scores = self._f32(self.bmm_t(q, k)) * self.scale + bias
        return self.bmm(self._compute(ops.softmax(scores, -1)), v)

    # Row-major blocks (x [rows, hidden]) for passes over many tokens: the prompt prefill and the training-side
    # forward. On CPU, MindSpore's Transpose and broadcasting element-wise kernels build a table of 8-byte indices
    # per output element when a graph is compiled and keep it for the graph's lifetime (two to four times the tensor
    # itself, in every compiled shape). These blocks therefore multiply by the stored weights with ``MatMul`` on
    # transposed operands, expand broadcast operands with ``Tile`` (index-free) and run attention one KV head at a
    # time on column slices, so they need no such table. (The decode graph keeps the feature-major blocks above:
    # its tensors are a few rows, and it is bound by kernel launches, which Tile would add.)
    def _embed_rows(self, tokens, table):
        """Embedding rows [rows, hidden] in the compute dtype, from the table as :meth:`_table_and_head` read it (cast
        before the lookup where the device cannot gather its dtype, see ``Qwen2Weights.table_dtype``; else the rows
        after it)."""
        if self.cast_table and table.dtype != self.dtype:
            table = ops.cast(table, self.dtype)
        h = embed_lookup(self.comm, table, tokens, self.vocab_start)
        return ops.cast(h, self.dtype) if h.dtype != self.dtype else h

    def _rope_rows(self, positions):
        """cos/sin [rows, heads + kv_heads, head_dim] for flat positions, shared by every layer."""
        rows, width = positions.shape[0], self.heads + self.kv_heads
        cos = ops.gather(self.cos, positions, 0).reshape((rows, 1, self.head_dim))
        sin = ops.gather(self.sin, positions, 0).reshape((rows, 1, self.head_dim))
        return ops.tile(cos, (1, width, 1)), ops.tile(sin, (1, width, 1))

    def _mrope_cos_sin(self, positions):
        """M-RoPE cos/sin [rows, head_dim] for t/h/w positions [3, rows]: each rotary chunk takes the table row of
        its position row (transformers' ``apply_multimodal_rotary_pos_emb``). With three equal rows this is exactly
        the 1-row table lookup."""
        if not self.mrope_chunks:
            raise ValueError("3-row (t/h/w) position ids need a Qwen2.5-VL model: this decoder has no mrope_section")
        rows, d = positions.shape[1], self.head_dim
        cos = ops.gather(self.cos, positions.reshape((-1,)), 0).reshape((3, rows, d))
        sin = ops.gather(self.sin, positions.reshape((-1,)), 0).reshape((3, rows, d))
        return self._mrope_pick(cos, rows), self._mrope_pick(sin, rows)

    def _mrope_pick(self, table, rows: int):
        """[rows, head_dim] from per-row tables [3, rows, head_dim]: each chunk's dims from its t/h/w row."""
        chunks = ()
        for row, start, width in self.mrope_chunks:
            chunks += (ops.slice(table, (row, 0, start), (1, rows, width)),)
        return ops.concat(chunks, 2).reshape((rows, self.head_dim))

    def _mrope_rows(self, positions):
        """:meth:`_rope_rows` for M-RoPE positions [3, rows]: cos/sin [rows, heads + kv_heads, head_dim]."""
        rows, width = positions.shape[1], self.heads + self.kv_heads
        cos, sin = self._mrope_cos_sin(positions)
        return (ops.tile(cos.reshape((rows, 1, self.head_dim)), (1, width, 1)),
                ops.tile(sin.reshape((rows, 1, self.head_dim)), (1, width, 1)))

    def _rms_norm_rows(self, x, weight):
        h = self._f32(x)
        scale = ops.rsqrt(ops.mean(ops.square(h), -1, keep_dims=True) + self.eps)
        h = self._compute(h * ops.tile(scale, (1, h.shape[1])))
        return h * ops.tile(weight.reshape((1, -1)), (h.shape[0], 1))

    def _linear_rows(self, layer: int, weight: int, x, bias: int = -1):
        y = self._proj_rows(layer, weight, x)
        if bias >= 0:
            y = y + ops.tile(self._w(layer, bias).reshape((1, -1)), (y.shape[0], 1))
        return y

    def _qkv_rows(self, layer: int, x, cos, sin):
        """RoPE'd q [rows, heads, d], k [rows, kv_heads, d] and v [rows, kv_heads, d] (this rank's heads)."""
        h = self.comm.enter(self._rms_norm_rows(x, self._w(layer, self.f_norm1)))
        use_bias = self.qkv_bias
        rows = h.shape[0]
        qk = ops.concat((self._linear_rows(layer, self.f_wq, h, self.f_bq if use_bias else -1),
                         self._linear_rows(layer, self.f_wk, h, self.f_bk if use_bias else -1)), 1)
        qk = self._rope(qk.reshape((rows, self.heads + self.kv_heads, self.head_dim)), cos, sin)
        v = self._linear_rows(layer, self.f_wv, h, self.f_bv if use_bias else -1)
        return qk[:, :self.heads], qk[:, self.heads:], v.reshape((rows, self.kv_heads, self.head_dim))

    def _attention_out_rows(self, layer: int, x, ctx):
        return x + self.comm.reduce(self._proj_rows(layer, self.f_wo, ctx))

    def _mlp_rows(self, layer: int, x):
        h = self.comm.enter(self._rms_norm_rows(x, self._w(layer, self.f_norm2)))
        gate = self._linear_rows(layer, self.f_w1, h)
        return x + self.comm.reduce(self._proj_rows(layer, self.f_w2,
                                                    ops.silu(gate) * self._linear_rows(layer, self.f_w3, h)))

    def _logits_rows(self, x, head):
        """float32 logits [rows, vocab of this rank] of final hidden states x [rows, hidden]: with tensor
        parallelism each rank projects onto its own vocabulary slice (see mindgrpo.parallel.layers)."""
        return self._f32(self.matmul_t(self.comm.enter(self._rms_norm_rows(x, self._param(1))), self._head(head)))

    def head_requires_grad(self) -> bool:
        """Whether the head's weight trains (full parameters; frozen under LoRA and in frozen roles)."""
        return bool(self.weights[self.lm_head].requires_grad)

    def _pass_output(self, x, head, shape: tuple):
        """A training-side pass's result from its final hidden states x [rows, hidden] (rows = prod(shape)): the
        logits ``[*shape, vocab]``, or with ``head_outside`` (set by the pass: the caller applies the head itself,
        :mod:`mindgrpo.ops.head_logprobs`) the normed states ``[*shape, hidden]`` and the head weight as this
        graph read it (a tied head is the embedding table's one read)."""
        if self.head_outside:
            return self._f32(self._rms_norm_rows(x, self._param(1))).reshape(shape + (-1,)), self._head(head)
        return self._logits_rows(x, head).reshape(shape + (-1,))

    def _scores_softmax(self, scores, bias):
        return self._compute(self.softmax(self._f32(scores) * self.scale + bias))

    def _causal_bias_rows(self, key_valid, s: int):
        """Additive float32 bias [B, S * groups, S] for causal attention within left-padded rows (key_valid [B, S],
        1 on real tokens); query rows are position-major, then query head of the KV head."""
        b, grp = key_valid.shape[0], self.groups
        causal = ops.tile(ops.tril(ops.ones((s, s), ms.float32)).reshape((s, 1, s)), (1, grp, 1))
        allowed = (ops.tile(causal.reshape((1, s * grp, s)), (b, 1, 1))
                   * ops.tile(ops.cast(key_valid, ms.float32).reshape((b, 1, s)), (1, s * grp, 1)))
        return mask_bias(allowed)

    def _heads(self, x, first: int, count: int):
        """Heads [first, first + count) of x [rows, heads, d], as [rows, count, d]. ``ops.slice``: on CPU the
        StridedSlice that ``x[:, h]`` compiles to is about 20x slower (it drops an axis element by element)."""
        return ops.slice(x, (0, first, 0), (x.shape[0], count, x.shape[2]))

    def _causal_attention_rows(self, q, k, v, bias, b: int, s: int):
        """Attention within each of b rows of s tokens: q [b*s, heads, d], k/v [b*s, kv_heads, d] -> [b*s, hidden].
        A KV head's keys are the column slice k[:, h]; its query heads are q's adjacent slice, read as ``groups``
        queries per position."""
        grp, d = self.groups, self.head_dim
        out = ()
        for h in range(self.kv_heads):
            q_h = self._heads(q, h * grp, grp).reshape((b, s * grp, d))
            ctx = self.bmm(self._scores_softmax(self.bmm_t(q_h, self._heads(k, h, 1).reshape((b, s, d))), bias),
                           self._heads(v, h, 1).reshape((b, s, d)))  # [b, s*groups, d]
            out += (ctx.reshape((b * s, grp * d)),)
        return ops.concat(out, 1)


class Softmax(nn.Cell):
    """Softmax over the last axis whose backward expands the row sums with ``Tile``: MindSpore's own backward
    subtracts a broadcast ``[..., 1]`` operand, whose kernel keeps an index table of twice the scores' size."""

    def construct(self, x):
        return ops.softmax(x, -1)

    def bprop(self, x, out, dout):
        # summed as a 2-D [rows, keys] array: MindSpore's CPU ReduceSum over the last axis of a 3-D tensor is
        # about 10x slower
        width = x.shape[-1]
        row_sums = (dout * out).reshape((-1, width)).sum(-1, keepdims=True).reshape(x.shape[:-1] + (1,))
        return ((dout - ops.tile(row_sums, (1,) * (x.ndim - 1) + (x.shape[-1],))) * out,)
