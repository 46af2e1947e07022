"""The ``mindformers`` rollout backend: MindFormers' own ``generate`` on a separate inference cell.

This is the reference path MindRLHF users know; on CPU it is slow because ``generate`` has no KV cache there
(``use_past`` is unavailable) and recomputes the whole padded sequence for every token. What it supports:

* every :class:`SamplingParams` field, with the same semantics as the native backend: MindFormers' own
  processors are switched off (``temperature=1``, ``top_k=0``, ``top_p=None``, ``repetition_penalty=1``) and one
  custom logits processor applies :func:`mindgrpo.rollout.sampler.process_logits`; MindFormers then draws from
  that distribution (``np.random.choice``; greedy params get a one-hot distribution);
* ``seed``: MindFormers samples with NumPy's *global* generator, which ``generate(seed=...)`` re-seeds (so a
  seeded rollout resets ``np.random``'s global state); completions differ from the native backend's for the same
  seed because the random streams differ;
* ``logprobs``: recorded by that processor (MindFormers has no per-token log-prob output of its own);
* ``n``: each prompt is repeated ``n`` times (no prefix sharing).

Prompts must not contain the pad id: MindFormers finds a prompt's length from its last non-pad token and masks
pad tokens inside it. Unless one is passed in, the inference cell is built from the actor's config with
``seq_length`` = longest prompt + ``max_tokens`` rounded up to 64 (every step computes that many positions, so a
tight value matters) and rebuilt if a request needs more; batches are padded to a power of two so GRAPH mode
compiles once per size.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

import numpy as np

from mindspore import Tensor, nn

from mindgrpo.rollout.api import (FINISH_LENGTH, FINISH_STOP, EosIds, PromptImages, RolloutResult, SampledRows,
                                  SamplingParams, TurnHandler, check_request, eos_tuple, generate_in_chunks,
                                  refuse_images, refuse_turns)
from mindgrpo.models.qwen2 import Qwen2Model
from mindgrpo.rollout.backends.native import graph_mode
from mindgrpo.rollout.sampler import process_logits, seen_tokens

_SEQ_STEP = 64


def _batch_bucket(rows: int, limit: int) -> int:
    size = 1
    while size < rows:
        size *= 2
    return min(size, limit)


class _SharedProcessor:
    """A MindFormers logits processor that applies mindgrpo's sampling options to a whole batch per step.

    It returns the log-probs of :func:`process_logits`, which MindFormers' sampler then draws from; for greedy
    params it returns a one-hot distribution on the argmax (MindFormers' own greedy path calls ``mint.argmax``,
    which has no CPU kernel). It also records the log-prob of every chosen token: the token chosen at step ``s``
    shows up in the ids of step ``s + 1``, and the last step's ones are read in :meth:`logprobs`.

    MindFormers calls the processor list once per step with the batch's padded ids (its default MindSpore path);
    its NumPy path (``postprocess_use_numpy``) calls it row by row instead, which is refused.
    """

    def __init__(self, params: SamplingParams, eos_ids: Sequence[int], prompt_lengths: np.ndarray):
        self.params, self.eos_ids, self.prompt_lengths = params, tuple(eos_ids), prompt_lengths
        self.rows = np.arange(len(prompt_lengths))
        self.step = 0
        self.previous: Optional[np.ndarray] = None  # log-probs of the last step
        self.chosen: List[np.ndarray] = []           # [rows] log-prob of each step's chosen token

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Tensor:
        ids = input_ids.asnumpy() if isinstance(input_ids, Tensor) else np.asarray(input_ids)
        logits = scores.asnumpy() if isinstance(scores, Tensor) else np.asarray(scores)
        if len(logits) != len(self.prompt_lengths):
            raise RuntimeError("MindFormers post-processes row by row (postprocess_use_numpy=True); the "
                               "mindformers rollout backend needs its default batched post-processing")
        if self.previous is not None:
            tokens = ids[self.rows, self.prompt_lengths + self.step - 1]
            self.chosen.append(self.previous[self.rows, tokens])
        seen = None
        if self.params.repetition_penalty != 1.0:
            seen = seen_tokens([row[:n] for row, n in zip(ids, self.prompt_lengths + self.step)], logits.shape[-1])
        logp = process_logits(logits, self.params, self.step, self.eos_ids, seen)
        self.previous = logp
        self.step += 1
        if self.params.greedy:
            one_hot = np.full(logp.shape, -np.inf, np.float32)
            one_hot[self.rows, np.argmax(logp, axis=-1)] = 0.0
            return Tensor(one_hot)
        return Tensor(logp)

    def logprobs(self, row: int, completion: Sequence[int]) -> List[float]:
        """Log-probs of a row's completion tokens (the last one from the final step's distribution)."""
        return [float(self.chosen[k][row]) if k < len(self.chosen) else float(self.previous[row, token])
                for k, token in enumerate(completion)]


class MindFormersRolloutEngine:
    """Rollouts through MindFormers' ``generate`` on an inference copy of the actor."""

    def __init__(self, actor: Qwen2Model, *, eos_token_id: EosIds, pad_token_id: int, max_prompt_length: int,
                 max_batch_size: int = 32, inference_model: Optional[nn.Cell] = None):
        """
        Args:
            actor: the policy; its weights are copied into the inference cell by :meth:`sync_weights`.
            inference_model: a prebuilt MindFormers ``LlamaForCausalLM``
                (:func:`~mindgrpo.models.causal_lm.build_mindformers_model`); default: built from the actor's
                spec on first use.
            Other arguments as in :func:`mindgrpo.rollout.build_rollout_engine`.
        """
        self.actor = actor
        self.eos_ids = eos_tuple(eos_token_id)
        self.pad_token_id = int(pad_token_id)
        self.max_prompt_length = int(max_prompt_length)
        self.max_batch_size = int(max_batch_size)
        self.vocab_size = actor.spec.vocab_size
        self.model = inference_model
        self._owns_model = inference_model is None  # ours may be rebuilt longer; a caller's is never replaced
        if inference_model is not None:
            self.sync_weights()

    def sync_weights(self) -> None:
        """Copy the actor's current weights into the inference cell (a cell built later copies them then)."""
        if self.model is not None:
            from mindgrpo.models import sync_weights
            sync_weights(self.actor, self.model)

    def compiled_graphs(self) -> int:
        """MindFormers' ``generate`` runs its inference cell: the graphs in that cell's compile cache."""
        return 0 if self.model is None else len(self.model.compile_cache)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 images: Optional[Sequence[Optional[PromptImages]]] = None,
                 turns: Optional[TurnHandler] = None) -> RolloutResult:
        refuse_images(images, "mindformers")
        refuse_turns(turns, "mindformers")
        prompts = check_request(prompts, params, self.max_prompt_length, self.vocab_size)
        for i, prompt in enumerate(prompts):
            if self.pad_token_id in prompt:
                raise ValueError(f"prompt {i} contains the pad id {self.pad_token_id}, which MindFormers' generate "
                                 "treats as padding; use the native backend for such prompts")
        needed = max(map(len, prompts)) + params.max_tokens
        self._ensure_model(-(-needed // _SEQ_STEP) * _SEQ_STEP)
        rows = [prompts[p] for p in range(len(prompts)) for _ in range(params.num_generations)]  # prompt-major
        # the seed starts NumPy's global stream once; later chunks continue it
        with graph_mode():
            return generate_in_chunks(
                rows, self.max_batch_size,
                lambda chunk, start: self._generate_chunk(chunk, params, params.seed if start == 0 else None),
                params, self.pad_token_id)

    def _ensure_model(self, seq_length: int) -> None:
        if self.model is not None and self.model.config.seq_length >= seq_length:
            return
        if not self._owns_model:
            raise ValueError(f"the inference_model has seq_length={self.model.config.seq_length}, but this request "
                             f"needs {seq_length} (longest prompt + max_tokens, rounded up to {_SEQ_STEP}); build it "
                             "with a larger seq_length")
        from mindspore.nn.utils import no_init_parameters

        from mindgrpo.models.causal_lm import LlamaForCausalLM, llama_config  # MindFormers, imported lean

        dtype = self.actor.compute_dtype
        config = llama_config(self.actor.spec, compute_dtype=dtype, param_dtype=dtype, seq_length=seq_length)
        with no_init_parameters():  # every weight is overwritten by sync_weights at once
            model = LlamaForCausalLM(config)
        model.set_train(False)
        self.model = model
        self.sync_weights()

    def _generate_chunk(self, row_prompts: List[List[int]], params: SamplingParams, seed: Optional[int]
                        ) -> SampledRows:
        rows = len(row_prompts)
        batch = _batch_bucket(rows, self.max_batch_size)
        padded = row_prompts + [row_prompts[0]] * (batch - rows)  # fixed batch shapes: one graph per size
        width = max(map(len, padded))
        input_ids = np.full((batch, width), self.pad_token_id, np.int32)
        for i, prompt in enumerate(padded):
            input_ids[i, :len(prompt)] = prompt
        lengths = np.array([len(p) for p in padded])
        stop_ids = self.eos_ids + params.stop_token_ids
        processor = _SharedProcessor(params, stop_ids, lengths)
        from mindformers.generation.logits_process import LogitsProcessorList
        processors = LogitsProcessorList()
        processors.append(processor)
        # do_sample=True even for greedy params: the processor then returns a one-hot distribution
        sequences = self.model.generate(
            input_ids, do_sample=True, temperature=1.0, top_k=0, top_p=None, repetition_penalty=1.0,
            min_new_tokens=None, max_new_tokens=params.max_tokens, eos_token_id=list(stop_ids),
            pad_token_id=self.pad_token_id, logits_processor=processors, seed=seed)
        tokens, logprobs, reasons = [], [], []
        eos = set(stop_ids)
        for r in range(rows):
            completion = [int(t) for t in np.asarray(sequences[r])[lengths[r]:]][:params.max_tokens]
            tokens.append(completion)
            reasons.append(FINISH_STOP if completion and completion[-1] in eos else FINISH_LENGTH)
            if params.logprobs:
                logprobs.append(processor.logprobs(r, completion))
        return SampledRows(tokens, logprobs, reasons)
