"""Host-side token sampling in numpy with a seeded generator, shared by the native and mindformers backends.

:func:`process_logits` is the single definition of every sampling option (both backends call it, so they sample
from the same distribution); :class:`TokenSampler` adds the random draw and the per-rollout state.

Sampling runs on the host because that keeps one readable implementation and is cheap at the sizes we decode on
CPU: with a 4,096-token vocabulary a step over 32 rows costs about 0.6 ms (~15% of a tiny-model decode step on
the fused kernels; top-p adds a partial sort). With Qwen2.5's 151,936-token vocabulary the logits are 19 MB per
step for 32 rows and the host work is ~30 ms per step (~150 ms with top-k 50 and top-p 0.95): small next to a
0.5B model's decode step on CPU, but on Ascend, where a step takes milliseconds, in-graph sampling (or an in-graph
top-k pre-filter) would pay off.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np

from mindgrpo.rollout.api import SamplingParams

_DRAW_BLOCK = 64  # tokens per block of the two-level inverse-CDF walk in TokenSampler._draw


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax that tolerates -inf entries (at least one finite entry per row)."""
    top = np.max(logits, axis=-1, keepdims=True)
    shifted = logits - top
    return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))


def seen_tokens(sequences: Sequence[Sequence[int]], vocab_size: int) -> np.ndarray:
    """bool [rows, vocab]: which tokens each row already contains (for the repetition penalty)."""
    seen = np.zeros((len(sequences), vocab_size), bool)
    for row, tokens in enumerate(sequences):
        seen[row, np.asarray(tokens, np.int64)] = True
    return seen


def process_logits(logits: np.ndarray, params: SamplingParams, step: int, eos_ids: Sequence[int],
                   seen: Optional[np.ndarray] = None) -> np.ndarray:
    """Log-probs [rows, vocab] of the distribution the token at completion position ``step`` is drawn from.

    Order (as in Hugging Face and vLLM): repetition penalty on ``seen`` tokens -> EOS masked while
    ``step < min_tokens`` -> temperature -> top-k -> top-p; removed tokens get -inf. For greedy params the
    temperature and filters are skipped: the result is the log-softmax of the penalised logits, whose argmax is the
    greedy token.
    """
    # own copy, edited in place below; row-major whatever the input's layout (the engine passes a transposed view),
    # so each row's sums run in the same order however many rows come along: a row's log-probs are the same bits
    # in a full batch and in a compacted one
    logits = np.array(logits, dtype=np.float32, order="C")
    if params.repetition_penalty != 1.0:
        if seen is None:
            raise ValueError("repetition_penalty needs the tokens seen so far")
        penalised = np.where(logits > 0, logits / params.repetition_penalty, logits * params.repetition_penalty)
        logits = np.where(seen, penalised, logits).astype(np.float32)
    if step < params.min_tokens:
        logits[:, np.asarray(eos_ids, np.int64)] = -np.inf
    if params.greedy:
        return log_softmax(logits)
    logits /= np.float32(params.temperature)
    vocab = logits.shape[-1]
    if 0 < params.top_k < vocab:
        # ties with the k-th value are kept, as in Hugging Face's TopKLogitsWarper
        kth = np.partition(logits, vocab - params.top_k, axis=-1)[:, vocab - params.top_k][:, None]
        logits[logits < kth] = -np.inf
    logp = log_softmax(logits)
    if params.top_p < 1.0:
        logp[_outside_top_p(logp, params.top_p)] = -np.inf
        logp = log_softmax(logp)
    return logp


def _outside_top_p(logp: np.ndarray, top_p: float, first_k: int = 64) -> np.ndarray:
    """bool [rows, vocab]: tokens outside the smallest most-likely set whose mass reaches ``top_p``.

    A token stays when the mass ranked above it is still below ``top_p`` (so the top token always stays). Rather
    than sorting the whole vocabulary, sort only the ``k`` most likely tokens of each row (``argpartition``) and
    grow ``k`` for the rows whose top-``k`` mass is still short of ``top_p``: LM distributions are peaked, so
    ``k = 64`` usually settles every row.
    """
    rows, vocab = logp.shape
    drop = np.ones(logp.shape, bool)
    pending = np.arange(rows)
    k = min(first_k, vocab)
    while pending.size:
        sub = logp[pending]
        if k < vocab:
            top = np.argpartition(-sub, k - 1, axis=-1)[:, :k]
            top = np.take_along_axis(top, np.argsort(-np.take_along_axis(sub, top, -1), -1, kind="stable"), -1)
        else:
            top = np.argsort(-sub, axis=-1, kind="stable")
        probs = np.exp(np.take_along_axis(sub, top, -1))
        mass = np.cumsum(probs, axis=-1)
        settled = (mass[:, -1] >= top_p) | (k >= vocab)  # the kept set lies inside these k tokens
        for i in np.flatnonzero(settled):
            drop[pending[i], top[i][mass[i] - probs[i] < top_p]] = False
        pending = pending[~settled]
        k = min(4 * k, vocab)
    return drop


_MIX = (np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _splitmix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on uint64 arrays (wrapping arithmetic): a bijection whose outputs pass BigCrush."""
    x = (x ^ (x >> np.uint64(30))) * _MIX[0]
    x = (x ^ (x >> np.uint64(27))) * _MIX[1]
    return x ^ (x >> np.uint64(31))


def row_uniforms(seed: int, row_keys: np.ndarray, step: int) -> np.ndarray:
    """float64 uniforms in [0, 1), one per row: a hash of (seed, the row's key, the completion position) alone.

    Counter-based rather than a stream, so a row's draws depend on nothing else in the call: not on the other
    rows, the chunk it is decoded in, or the rank that samples it. Data-parallel ranks that key their rows by
    their place in the global batch draw what one process sampling the whole batch draws.
    """
    keys = np.asarray(row_keys, np.uint64)
    with np.errstate(over="ignore"):
        x = _splitmix(np.uint64(seed) * _GOLDEN + keys)
        x = _splitmix(x ^ (np.uint64(step) * _GOLDEN + _GOLDEN))
    return (x >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


class TokenSampler:
    """Draws the next token of a batch of rows, one step at a time, from :func:`process_logits`' distribution.

    Holds the per-rollout state: the seed, each row's key (:func:`row_uniforms`) and, for the repetition penalty,
    which tokens each row has seen (its prompt and its completion so far). A row's uniform at each position is a
    function of (seed, key, position), so a row's tokens depend neither on which other rows have ended (the native
    engine stops decoding finished rows) nor on which rows share its call.
    """

    def __init__(self, params: SamplingParams, eos_ids: Sequence[int], vocab_size: int, seed: int,
                 row_keys: Sequence[int], row_prompts: Sequence[Sequence[int]]):
        if len(row_keys) != len(row_prompts):
            raise ValueError(f"{len(row_keys)} row keys for {len(row_prompts)} rows")
        self.params = params
        self.eos_ids = tuple(eos_ids)
        self.seed = int(seed)
        self.row_keys = np.asarray(row_keys, np.int64)
        self.num_rows = len(row_prompts)
        self.seen = seen_tokens(row_prompts, vocab_size) if params.repetition_penalty != 1.0 else None

    def sample(self, logits: np.ndarray, step: int, rows: Optional[np.ndarray] = None
               ) -> Tuple[np.ndarray, np.ndarray]:
        """Tokens and their log-probs for completion position ``step`` of ``rows`` (indices into the rollout's
        rows, default all of them) from their logits [len(rows), vocab]."""
        rows = np.arange(self.num_rows) if rows is None else np.asarray(rows)
        seen = None if self.seen is None else self.seen[rows]
        logp = process_logits(logits, self.params, step, self.eos_ids, seen)
        tokens = np.argmax(logp, axis=-1) if self.params.greedy else self._draw(np.exp(logp), rows, step)
        if self.seen is not None:
            self.seen[rows, tokens] = True
        return tokens, np.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0].astype(np.float32)

    def observe(self, rows: np.ndarray, tokens: np.ndarray) -> None:
        """Tokens put into ``rows`` without sampling (a tool's response): context like any other, so the
        repetition penalty counts them, as Hugging Face and vLLM count every token before the next."""
        if self.seen is not None:
            self.seen[rows, tokens] = True

    def _draw(self, probs: np.ndarray, rows: np.ndarray, step: int) -> np.ndarray:
        """One token per row of ``rows`` with probability ``probs`` (inverse CDF with the row's uniform at
        ``step``).

        The CDF is walked in two levels, blocks of ``_DRAW_BLOCK`` tokens and then one block per row: numpy's cumsum
        over a whole vocabulary is sequential (3.5 ns a token, 0.45 ms per step for 32 rows of 4,096), while the
        block sums vectorise.
        """
        count, vocab = probs.shape
        block = _DRAW_BLOCK
        padded = -(-vocab // block) * block
        blocks = np.pad(probs, ((0, 0), (0, padded - vocab))).reshape(count, padded // block, block)
        block_cdf = np.cumsum(blocks.sum(-1), axis=-1)
        # u in (0, 1]: the first block (then token) whose cdf reaches u * total has positive probability
        target = (1.0 - row_uniforms(self.seed, self.row_keys[rows], step)) * block_cdf[:, -1]
        chosen = np.minimum((block_cdf < target[:, None]).sum(-1), block_cdf.shape[1] - 1)
        everything = np.arange(count)
        before = np.where(chosen > 0, block_cdf[everything, chosen - 1], 0.0)
        within = before[:, None] + np.cumsum(blocks[everything, chosen], axis=-1)
        # the block's own sum may round a hair below its cdf entry: aim at most at its last cumulative value
        target = np.minimum(target, within[:, -1])
        tokens = chosen * block + np.minimum((within < target[:, None]).sum(-1), block - 1)
        tokens = np.minimum(tokens, vocab - 1)
        for row in np.flatnonzero(probs[everything, tokens] <= 0):  # rounding at a block edge (~never)
            positive = np.flatnonzero(probs[row] > 0)  # take the next token that can be drawn
            later = positive[positive >= tokens[row]]
            tokens[row] = later[0] if later.size else positive[-1]
        return tokens.astype(np.int64)
