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
left-padded row. Qwen2.5-VL prompts come with their M-RoPE positions and image features instead (see
:class:`PromptBlocks`): the vision tower's output enters once per prompt, not once per completion.

The result is the float32 logits at the positions that predict each completion token (the prompt's last token for
``t = 0``), so the vocabulary is projected only where log-probs are needed. The math is
:class:`~mindgrpo.models.qwen2_blocks.Qwen2Blocks` over the model's own Parameters, so gradients reach them and the
log-probs equal the unshared forward over ``[prompt | completion]`` rows (``tests/test_shared_prompt.py``).

The blocks are :class:`Qwen2Blocks`' row-major, table-free ones (see there why that matters for memory on CPU).
Each decoder layer is its own small Cell (:class:`SharedPromptLayer`, over the same Parameters), so
``recompute=True`` (``actor_config.recompute``) can mark each one with ``Cell.recompute()``: the backward then keeps
only every layer's input hidden state and recomputes one layer's activations at a time from it.

Under tensor parallelism it runs each rank's slices of a :class:`~mindgrpo.models.qwen2.Qwen2Model` with the
collectives of :mod:`mindgrpo.parallel.layers`.
"""
from __future__ import annotations

import mindspore as ms
from mindspore import ParameterTuple, nn, ops

from mindgrpo.models.image_tokens import merge_image_features
from mindgrpo.models.attention_bias import mask_bias
from mindgrpo.models.qwen2_blocks import Qwen2Blocks, Qwen2Weights, reused_layer


class PromptBlocks(Qwen2Blocks):
    """:class:`Qwen2Blocks` plus the prompt rows of a Qwen2.5-VL prompt, for the forwards that compute each prompt
    once (this one and :class:`~mindgrpo.models.packed_prompt.PackedPromptForward`).

    A VL prompt's tokens read the vision tower's merged features at its ``<|image_pad|>`` tokens
    (:func:`~mindgrpo.models.image_tokens.merge_image_features`, a gather, so gradients reach the features and a
    trainable tower could learn) and are rotated by their 3-row t/h/w positions
    (:func:`~mindgrpo.models.mrope.get_rope_index`). Completions are text: their three position rows are equal,
    which is exactly the 1-row RoPE lookup, so the callers rotate them by 1-row positions continuing from the
    prompt's ``rope_delta`` (``P + rope_delta + t`` for completion token ``t`` after a prompt padded to ``P``,
    as transformers' ``generate`` decodes).
    """

    def _vl_prompt_rows(self, prompt_ids, prompt_positions, image_features, image_rows, table):
        """Embeddings ``[S * P, hidden]`` and cos/sin of the prompts' rows: ``prompt_positions`` int32
        ``[3, S, P]``; ``image_features [N, hidden]`` with ``image_rows`` int32 ``[S * P]`` from
        :func:`~mindgrpo.models.image_tokens.image_source_rows` over ``prompt_ids`` (both None: no image)."""
        s, p = prompt_ids.shape
        x = self._embed_rows(prompt_ids.reshape((-1,)), table)
        if image_features is not None:
            x = merge_image_features(x, self._compute(image_features), image_rows)
        cos, sin = self._mrope_rows(prompt_positions.reshape((3, s * p)))
        return x, cos, sin


class SharedPromptForward(PromptBlocks):
    """``(prompt_ids [NG, P], prompt_mask [NG, P], completion_ids [NG * G, T])`` -> logits ``[NG * G, T, V]``.

    ``prompt_mask`` is 1 on real prompt tokens (prompts left-padded); completion ``i`` belongs to prompt
    ``i // G``. Completion padding after EOS needs no mask: a completion's pads are seen only by its own later
    pads, whose log-probs the loss masks out anyway. ``recompute`` recomputes each decoder layer in the backward
    instead of keeping its activations (same gradients, one more forward of the layers, far less memory).

    Qwen2.5-VL prompts (each distinct prompt once, as the text ones) add ``prompt_positions`` int32 ``[3, NG, P]``
    and ``rope_deltas`` int32 ``[NG]`` or ``[NG, 1]`` (both from :func:`~mindgrpo.models.mrope.get_rope_index`),
    and when they hold images ``image_features [N, hidden]`` (the vision tower's output for their images, in
    prompt order) with ``image_rows`` int32 ``[NG * P]`` (:func:`~mindgrpo.models.image_tokens.image_source_rows`
    of ``prompt_ids``). Without them the call is the text forward, unchanged.
    """

    def __init__(self, model: nn.Cell, num_generations: int, max_positions: int, recompute: bool = False,
                 adapters: bool = True, head_outside: bool = False):
        weights = model.decoder_weights(adapters)
        super().__init__(weights, max_positions, ParameterTuple(()))
        self.head_outside = head_outside
        self.num_generations = num_generations
        self.layers = nn.CellList([SharedPromptLayer(weights.layer(i), num_generations)
                                   for i in range(self.num_layers)], auto_prefix=False)
        if recompute:
            for layer in self.layers:
                layer.recompute()

    INPUTS = ("prompt_ids", "prompt_mask", "completion_ids", "prompt_positions", "rope_deltas", "image_features",
              "image_rows")
    """The names of the inputs, for :mod:`mindgrpo.train.step_batch`."""

    def construct(self, prompt_ids, prompt_mask, completion_ids, prompt_positions=None, rope_deltas=None,
                  image_features=None, image_rows=None):
        ng, p = prompt_ids.shape
        n, t = completion_ids.shape
        g = self.num_generations
        table, head = self._table_and_head()
        valid = ops.cast(prompt_mask, ms.int32)
        steps = ops.tile(ops.arange(t, dtype=ms.int32).reshape((1, t)), (ng, g))
        if prompt_positions is None:
            prompt_pos = ops.cast(ops.maximum(ops.cumsum(valid, 1) - 1, 0), ms.int32)
            lengths = ops.cast(valid.sum(1), ms.int32)
            completion_pos = ops.tile(lengths.reshape((ng, 1)), (1, g * t)) + steps
            positions = ops.concat((prompt_pos.reshape((-1,)), completion_pos.reshape((-1,))))
            cos, sin = self._rope_rows(positions)
            x = self._embed_rows(ops.concat((prompt_ids.reshape((-1,)), completion_ids.reshape((-1,)))), table)
        else:
            x, cos, sin = self._vl_prompt_rows(prompt_ids, prompt_positions, image_features, image_rows, table)
            # completion token t sits at index P + t of the padded [prompt | completion] row
            starts = ops.cast(rope_deltas, ms.int32).reshape((ng, 1)) + p
            completion_cos, completion_sin = self._rope_rows((ops.tile(starts, (1, g * t)) + steps).reshape((-1,)))
            cos, sin = ops.concat((cos, completion_cos)), ops.concat((sin, completion_sin))
            x = ops.concat((x, self._embed_rows(completion_ids.reshape((-1,)), table)))
        bias_prompt = self._causal_bias_rows(valid, p)
        bias_completion = self._completion_bias(valid, p, t)
        for layer in self.layers:
            x = layer(x, cos, sin, bias_prompt, bias_completion)
        # The state at position j predicts token j + 1: the prompt's last token predicts each completion's first.
        split, hidden = ng * p, x.shape[1]
        last_prompt = ops.tile(x[:split].reshape((ng, 1, p, hidden))[:, :, p - 1:], (1, g, 1, 1))  # [NG, G, 1, H]
        completion = x[split:].reshape((ng, g, t, hidden))[:, :, :t - 1]
        predict = ops.concat((last_prompt, completion), 2).reshape((n * t, hidden))
        return self._pass_output(predict, head, (n, t))

    def _completion_bias(self, valid, p: int, t: int):
        """Additive float32 bias [NG * G, T * groups, P + T] for completion queries (built once, shared by every layer
        and KV head): the group's real prompt keys, then causal within the completion; query rows are
        position-major, then query head."""
        ng, grp, g = valid.shape[0], self.groups, self.num_generations
        key_valid = ops.cast(valid, ms.float32)
        prompt_keys = ops.tile(key_valid.reshape((ng, 1, 1, p)), (1, g, t * grp, 1)).reshape((ng * g, t * grp, p))
        causal_t = ops.tile(ops.tril(ops.ones((t, t), ms.float32)).reshape((t, 1, t)), (1, grp, 1))
        own_keys = ops.tile(causal_t.reshape((1, t * grp, t)), (ng * g, 1, 1))
        return mask_bias(ops.concat((prompt_keys, own_keys), 2))


class SharedPromptLayer(Qwen2Blocks):
    """A decoder layer of :class:`SharedPromptForward`: ``(x [NG*P + NG*G*T, hidden], cos, sin, bias_prompt
    [NG, P*groups, P], bias_completion [NG*G, T*groups, P+T])`` -> the layer's output hidden states (prompt rows,
    then completion rows). It holds its layer's Parameters (:meth:`Qwen2Weights.layer`: the actor's objects, names
    unchanged) and no RoPE table of its own (``cos``/``sin`` come in per row), so one Cell per layer costs nothing,
    compiles once for all layers (:func:`reused_layer`) and lets ``Cell.recompute()`` mark exactly one layer."""

    @reused_layer
    def __init__(self, weights: Qwen2Weights, num_generations: int):
        super().__init__(weights, 1, ParameterTuple(()))
        self.num_generations = num_generations
        self.graph_key = repr((weights.graph_key(), num_generations))

    def construct(self, x, cos, sin, bias_prompt, bias_completion):
        ng, p = bias_prompt.shape[0], bias_prompt.shape[2]
        t = bias_completion.shape[2] - p
        split, i = ng * p, 0  # the Cell's weights are its layer's alone, addressed as layer 0
        q, k, v = self._qkv_rows(i, x, cos, sin)  # q [rows, heads, d], k [rows, kv, d], v [rows, kv, d]
        ctx_prompt = self._causal_attention_rows(q[:split], k[:split], v[:split], bias_prompt, ng, p)
        ctx_completion = self._completion_attention(q[split:], k[split:], v[split:], k[:split], v[:split],
                                                    bias_completion, ng, p, t)
        return self._mlp_rows(i, self._attention_out_rows(i, x, ops.concat((ctx_prompt, ctx_completion), 0)))

    def _completion_attention(self, q, k, v, k_prompt, v_prompt, bias, ng: int, p: int, t: int):
        """Completion queries over [group's prompt keys | own causal keys]: q [N*T, heads, d] -> [N*T, hidden].
        ``bias`` [NG*G, T*groups, P + T]."""
        g, grp, d = self.num_generations, self.groups, self.head_dim
        out = ()
        for h in range(self.kv_heads):
            q_h = self._heads(q, h * grp, grp)  # [N*T, groups, d]
            # all G completions of a group against its prompt at once, then each completion against itself
            to_prompt = self.bmm_t(q_h.reshape((ng, g * t * grp, d)), self._heads(k_prompt, h, 1).reshape((ng, p, d)))
            to_own = self.bmm_t(q_h.reshape((ng * g, t * grp, d)), self._heads(k, h, 1).reshape((ng * g, t, d)))
            probs = self._scores_softmax(ops.concat((to_prompt.reshape((ng * g, t * grp, p)), to_own), 2), bias)
            to_prompt_probs = ops.slice(probs, (0, 0, 0), (ng * g, t * grp, p)).reshape((ng, g * t * grp, p))
            own_probs = ops.slice(probs, (0, 0, p), (ng * g, t * grp, t))
            ctx = (self.bmm(to_prompt_probs, self._heads(v_prompt, h, 1).reshape((ng, p, d)))
                   .reshape((ng * g, t * grp, d))
                   + self.bmm(own_probs, self._heads(v, h, 1).reshape((ng * g, t, d))))
            out += (ctx.reshape((ng * g * t, grp * d)),)
        return ops.concat(out, 1)

