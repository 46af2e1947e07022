"""The plain full-sequence forward over :class:`~mindgrpo.models.qwen2_blocks.Qwen2Blocks`: every token of every
(padded) row through the decoder, logits at every position, with image features in place of the
``<|image_pad|>`` tokens and Qwen2.5-VL's 3-row M-RoPE positions.

It is the forward for scoring whole sequences of a text or Qwen2.5-VL model (no prompt sharing, no KV cache), and
the one the parity tests hold against transformers' ``Qwen2_5_VLForConditionalGeneration``
(``tests/test_mrope.py``). The host prepares what depends on token values: the positions
(:func:`mindgrpo.models.mrope.get_rope_index` for VL prompts, ``cumsum(mask) - 1`` for text) and which rows read
image features (:func:`mindgrpo.models.image_tokens.image_source_rows`), so the graph has static shapes.
"""
from __future__ import annotations

import mindspore as ms
from mindspore import ParameterTuple, nn, ops

from mindgrpo.models.image_tokens import merge_image_features
from mindgrpo.models.qwen2_blocks import Qwen2Blocks


class FullSequenceForward(Qwen2Blocks):
    """``(input_ids [B, S], attention_mask [B, S], position_ids, image_features=None, image_rows=None)`` -> float32
    logits ``[B, S, V]`` (this rank's vocabulary slice under tensor parallelism).

    * ``attention_mask``: 1 on real tokens (padding on either side); attention is causal within each row.
    * ``position_ids``: int32 ``[B, S]`` (plain RoPE) or ``[3, B, S]`` (M-RoPE t/h/w rows; a Qwen2.5-VL model),
      all below ``max_positions``. None: ``cumsum(mask) - 1`` (clipped at 0), so a left-padded row gets the
      positions of the same tokens unpadded.
    * ``image_features``: the vision tower's merged features ``[N, hidden]``; ``image_rows`` int32 ``[B * S]`` from
      :func:`~mindgrpo.models.image_tokens.image_source_rows`. Both None for text.

    Logits at padding positions are finite but meaningless (their queries see no real key).
    """

    def __init__(self, model: nn.Cell, max_positions: int, adapters: bool = True):
        super().__init__(model.decoder_weights(adapters), max_positions, ParameterTuple(()))

    def construct(self, input_ids, attention_mask, position_ids=None, image_features=None, image_rows=None):
        b, s = input_ids.shape
        table, head = self._table_and_head()
        return self._logits_rows(self._hidden_rows(table, input_ids, attention_mask, position_ids, image_features,
                                                   image_rows), head).reshape((b, s, -1))

    def _hidden_rows(self, table, input_ids, attention_mask, position_ids, image_features, image_rows):
        """The decoder's output rows ``[B * S, hidden]``, before the final norm (which ``_logits_rows`` applies)."""
        b, s = input_ids.shape
        if position_ids is None:
            valid = ops.cast(attention_mask, ms.int32)
            position_ids = ops.maximum(ops.cumsum(valid, 1) - 1, 0)
        x = self._embed_rows(input_ids.reshape((-1,)), table)
        if image_features is not None:
            x = merge_image_features(x, self._compute(image_features), image_rows)
        if position_ids.ndim == 3:
            cos, sin = self._mrope_rows(position_ids.reshape((3, b * s)))
        else:
            cos, sin = self._rope_rows(position_ids.reshape((-1,)))
        bias = self._causal_bias_rows(ops.cast(attention_mask, ms.int32), s)
        for i in range(self.num_layers):
            q, k, v = self._qkv_rows(i, x, cos, sin)
            x = self._mlp_rows(i, self._attention_out_rows(i, x, self._causal_attention_rows(q, k, v, bias, b, s)))
        return x


class CompletionForward(FullSequenceForward):
    """``(input_ids [B, S], attention_mask [B, S], completion_ids [B, T])`` -> float32 logits ``[B, T, V]`` of the
    last ``T`` tokens of each ``[prompt | completion]`` row (left-padded prompts, right-padded completions): only
    those positions are projected to the vocabulary. The forward of training and scoring with
    ``rl_config.share_prompt: false``."""

    INPUTS = ("input_ids", "attention_mask", "completion_ids")
    """The names of the inputs, for :mod:`mindgrpo.train.step_batch`."""

    def __init__(self, model: nn.Cell, max_positions: int, adapters: bool = True, head_outside: bool = False):
        super().__init__(model, max_positions, adapters)
        self.head_outside = head_outside

    def construct(self, input_ids, attention_mask, completion_ids):
        b, s = input_ids.shape
        width = completion_ids.shape[1]
        table, head = self._table_and_head()
        x = self._hidden_rows(table, input_ids, attention_mask, None, None, None).reshape((b, s, -1))
        # The hidden state at position i predicts token i + 1: the completion is predicted from s - width - 1 on.
        rows = x[:, s - width - 1: s - 1].reshape((b * width, -1))
        return self._pass_output(rows, head, (b, width))
