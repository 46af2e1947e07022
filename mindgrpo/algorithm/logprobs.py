"""Per-token log-probs and entropies from logits, keeping vocabulary-sized temporaries to a minimum.

Qwen2.5's vocabulary has 151,936 entries, so a [B, T, V] float32 tensor is ~0.6 MB per token; a full log-softmax
would add one more such tensor on top of the logits. Instead we gather the target logit and subtract the
log-sum-exp (one [B, T] result), the way TRL's ``selective_log_softmax`` does for float32. The max used to
stabilise the exp is detached: d lse / d max is exactly zero, so this is the same gradient without a backward
pass through ``ReduceMax``. ``chunk_size`` bounds the remaining temporaries (the shifted logits and their exp) to
``chunk_size`` rows of the flattened [B*T, V] logits; ``ops.split`` is used so the backward concatenates chunk
gradients rather than padding each to full size. The gradient with respect to the logits is itself [B, T, V], so
training cannot go below that.
"""
from __future__ import annotations

import mindspore as ms
from mindspore import Tensor, ops


def _chunks(rows: Tensor, chunk_size: int | None) -> tuple[Tensor, ...]:
    if chunk_size is None or chunk_size >= rows.shape[0]:
        return (rows,)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive number of rows, got {chunk_size}")
    return ops.split(rows, chunk_size, axis=0)


def _scaled_shift(logits: Tensor, temperature: float) -> Tensor:
    """``(logits - max) / temperature``, the numerically safe argument of the softmax."""
    shifted = logits - ops.stop_gradient(logits.max(axis=-1, keepdims=True))
    return shifted if temperature == 1.0 else shifted * (1.0 / temperature)


def token_logprobs(logits: Tensor, targets: Tensor, temperature: float = 1.0,
                   chunk_size: int | None = None) -> Tensor:
    """``log softmax(logits / temperature)[..., targets]``: [B, T, V] logits, [B, T] ids -> [B, T] log-probs.

    ``logits[:, t]`` must already be the prediction for ``targets[:, t]`` (shift by one before calling).
    ``temperature`` must match the sampling temperature so the log-probs are those of the sampling policy (as
    TRL and verl do). ``chunk_size`` (rows of the flattened [B*T, V] logits per chunk) caps temporaries.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if logits.ndim != targets.ndim + 1 or logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)} do not match: "
                         "expected logits [..., V] and targets [...]")
    vocab = logits.shape[-1]
    flat_ids = targets.reshape(-1, 1).astype(ms.int32)
    pieces = []
    for rows, ids in zip(_chunks(logits.reshape(-1, vocab), chunk_size), _chunks(flat_ids, chunk_size)):
        z = _scaled_shift(rows, temperature)
        picked = ops.gather_elements(z, 1, ids).squeeze(-1)
        pieces.append(picked - ops.log(ops.exp(z).sum(axis=-1)))
    flat = pieces[0] if len(pieces) == 1 else ops.cat(pieces)
    return flat.reshape(targets.shape)


def token_entropy(logits: Tensor, temperature: float = 1.0, chunk_size: int | None = None) -> Tensor:
    """Entropy of ``softmax(logits / temperature)`` per position: [B, T, V] -> [B, T], without gradient.

    Computed as ``lse(z) - sum(softmax(z) * z)`` on the shifted logits z; it is a metric (``actor/entropy``), so
    the logits are detached and no [B, T, V] activation is kept for a backward pass.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    logits = ops.stop_gradient(logits)
    vocab = logits.shape[-1]
    pieces = []
    for rows in _chunks(logits.reshape(-1, vocab), chunk_size):
        z = _scaled_shift(rows, temperature)
        exp_z = ops.exp(z)
        total = exp_z.sum(axis=-1)
        pieces.append(ops.log(total) - (exp_z * z).sum(axis=-1) / total)
    flat = pieces[0] if len(pieces) == 1 else ops.cat(pieces)
    return flat.reshape(logits.shape[:-1])
