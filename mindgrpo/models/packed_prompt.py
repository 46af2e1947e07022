"""Packed shared-prompt forward: completions without padding, several to a row, each attending to its own prompt.

:class:`~mindgrpo.models.SharedPromptForward` scores ``G`` completions per prompt, each right-padded to the
generation limit. This forward takes the packed rows of :mod:`mindgrpo.train.packing` instead: a row holds
completions of one group end to end, the forward holds the distinct prompts of its rows in ``S`` slots (left-padded,
computed once each), and ``row_prompt`` names each row's slot. Attention is that of the shared forward per
completion:

* prompt queries attend causally within their prompt (left padding masked);
* completion queries attend to their row's prompt (its keys gathered per row, one product per row) and causally
  to the earlier tokens of their own segment of the row; one softmax runs over both parts.

Positions are given per token (the prompt's real length + t), and ``source`` names the hidden state that predicts
each token (the previous token of its segment, the prompt's last for its first), so the logits, log-probs and
gradients are those of the padded forward (``tests/test_packing.py``). The blocks are :class:`Qwen2Blocks`'
row-major ones, tensor-parallel like the shared forward's, and ``recompute`` marks each layer as there.
Qwen2.5-VL prompts take their M-RoPE positions and image features in their slots, as the shared forward's
(:class:`~mindgrpo.models.shared_prompt.PromptBlocks`).
"""
from __future__ import annotations

import mindspore as ms
from mindspore import ParameterTuple, nn, ops

from mindgrpo.models.attention_bias import mask_bias
from mindgrpo.models.qwen2_blocks import Qwen2Blocks, Qwen2Weights, reused_layer
from mindgrpo.models.shared_prompt import PromptBlocks


class PackedPromptForward(PromptBlocks):
    """``(prompt_ids [S, P], prompt_mask [S, P], completion_ids [R, W], positions [R, W], segments [R, W],
    row_prompt [R], source [R * W])`` -> logits ``[R, W, V]`` (see :class:`mindgrpo.train.packing.MicroBatch`).

    A row's unused tail (segment 0) attends to itself and is scored like any token; its log-probs are never read.

    Qwen2.5-VL slots add ``prompt_positions`` int32 ``[3, S, P]`` (:func:`~mindgrpo.models.mrope.get_rope_index` of
    the slots' prompts) and, when they hold images, ``image_features [N, hidden]`` (the slots' images in slot order)
    with ``image_rows`` int32 ``[S * P]`` (:func:`~mindgrpo.models.image_tokens.image_source_rows` of
    ``prompt_ids``). ``positions`` then continue each prompt's ``rope_delta`` (``P + rope_delta + t``), which the
    host computes as it computes the text ones.
    """

    def __init__(self, model: nn.Cell, max_positions: int, recompute: bool = False, adapters: bool = True,
                 head_outside: bool = False):
        weights = model.decoder_weights(adapters)
        super().__init__(weights, max_positions, ParameterTuple(()))
        self.head_outside = head_outside
        self.layers = nn.CellList([PackedPromptLayer(weights.layer(i)) for i in range(self.num_layers)],
                                    auto_prefix=False)
        if recompute:
            for layer in self.layers:
                layer.recompute()

    INPUTS = ("prompt_ids", "prompt_mask", "completion_ids", "positions", "segments", "row_prompt", "source",
              "prompt_positions", "image_features", "image_rows")
    """The names of the inputs, for :mod:`mindgrpo.train.step_batch`."""

    def construct(self, prompt_ids, prompt_mask, completion_ids, positions, segments, row_prompt, source,
                  prompt_positions=None, image_features=None, image_rows=None):
        r, w = completion_ids.shape
        table, head = self._table_and_head()
        valid = ops.cast(prompt_mask, ms.int32)
        if prompt_positions is None:
            prompt_pos = ops.cast(ops.maximum(ops.cumsum(valid, 1) - 1, 0), ms.int32)
            cos, sin = self._rope_rows(ops.concat((prompt_pos.reshape((-1,)), positions.reshape((-1,)))))
            x = self._embed_rows(ops.concat((prompt_ids.reshape((-1,)), completion_ids.reshape((-1,)))), table)
        else:
            x, cos, sin = self._vl_prompt_rows(prompt_ids, prompt_positions, image_features, image_rows, table)
            completion_cos, completion_sin = self._rope_rows(positions.reshape((-1,)))
            cos, sin = ops.concat((cos, completion_cos)), ops.concat((sin, completion_sin))
            x = ops.concat((x, self._embed_rows(completion_ids.reshape((-1,)), table)))
        bias_prompt = self._causal_bias_rows(valid, prompt_ids.shape[1])
        bias_completion = self._packed_bias(valid, segments, row_prompt)
        for layer in self.layers:
            x = layer(x, cos, sin, bias_prompt, bias_completion, row_prompt)
        return self._pass_output(ops.gather(x, source, 0), head, (r, w))

    def _packed_bias(self, valid, segments, row_prompt):
        """Additive float32 bias [R, W * groups, P + W] for completion queries (built once, shared by every layer and
        KV head): the row's real prompt keys, then the earlier keys of the query's own segment; query rows are
        position-major, then query head."""
        r, w = segments.shape
        p, grp = valid.shape[1], self.groups
        prompt_keys = ops.tile(ops.cast(ops.gather(valid, row_prompt, 0), ms.float32).reshape((r, 1, p)),
                               (1, w * grp, 1))
        same = ops.cast(ops.equal(ops.tile(segments.reshape((r, w, 1)), (1, 1, w)),
                                  ops.tile(segments.reshape((r, 1, w)), (1, w, 1))), ms.float32)
        own = same * ops.tile(ops.tril(ops.ones((w, w), ms.float32)).reshape((1, w, w)), (r, 1, 1))
        own_keys = ops.tile(own.reshape((r, w, 1, w)), (1, 1, grp, 1)).reshape((r, w * grp, w))
        return mask_bias(ops.concat((prompt_keys, own_keys), 2))


class PackedPromptLayer(Qwen2Blocks):
    """A decoder layer of :class:`PackedPromptForward`: ``(x [S*P + R*W, hidden], cos, sin, bias_prompt
    [S, P*groups, P], bias_completion [R, W*groups, P+W], row_prompt [R])`` -> the layer's output hidden states
    (prompt rows, then completion rows), over its layer's Parameters (see ``SharedPromptLayer``)."""

    @reused_layer
    def __init__(self, weights: Qwen2Weights):
        super().__init__(weights, 1, ParameterTuple(()))
        self.graph_key = weights.graph_key()

    def construct(self, x, cos, sin, bias_prompt, bias_completion, row_prompt):
        s, p = bias_prompt.shape[0], bias_prompt.shape[2]
        split, i = s * p, 0  # the Cell's weights are its layer's alone, addressed as layer 0
        q, k, v = self._qkv_rows(i, x, cos, sin)
        ctx_prompt = self._causal_attention_rows(q[:split], k[:split], v[:split], bias_prompt, s, p)
        ctx_completion = self._packed_attention(q[split:], k[split:], v[split:], k[:split], v[:split],
                                                bias_completion, row_prompt, s, p)
        return self._mlp_rows(i, self._attention_out_rows(i, x, ops.concat((ctx_prompt, ctx_completion), 0)))

    def _packed_attention(self, q, k, v, k_prompt, v_prompt, bias, row_prompt, s: int, p: int):
        """Completion queries over [row's prompt keys | own row's keys]: q [R*W, heads, d] -> [R*W, hidden]."""
        r = row_prompt.shape[0]
        w, grp, d = bias.shape[2] - p, self.groups, self.head_dim
        out = ()
        for h in range(self.kv_heads):
            q_h = self._heads(q, h * grp, grp).reshape((r, w * grp, d))
            k_p = ops.gather(self._heads(k_prompt, h, 1).reshape((s, p, d)), row_prompt, 0)  # [R, P, d]: row's prompt
            v_p = ops.gather(self._heads(v_prompt, h, 1).reshape((s, p, d)), row_prompt, 0)
            k_own, v_own = self._heads(k, h, 1).reshape((r, w, d)), self._heads(v, h, 1).reshape((r, w, d))
            probs = self._scores_softmax(ops.concat((self.bmm_t(q_h, k_p), self.bmm_t(q_h, k_own)), 2), bias)
            ctx = (self.bmm(ops.slice(probs, (0, 0, 0), (r, w * grp, p)), v_p)
                   + self.bmm(ops.slice(probs, (0, 0, p), (r, w * grp, w)), v_own))
            out += (ctx.reshape((r * w, grp * d)),)
        return ops.concat(out, 1)
