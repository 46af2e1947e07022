"""The rollout interface every backend implements: prompts x ``num_generations`` samples + sampling settings ->
completions."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, NamedTuple, Optional, Protocol, Sequence, Tuple, Union, runtime_checkable

import numpy as np

from mindgrpo.models.prompt_images import PromptImages  # what a Qwen2.5-VL prompt's images are to an engine

FINISH_STOP = "stop"      # the sequence emitted an EOS or stop token (kept in the completion, mask 1)
FINISH_LENGTH = "length"  # the sequence reached max_tokens without one


@dataclass(frozen=True)
class SamplingParams:
    """How completions are drawn. Field names match ``mindgrpo.config.SamplingConfig``.

    The processing order for each new token is the one Hugging Face and vLLM use: repetition penalty ->
    EOS suppression (``min_tokens``) -> temperature -> top-k -> top-p -> sample.
    """
    max_tokens: int = 64
    """Completion length limit; ``RolloutResult`` arrays have exactly this many columns."""
    min_tokens: int = 0
    """EOS (and ``stop_token_ids``) are masked out until a completion has this many tokens."""
    temperature: float = 1.0
    """Softmax temperature; 0 means greedy decoding (argmax; no randomness, ``top_k``/``top_p`` unused)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of most likely tokens whose probability reaches ``top_p``."""
    top_k: int = -1
    """Keep only the ``top_k`` most likely tokens; -1 or 0 disables."""
    repetition_penalty: float = 1.0
    """CTRL-style penalty on every token already in the prompt or the completion so far (positive logits are
    divided by it, negative ones multiplied); 1 disables."""
    seed: Optional[int] = None
    """Seed of the sampler; the same seed, prompts, params, weights and engine give the same completions. None
    draws a fresh seed."""
    prompt_keys: Tuple[int, ...] = ()
    """Each prompt's place in a larger batch sampled with the same seed (empty: its index in this call). The native
    backend draws completion ``j`` of a prompt from (seed, key * num_generations + j) alone, so data-parallel
    ranks that each sample their share of a global batch draw what one process sampling all of it draws. The
    mindformers and vllm backends draw from streams of their own and ignore it."""
    num_generations: int = 1
    """Completions per prompt (GRPO's group size; vLLM's ``n``)."""
    stop_token_ids: Tuple[int, ...] = ()
    """Extra ids that end a completion like the engine's EOS ids (kept in it, finish reason ``"stop"``)."""
    logprobs: bool = False
    """Also return the log-probability of each chosen token under the distribution it was sampled from (after
    penalty, EOS suppression, temperature, top-k and top-p, renormalised). Greedy decoding reports the
    log-softmax of the penalised logits instead (its sampling distribution is a point mass). The vllm backend
    reports vLLM's log-probs (see ``mindgrpo.rollout.backends.vllm``)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        object.__setattr__(self, "prompt_keys", tuple(int(k) for k in self.prompt_keys))
        problems = []
        if self.max_tokens < 1:
            problems.append(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            problems.append(f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}")
        if not self.temperature >= 0:
            problems.append(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            problems.append(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            problems.append(f"top_k must be -1/0 (off) or a positive count, got {self.top_k}")
        if not self.repetition_penalty > 0:
            problems.append(f"repetition_penalty must be > 0 (1 = off), got {self.repetition_penalty}")
        if self.num_generations < 1:
            problems.append(f"num_generations must be >= 1, got {self.num_generations}")
        if any(k < 0 for k in self.prompt_keys) or len(set(self.prompt_keys)) != len(self.prompt_keys):
            problems.append("prompt_keys must be distinct non-negative integers")
        if self.seed is not None and not 0 <= self.seed < 2 ** 63:
            problems.append(f"seed must be a non-negative integer below 2**63 or None, got {self.seed}")
        if problems:
            raise ValueError("invalid SamplingParams: " + "; ".join(problems))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class RolloutResult:
    """Completions of ``num_prompts * G`` sequences (``G = num_generations``), prompt-major: rows ``i*G .. i*G+G-1``
    continue prompt ``i``."""
    completion_ids: np.ndarray
    """int32 [num_prompts*G, max_tokens], right-padded with the pad id."""
    completion_mask: np.ndarray
    """int32, same shape: 1 on the completion's tokens including the EOS token that ended it (with tools, the
    tool responses appended between the model's turns too: see ``tool_mask``)."""
    finish_reasons: List[str]
    """Per row: ``"stop"`` (EOS emitted) or ``"length"`` (max_tokens reached)."""
    logprobs: Optional[np.ndarray] = None
    """float32, same shape, when ``SamplingParams.logprobs``: see that field for which distribution; 0 on
    padding and on tool responses."""
    tool_mask: Optional[np.ndarray] = None
    """int32, same shape, when a :class:`TurnHandler` appended tokens: 1 on them (context the model reads but did
    not sample). None: every completion token is the model's."""

    @property
    def model_mask(self) -> np.ndarray:
        """1 on the tokens the model sampled: what a loss trains on."""
        return self.completion_mask if self.tool_mask is None else self.completion_mask * (1 - self.tool_mask)

    @property
    def num_tokens(self) -> int:
        """Completion tokens (EOS and tool responses included)."""
        return int(self.completion_mask.sum())


@runtime_checkable
class TurnHandler(Protocol):
    """What follows a model turn that ended with a stop token, in a multi-turn rollout (tools:
    :class:`mindgrpo.tools.turns.ToolTurns`)."""

    def respond(self, turns: Sequence[Sequence[int]], turn_numbers: Sequence[int]) -> List[Optional[List[int]]]:
        """For each ended turn (the token ids the model sampled since its last turn began, its stop token
        included; ``turn_numbers[i]``: 1 for a completion's first turn), the token ids to append before the model
        continues, or None: the completion ends with this turn. Appended tokens are the model's context, never its
        samples: the rollout feeds them as they are (no re-tokenisation of the model's text) and marks them in
        ``RolloutResult.tool_mask``."""


@runtime_checkable
class RolloutEngine(Protocol):
    """A rollout backend (``native``, ``mindformers`` or ``vllm``)."""

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 images: Optional[Sequence[Optional[PromptImages]]] = None,
                 turns: Optional["TurnHandler"] = None) -> RolloutResult:
        """Sample ``params.num_generations`` completions for each prompt (lists of token ids, any lengths).
        ``images`` (Qwen2.5-VL, ``native`` backend only): one entry per prompt, its :class:`PromptImages` or None
        for a text-only prompt; None for a text-only call. ``turns`` (``native`` only): a multi-turn rollout's
        :class:`TurnHandler`; None: one turn."""

    def sync_weights(self) -> None:
        """Make the next ``generate`` use the actor's current weights."""

    def compiled_graphs(self) -> int:
        """Graphs MindSpore has compiled in this process for the engine so far (the trainer's recompile count)."""


EosIds = Union[int, Sequence[int]]


def eos_tuple(eos_token_id: EosIds) -> Tuple[int, ...]:
    """EOS ids as a non-empty tuple (Qwen2.5 chat models stop on both <|im_end|> and <|endoftext|>)."""
    ids = (eos_token_id,) if isinstance(eos_token_id, (int, np.integer)) else tuple(eos_token_id)
    if not ids:
        raise ValueError("eos_token_id must name at least one token id")
    return tuple(int(i) for i in ids)


def check_request(prompts: Sequence[Sequence[int]], params: SamplingParams, max_prompt_length: int,
                  vocab_size: int) -> List[List[int]]:
    """Prompts as lists of ints, with a clear error for empty, too long or out-of-vocabulary prompts or stop ids."""
    if params.prompt_keys and len(params.prompt_keys) != len(prompts):
        raise ValueError(f"{len(params.prompt_keys)} prompt_keys for {len(prompts)} prompts: one key per prompt")
    bad_stops = [t for t in params.stop_token_ids if not 0 <= t < vocab_size]
    if bad_stops:
        raise ValueError(f"stop_token_ids {bad_stops} are outside the vocabulary [0, {vocab_size})")
    return check_prompts(prompts, max_prompt_length, vocab_size)


def refuse_turns(turns: Optional["TurnHandler"], backend: str) -> None:
    """A clear error when a backend without multi-turn rollouts is given a TurnHandler."""
    if turns is not None:
        raise NotImplementedError(f"the {backend} rollout backend samples one turn; multi-turn rollouts (tools) need "
                                  "rollout_backend: native")


def refuse_images(images: Optional[Sequence[Optional[PromptImages]]], backend: str) -> None:
    """A clear error when a backend without Qwen2.5-VL support is given images."""
    if images is not None and any(entry is not None for entry in images):
        raise NotImplementedError(f"the {backend} rollout backend takes text prompts only; Qwen2.5-VL prompts with "
                                  "images need rollout_backend: native")


def check_prompts(prompts: Sequence[Sequence[int]], max_prompt_length: int, vocab_size: int) -> List[List[int]]:
    """Prompts as lists of ints, with a clear error for empty, too long or out-of-vocabulary prompts."""
    if len(prompts) == 0:
        raise ValueError("generate() needs at least one prompt")
    checked = []
    for i, prompt in enumerate(prompts):
        ids = [int(t) for t in prompt]
        if not ids:
            raise ValueError(f"prompt {i} is empty; every prompt needs at least one token")
        if len(ids) > max_prompt_length:
            raise ValueError(f"prompt {i} has {len(ids)} tokens, more than max_prompt_length={max_prompt_length}; "
                             "truncate it or build the engine with a larger max_prompt_length")
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"prompt {i} has token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}")
        checked.append(ids)
    return checked


class SampledRows(NamedTuple):
    """One chunk's completions, a list per row."""
    tokens: List[List[int]]
    logprobs: List[List[float]]
    reasons: List[str]
    appended: Optional[List[List[int]]] = None
    """Per row, 1 on each token a TurnHandler appended (None: none can have been)."""


ChunkSampler = Callable[[List[List[int]], int], SampledRows]


def generate_in_chunks(rows: List[List[int]], max_batch_size: int, sample_chunk: ChunkSampler,
                       params: "SamplingParams", pad_token_id: int) -> "RolloutResult":
    """Sample ``rows`` (one prompt per sequence) in chunks of at most ``max_batch_size``:
    ``sample_chunk(chunk_rows, start)`` returns per-row tokens, log-probs and finish reasons; one result is
    assembled from all chunks."""
    tokens: List[List[int]] = []
    logprobs: List[List[float]] = []
    reasons: List[str] = []
    appended: Optional[List[List[int]]] = []
    for start in range(0, len(rows), max_batch_size):
        chunk = sample_chunk(rows[start:start + max_batch_size], start)
        tokens += chunk.tokens
        logprobs += chunk.logprobs
        reasons += chunk.reasons
        appended = None if chunk.appended is None or appended is None else appended + chunk.appended
    return assemble_result(tokens, reasons, logprobs if params.logprobs else None, params.max_tokens, pad_token_id,
                           appended)


def assemble_result(rows: List[List[int]], reasons: List[str], row_logprobs: Optional[List[List[float]]],
                    max_tokens: int, pad_token_id: int, appended: Optional[List[List[int]]] = None
                    ) -> RolloutResult:
    """Pad per-row token lists into the fixed-width arrays of a RolloutResult."""
    ids = np.full((len(rows), max_tokens), pad_token_id, np.int32)
    mask = np.zeros((len(rows), max_tokens), np.int32)
    logprobs = None if row_logprobs is None else np.zeros((len(rows), max_tokens), np.float32)
    tool_mask = None if appended is None else np.zeros((len(rows), max_tokens), np.int32)
    for r, tokens in enumerate(rows):
        ids[r, :len(tokens)] = tokens
        mask[r, :len(tokens)] = 1
        if logprobs is not None:
            logprobs[r, :len(tokens)] = row_logprobs[r]
        if tool_mask is not None:
            tool_mask[r, :len(tokens)] = appended[r]
    return RolloutResult(ids, mask, list(reasons), logprobs, tool_mask)
