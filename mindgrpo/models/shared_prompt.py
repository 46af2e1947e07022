"""Shared-prompt forward: each prompt computed once per group, its completions attending to it (Prefix Grouper).

GRPO samples ``G`` completions per prompt. Scoring ``[prompt | completion]`` rows repeats every prompt ``G``
times; on GSM8K prompts are about 60 % of those tokens. :class:`SharedPromptForward` takes each prompt once
(``[NG, P]``, left-padded) with its ``G`` completions (``[NG * G, T]``, prompt-major) and runs all their tokens
through the decoder layers together, so every weight product sees ``NG * P + NG * G * T`` tokens instead of
``NG * G * (P + T)``. Attention is split the way the Prefix Grouper paper does it, so nothing attends to what it
must not and no key/value is repeated:

* prompt queries attend causally within their prompt (left padding masked);
* completion queries attend to their group's prompt keys (one batched product per group, all ``G`` completions
  at once) and causally to their own completion; one softmax runs over both parts.

Positions continue each prompt's real length (``prompt_len + t`` for completion token ``t``), as in an unshared
left-padded row. The result is the float32 logits at the positions that predict each completion token (the
prompt's last token for ``t = 0``), so the vocabulary is projected only where log-probs are needed. The math is
:class:`~mindgrpo.models.qwen2_blocks.Qwen2Blocks` over the model's own Parameters, so gradients reach them and the
log-probs equal the unshared MindFormers forward (``tests/test_shared_prompt.py``).

Memory: on CPU, MindSpore's ``Transpose`` and broadcasting element-wise kernels build a table of 8-byte indices per
output element at compile time and keep it for the graph's lifetime (twice to four times the tensor itself, in
every compiled shape). So this forward works row-major (tokens x features) with the weight products as ``MatMul``
with transposed operands (no ``Transpose`` kernel), expands every broadcast operand once with ``Tile`` (index-free)
and keeps transposes to the attention's head layout, the only place they are needed.

CPU and data parallel only: this forward has no sharding strategies, so tensor- or pipeline-parallel layouts on
Ascend keep MindFormers' forward (``rl_config.share_prompt: false``).
"""
from __future__ import annotations

import mindspore as ms
from mindspore import ParameterTuple, nn, ops

from mindgrpo.models.qwen2_blocks import MASKED_SCORE, Qwen2Blocks, Qwen2Weights


class SharedPromptForward(Qwen2Blocks):
    """``(prompt_ids [NG, P], prompt_mask [NG, P], completion_ids [NG * G, T])`` -> logits ``[NG * G, T, V]``.

    ``prompt_mask`` is 1 on real prompt tokens (prompts left-padded); completion ``i`` belongs to prompt
    ``i // G``. Completion padding after EOS needs no mask: a completion's pads are seen only by its own later
    pads, whose log-probs the loss masks out anyway.
    """

    def __init__(self, model: nn.Cell, num_generations: int, max_positions: int):
        super().__init__(Qwen2Weights(model), max_positions, ParameterTuple(()))
        self.group = num_generations
        self.matmul_t = ops.MatMul(transpose_b=True)  # x [rows, in] @ W[out, in]^T, W as stored

    def construct(self, prompt_ids, prompt_mask, completion_ids):
        ng, p = prompt_ids.shape
        n, t = completion_ids.shape
        g = self.group
        valid = ops.cast(prompt_mask, ms.int32)
        prompt_pos = ops.cast(ops.maximum(ops.cumsum(valid, 1) - 1, 0), ms.int32)
        lengths = ops.cast(valid.sum(1), ms.int32)
        completion_pos = ops.tile(lengths.reshape((ng, 1)), (1, g * t)) + ops.tile(
            ops.arange(t, dtype=ms.int32).reshape((1, t)), (ng, g))
        positions = ops.concat((prompt_pos.reshape((-1,)), completion_pos.reshape((-1,))))
        rows = positions.shape[0]
        heads = self.heads + self.kv_heads
        # RoPE tables per (row, q/k head), expanded once and shared by every layer
        cos = ops.tile(ops.gather(self.cos, positions, 0).reshape((rows, 1, self.head_dim)), (1, heads, 1))
        sin = ops.tile(ops.gather(self.sin, positions, 0).reshape((rows, 1, self.head_dim)), (1, heads, 1))
        x = ops.gather(self.weights[0], ops.concat((prompt_ids.reshape((-1,)), completion_ids.reshape((-1,)))), 0)
        x = self._compute(x)
        bias_prompt, bias_completion = self._biases(valid, p, t)
        split = ng * p
        for i in range(self.num_layers):
            q, k, v = self._qkv_rows(i, x, cos, sin)  # q [rows, heads, d], k [rows, kv, d], v [rows, kv, d]
            ctx_prompt = self._prompt_attention(q[:split], k[:split], v[:split], bias_prompt, ng, p)
            ctx_completion = self._completion_attention(q[split:], k[split:], v[split:], k[:split], v[:split],
                                                        bias_completion, ng, p, t)
            x = x + self.matmul_t(ops.concat((ctx_prompt, ctx_completion), 0), self._w(i, self.f_wo))
            x = self._mlp_rows(i, x)
        # The state at position j predicts token j + 1: the prompt's last token predicts each completion's first.
        hidden = x.shape[1]
        last_prompt = ops.tile(x[:split].reshape((ng, 1, p, hidden))[:, :, p - 1:], (1, g, 1, 1))  # [NG, G, 1, H]
        completion = x[split:].reshape((ng, g, t, hidden))[:, :, :t - 1]
        predict = ops.concat((last_prompt, completion), 2).reshape((n * t, hidden))
        logits = self.matmul_t(self._rms_norm_rows(predict, self._param(1)), self._param(2))
        return self._f32(logits).reshape((n, t, -1))

    # -- row-major blocks (x [rows, hidden]) -------------------------------------------------------------------
    def _rms_norm_rows(self, x, weight):
        h = self._f32(x)
        scale = ops.rsqrt(ops.mean(ops.square(h), -1, keep_dims=True) + self.eps)
        h = self._compute(h * ops.tile(scale, (1, h.shape[1])))
        return h * ops.tile(weight.reshape((1, -1)), (h.shape[0], 1))

    def _linear_rows(self, layer: int, weight: int, x, bias: int = -1):
        y = self.matmul_t(x, self._w(layer, weight))
        if bias >= 0:
            y = y + ops.tile(self._w(layer, bias).reshape((1, -1)), (y.shape[0], 1))
        return y

    def _qkv_rows(self, layer: int, x, cos, sin):
        h = self._rms_norm_rows(x, self._w(layer, self.f_norm1))
        use_bias = self.qkv_bias
        rows = h.shape[0]
        qk = ops.concat((self._linear_rows(layer, self.f_wq, h, self.f_bq if use_bias else -1),
                         self._linear_rows(layer, self.f_wk, h, self.f_bk if use_bias else -1)), 1)
        qk = self._rope(qk.reshape((rows, self.heads + self.kv_heads, self.head_dim)), cos, sin)
        v = self._linear_rows(layer, self.f_wv, h, self.f_bv if use_bias else -1)
        return qk[:, :self.heads], qk[:, self.heads:], v.reshape((rows, self.kv_heads, self.head_dim))

    def _mlp_rows(self, layer: int, x):
        h = self._rms_norm_rows(x, self._w(layer, self.f_norm2))
        gate = self._linear_rows(layer, self.f_w1, h)
        return x + self.matmul_t(ops.silu(gate) * self._linear_rows(layer, self.f_w3, h), self._w(layer, self.f_w2))

    def _biases(self, valid, p: int, t: int):
        """Additive float32 score biases, expanded to the full score shapes (shared by every layer): prompt
        [NG, kv, groups * P, P] (causal, pads masked) and completion [NG, kv, G, groups * T, P + T] (the group's
        real prompt keys, then causal within the completion)."""
        ng, kv, grp, g = valid.shape[0], self.kv_heads, self.groups, self.group
        key_valid = ops.cast(valid, ms.float32)
        causal_p = ops.tile(ops.tril(ops.ones((p, p), ms.float32)).reshape((1, p, p)), (ng, 1, 1))
        allowed_p = ops.tile((causal_p * ops.tile(key_valid.reshape((ng, 1, p)), (1, p, 1))).reshape((ng, 1, p, p)),
                             (1, kv, grp, 1)).reshape((ng, kv, grp * p, p))
        bias_prompt = (allowed_p - 1.0) * (-MASKED_SCORE)
        prompt_keys = ops.tile(key_valid.reshape((ng, 1, p)), (1, grp * t, 1))
        own_keys = ops.tile(ops.tril(ops.ones((t, t), ms.float32)).reshape((1, t, t)), (ng, grp, 1))
        allowed_c = ops.concat((prompt_keys, own_keys), 2).reshape((ng, 1, 1, grp * t, p + t))
        bias_completion = (ops.tile(allowed_c, (1, kv, g, 1, 1)) - 1.0) * (-MASKED_SCORE)
        return bias_prompt, bias_completion

    def _rope(self, x, cos, sin):
        """x [rows, heads, d] with cos/sin of the same shape: x*cos + rotate_half(x)*sin in float32."""
        x = self._f32(x)
        rotated = ops.matmul(x.reshape((-1, self.head_dim)), self.rotate).reshape(x.shape)
        return self._compute(x * cos + rotated * sin)

    def _scores_softmax(self, scores, bias):
        return self._compute(ops.softmax(self._f32(scores) * self.scale + bias, -1))

    def _prompt_attention(self, q, k, v, bias, ng: int, p: int):
        """Causal attention within each prompt: q [NG*P, heads, d], k/v [NG*P, kv, d] -> [NG*P, hidden]."""
        kv, d = self.kv_heads, self.head_dim
        q = q.reshape((ng, p, self.heads, d)).transpose((0, 2, 1, 3)).reshape((ng, kv, self.groups * p, d))
        k = k.reshape((ng, p, kv, d)).transpose((0, 2, 1, 3))
        v = v.reshape((ng, p, kv, d)).transpose((0, 2, 1, 3))
        ctx = self.bmm(self._scores_softmax(self.bmm_t(q, k), bias), v)  # [NG, kv, groups*P, d]
        return ctx.reshape((ng, self.heads, p, d)).transpose((0, 2, 1, 3)).reshape((ng * p, self.hidden))

    def _completion_attention(self, q, k, v, k_prompt, v_prompt, bias, ng: int, p: int, t: int):
        """Completion queries over [group's prompt keys | own causal keys]: q [N*T, heads, d] -> [N*T, hidden]."""
        g, kv, grp, d = self.group, self.kv_heads, self.groups, self.head_dim
        # queries [NG, kv, G, groups*T, d]: one product per group against its prompt, one per completion for itself
        q = q.reshape((ng, g, t, kv, grp, d)).transpose((0, 3, 1, 4, 2, 5))
        k_own = k.reshape((ng, g, t, kv, d)).transpose((0, 3, 1, 2, 4))  # [NG, kv, G, T, d]
        v_own = v.reshape((ng, g, t, kv, d)).transpose((0, 3, 1, 2, 4))
        k_prompt = k_prompt.reshape((ng, p, kv, d)).transpose((0, 2, 1, 3))  # [NG, kv, P, d]
        v_prompt = v_prompt.reshape((ng, p, kv, d)).transpose((0, 2, 1, 3))
        rows = g * grp * t
        to_prompt = self.bmm_t(q.reshape((ng, kv, rows, d)), k_prompt).reshape((ng, kv, g, grp * t, p))
        to_own = self.bmm_t(q.reshape((ng * kv * g, grp * t, d)), k_own.reshape((ng * kv * g, t, d)))
        probs = self._scores_softmax(ops.concat((to_prompt, to_own.reshape((ng, kv, g, grp * t, t))), 4), bias)
        ctx = (self.bmm(probs[..., :p].reshape((ng, kv, rows, p)), v_prompt).reshape((ng * kv * g, grp * t, d))
               + self.bmm(probs[..., p:].reshape((ng * kv * g, grp * t, t)), v_own.reshape((ng * kv * g, t, d))))
        # [NG, kv, G, groups, T, d] -> [NG, G, T, kv, groups, d] = [N*T, hidden]
        ctx = ctx.reshape((ng, kv, g, grp, t, d)).transpose((0, 2, 4, 1, 3, 5))
        return ctx.reshape((ng * g * t, self.hidden))
