"""Per-token log-probs and entropies from logits, with every vocabulary-sized step a kernel that needs no index tables.

Qwen2.5's vocabulary has 151,936 entries, so a [B, T, V] float32 tensor is ~0.6 MB per token. On CPU, MindSpore's
broadcasting element-wise kernels (``logits - max[..., None]``) and ``Transpose`` build a table of 8-byte indices
per output element when a graph is compiled, and keep it for the graph's lifetime: two such tables cost four times
the logits themselves, in every compiled shape (found with an allocation tracer; see docs/performance.md,
"Memory"). So the log-softmax is MindSpore's own ``LogSoftmax`` kernel (one fused pass, its own backward, no tables)
followed by a gather of the target column, and temperature scaling is a scalar multiply. ``chunk_size`` bounds the
temporaries to ``chunk_size`` rows of the flattened [B*T, V] logits; ``ops.split`` is used so the backward
concatenates chunk gradients rather than padding each to full size. The gradient with respect to the logits is
itself [B, T, V], so training cannot go below that.
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


def _scaled(logits: Tensor, temperature: float) -> Tensor:
    return logits if temperature == 1.0 else logits * (1.0 / temperature)


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
        log_p = ops.log_softmax(_scaled(rows, temperature), -1)
        pieces.append(ops.gather_elements(log_p, 1, ids).squeeze(-1))
    flat = pieces[0] if len(pieces) == 1 else ops.cat(pieces)
    return flat.reshape(targets.shape)


def token_entropy(logits: Tensor, temperature: float = 1.0, chunk_size: int | None = None, *,
                  keep_gradient: bool = False) -> Tensor:
    """Entropy of ``softmax(logits / temperature)`` per position: [B, T, V] -> [B, T].

    Computed as ``-sum(softmax(z) * log_softmax(z))``. As a metric (``actor/entropy``) or the entropy mask's key
    it needs no gradient, so by default the logits are detached and no [B, T, V] activation is kept for a backward
    pass; ``keep_gradient`` keeps it, for the entropy bonus (``rl_config.entropy_coef``).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if not keep_gradient:
        logits = ops.stop_gradient(logits)
    vocab = logits.shape[-1]
    pieces = []
    for rows in _chunks(logits.reshape(-1, vocab), chunk_size):
        z = _scaled(rows, temperature)
        pieces.append(-(ops.softmax(z, -1) * ops.log_softmax(z, -1)).sum(axis=-1))
    flat = pieces[0] if len(pieces) == 1 else ops.cat(pieces)
    return flat.reshape(logits.shape[:-1])
