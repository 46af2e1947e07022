"""The ``native`` rollout backend: KV-cache decoding in MindSpore GRAPH mode over the actor's own Parameters.

Shapes are static per bucket so each bucket compiles exactly once:

* chunk batch ``B``: rows (``prompts x num_generations``) rounded up to a power of two, capped at ``max_batch_size``
  (larger requests run in chunks of whole rows, prompt-major); the KV cache has ``B`` rows;
* prompt batch ``P``: distinct prompts of a chunk rounded up to a power of two (identical prompts are
  prefilled once, and each prompt's cache rows are forked to its samples);
* prompt length ``S``: the longest prompt of a chunk rounded up to ``prompt_length_buckets``;
* cache length ``S + T`` with ``T`` = ``max_tokens`` rounded up to a multiple of 32;
* decode batch ``b``: each step decodes only the rows still generating (compaction), in the smallest power of
  two that holds them, down to ``min_decode_batch`` (default 8: below it a step costs the same on CPU). A bucket
  has one decode graph per such ``b <= B``, all on the chunk's one KV cache: a decode column names the cache row it
  continues, so compaction moves no cache row. With ragged lengths (most completions short, a few at the limit)
  the decode work then follows the tokens generated rather than ``B x T``. Every decode graph of a bucket compiles
  when the bucket is built (``log2(B / min_decode_batch) + 1`` of them): which ones a rollout reaches depends on
  where its rows end, and after the first rollout of a bucket nothing compiles again.

Where the cache lives depends on the decode path. The fused CPU kernels (``decode_impl="fused"``, float32,
:class:`~mindgrpo.rollout.backends.native_graphs.FusedDecodeGraph`) keep it in a
:class:`~mindgrpo.ops.kv_store.KvStore`, memory that is resident only where written: it grows with the rows'
lengths, not the limit, a row's memory is given back when it ends and the whole cache after each chunk, so between
rollouts (during training) it holds nothing; columns of a decode batch beyond its live rows name no cache row and
the kernel skips them. The plain ops (:class:`~mindgrpo.rollout.backends.native_graphs.DecodeGraph`: other dtypes,
Ascend) keep it in Parameters of the full shape; their batch-``B`` graph reads the cache in place (column ``i``
decodes row ``i``, finished rows included) and the smaller ones gather their rows, filling the batch with finished
rows whose results are dropped.

Prompts are left-padded to ``S``, so every row writes its ``t``-th token at cache index ``S + t``; position ids
count from each prompt's first real token and padded keys are masked, which makes results equal to the unpadded
computation. Compaction does not change results either: each row's logits are the same bits in any decode batch
of two or more columns (the products and kernels are column-wise; a single column would take MatMul's
matrix-vector kernel, which rounds differently, hence ``min_decode_batch >= 2``) and a row's random draws are a
function of (seed, the row's key, the position) alone (:func:`~mindgrpo.rollout.sampler.row_uniforms`), so tokens
and log-probs equal those of decoding every row to the end (``compact=False``), in any chunk, on any rank.

Qwen2.5-VL prompts (``generate(..., images=...)``, one :class:`~mindgrpo.rollout.api.PromptImages` per prompt with
images) take the same path. The host computes each prompt's M-RoPE positions once
(:func:`~mindgrpo.models.mrope.get_rope_index`); the prefill puts the image features in place of the
``<|image_pad|>`` tokens and rotates by the three position rows; a bucket's feature input holds ``P x S`` rows (as
many as the prompt batch has tokens), so image counts and sizes never change a compiled shape. Decoding is
unchanged: every generated token is text, whose three position rows are equal, so decode positions are plain
1-row positions that continue from each prompt's last position + 1 (``index + rope_delta``,
:func:`~mindgrpo.models.mrope.decode_position_ids`) instead of from its length; the decode graphs and the fused
kernels take positions per row and only their values change. Prompts with images are never merged with one
another (two images may give the same tokens), so each is prefilled once for its ``num_generations`` samples.

The graphs run in GRAPH mode even when the process is in PyNative mode: on MindSpore 2.9 a ``@jit`` graph in
PyNative mode keeps the tensor a Parameter had when it was compiled, so a later ``set_data`` (checkpoint load,
``mindgrpo.models.sync_weights``) never reaches it, while a GRAPH-mode Cell reads the live Parameter after
``set_data`` and after in-place optimizer updates alike. Sampling runs on the host (:mod:`mindgrpo.rollout.sampler`).
The fused kernels exist because decoding a few rows at a time is bound by kernel launches, not arithmetic.
"""
from __future__ import annotations

import contextlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

import mindspore as ms
from mindspore import Tensor

from mindgrpo.choices import DECODE_IMPLS, canonical
from mindgrpo.config import PROMPT_LENGTH_BUCKET
from mindgrpo.models.image_tokens import image_source_rows
from mindgrpo.models.mrope import decode_position_ids, get_rope_index
from mindgrpo.models.qwen2 import Qwen2Model
from mindgrpo.rollout.api import (FINISH_LENGTH, FINISH_STOP, EosIds, PromptImages, RolloutResult, SampledRows,
                                  SamplingParams, TurnHandler, check_prompts, check_request, eos_tuple,
                                  generate_in_chunks)
from mindgrpo.ops.decode_step import fused_decode_available
from mindgrpo.ops.kv_store import KvStore
from mindgrpo.rollout.backends.native_graphs import (DecodeGraph, FusedDecodeGraph, FusedPrefillGraph, PrefillGraph,
                                          Qwen2Weights, new_kv_cache)
from mindgrpo.rollout.sampler import TokenSampler

_MAX_TOKENS_STEP = 32


@contextlib.contextmanager
def graph_mode() -> Iterator[None]:
    """Run the enclosed calls in GRAPH mode and restore the caller's mode afterwards."""
    previous = ms.get_context("mode")
    if previous != ms.GRAPH_MODE:
        ms.set_context(mode=ms.GRAPH_MODE)
    try:
        yield
    finally:
        if previous != ms.GRAPH_MODE:
            ms.set_context(mode=previous)


def _round_up(value: int, buckets: Sequence[int]) -> int:
    for bucket in buckets:
        if value <= bucket:
            return bucket
    raise ValueError(f"{value} exceeds the largest bucket {buckets[-1]}")


def _powers_of_two_upto(limit: int) -> Tuple[int, ...]:
    sizes = [1]
    while sizes[-1] * 2 < limit:
        sizes.append(sizes[-1] * 2)
    return tuple(sorted(set(sizes + [limit])))


@dataclass(frozen=True)
class BucketKey:
    prompt_batch: int
    prompt_len: int
    batch: int
    max_tokens: int
    vision: bool = False
    """Whether the prefill takes images and M-RoPE positions (a Qwen2.5-VL call)."""

    @property
    def cache_len(self) -> int:
        return self.prompt_len + self.max_tokens


class _Bucket:
    """The compiled graphs of one shape bucket and the KV cache they share: the prefill, and one decode graph per
    decode batch (``decode_batches``, ending with the chunk batch). The fused graphs keep the cache in a
    :class:`~mindgrpo.ops.kv_store.KvStore` (memory only where written, given back as rows end and after each
    chunk), the plain ones in Parameters of the full shape."""

    def __init__(self, weights: Qwen2Weights, key: BucketKey, tag: str, fused_decode: bool,
                 decode_batches: Sequence[int]):
        self.key = key
        spec = weights.spec
        if fused_decode:
            self.store: Optional[KvStore] = KvStore(key.batch, spec.local_kv_heads, key.cache_len, spec.head_dim,
                                                    spec.num_layers)
            self.prefill = FusedPrefillGraph(weights, key.cache_len, self.store)
            self.decode = {batch: FusedDecodeGraph(weights, key.cache_len, self.store)
                           for batch in decode_batches}
        else:
            self.store = None
            kv_cache = new_kv_cache(weights, key.batch, key.cache_len, tag)
            self.prefill = PrefillGraph(weights, key.cache_len, kv_cache)
            self.decode = {batch: DecodeGraph(weights, key.cache_len, kv_cache, batch) for batch in decode_batches}
        self.graphs = (self.prefill, *self.decode.values())

    def compile_decode(self) -> None:
        """Compile every decode graph (without running one): which of them a rollout reaches depends on where its
        rows end, and none may compile in the middle of a later rollout."""
        write_pos = Tensor(self.key.prompt_len, ms.int32)
        for batch, graph in self.decode.items():
            zeros, rows = Tensor(np.zeros(batch, np.int32)), Tensor(np.arange(batch, dtype=np.int32))
            graph.compile(zeros, zeros, zeros, write_pos, rows)

    def columns(self, rows: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """The cache row of each column of the decode batch that holds ``rows`` (sorted cache rows, the live
        sequences), and the columns that decode them. The store's kernel skips a column without a row (-1); the
        Parameter cache's full-batch graph reads the cache in place (column i decodes row i) and its smaller ones
        take the live rows first, then other rows (finished or padding) whose results are dropped."""
        batch = next(b for b in self.decode if b >= len(rows))
        if self.store is not None:
            return np.concatenate((rows, np.full(batch - len(rows), -1))), np.arange(len(rows))
        if batch == self.key.batch:
            return np.arange(batch), rows
        others = np.setdiff1d(np.arange(self.key.batch), rows)[:batch - len(rows)]
        return np.concatenate((rows, others)), np.arange(len(rows))

    def release_rows(self, rows: np.ndarray) -> None:
        """The sequences in these cache rows ended: give their cache memory back (store only)."""
        if self.store is not None and len(rows):
            self.store.release_rows(rows)

    def release_cache(self) -> None:
        """The chunk is done: give all cache memory back (store only)."""
        if self.store is not None:
            self.store.release()

    def close(self) -> None:
        """Unmap the store; the bucket's graphs must not run afterwards."""
        if self.store is not None:
            self.store.close()

    def compiled_graphs(self) -> int:
        """Graphs MindSpore has compiled for these Cells (its own per-Cell compile cache)."""
        return sum(len(cell.compile_cache) for cell in self.graphs)


class NativeRolloutEngine:
    """KV-cache rollouts that read the actor's Parameters directly (``sync_weights`` is a no-op)."""

    def __init__(self, actor: Qwen2Model, *, eos_token_id: EosIds, pad_token_id: int, max_prompt_length: int,
                 max_batch_size: int = 32, prompt_length_buckets: Optional[Sequence[int]] = None,
                 max_cached_buckets: int = 4, decode_impl: str = "fused", compact: bool = True,
                 min_decode_batch: int = 8):
        """
        Args:
            actor: the policy, a :class:`~mindgrpo.models.qwen2.Qwen2Model`.
            eos_token_id: id(s) that end a completion.
            pad_token_id: id used to pad completions (and left-pad prompts inside a bucket; masked, never seen).
            max_prompt_length: longest prompt accepted.
            max_batch_size: most sequences decoded together (``generate_config.infer_model_batch_size``).
            prompt_length_buckets: increasing prompt-length buckets; default multiples of PROMPT_LENGTH_BUCKET (64)
                up to ``max_prompt_length``. Each (bucket, batch, max_tokens) combination compiles once.
            max_cached_buckets: buckets (compiled graphs + KV cache) kept alive, least recently used dropped.
            decode_impl: ``fused`` decodes with fused C++ kernels (attention with the cache write, RMSNorm,
                SwiGLU; :mod:`mindgrpo.ops.decode_step`) when the device is CPU and the model float32, with the
                plain ops otherwise; ``plain`` always uses the plain ops.
            compact: decode only the rows still generating, in the smallest batch bucket that holds them (see the
                module docstring); False decodes every row of a chunk until its last one ends (the same tokens and
                log-probs, at the cost of the whole batch per step).
            min_decode_batch: the smallest batch compaction goes down to (a power of two, at least 2). Each decode
                batch is one more compiled graph (about 7 MB each for ``small`` on CPU), and below a few rows a step
                costs the same (measured on ``small``, fused, 250 keys: 32 rows 17.8 ms, 16 12.3, 8 9.5, 4 9.9,
                2 9.0 ms: reading the weights, ~96 MB a step, bounds it). Never 1: a single column takes MatMul's
                matrix-vector kernel, whose sums round differently from the batched one.
        """
        if max_batch_size < 1 or max_prompt_length < 1 or max_cached_buckets < 1:
            raise ValueError("max_batch_size, max_prompt_length and max_cached_buckets must be >= 1")
        if min_decode_batch < 2 or min_decode_batch & (min_decode_batch - 1):
            raise ValueError(f"min_decode_batch must be a power of two >= 2, got {min_decode_batch}")
        if not isinstance(actor, Qwen2Model):
            raise TypeError(f"{type(actor).__name__} is not a mindgrpo Qwen2Model: build it with "
                            "mindgrpo.models.build_model")
        self.weights = actor.decoder_weights()
        self.spec = self.weights.spec
        self.eos_ids = eos_tuple(eos_token_id)
        self.pad_token_id = int(pad_token_id)
        self.max_prompt_length = int(max_prompt_length)
        self.max_batch_size = int(max_batch_size)
        self.batch_buckets = _powers_of_two_upto(self.max_batch_size)
        if prompt_length_buckets is None:
            step = PROMPT_LENGTH_BUCKET
            prompt_length_buckets = [*range(step, self.max_prompt_length, step), self.max_prompt_length]
        self.prompt_length_buckets = tuple(sorted(int(b) for b in prompt_length_buckets))
        if self.prompt_length_buckets[-1] < self.max_prompt_length:
            raise ValueError(f"prompt_length_buckets {self.prompt_length_buckets} do not reach "
                             f"max_prompt_length={self.max_prompt_length}")
        self.max_cached_buckets = int(max_cached_buckets)
        canonical("decode_impl", decode_impl, DECODE_IMPLS)
        self.fused_decode = decode_impl == "fused" and fused_decode_available(
            ms.get_context("device_target"), self.weights.compute_dtype, self.weights.param_dtype, self.spec.qkv_bias)
        """Whether decoding uses the fused kernels (see ``decode_impl``)."""
        self.compact = bool(compact)
        self.min_decode_batch = int(min_decode_batch)
        hf_spec = actor.spec
        self.image_tokens = ((hf_spec.image_token_id, hf_spec.vision_start_token_id, hf_spec.spatial_merge_size)
                             if actor.is_vl else None)
        """(<|image_pad|>, <|vision_start|>, spatial_merge_size) of a Qwen2.5-VL actor; None for a text model."""
        self._buckets: "OrderedDict[BucketKey, _Bucket]" = OrderedDict()
        self._evicted_graphs = 0
        self.buckets_built: List[BucketKey] = []
        """Every bucket built so far, in order (a bucket is rebuilt only after LRU eviction)."""

    # -- public API -------------------------------------------------------------------------------------
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 images: Optional[Sequence[Optional[PromptImages]]] = None,
                 turns: Optional[TurnHandler] = None) -> RolloutResult:
        """See :meth:`mindgrpo.rollout.api.RolloutEngine.generate`. ``images``: one entry per prompt (its
        :class:`~mindgrpo.rollout.api.PromptImages`, or None for a text-only prompt) for a Qwen2.5-VL actor.

        ``turns``: a multi-turn rollout. When a row samples a stop token, ``turns.respond`` gets the turn; the
        tokens it returns are fed to that row one per decode step, in the same batch as the rows still sampling
        (each goes into the row's KV cache like a sampled token: no row is prefilled again), and the row samples
        again after them. Appended tokens count against ``max_tokens``; a row whose response does not fit in what
        is left ends there (``length``)."""
        prompts = check_request(prompts, params, self.max_prompt_length, self.spec.vocab_size)
        vision = self._vision_prompts(prompts, images)
        g = params.num_generations
        rows = [prompts[p] for p in range(len(prompts)) for _ in range(g)]  # prompt-major
        row_vision = None if vision is None else [vision[p] for p in range(len(prompts)) for _ in range(g)]
        seed = params.seed if params.seed is not None else int(np.random.default_rng().integers(2 ** 63))
        keys = np.asarray(params.prompt_keys or range(len(prompts)), np.int64)
        row_keys = (keys[:, None] * g + np.arange(g)).reshape(-1)  # each row's draws: (seed, its key) alone

        def sample_chunk(chunk, start):
            chunk_vision = None if row_vision is None else row_vision[start:start + len(chunk)]
            return self._sample_chunk(chunk, params, seed, row_keys[start:start + len(chunk)], chunk_vision, turns)

        with graph_mode():
            return generate_in_chunks(rows, self.max_batch_size, sample_chunk, params, self.pad_token_id)

    def stream(self, prompt: Sequence[int], params: SamplingParams,
               images: Optional[PromptImages] = None) -> Iterator[int]:
        """One completion of ``prompt``, a token at a time as it is sampled (a chat shows each one at once): the
        tokens :meth:`generate` samples for it with the same ``params`` and seed, the stop token last when one
        ends it."""
        if params.num_generations != 1:
            raise ValueError(f"stream samples one completion, not num_generations={params.num_generations}")
        prompts = check_request([prompt], params, self.max_prompt_length, self.spec.vocab_size)
        vision = self._vision_prompts(prompts, None if images is None else [images])
        seed = params.seed if params.seed is not None else int(np.random.default_rng().integers(2 ** 63))
        stop_ids = np.array(self.eos_ids + params.stop_token_ids)
        with graph_mode():
            decoder = _ChunkDecoder(self, prompts, params.max_tokens, vision)
            try:
                sampler = TokenSampler(params, stop_ids, self.spec.vocab_size, seed,
                                       np.asarray(params.prompt_keys or (0,), np.int64), prompts)
                for step in range(params.max_tokens):
                    chosen, _ = sampler.sample(decoder.logits, step, decoder.rows)
                    yield int(chosen[0])
                    if chosen[0] in stop_ids or step + 1 == params.max_tokens:
                        return
                    decoder.advance(chosen)
            finally:
                decoder.bucket.release_cache()

    def forced_logits(self, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]],
                      images: Optional[Sequence[Optional[PromptImages]]] = None) -> List[np.ndarray]:
        """Next-token logits the engine computes when prompt ``i`` is continued by ``continuations[i]``.

        Row ``i`` is float32 ``[len(continuations[i]) + 1, vocab]``: the logits after the prompt and after each
        continuation token, computed by the same buckets, padding and KV-cache path as :meth:`generate` (so it
        shows what a rollout samples from, e.g. to check it against a full forward). ``images`` as in
        :meth:`generate`.
        """
        prompts = check_prompts(prompts, self.max_prompt_length, self.spec.vocab_size)
        vision = self._vision_prompts(prompts, images)
        if len(continuations) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(continuations)} continuations")
        if any(not 0 <= int(t) < self.spec.vocab_size for c in continuations for t in c):
            raise ValueError(f"continuations hold token ids outside the vocabulary [0, {self.spec.vocab_size})")
        result: List[np.ndarray] = []
        with graph_mode():
            for start in range(0, len(prompts), self.max_batch_size):
                chunk = prompts[start:start + self.max_batch_size]
                forced = [list(c) for c in continuations[start:start + self.max_batch_size]]
                steps = max(map(len, forced)) + 1
                decoder = _ChunkDecoder(self, chunk, steps,
                                        None if vision is None else vision[start:start + self.max_batch_size])
                history = [decoder.logits]
                try:
                    for step in range(steps - 1):  # every row to the end: the whole batch decodes each step
                        decoder.advance(np.array([c[step] if step < len(c) else self.pad_token_id for c in forced]))
                        history.append(decoder.logits)
                finally:
                    decoder.bucket.release_cache()
                stacked = np.stack(history, axis=1)  # [rows, steps, vocab]
                result += [stacked[r, :len(forced[r]) + 1] for r in range(len(chunk))]
        return result

    def sync_weights(self) -> None:
        """Nothing to do: the graphs read the actor's own Parameters."""

    def compiled_graphs(self) -> int:
        """Graphs MindSpore compiled for this engine so far (counted from its per-Cell compile caches)."""
        return self._evicted_graphs + sum(b.compiled_graphs() for b in self._buckets.values())

    def release(self) -> None:
        """Drop every bucket (compiled graphs and KV caches) to free memory; they rebuild on demand."""
        for bucket in self._buckets.values():
            self._evicted_graphs += bucket.compiled_graphs()
            bucket.close()
        self._buckets.clear()

    # -- internals --------------------------------------------------------------------------------------
    def _sample_chunk(self, rows: List[List[int]], params: SamplingParams, seed: int, row_keys: np.ndarray,
                      row_vision: Optional[List[Optional["_VisionPrompt"]]] = None,
                      turns: Optional[TurnHandler] = None) -> SampledRows:
        """Sample completions for one batch of rows (each a prompt to continue, with its images in a Qwen2.5-VL
        call): tokens, log-probs, reasons, and with ``turns`` which tokens were appended."""
        stop_ids = np.array(self.eos_ids + params.stop_token_ids)
        decoder = _ChunkDecoder(self, rows, params.max_tokens, row_vision)
        sampler = TokenSampler(params, stop_ids, self.spec.vocab_size, seed, row_keys, rows)
        tokens: List[List[int]] = [[] for _ in rows]
        logprobs: List[List[float]] = [[] for _ in rows]
        appended: List[List[int]] = [[] for _ in rows]  # per token: 1 where a TurnHandler put it
        forced: List[List[int]] = [[] for _ in rows]  # per row: appended tokens still to feed, in reverse order
        turn_start, turn_count = [0] * len(rows), [0] * len(rows)
        reasons = [FINISH_LENGTH] * len(rows)
        active = np.ones(len(rows), bool)
        try:
            for step in range(params.max_tokens):
                decoded = decoder.rows  # the rows decoder.logits belongs to: the live ones (all without compaction)
                feeding = np.array([bool(forced[r]) for r in decoded], bool)
                if not feeding.any():
                    chosen, chosen_logprobs = sampler.sample(decoder.logits, step, decoded)
                else:  # rows being fed a response take its next token; the others sample
                    chosen = np.zeros(len(decoded), np.int64)
                    chosen_logprobs = np.zeros(len(decoded), np.float32)
                    sampled = ~feeding
                    if sampled.any():
                        chosen[sampled], chosen_logprobs[sampled] = sampler.sample(decoder.logits[sampled], step,
                                                                                   decoded[sampled])
                    chosen[feeding] = [forced[r].pop() for r in decoded[feeding]]
                    sampler.observe(decoded[feeding], chosen[feeding])
                for i in np.flatnonzero(active[decoded]):
                    tokens[decoded[i]].append(int(chosen[i]))
                    logprobs[decoded[i]].append(float(chosen_logprobs[i]))
                    appended[decoded[i]].append(int(feeding[i]))
                # an appended token never ends a turn: tool responses hold <|im_end|> themselves
                ended = decoded[active[decoded] & ~feeding & np.isin(chosen, stop_ids)]
                responses = self._respond(turns, ended, tokens, turn_start, turn_count)
                for r, response in zip(ended, responses):
                    if response is None:
                        reasons[r] = FINISH_STOP
                        active[r] = False
                    elif len(tokens[r]) + len(response) >= params.max_tokens:  # no room to answer after it
                        active[r] = False
                    else:
                        forced[r] = list(reversed(response))
                        turn_start[r] = len(tokens[r]) + len(response)
                if not active.any() or step + 1 == params.max_tokens:
                    break
                decoder.advance(chosen, active[decoded])
        finally:
            decoder.bucket.release_cache()
        return SampledRows(tokens, logprobs, reasons, None if turns is None else appended)

    def _respond(self, turns: Optional[TurnHandler], ended: np.ndarray, tokens: List[List[int]],
                 turn_start: List[int], turn_count: List[int]) -> List[Optional[List[int]]]:
        """What follows each ended turn: None (the completion ends) without a TurnHandler."""
        if turns is None or not len(ended):
            return [None] * len(ended)
        for r in ended:
            turn_count[r] += 1
        responses = turns.respond([tokens[r][turn_start[r]:] for r in ended], [turn_count[r] for r in ended])
        if len(responses) != len(ended):
            raise RuntimeError(f"{type(turns).__name__}.respond answered {len(responses)} of {len(ended)} turns")
        responses = [None if response is None else [int(t) for t in response] for response in responses]
        vocab = self.spec.vocab_size
        bad = [t for response in responses if response for t in response if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"{type(turns).__name__}.respond returned token ids outside the vocabulary [0, {vocab}):"
                             f" {bad[:5]}")
        return responses

    def bucket_for(self, row_prompts: Sequence[Sequence[int]], max_tokens: int,
                   row_vision: Optional[Sequence[Optional["_VisionPrompt"]]] = None) -> "_Bucket":
        """The (cached, compiled-once) bucket that decodes these rows for up to ``max_tokens`` steps (rows with
        their images in a Qwen2.5-VL call: ``row_vision`` not None)."""
        distinct = set(_prompt_keys(row_prompts, row_vision))
        key = BucketKey(prompt_batch=_round_up(len(distinct), self.batch_buckets),
                        prompt_len=_round_up(max(map(len, row_prompts)), self.prompt_length_buckets),
                        batch=_round_up(len(row_prompts), self.batch_buckets),
                        max_tokens=-(-max_tokens // _MAX_TOKENS_STEP) * _MAX_TOKENS_STEP,
                        vision=row_vision is not None)
        bucket = self._buckets.get(key)
        if bucket is None:
            while len(self._buckets) >= self.max_cached_buckets:
                _, old = self._buckets.popitem(last=False)
                self._evicted_graphs += old.compiled_graphs()
                old.close()
            smaller = [b for b in self.batch_buckets if self.min_decode_batch <= b < key.batch] if self.compact else []
            decode_batches = [*smaller, key.batch]
            bucket = _Bucket(self.weights, key, f"{id(self):x}.{len(self.buckets_built)}", self.fused_decode,
                             decode_batches)
            with graph_mode():
                bucket.compile_decode()
            self._buckets[key] = bucket
            self.buckets_built.append(key)
        self._buckets.move_to_end(key)
        return bucket

    def _vision_prompts(self, prompts: List[List[int]], images: Optional[Sequence[Optional[PromptImages]]]
                        ) -> Optional[List[Optional["_VisionPrompt"]]]:
        """Per prompt, its images' features and M-RoPE positions (None: a text-only prompt), or None for a text
        call; a clear error for images the prompt does not hold or a model without M-RoPE."""
        if self.image_tokens is None:
            if images is not None and any(entry is not None for entry in images):
                raise ValueError("images need a Qwen2.5-VL actor (built by mindgrpo.models.build_model from a "
                                 "Qwen2.5-VL folder); this one is a text model")
            return None
        image_token_id = self.image_tokens[0]
        if images is None:
            images = [None] * len(prompts)
            text_call = True
        else:
            text_call = False
            if len(images) != len(prompts):
                raise ValueError(f"{len(prompts)} prompts but {len(images)} images entries; give one per prompt "
                                 "(None for a prompt without images)")
        vision: List[Optional[_VisionPrompt]] = []
        for i, (prompt, entry) in enumerate(zip(prompts, images)):
            count = prompt.count(image_token_id)
            if entry is None:
                if count:
                    raise ValueError(f"prompt {i} holds {count} <|image_pad|> tokens ({image_token_id}) but no images "
                                     "were given for it; pass its PromptImages in generate(..., images=...)")
                vision.append(None)
            else:
                vision.append(_VisionPrompt(self, i, prompt, entry))
        return None if text_call else vision


def _prompt_keys(row_prompts: Sequence[Sequence[int]], row_vision: Optional[Sequence[Optional["_VisionPrompt"]]]
                 ) -> List[object]:
    """What makes rows share a prefill: the same tokens, and for a prompt with images the same prompt (compared by
    identity: other images can give the same tokens)."""
    if row_vision is None:
        return [tuple(p) for p in row_prompts]
    return [tuple(p) if vision is None else vision for p, vision in zip(row_prompts, row_vision)]


class _VisionPrompt:
    """A Qwen2.5-VL prompt's inputs, prepared on the host once per prompt (not per sample): its image features
    (float32 [image tokens, hidden]), its M-RoPE positions [3, length] and the position of its first generated
    token (its last position + 1, i.e. ``length + rope_delta``)."""

    def __init__(self, engine: NativeRolloutEngine, index: int, prompt: List[int], images: PromptImages):
        image_token_id, vision_start_token_id, merge = engine.image_tokens
        features = np.asarray(images.features, np.float32)
        count = prompt.count(image_token_id)
        if features.ndim != 2 or features.shape[1] != engine.spec.hidden_size:
            raise ValueError(f"prompt {index}: image features must be [image tokens, hidden_size="
                             f"{engine.spec.hidden_size}], got shape {features.shape}")
        if len(features) != count:
            raise ValueError(f"prompt {index} holds {count} <|image_pad|> tokens ({image_token_id}) but its images "
                             f"have {len(features)} feature rows; each image needs one token per merged patch")
        try:
            positions, deltas = get_rope_index(np.array([prompt]), images.image_grid_thw, None,
                                               image_token_id=image_token_id,
                                               vision_start_token_id=vision_start_token_id, spatial_merge_size=merge)
        except ValueError as err:
            raise ValueError(f"prompt {index}: {err}") from err
        # get_rope_index checks that each image's tokens are there, not that no <|image_pad|> is left over
        grid_tokens = int(np.prod(np.asarray(images.image_grid_thw, np.int64), axis=1).sum()) // merge ** 2
        if grid_tokens != count:
            raise ValueError(f"prompt {index}: image_grid_thw {np.asarray(images.image_grid_thw).tolist()} makes "
                             f"{grid_tokens} image tokens but the prompt holds {count} <|image_pad|> tokens")
        self.features = features
        self.positions = positions[:, 0].astype(np.int32)
        self.next_position = int(decode_position_ids(deltas, len(prompt))[0, 0, 0])


class _ChunkDecoder:
    """Prefill of one chunk of rows (distinct prompts once, cache forked to their rows), then one token per row
    per :meth:`advance`. ``logits`` [len(rows), vocab] always holds the next-token logits of the chunk rows
    ``rows``: all of them at first, then, with compaction, those still generating. Chunk row ``r`` lives in cache
    row ``r`` throughout."""

    def __init__(self, engine: NativeRolloutEngine, row_prompts: Sequence[Sequence[int]], max_tokens: int,
                 row_vision: Optional[Sequence[Optional[_VisionPrompt]]] = None):
        self.bucket = bucket = engine.bucket_for(row_prompts, max_tokens, row_vision)
        key, s, pad = bucket.key, bucket.key.prompt_len, engine.pad_token_id
        distinct: Dict[object, int] = {}
        row_source = np.array([distinct.setdefault(k, len(distinct)) for k in _prompt_keys(row_prompts, row_vision)],
                              np.int32)
        first_row = np.unique(row_source, return_index=True)[1]  # a row of each distinct prompt, in prompt order
        tokens = np.full((key.prompt_batch, s), pad, np.int32)
        positions = np.zeros((key.prompt_batch, s), np.int32)
        key_valid = np.zeros((key.prompt_batch, s), np.float32)  # padding prompt rows stay fully masked
        for i, r in enumerate(first_row):
            prompt = row_prompts[r]
            tokens[i, s - len(prompt):] = prompt
            positions[i, s - len(prompt):] = np.arange(len(prompt))
            key_valid[i, s - len(prompt):] = 1.0
        cache_rows = np.zeros(key.batch, np.int32)  # padding decode rows continue prompt 0 and are ignored
        cache_rows[:len(row_prompts)] = row_source
        # per row: its prompt's length and the cache index of its first real token
        self.lengths = np.array([len(p) for p in row_prompts], np.int32)
        self.first_key = s - self.lengths
        # per row: the position of its first generated token (its prompt's length for text)
        self.next_position = self.lengths
        if row_vision is None:
            prompt_logits = bucket.prefill(Tensor(tokens), Tensor(positions), Tensor(key_valid), Tensor(cache_rows))
        else:
            positions, features, image_rows, next_position = _vision_prefill_inputs(
                engine, tokens, positions, [row_vision[r] for r in first_row], self.lengths[first_row])
            self.next_position = next_position[row_source]
            prompt_logits = bucket.prefill(Tensor(tokens), Tensor(positions), Tensor(key_valid), Tensor(cache_rows),
                                           Tensor(features), Tensor(image_rows))
        prompt_logits = prompt_logits.asnumpy()
        self.logits = prompt_logits[row_source]
        self.rows = np.arange(len(row_prompts))
        self.compact = engine.compact
        self.pad = pad
        self.step = 0
        bucket.release_rows(np.arange(len(row_prompts), key.batch))  # padding rows: never decoded

    def advance(self, tokens: np.ndarray, keep: Optional[np.ndarray] = None) -> None:
        """Feed the token of each row of ``rows`` for the current step; with compaction, the rows where ``keep``
        is False (they ended) stop being decoded. ``logits`` then predicts the step after it."""
        key = self.bucket.key
        if self.step >= key.max_tokens:
            raise RuntimeError("decoded past the bucket's cache length")
        if self.compact and keep is not None:
            self.bucket.release_rows(self.rows[~keep])
            self.rows, tokens = self.rows[keep], tokens[keep]
        count = len(self.rows)
        columns, live = self.bucket.columns(self.rows)
        batch, write_pos = len(columns), key.prompt_len + self.step
        # columns without a live row (see _Bucket.columns) are fed padding and attend to their new key only (or are
        # skipped), and their results dropped
        feed = np.full(batch, self.pad, np.int32)
        feed[live] = tokens
        positions = np.zeros(batch, np.int32)
        positions[live] = self.next_position[self.rows] + self.step
        start = np.full(batch, write_pos, np.int32)
        start[live] = self.first_key[self.rows]
        logits_t = self.bucket.decode[batch](Tensor(feed), Tensor(positions), Tensor(start),
                                             Tensor(write_pos, ms.int32), Tensor(columns.astype(np.int32)))
        logits = logits_t.asnumpy().T
        # a view when the live columns are the first ones: the sampler's copy does the transpose
        self.logits = logits[:count] if live[-1] == count - 1 else logits[live]
        self.step += 1


def _vision_prefill_inputs(engine: NativeRolloutEngine, tokens: np.ndarray, text_positions: np.ndarray,
                           prompt_vision: List[Optional[_VisionPrompt]], prompt_lengths: np.ndarray
                           ) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """What a Qwen2.5-VL chunk's prefill adds, for its prompts left-padded in ``tokens [P, S]`` (the first
    ``len(prompt_vision)`` rows real): 3-row positions [3, P, S] (a text-only prompt's rows are its 1-row
    positions), the prompts' image features in row order padded to ``P * S`` rows (static per bucket), which row
    each token reads, and the position of each prompt's first generated token."""
    p, s = tokens.shape
    positions = np.stack([text_positions] * 3)
    next_position = np.zeros(p, np.int32)
    features = np.zeros((p * s, engine.spec.hidden_size), np.float32)
    used = 0
    for i, (vision, length) in enumerate(zip(prompt_vision, prompt_lengths)):
        if vision is None:
            next_position[i] = length
            continue
        positions[:, i, s - length:] = vision.positions
        next_position[i] = vision.next_position
        features[used:used + len(vision.features)] = vision.features
        used += len(vision.features)
    # image features come in row-major token order, as image_source_rows hands them out; padding rows hold none
    image_rows = image_source_rows(tokens, engine.image_tokens[0], used)
    return positions, features, image_rows, next_position
