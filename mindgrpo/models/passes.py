"""What a training-side pass of a :class:`~mindgrpo.models.qwen2.Qwen2Model` is to the step graphs that call it.

The model makes three (:meth:`~mindgrpo.models.qwen2.Qwen2Model.completions`, ``shared_prompt`` and ``packed``);
:mod:`mindgrpo.train.step_graphs` turns their output into log-probs, entropies and the loss, whichever it gets. Each
is a Cell over the model's own Parameters (:class:`~mindgrpo.models.qwen2_blocks.Qwen2Blocks`), so this is what
they share, written down once instead of read off whichever pass came.
"""
from __future__ import annotations

from typing import Protocol, Tuple, runtime_checkable

from mindgrpo.parallel.layers import TPComm


@runtime_checkable
class ModelPass(Protocol):
    """A forward of a micro-batch's completions: ``pass_(*inputs)`` with the batch's values of :attr:`INPUTS` (a
    prefix of them: the text inputs, then a Qwen2.5-VL batch's image ones) returns float32 logits ``[rows, T, vocab of this rank]`` at the positions that predict each completion token, or,
    with :attr:`head_outside`, the normed final states ``[rows, T, hidden]`` and the head weight, for a caller that
    applies the head itself (:mod:`mindgrpo.ops.head_logprobs`)."""

    INPUTS: Tuple[str, ...]
    """The names of the pass's inputs, in order, as a step batch names them (:mod:`mindgrpo.train.step_batch`)."""
    comm: TPComm
    """The tensor-parallel group the pass's collectives run in (``comm.size`` 1: the whole model)."""
    vocab_start: int
    """The first vocabulary id of this rank's slice of the logits (0 at ``model_parallel`` 1)."""
    head_outside: bool
    """The pass returns the normed states and the head weight instead of the logits."""

    def __call__(self, *inputs):
        """The logits (or, with :attr:`head_outside`, the normed states and the head weight)."""

    def head_requires_grad(self) -> bool:
        """Whether the head's weight trains (full parameters; frozen under LoRA and in frozen roles)."""
