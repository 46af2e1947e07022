"""Where each rank's AdamW moments live, and how a checkpoint's moments move to another layout (pure numpy).

Under ZeRO-1 every data-parallel rank keeps the moments of only some parameters (:func:`owner_ranks`), and under
tensor parallelism each rank's moments are slices of the Hugging Face tensors, cut like the weights
(:class:`~mindgrpo.parallel.layout.TPLayout`). A checkpoint therefore holds one file per rank, each keyed by
HF name (``exp_avg.<hf_name>``, ``exp_avg_sq.<hf_name>``, with bf16 weights ``master.<hf_name>``, ``step_count``) and
holding only what that rank keeps,
plus one layout record. :func:`load_resharded` gives a rank of any other layout its moments: for each parameter it
owns, the old slices are read from whichever old data-parallel rank kept them, joined into the full tensor and cut
again. Only the needed tensors are read (``safe_open``), so a rank never loads the whole optimizer state.
"""
from __future__ import annotations

from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Dict, Mapping, Sequence

import numpy as np

from mindgrpo.parallel.layout import TPLayout

MOMENTS = ("exp_avg", "exp_avg_sq")
# The fp32 master weights of a mixed-precision run (actor_config.param_dtype bfloat16), kept and resharded as the
# moments are: ``master.<hf_name>``.
MASTER = "master"
STEP_COUNT = "step_count"
RECORD_FORMAT = "mindgrpo-optimizer-shards"


def owner_ranks(sizes: Sequence[int], parts: int) -> list:
    """The data-parallel rank that keeps the moments of each parameter (element counts ``sizes``, in order).

    Greedy largest-first onto the least-loaded rank (ties to the lower index): every rank computes the same
    answer from the same sizes, with no communication, and the loads differ by at most one parameter's size.
    """
    if parts < 1:
        raise ValueError(f"cannot partition parameters over {parts} ranks")
    loads, owners = [0] * parts, [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-int(sizes[i]), i)):
        rank = min(range(parts), key=lambda r: (loads[r], r))
        owners[i] = rank
        loads[rank] += int(sizes[i])
    return owners


def layout_record(*, tp: int, dp: int, optimizer_shard: bool) -> dict:
    """The checkpoint-wide record (``optimizer/layout.json``): the layout the rank files were written under."""
    return {"format": RECORD_FORMAT, "version": 1, "tp": int(tp), "dp": int(dp),
            "optimizer_shard": bool(optimizer_shard)}


def rank_metadata(*, tp_rank: int, dp_rank: int) -> Dict[str, str]:
    """Safetensors metadata of one rank's file, so a file put in the wrong slot is caught on load."""
    return {"tp_rank": str(int(tp_rank)), "dp_rank": str(int(dp_rank))}


def _check_record(record: Mapping, files: Sequence) -> tuple:
    if record.get("format") != RECORD_FORMAT:
        raise ValueError(f"optimizer layout record has format {record.get('format')!r}, expected {RECORD_FORMAT!r}")
    tp, dp = int(record["tp"]), int(record["dp"])
    if len(files) != tp * dp:
        raise ValueError(f"the optimizer checkpoint was written by tp {tp} x dp {dp} = {tp * dp} ranks, but "
                         f"{len(files)} rank file(s) were given")
    return tp, dp


def load_resharded(files: Sequence[str | Path], record: Mapping, target: TPLayout, owned: Sequence[str],
                   full_shapes: Mapping[str, Sequence[int]]) -> Dict[str, np.ndarray]:
    """This rank's moments (for ``AdamW.load_state_arrays``) from a checkpoint written under another layout.

    ``files`` are the old ranks' files in rank order (rank = dp_rank * tp + tp_rank), ``record`` the old
    :func:`layout_record`, ``target`` this rank's tensor-parallel layout (``tp = 1`` without TP), ``owned`` the HF
    names whose moments this rank keeps, and ``full_shapes`` the full HF shape of each. The pieces are copied,
    never recomputed, so the same layout gives bit-identical moments.
    """
    from safetensors import safe_open

    tp, dp = _check_record(record, files)
    source = replace(target, tp=tp, rank=0)
    source.validate()
    with ExitStack() as stack:
        handles = [stack.enter_context(safe_open(str(path), framework="np")) for path in files]
        return _reshard(handles, [str(f) for f in files], source, target, dp, owned, full_shapes)


def _reshard(handles, files, source: TPLayout, target: TPLayout, dp: int, owned, full_shapes) -> Dict[str, np.ndarray]:
    tp = source.tp
    keys = [set(h.keys()) for h in handles]
    for rank, handle in enumerate(handles):
        meta = handle.metadata() or {}
        expected = rank_metadata(tp_rank=rank % tp, dp_rank=rank // tp)
        if any(meta.get(k) != v for k, v in expected.items()):
            raise ValueError(f"{files[rank]}: written by tp_rank {meta.get('tp_rank')}, dp_rank "
                             f"{meta.get('dp_rank')}, but it is in the slot of rank {rank} ({expected})")
    steps = {int(h.get_tensor(STEP_COUNT)) for h in handles}
    if len(steps) != 1:
        raise ValueError(f"the optimizer rank files disagree on the step count ({sorted(steps)}): they come from "
                         "different checkpoints")

    def piece(key: str, name: str, full_shape, tp_rank: int) -> np.ndarray:
        # Without ZeRO every data-parallel rank holds it (the first is read); with ZeRO exactly one does.
        for dp_rank in range(dp):
            rank = dp_rank * tp + tp_rank
            if key in keys[rank]:
                value = handles[rank].get_tensor(key)
                expected = source.with_rank(tp_rank).local_shape(name, full_shape)
                if tuple(value.shape) != expected:
                    raise ValueError(f"{files[rank]}: '{key}' has shape {tuple(value.shape)}, expected {expected} "
                                     f"for tensor-parallel rank {tp_rank} of {tp}: written for a different model")
                return value
        raise ValueError(f"no rank of tensor-parallel index {tp_rank} in the optimizer checkpoint holds '{key}': "
                         "it was written for a different model")

    state: Dict[str, np.ndarray] = {STEP_COUNT: np.array(steps.pop(), dtype=np.int64)}
    kinds = MOMENTS + ((MASTER,) if any(key.startswith(MASTER + ".") for rank_keys in keys for key in rank_keys)
                       else ())
    for name in owned:
        if name not in full_shapes:
            raise ValueError(f"no full shape given for '{name}'")
        shape = tuple(int(n) for n in full_shapes[name])
        split = source.shard(name, shape) is not None
        for kind in kinds:
            key = f"{kind}.{name}"
            if split:
                full = source.assemble(name, [piece(key, name, shape, t) for t in range(tp)], shape)
            else:  # every old tensor-parallel rank holds the whole tensor: read one
                full = piece(key, name, shape, 0)
            state[key] = np.ascontiguousarray(target.take(name, full))
    return state
