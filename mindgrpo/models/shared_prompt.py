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

    def construct(self, prompt_ids, prompt_mask, completion_ids):
        ng, p = prompt_ids.shape
        n, t = completion_ids.shape
        g, kv, d = self.group, self.kv_heads, self.head_dim
        valid = ops.cast(prompt_mask, ms.int32)
        prompt_pos = ops.maximum(ops.cumsum(valid, 1) - 1, 0)
        lengths = ops.cast(valid.sum(1), ms.int32)
        completion_pos = lengths.reshape((ng, 1, 1)) + ops.arange(t, dtype=ms.int32).reshape((1, 1, t))
        completion_pos = ops.broadcast_to(completion_pos, (ng, g, t))
        positions = ops.concat((ops.cast(prompt_pos, ms.int32).reshape((-1,)), completion_pos.reshape((-1,))))
        cos = ops.gather(self.cos, positions, 0)
        sin = ops.gather(self.sin, positions, 0)
        hT = self._embed_t(ops.concat((prompt_ids.reshape((-1,)), completion_ids.reshape((-1,)))))
        bias_prompt, bias_completion = self._biases(valid, p, t)
        split = ng * p
        for i in range(self.num_layers):
            q, k, v = self._qkv(i, hT, cos, sin)  # row-major: q [rows, heads, d], k [rows, kv, d], v [rows, kv*d]
            v = v.reshape((-1, kv, d))
            ctx_prompt = self._prompt_attention(q[:split], k[:split], v[:split], bias_prompt, ng, p)
            ctx_completion = self._completion_attention(q[split:], k[split:], v[split:], k[:split], v[:split],
                                                        bias_completion, ng, p, t)
            hT = self._mlp(i, self._attention_out(i, hT, ops.concat((ctx_prompt, ctx_completion), 0)))
        # The state at position j predicts token j + 1: the prompt's last token predicts each completion's first.
        hidden = hT.shape[0]
        last_prompt = hT[:, :split].reshape((hidden, ng, 1, p))[:, :, :, p - 1:]  # [H, NG, 1, 1]
        last_prompt = ops.broadcast_to(last_prompt, (hidden, ng, g, 1))
        completion = hT[:, split:].reshape((hidden, ng, g, t))[:, :, :, :t - 1]
        predict = ops.concat((last_prompt, completion), 3).reshape((hidden, n * t))
        return self._logits(predict).reshape((n, t, -1))

    def _biases(self, valid, p: int, t: int):
        """Additive float32 score biases: prompt [NG, 1, 1, groups * P, P] (causal, pads masked) and completion
        [NG, 1, 1, groups * T, P + T] (group's real prompt keys, then causal within the completion)."""
        ng = valid.shape[0]
        key_valid = ops.cast(valid, ms.float32)
        causal_p = ops.tril(ops.ones((p, p), ms.float32))
        allowed_p = causal_p.reshape((1, p, p)) * key_valid.reshape((ng, 1, p))
        allowed_p = ops.broadcast_to(allowed_p.reshape((ng, 1, p, p)), (ng, self.groups, p, p))
        bias_prompt = ((allowed_p - 1.0) * (-MASKED_SCORE)).reshape((ng, 1, self.groups * p, p))
        prompt_keys = ops.broadcast_to(key_valid.reshape((ng, 1, p)), (ng, self.groups * t, p))
        causal_t = ops.tile(ops.tril(ops.ones((t, t), ms.float32)), (self.groups, 1))
        own_keys = ops.broadcast_to(causal_t.reshape((1, self.groups * t, t)), (ng, self.groups * t, t))
        allowed_c = ops.concat((prompt_keys, own_keys), 2)
        bias_completion = ((allowed_c - 1.0) * (-MASKED_SCORE)).reshape((ng, 1, 1, self.groups * t, p + t))
        return bias_prompt, bias_completion

    def _prompt_attention(self, q, k, v, bias, ng: int, p: int):
        """Causal attention within each prompt: q [NG*P, heads, d], k/v [NG*P, kv, d] -> [NG*P, hidden]."""
        kv, d = self.kv_heads, self.head_dim
        q = q.reshape((ng, p, self.heads, d)).transpose((0, 2, 1, 3)).reshape((ng, kv, self.groups * p, d))
        k = k.reshape((ng, p, kv, d)).transpose((0, 2, 1, 3))
        v = v.reshape((ng, p, kv, d)).transpose((0, 2, 1, 3))
        ctx = self._attend(q, k, v, bias)  # [NG, kv, groups*P, d]
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
        scores = ops.concat((self._f32(to_prompt), self._f32(to_own.reshape((ng, kv, g, grp * t, t)))), 4)
        probs = self._compute(ops.softmax(scores * self.scale + bias, -1))
        ctx = (self.bmm(probs[..., :p].reshape((ng, kv, rows, p)), v_prompt).reshape((ng * kv * g, grp * t, d))
               + self.bmm(probs[..., p:].reshape((ng * kv * g, grp * t, t)), v_own.reshape((ng * kv * g, t, d))))
        # [NG, kv, G, groups, T, d] -> [NG, G, T, kv, groups, d] = [N*T, hidden]
        ctx = ctx.reshape((ng, kv, g, grp, t, d)).transpose((0, 2, 4, 1, 3, 5))
        return ctx.reshape((ng * g * t, self.hidden))

