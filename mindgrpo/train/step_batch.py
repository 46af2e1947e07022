"""One micro-batch as the step graphs take it: a single named batch, a MindSpore-mutable dict of Tensors.

GRAPH mode compiles a Cell once per input structure and shape. A ``NamedTuple`` or dataclass input is folded into
the graph as a constant (every batch compiled a graph of its own, measured); a dict made ``ms.mutable`` is a graph
input like a tuple, and the graph reads its fields by name. Each key set compiles once (a Qwen2.5-VL batch adds
its image keys).

The keys:

* what the model's pass reads, named as its ``construct`` parameters and listed in its ``INPUTS``
  (:class:`~mindgrpo.models.shared_prompt.SharedPromptForward`: ``prompt_ids``, ``prompt_mask``,
  ``completion_ids`` and, with images, ``prompt_positions``, ``rope_deltas``, ``image_features``, ``image_rows``;
  :class:`~mindgrpo.models.packed_prompt.PackedPromptForward` adds ``positions``, ``segments``, ``row_prompt``,
  ``source``; :class:`~mindgrpo.models.full_sequence.CompletionForward` reads ``input_ids``, ``attention_mask``,
  ``completion_ids``). A batch holds a prefix of ``INPUTS``: the text inputs, then the image ones when it has them;
* what the loss reads (:class:`mindgrpo.train.step_graphs.GRPOLossCell`): ``loss_mask``, ``advantages``,
  ``old_logp``, ``ref_logp``, ``sampling_logp``, and ``num_items`` (padded micro-batches) or ``unpack`` and
  ``row_weights`` (packed ones, :mod:`mindgrpo.train.packing`).
"""
from __future__ import annotations

from typing import Mapping, Union

import numpy as np

import mindspore as ms
from mindspore import Tensor


def step_batch(fields: Mapping[str, Union[np.ndarray, Tensor]]) -> dict:
    """The named batch of ``fields`` (numpy arrays become Tensors without a copy where numpy allows)."""
    return ms.mutable({name: value if isinstance(value, Tensor) else Tensor(value) for name, value in fields.items()})


def pass_inputs(names, batch: dict) -> tuple:
    """Inside a graph: the batch's values of the pass inputs ``names`` it holds, in the pass's order."""
    inputs = ()
    for name in names:
        if name in batch:
            inputs = inputs + (batch[name],)
    return inputs
