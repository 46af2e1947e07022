"""Rollout engines: sample ``num_generations`` completions per prompt from the current policy.

One interface (:class:`RolloutEngine`: ``generate(prompts, SamplingParams) -> RolloutResult`` and
``sync_weights()``; Qwen2.5-VL prompts pass their images as :class:`PromptImages`) with three backends chosen by
name in :func:`build_rollout_engine`:

* ``native`` (default, CPU and Ascend): KV-cache decoding in MindSpore GRAPH mode over the actor's own
  Parameters; no weight copy, several times faster than MindFormers' cache-less ``generate`` on CPU.
* ``mindformers``: MindFormers' ``generate`` on a separate inference cell, weights copied on ``sync_weights``.
* ``vllm``: vllm-mindspore (Ascend only, ``pip install mindgrpo[ascend]``), imported only when chosen.
"""
from __future__ import annotations

from typing import Any

from mindgrpo.choices import ROLLOUT_BACKENDS
from mindgrpo.rollout.api import (FINISH_LENGTH, FINISH_STOP, EosIds, PromptImages, RolloutEngine, RolloutResult,
                                  SamplingParams)

__all__ = ["FINISH_LENGTH", "FINISH_STOP", "PromptImages", "RolloutEngine", "RolloutResult", "SamplingParams",
           "build_rollout_engine"]


def build_rollout_engine(backend: str, actor: Any, *, eos_token_id: EosIds, pad_token_id: int,
                         max_prompt_length: int, max_batch_size: int = 32, **options: Any) -> RolloutEngine:
    """Create the rollout engine ``backend`` for ``actor``.

    Args:
        backend: one of the registry's ``ROLLOUT_BACKENDS`` (``"native"``, ``"mindformers"`` or ``"vllm"``).
        actor: the policy, a :class:`~mindgrpo.models.qwen2.Qwen2Model` (``mindgrpo.models.build_model``).
        eos_token_id: id or ids that end a completion.
        pad_token_id: id that pads completions in :class:`RolloutResult`.
        max_prompt_length: longest prompt accepted (longer ones are an error).
        max_batch_size: most sequences decoded together.
        options: backend-specific keyword arguments, see :class:`~mindgrpo.rollout.backends.native.NativeRolloutEngine`,
            :class:`~mindgrpo.rollout.backends.mindformers.MindFormersRolloutEngine` and
            :class:`~mindgrpo.rollout.backends.vllm.VllmRolloutEngine`.
    """
    common = dict(eos_token_id=eos_token_id, pad_token_id=pad_token_id, max_prompt_length=max_prompt_length,
                  max_batch_size=max_batch_size)
    if backend == "native":
        from mindgrpo.rollout.backends.native import NativeRolloutEngine
        return NativeRolloutEngine(actor, **common, **options)
    if backend == "mindformers":
        from mindgrpo.rollout.backends.mindformers import MindFormersRolloutEngine
        return MindFormersRolloutEngine(actor, **common, **options)
    if backend == "vllm":
        from mindgrpo.rollout.backends.vllm import VllmRolloutEngine
        return VllmRolloutEngine(actor, **common, **options)
    raise ValueError(f"unknown rollout backend {backend!r}; choose one of {', '.join(ROLLOUT_BACKENDS)}")
