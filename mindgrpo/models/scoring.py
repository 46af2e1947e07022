"""Per-token log-probs of whole sequences under a Hugging Face model folder: ``mindgrpo.logprobs``, the call a user
makes to check a model (a fine-tuned export against its base, mindgrpo against transformers).

``logprobs(model_dir, input_ids, attention_mask)`` returns ``log p(token t+1 | tokens <= t)`` as numpy
``[batch, length - 1]``, the same numbers as ``log_softmax(transformers_model(...).logits)[:, :-1]`` gathered at
``input_ids[:, 1:]``. It takes text Qwen2/Qwen2.5 folders and Qwen2.5-VL folders alike; for the latter,
``pixel_values`` and ``image_grid_thw`` (the image processor's outputs, ``mindgrpo.data.images`` or transformers')
put the images in place of the ``<|image_pad|>`` tokens.

It reuses the pieces the trainer is built from, nothing of its own: :func:`~mindgrpo.models.qwen2.build_model`
(the language model, with a Qwen2.5-VL folder's vision tower; its config and weights in either layout), the
full-sequence forward
(:class:`~mindgrpo.models.full_sequence.FullSequenceForward`) with M-RoPE positions from
:func:`~mindgrpo.models.mrope.get_rope_index` for a Qwen2.5-VL folder (plain ``cumsum(mask) - 1`` for text), and
the log-softmax of :func:`mindgrpo.algorithm.logprobs.token_logprobs`. The log-softmax runs inside the same graph
as the forward, so the ``[batch, length, vocab]`` logits never travel to the host.

:func:`logprobs` builds the model at every call (a notebook convenience). To score many batches with one model,
build a :class:`SequenceScorer` once and call it.
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Optional, Tuple, Union

import numpy as np

import mindspore as ms
from mindspore import Tensor, nn

from mindgrpo.algorithm.logprobs import token_logprobs
from mindgrpo.models.qwen2 import build_model
from mindgrpo.models.full_sequence import FullSequenceForward
from mindgrpo.hf_config import check_dtype
from mindgrpo.models.image_tokens import image_source_rows
from mindgrpo.models.mrope import get_rope_index

PathLike = Union[str, Path]
MODES = {"graph": ms.GRAPH_MODE, "pynative": ms.PYNATIVE_MODE}
# log-prob written where a token or its predecessor is padding: 0, so that sums over a row need no mask
# (NaN would poison them) and a masked mean (``(lp * m).sum() / m.sum()``) is still right
PAD_LOGPROB = 0.0
_MIN_TABLE = 64  # smallest RoPE table: tables are sized in powers of two, so lengths share compiled graphs


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: expected 'graph' (compiled, the default) or 'pynative' (op by op)")


@contextmanager
def execution_mode(mode: str):
    """Run the body in MindSpore's ``"graph"`` or ``"pynative"`` mode, then restore the caller's mode."""
    _check_mode(mode)
    previous = ms.get_context("mode")
    ms.set_context(mode=MODES[mode])
    try:
        yield
    finally:
        ms.set_context(mode=previous)


def _host(name: str, value) -> np.ndarray:
    """A numpy copy of a list, numpy array, torch tensor or MindSpore Tensor."""
    if isinstance(value, Tensor):
        return value.asnumpy()
    if hasattr(value, "detach"):  # torch, without importing it
        value = value.detach().cpu().numpy()
    try:
        return np.asarray(value)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{name}: expected an array (numpy, list, torch or MindSpore), got {type(value).__name__}") \
            from err


class _NextTokenLogprobs(nn.Cell):
    """The forward and the log-softmax in one graph: ``log p(targets[:, t] | tokens <= t)`` for every position
    ``t`` ([B, S]; the last column has no next token and is dropped by the caller)."""

    def __init__(self, forward: FullSequenceForward):
        super().__init__(auto_prefix=False)  # the model's Parameter names stay its own
        self.forward = forward

    def construct(self, input_ids, attention_mask, position_ids, targets, image_features=None, image_rows=None):
        logits = self.forward(input_ids, attention_mask, position_ids, image_features, image_rows)
        return token_logprobs(logits, targets)


class SequenceScorer:
    """A Hugging Face folder's model (and, for Qwen2.5-VL, its vision tower), built once, scoring batches:
    ``scorer(input_ids, attention_mask, pixel_values=None, image_grid_thw=None, mode="graph")`` is
    :func:`logprobs` without rebuilding the model. ``compute_dtype`` (float32, bfloat16, float16) is the dtype of
    the weights and the matmuls; log-probs are always computed in float32."""

    def __init__(self, model_dir: PathLike, *, compute_dtype: str = "float32", adapter_dir: Optional[PathLike] = None):
        check_dtype("compute_dtype", compute_dtype)
        self.model_dir = Path(model_dir)
        # a LoRA adapter folder (PEFT's format) on this base: its adapters applied, unmerged
        self.model = build_model(model_dir, role="reference", compute_dtype=compute_dtype, adapter_dir=adapter_dir)
        self.spec = self.model.spec
        self._graphs: Dict[int, _NextTokenLogprobs] = {}  # by RoPE table size

    def __call__(self, input_ids, attention_mask, pixel_values=None, image_grid_thw=None,
                 mode: str = "graph") -> np.ndarray:
        ids, mask = self._check_tokens(input_ids, attention_mask)
        has_images = pixel_values is not None or image_grid_thw is not None
        if has_images and not self.model.is_vl:
            model_type = self.model.hf_config.get("model_type")
            raise ValueError(f"{self.model_dir} is a text model (model_type={model_type!r}): it has no vision tower, "
                             "so pixel_values / image_grid_thw need a Qwen2.5-VL folder")
        if has_images and (pixel_values is None or image_grid_thw is None):
            raise ValueError("pixel_values and image_grid_thw come together (both from the image processor); "
                             f"got only {'pixel_values' if image_grid_thw is None else 'image_grid_thw'}")
        if self.model.is_vl and not has_images and np.any(ids == self.spec.image_token_id):
            raise ValueError(f"input_ids hold <|image_pad|> tokens ({self.spec.image_token_id}) but no pixel_values "
                             "/ image_grid_thw were given: pass the image processor's outputs for those images")
        positions = self._positions(ids, mask, None if image_grid_thw is None else _host("image_grid_thw",
                                                                                          image_grid_thw))
        table = max(_MIN_TABLE, 1 << int(positions.max()).bit_length())  # next power of two above every position
        targets = np.zeros_like(ids)
        targets[:, :-1] = ids[:, 1:]
        with execution_mode(mode):
            inputs = [Tensor(ids.astype(np.int32)), Tensor(mask.astype(np.int32)),
                      Tensor(positions.astype(np.int32)), Tensor(targets.astype(np.int32))]
            if has_images:
                features = self.model.vision.tower.embed_images(_host("pixel_values", pixel_values),
                                                          _host("image_grid_thw", image_grid_thw))
                rows = image_source_rows(ids, self.spec.image_token_id, features.shape[0])
                inputs += [features, Tensor(rows)]
            logp = self._graph(table)(*inputs).asnumpy()[:, :-1]
        real = (mask[:, :-1] == 1) & (mask[:, 1:] == 1)
        return np.where(real, logp, PAD_LOGPROB).astype(np.float32)

    def _check_tokens(self, input_ids, attention_mask) -> Tuple[np.ndarray, np.ndarray]:
        ids, mask = _host("input_ids", input_ids), _host("attention_mask", attention_mask)
        if ids.ndim != 2 or ids.shape[1] < 2:
            raise ValueError(f"input_ids must be [batch, length] with length >= 2 (a next token to score), got "
                             f"shape {ids.shape}")
        if not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"input_ids must hold integer token ids, got dtype {ids.dtype}")
        if mask.shape != ids.shape:
            raise ValueError(f"attention_mask has shape {mask.shape}, input_ids {ids.shape}: they must match "
                             "(1 = real token, 0 = padding)")
        if not np.isin(mask, (0, 1)).all():
            raise ValueError("attention_mask must hold only 0 (padding) and 1 (real token)")
        bad = (ids < 0) | (ids >= self.spec.vocab_size)
        if bad.any():
            row, col = np.argwhere(bad)[0]
            raise ValueError(f"input_ids[{row}, {col}] = {ids[row, col]} is outside the vocabulary of "
                             f"{self.model_dir} (0 .. {self.spec.vocab_size - 1}): tokenized with another tokenizer?")
        return ids.astype(np.int64), mask.astype(np.int64)

    def _positions(self, ids: np.ndarray, mask: np.ndarray, image_grid_thw: Optional[np.ndarray]) -> np.ndarray:
        """Position ids as transformers computes them: M-RoPE's three rows for a Qwen2.5-VL folder (with or without
        images), else ``cumsum(mask) - 1`` (0 on padding, which no real token attends to)."""
        if self.model.is_vl:
            positions, _ = get_rope_index(ids, image_grid_thw, mask, image_token_id=self.spec.image_token_id,
                                          vision_start_token_id=self.spec.vision_start_token_id,
                                          spatial_merge_size=self.spec.spatial_merge_size)
            return positions
        return np.where(mask == 1, np.cumsum(mask, 1) - 1, 0)

    def _graph(self, table: int) -> _NextTokenLogprobs:
        if table not in self._graphs:
            self._graphs[table] = _NextTokenLogprobs(self.model.full_sequence(table))
        return self._graphs[table]


def logprobs(model_dir: PathLike, input_ids, attention_mask, pixel_values=None, image_grid_thw=None,
             mode: str = "graph", adapter_dir: Optional[PathLike] = None) -> np.ndarray:
    """Per-token log-probs ``[batch, length - 1]`` (float32 numpy) of ``input_ids`` under the Hugging Face folder
    ``model_dir`` (Qwen2/Qwen2.5 or Qwen2.5-VL): column ``t`` is ``log p(input_ids[:, t+1] | input_ids[:, :t+1])``.

    * ``input_ids``, ``attention_mask``: ``[batch, length]`` (numpy, lists, torch or MindSpore); the mask is 1 on
      real tokens, 0 on padding (left or right). Column ``t`` is **0** (:data:`PAD_LOGPROB`) where token ``t`` or
      ``t+1`` is padding, so the result can be summed per row without a mask.
    * ``pixel_values`` ``[patches, C*T*P*P]`` and ``image_grid_thw`` ``[images, 3]``: the image processor's
      outputs for the images of the batch, in order (Qwen2.5-VL folders only); the prompts hold each image as
      ``<|vision_start|>`` and its ``<|image_pad|>`` tokens, as the processor expands them.
    * ``mode``: ``"graph"`` (compiled, faster for long inputs) or ``"pynative"``; the caller's MindSpore mode is
      restored afterwards.

    * ``adapter_dir``: a LoRA adapter folder (PEFT's ``adapter_config.json`` + ``adapter_model.safetensors``, as a
      mindgrpo LoRA checkpoint's ``model/`` holds) applied on ``model_dir``, the base.

    Builds the model on every call; use :class:`SequenceScorer` to score many batches with one model.
    """
    _check_mode(mode)  # before the (slow) build
    return SequenceScorer(model_dir, adapter_dir=adapter_dir)(input_ids, attention_mask, pixel_values,
                                                              image_grid_thw, mode=mode)
