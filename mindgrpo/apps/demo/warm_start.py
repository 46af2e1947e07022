"""The demo model's supervised warm start: `gsm8k_hash` prompts -> answers, before GRPO sees it, and the loop every
demo's warm start runs (:func:`fit_until_match`: the text, VL and tool demos differ only in their loss and data).

A random model never writes `#### N`, so GRPO's reward would be all zeros. The warm start stops once the model gets
about a fifth of its training answers exactly right (about 30-45% greedy test accuracy, less when sampling), which
leaves GRPO a reward signal and room to improve. Its optimizer is the library's (`mindgrpo.train.optim`: AdamW,
global-norm clipping, the warmup schedule); only the loss, on answer tokens, is its own.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Sequence

import numpy as np

from mindgrpo.apps.demo.scoring import Scorer, encode, window_functions

BATCH_SIZE = 32
LEARNING_RATE = 4e-3  # after WARMUP_STEPS of linear warmup, constant
WARMUP_STEPS = 20
ADAM_BETA2 = 0.99
# Exact-match rate over the last MATCH_WINDOW training batches at which the warm start stops. 0.22 was tuned on
# MindFormers' forward (held-out greedy 0.295); on mindgrpo's own it stopped stronger (0.355), leaving GRPO gains of
# +0.03 to +0.11; at 0.20 it starts at 0.235 and seeds 0-2 gain +0.155 to +0.235 (tools/demo_seeds.py).
TARGET_MATCH = 0.20
MATCH_WINDOW = 10


def shuffled_batches(count: int, seed: int) -> Iterator[np.ndarray]:
    """BATCH_SIZE row indices of `count` rows at a time, epoch after epoch, each in a fresh random order (an epoch's
    last rows open the next batch). The demos' warm starts all draw their batches so."""
    rng = np.random.default_rng(seed)
    order = np.zeros(0, np.int64)
    while True:
        if len(order) < BATCH_SIZE:
            order = np.concatenate([order, rng.permutation(count)])
        batch, order = order[:BATCH_SIZE], order[BATCH_SIZE:]
        yield batch


def fit_until_match(model, loss_fn: Callable, batch_arrays: Callable[[np.ndarray], Sequence[np.ndarray]], *,
                    rows: int, scored_rows: int, target_match: float, max_steps: int, seed: int) -> Dict[str, object]:
    """Train ``model`` on ``loss_fn`` until its answers are right often enough: AdamW (``mindgrpo.train.optim``,
    global-norm clipping at 1, LEARNING_RATE after WARMUP_STEPS of warmup), one GRAPH-mode step per batch of
    BATCH_SIZE of the ``rows`` rows (:func:`shuffled_batches`; ``batch_arrays(indices)`` gives the step's inputs).

    ``loss_fn(*inputs)`` returns the loss and how many rows had every answer token as the model's top choice
    (measured by the step's own forward, before its update: this is when greedy decoding writes the gold answer),
    out of ``scored_rows`` a batch. Training stops once that exact match, averaged over the last MATCH_WINDOW
    batches, reaches ``target_match``, or after ``max_steps``. Stopping on a measurement rather than after a fixed
    step count lands in the band GRPO needs (some reward signal, room to improve) whatever the data order or the
    machine's floating-point rounding; measuring inside the training step keeps it free (switching to another
    compiled graph every few steps would halve the step rate). Returns the steps run, the last loss and the exact
    match."""
    import mindspore as ms
    from mindspore import Tensor

    from mindgrpo.config import LRScheduleConfig, OptimizerConfig
    from mindgrpo.train.optim import AdamW, clip_by_global_norm, learning_rate_at

    config = OptimizerConfig(weight_decay=0.0, beta2=ADAM_BETA2, max_grad_norm=1.0)
    optimizer = AdamW(model.trainable_params(), config)
    schedule = LRScheduleConfig(learning_rate=LEARNING_RATE, warmup_steps=WARMUP_STEPS)
    grad_fn = ms.value_and_grad(loss_fn, None, optimizer.params, has_aux=True)

    @ms.jit
    def train_step(step_size, eps, decay, *inputs):  # the first three: the optimizer's hyper_tensors
        (loss, exact_rows), grads = grad_fn(*inputs)
        grads, _ = clip_by_global_norm(grads, config.max_grad_norm)
        optimizer(grads, step_size, eps, decay)
        return loss, exact_rows

    matches: List[float] = []
    step, loss = 0, None
    for step, batch in zip(range(1, max_steps + 1), shuffled_batches(rows, seed)):
        lr = learning_rate_at(schedule, step - 1, max_steps)
        loss, exact_rows = train_step(*optimizer.hyper_tensors(lr), *(Tensor(a) for a in batch_arrays(batch)))
        matches.append(float(exact_rows.asnumpy()) / scored_rows)
        if len(matches) >= MATCH_WINDOW and np.mean(matches[-MATCH_WINDOW:]) >= target_match:
            break
    return {"warm_start_steps_run": step, "warm_start_loss": round(float(loss.asnumpy()), 4),
            "train_exact_match": round(float(np.mean(matches[-MATCH_WINDOW:])), 4)}


def warm_start(init_dir: Path, out_dir: Path, train: Sequence[dict], test: Sequence[dict], *, max_steps: int,
               seed: int) -> Dict[str, object]:
    """Supervised fine-tuning of the model in `init_dir` on `train` (loss on answer tokens only), until
    TARGET_MATCH (:func:`fit_until_match`), exported to `out_dir`. Returns the steps and time taken, and greedy and
    sampled accuracy on `test`."""
    import mindspore as ms
    from mindspore import ops

    from mindgrpo.data.tokenizer import load_tokenizer
    from mindgrpo.models import build_model, export_hf, read_hf_config

    start_time = time.perf_counter()
    tok = load_tokenizer(init_dir)
    model = build_model(init_dir, role="actor")
    window, window_logits = window_functions(model)

    def answer_loss(ids, attention, answer_mask, first):
        logits = window_logits(ids, attention, first)
        targets = ops.gather_elements(ids, 1, window(first) + 1)
        mask = ops.gather_elements(answer_mask, 1, window(first) + 1)
        token_logprobs = ops.gather_elements(ops.log_softmax(logits, -1), 2, targets.expand_dims(-1)).squeeze(-1)
        misses = ops.cast(ops.not_equal(logits.argmax(-1), targets), ms.float32) * mask
        exact_rows = ops.cast(misses.sum(-1) == 0, ms.float32).sum()
        return -(token_logprobs * mask).sum() / mask.sum(), exact_rows

    arrays = encode(tok, train, with_answers=True)
    facts = fit_until_match(model, answer_loss, lambda batch: [array[batch] for array in arrays], rows=len(train),
                            scored_rows=BATCH_SIZE, target_match=TARGET_MATCH, max_steps=max_steps, seed=seed)
    facts["warm_start_seconds"] = round(time.perf_counter() - start_time, 1)
    export_hf(model, out_dir, hf_config=read_hf_config(init_dir), tokenizer_dir=init_dir)
    scorer = Scorer(model, tok)
    return {**facts, "test_greedy_accuracy": scorer.accuracy(test),
            "test_sampled_accuracy": scorer.accuracy(test, seed)}
