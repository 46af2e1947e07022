r"""The VL demo's supervised warm start: picture + question -> `\boxed{n}`, before GRPO sees the model.

As the text demo's warm start (:mod:`mindgrpo.apps.demo.warm_start`, whose loop it runs), it stops once the model's
answers are right about TARGET_MATCH of the time over the last batches (chance is 1/4), leaving GRPO a reward signal
and room to improve. The vision tower stays frozen, as in GRPO: each picture's features are computed
once, and the language model learns to read them (through mindgrpo's full-sequence forward with M-RoPE).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Dict

import numpy as np

from mindgrpo.apps.demo.warm_start import BATCH_SIZE, fit_until_match

TARGET_MATCH = 0.45


def warm_start(init_dir: Path, out_dir: Path, dataset_file: Path, *, max_steps: int, seed: int) -> Dict[str, object]:
    """Fine-tune the language model of the Qwen2.5-VL folder `init_dir` on the prompts of the MindRecord
    `dataset_file` (answers `\boxed{gold}`), export it with its unchanged tower to `out_dir`; returns the steps, time
    and the final exact-match rate."""
    import mindspore as ms
    from mindspore import Tensor, ops

    from mindgrpo.data import PromptDataset
    from mindgrpo.data.tokenizer import load_tokenizer
    from mindgrpo.models import build_model, export_hf, read_hf_config
    from mindgrpo.models.image_tokens import image_source_rows
    from mindgrpo.models.mrope import get_rope_index

    start_time = time.perf_counter()
    tok = load_tokenizer(init_dir)
    data = PromptDataset(dataset_file)
    answers = [tok.encode(f"\\boxed{{{gold}}}") + [tok.eos_token_id] for gold in data.golds]
    if len({len(a) for a in answers}) != 1 or len(set(data.lengths.tolist())) != 1:
        raise ValueError("the VL demo's prompts and answers must each have one length (one question, one picture "
                         "size, one-digit answers); the task changed without updating the warm start")
    ids = np.concatenate([data.input_ids[:, :int(data.lengths[0])], np.array(answers, np.int32)], 1)
    prompt_len, length = int(data.lengths[0]), ids.shape[1]
    answer_mask = np.zeros(ids.shape, np.float32)
    answer_mask[:, prompt_len:] = 1.0

    model = build_model(init_dir, role="actor")
    tower = model.vision.tower  # frozen: the language model learns to read its features
    spec = model.spec
    pixels = [data.prompt_images(i) for i in range(len(data))]
    chunks = []  # the tower over 32 pictures per call (one call per picture costs as much as 32 in PyNative)
    for first in range(0, len(pixels), 32):
        chunk = pixels[first:first + 32]
        chunks.append(tower.embed_images(np.concatenate([p.pixel_values for p in chunk]),
                                         np.concatenate([p.image_grid_thw for p in chunk])).asnumpy())
    features = np.concatenate(chunks).reshape(len(pixels), -1, chunks[0].shape[1])
    tokens = features.shape[1]  # per picture
    # every row has the same layout: one set of positions and feature rows serves every batch
    positions, _ = get_rope_index(ids[:1], pixels[0].image_grid_thw, None, image_token_id=spec.image_token_id,
                                  vision_start_token_id=spec.vision_start_token_id,
                                  spatial_merge_size=spec.spatial_merge_size)
    positions = Tensor(np.repeat(positions, BATCH_SIZE, 1).astype(np.int32))
    rows = Tensor(image_source_rows(ids[:BATCH_SIZE], spec.image_token_id, BATCH_SIZE * tokens))
    attention = Tensor(np.ones((BATCH_SIZE, length), np.int32))
    forward = model.full_sequence(length)

    def answer_loss(batch_ids, batch_features, mask):
        logits = forward(batch_ids, attention, positions, batch_features, rows)[:, :-1]
        targets = batch_ids[:, 1:]
        mask = mask[:, 1:]
        logp = ops.gather_elements(ops.log_softmax(logits, -1), 2, targets.expand_dims(-1)).squeeze(-1)
        misses = ops.cast(ops.not_equal(logits.argmax(-1), targets), ms.float32) * mask
        return -(logp * mask).sum() / mask.sum(), ops.cast(misses.sum(-1) == 0, ms.float32).sum()

    facts = fit_until_match(
        model, answer_loss,
        lambda batch: [ids[batch], features[batch].reshape(-1, features.shape[2]), answer_mask[batch]],
        rows=len(ids), scored_rows=BATCH_SIZE, target_match=TARGET_MATCH, max_steps=max_steps, seed=seed)
    export_hf(model, out_dir, hf_config=read_hf_config(init_dir), tokenizer_dir=init_dir)
    return {**facts, "warm_start_seconds": round(time.perf_counter() - start_time, 1)}
