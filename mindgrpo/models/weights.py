"""Hugging Face <-> MindFormers parameter names, strict weight loading, state dicts and weight sync.

Name mapping (HF Qwen2 -> MindFormers Llama; ``N`` is the layer index; shapes are identical, no transposes)::

    model.embed_tokens.weight                  model.tok_embeddings.embedding_weight
    model.layers.N.self_attn.{q,k,v}_proj.{weight,bias}
                                               model.layers.N.attention.w{q,k,v}.{weight,bias}
    model.layers.N.self_attn.o_proj.weight     model.layers.N.attention.wo.weight
    model.layers.N.mlp.gate_proj.weight        model.layers.N.feed_forward.w1.weight
    model.layers.N.mlp.down_proj.weight        model.layers.N.feed_forward.w2.weight
    model.layers.N.mlp.up_proj.weight          model.layers.N.feed_forward.w3.weight
    model.layers.N.input_layernorm.weight      model.layers.N.attention_norm.weight
    model.layers.N.post_attention_layernorm.weight
                                               model.layers.N.ffn_norm.weight
    model.norm.weight                          model.norm_out.weight
    lm_head.weight                             lm_head.weight  (absent when tie_word_embeddings: the lm_head
                                               Parameter *is* the embedding Parameter)

This is the mapping of MindFormers' ``LlamaForCausalLM.convert_name`` (the tests check both agree), written as a
table so it can be inverted for export.

Qwen2.5-VL checkpoints hold the same language model under the same names in the hub layout (``model.*``,
``lm_head``), or under ``model.language_model.*`` (transformers >= 4.52 saves them so), beside the vision tower's
``visual.*`` / ``model.visual.*`` tensors. :func:`language_model_names` reads both layouts as the names above and
leaves the vision tower's tensors to :func:`mindgrpo.models.vision.load_vision_weights`.

Loading is strict: every parameter of the network must come from the checkpoint, every checkpoint tensor must land
in the network, shapes must match, all checked from the headers before anything is read. Tensors are read one at a
time and widened to the parameter dtype, so peak extra memory is one tensor, not a second model.

Tensor-parallel ranks pass their :class:`~mindgrpo.parallel.layout.TPLayout` and read only their slices of the
same full-size files, so one folder serves every layout with no per-layout copy of the weights.
"""
from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Dict, Mapping, Optional, Tuple, Union

import numpy as np

import mindspore as ms
from mindspore import Parameter, Tensor

from mindgrpo.models.safetensors_io import SafetensorsReader
from mindgrpo.parallel.layout import TPLayout

PathLike = Union[str, Path]

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_SHOWN = 8  # names listed per error; more are counted

_GLOBAL = {"model.embed_tokens.weight": "model.tok_embeddings.embedding_weight",
           "model.norm.weight": "model.norm_out.weight",
           "lm_head.weight": "lm_head.weight"}
_LAYER = {"self_attn.q_proj.weight": "attention.wq.weight", "self_attn.q_proj.bias": "attention.wq.bias",
          "self_attn.k_proj.weight": "attention.wk.weight", "self_attn.k_proj.bias": "attention.wk.bias",
          "self_attn.v_proj.weight": "attention.wv.weight", "self_attn.v_proj.bias": "attention.wv.bias",
          "self_attn.o_proj.weight": "attention.wo.weight",
          "mlp.gate_proj.weight": "feed_forward.w1.weight", "mlp.down_proj.weight": "feed_forward.w2.weight",
          "mlp.up_proj.weight": "feed_forward.w3.weight",
          "input_layernorm.weight": "attention_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight"}
_GLOBAL_INV = {ms_name: hf for hf, ms_name in _GLOBAL.items()}
_LAYER_INV = {ms_name: hf for hf, ms_name in _LAYER.items()}
_LAYER_NAME = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
# Qwen2.5-VL: where transformers >= 4.52 saves the language model, and the vision tower's tensors (not ours)
_VL_LANGUAGE_MODEL = "model.language_model."
VISION_PREFIXES = ("visual.", "model.visual.")


class CheckpointMismatchError(ValueError):
    """Checkpoint tensors and network parameters do not match (names or shapes); the message lists them."""


def _rename(name: str, global_names: Dict[str, str], layer_names: Dict[str, str]) -> str | None:
    """``name`` through one direction of the mapping (both keep ``model.layers.N.``), or None when it has none."""
    if name in global_names:
        return global_names[name]
    match = _LAYER_NAME.match(name)
    if match and match.group(2) in layer_names:
        return f"model.layers.{match.group(1)}.{layer_names[match.group(2)]}"
    return None


def hf_to_ms_name(name: str) -> str | None:
    """MindFormers parameter name for a Hugging Face tensor name, or None if the name is not a Qwen2 weight."""
    return _rename(name, _GLOBAL, _LAYER)


def ms_to_hf_name(name: str) -> str | None:
    """Hugging Face tensor name for a MindFormers parameter name, or None for non-weights (e.g. KV caches)."""
    return _rename(name, _GLOBAL_INV, _LAYER_INV)


def hf_parameters(model: ms.nn.Cell) -> Dict[str, Parameter]:
    """The model's weights keyed by Hugging Face name (tied models have no ``lm_head.weight`` entry: their lm_head
    Parameter is the embedding Parameter). Parameters that are not weights (KV caches, ...) are left out."""
    found: Dict[str, Parameter] = {}
    # Names relative to `model`, not `param.name`: wrapping the model in another Cell (a loss cell, a trainer)
    # prefixes every param.name with the attribute path. A tied Parameter comes once, under its first (embedding) name.
    for name, param in model.parameters_and_names():
        hf_name = ms_to_hf_name(name)
        if hf_name is not None:
            found[hf_name] = param
    return found


def _listing(names, source: str) -> str:
    names = sorted(names)
    more = f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
    return f"{', '.join(names[:_SHOWN])}{more} ({source})"


def checkpoint_files(model_dir: PathLike) -> Dict[str, Path]:
    """Map each tensor name to the .safetensors file that holds it: ``model.safetensors.index.json`` (sharded) if
    present, else ``model.safetensors``. Missing shards and index entries that lie are errors naming the files."""
    folder = Path(model_dir)
    index_path = folder / INDEX_FILE
    if index_path.is_file():
        try:
            weight_map = json.loads(index_path.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise CheckpointMismatchError(f"{index_path}: not a safetensors index (need a 'weight_map' object): "
                                          f"{err}") from err
        missing = sorted({file for file in weight_map.values() if not (folder / file).is_file()})
        if missing:
            raise FileNotFoundError(f"{index_path} lists shard(s) {', '.join(missing)} that are not in {folder}; "
                                    "download the missing shard files")
        files = {name: folder / file for name, file in weight_map.items()}
        for shard in sorted(set(files.values())):
            listed = {name for name, file in files.items() if file == shard}
            absent = listed - set(SafetensorsReader(shard).keys())
            if absent:
                raise CheckpointMismatchError(f"{index_path} places {_listing(absent, shard.name)} in a shard that "
                                              "does not contain them; the index and shards are from different saves")
        return files
    single = folder / SINGLE_FILE
    if single.is_file():
        return {name: single for name in SafetensorsReader(single).keys()}
    bins = sorted(p.name for p in folder.glob("*.bin")) if folder.is_dir() else []
    hint = (f" Found {', '.join(bins)}: PyTorch pickles are not read; re-save with "
            "save_pretrained(..., safe_serialization=True).") if bins else ""
    raise FileNotFoundError(f"no {SINGLE_FILE} or {INDEX_FILE} in {folder}.{hint}")


def language_model_names(stored_names) -> Dict[str, str]:
    """The language model's tensors of a checkpoint: {Hugging Face Qwen2 name: name as stored}. Text Qwen2 and
    hub-layout Qwen2.5-VL names are kept as they are, ``model.language_model.X`` is read as ``model.X``, and the
    vision tower's ``visual.*`` / ``model.visual.*`` tensors are left out. A checkpoint holding both layouts of a
    name is an error (it came from two saves)."""
    names: Dict[str, str] = {}
    for stored in stored_names:
        if stored.startswith(VISION_PREFIXES):
            continue
        name = "model." + stored[len(_VL_LANGUAGE_MODEL):] if stored.startswith(_VL_LANGUAGE_MODEL) else stored
        if name in names:
            first, second = sorted((names[name], stored))
            raise CheckpointMismatchError(f"the checkpoint holds both {first} and {second}: the language model in "
                                          "two layouts; keep one save's files")
        names[name] = stored
    return names


def _check_names(params: Mapping[str, Parameter], available: Mapping[str, Tuple[int, ...]], tied: bool,
                 source: str) -> None:
    missing = set(params) - set(available)
    unexpected = set(available) - set(params)
    if tied:
        unexpected.discard("lm_head.weight")  # some tied checkpoints store a copy; _load_into checks it is a copy
    problems = []
    if missing:
        problems.append(f"missing from the checkpoint: {_listing(missing, source)}")
    if unexpected:
        problems.append(f"not in the network: {_listing(unexpected, source)}")
    shapes = [f"{name} {tuple(available[name])} in {source} vs {tuple(params[name].shape)} in the network"
              for name in sorted(set(params) & set(available))
              if tuple(available[name]) != tuple(params[name].shape)]
    if shapes:
        more = f" and {len(shapes) - _SHOWN} more" if len(shapes) > _SHOWN else ""
        problems.append(f"shape mismatch: {'; '.join(shapes[:_SHOWN])}{more}")
    if problems:
        raise CheckpointMismatchError(
            "checkpoint does not fit the network built from config.json — " + " | ".join(problems) +
            ". Check that config.json (vocab_size, hidden sizes, layer count, tie_word_embeddings) belongs to "
            "these weights.")


def _assign(param: Parameter, array: np.ndarray) -> None:
    """Set a host array as the parameter's data, cast to the parameter's dtype."""
    tensor = Tensor.from_numpy(np.ascontiguousarray(array, dtype=np.float32))  # no copy: `array` is ours
    param.set_data(tensor if tensor.dtype == param.dtype else tensor.astype(param.dtype))


def load_hf_weights(model: ms.nn.Cell, model_dir: PathLike, layout: Optional[TPLayout] = None) -> None:
    """Load a Hugging Face safetensors checkpoint (single file or sharded; F32/F16/BF16) into ``model``, strictly.

    With a tensor-parallel ``layout`` (a :class:`~mindgrpo.models.qwen2.Qwen2Model`'s own) the model reads only
    its slice of each tensor, from the same full-size files, so one folder serves every layout."""
    stored_files = checkpoint_files(model_dir)
    stored = language_model_names(stored_files)  # Qwen2 name -> name in the files (they differ for Qwen2.5-VL)
    files = {name: stored_files[original] for name, original in stored.items()}
    readers = {path: SafetensorsReader(path) for path in set(files.values())}
    params = hf_parameters(model)
    tied = "lm_head.weight" not in params

    def part(name: str):
        return None if layout is None else layout.shard(name, readers[files[name]].shape(stored[name]))

    def stored_shape(name: str):
        shape = readers[files[name]].shape(stored[name])
        return shape if layout is None else layout.local_shape(name, shape)

    source = ", ".join(sorted(str(p) for p in readers))
    _check_names(params, {name: stored_shape(name) for name in files}, tied, source)
    by_file = defaultdict(list)
    for name, path in files.items():
        by_file[path].append(name)
    for path, names in sorted(by_file.items()):
        for name in names:
            if name in params:
                _assign(params[name], readers[path].read(stored[name], part(name)))
    if tied and "lm_head.weight" in files:
        head = readers[files["lm_head.weight"]].read(stored["lm_head.weight"], part("lm_head.weight"))
        if not np.array_equal(head, host_array(params["model.embed_tokens.weight"])):
            raise CheckpointMismatchError(
                f"{files['lm_head.weight']}: config.json says tie_word_embeddings=true, but lm_head.weight differs "
                "from model.embed_tokens.weight; set tie_word_embeddings=false if the model has its own lm_head")


def host_array(param: Parameter) -> np.ndarray:
    """A float32 host copy of a Parameter (bfloat16 has no numpy type, so cast on the device side first)."""
    value = param.value() if param.dtype == ms.float32 else param.astype(ms.float32)  # CPU has no bf16 Identity
    return np.array(value.asnumpy(), dtype=np.float32, copy=True)  # never a view the optimizer could update


def state_dict_hf(model: ms.nn.Cell) -> Dict[str, np.ndarray]:
    """The model's weights as float32 host arrays under Hugging Face names (tied: no ``lm_head.weight``)."""
    return {name: host_array(param) for name, param in hf_parameters(model).items()}


def load_state_dict_hf(model: ms.nn.Cell, state: Mapping[str, np.ndarray], source: str = "state dict") -> None:
    """Inverse of ``state_dict_hf``: strict about names and shapes, like ``load_hf_weights``."""
    params = hf_parameters(model)
    tied = "lm_head.weight" not in params
    _check_names(params, {name: np.shape(value) for name, value in state.items()}, tied, source)
    for name, param in params.items():
        _assign(param, np.array(state[name], dtype=np.float32))  # copy: the caller keeps its arrays


def sync_weights(src: ms.nn.Cell, dst: ms.nn.Cell) -> int:
    """Copy every weight of ``src`` into the same-named weight of ``dst`` (e.g. actor -> mindformers-generate
    inference cell), casting to ``dst``'s dtype; returns how many Parameters were copied.

    Parameters that are the same object (a shared cell) are skipped, so syncing a model with itself is free.
    Non-weight parameters of ``dst`` (KV caches) are left alone. Both sides must hold the same weights at the same
    shapes, i.e. the same layout: this function never reshards, and different shapes (another tensor-parallel
    slicing) are an error rather than a copy of the wrong slices. The vllm backend, whose layout differs from the
    training one, reshards with :mod:`mindgrpo.parallel.resharding` instead.
    """
    src_params, dst_params = hf_parameters(src), hf_parameters(dst)
    if set(src_params) != set(dst_params):
        raise CheckpointMismatchError(
            f"sync_weights: weights differ; only in src: {sorted(set(src_params) - set(dst_params))[:_SHOWN]}, "
            f"only in dst: {sorted(set(dst_params) - set(src_params))[:_SHOWN]} (built from different configs?)")
    copied = 0
    for name, source in src_params.items():
        target = dst_params[name]
        if target is source:
            continue
        if tuple(target.shape) != tuple(source.shape):
            raise CheckpointMismatchError(
                f"sync_weights: {name} is {tuple(source.shape)} in src and {tuple(target.shape)} in dst; "
                "sync_weights copies between models of the same layout only (it does not reshard)")
        target.set_data(source.value().astype(target.dtype).copy())
        copied += 1
    return copied
