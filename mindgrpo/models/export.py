"""Export a model back to a Hugging Face folder that ``transformers.AutoModelForCausalLM.from_pretrained`` loads
(``Qwen2_5_VLForConditionalGeneration.from_pretrained`` for a Qwen2.5-VL model).

Written: ``config.json`` (the source config with the stored dtype updated), the weights under HF names (tied models:
no ``lm_head.weight``, as ``save_pretrained`` does), ``generation_config.json`` (given, or copied from
``tokenizer_dir``), and the tokenizer and image-processor files of ``tokenizer_dir``. Everything goes to a hidden
temporary folder next to ``out_dir`` that is renamed into place at the end, so a crash never leaves a half-written
model behind.

A Qwen2.5-VL model (its config.json says ``qwen2_5_vl``; either spelling of that config) is written in the hub layout
every transformers version reads: the language model under ``model.*`` / ``lm_head.weight``, as for Qwen2, and the
vision tower the model holds (``Qwen2Model.vision``) under ``visual.*``.

The weights go to one ``model.safetensors`` when they fit ``max_shard_size``, else to shards
``model-00001-of-0000N.safetensors`` plus ``model.safetensors.index.json`` (``{"metadata": {"total_size": bytes},
"weight_map": {name: file}}``), split the way ``save_pretrained`` splits them (huggingface_hub's
``split_state_dict_into_shards_factory``): tensors in order, a new shard when the next tensor would overflow the
current one, a tensor larger than the limit alone in its own shard.

:func:`export_hf` writes a model whose Parameters hold full tensors. :func:`export_hf_arrays` is the layer under
it: it takes the full shapes and a ``fetch(name)`` that returns one full tensor at a time, so a tensor-parallel run
can gather each tensor from its ranks just before it is written, and never holds the whole model in one place.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

import mindspore as ms

from mindgrpo.hf_config import (CONFIG_FILE, GENERATION_CONFIG_FILE, check_dtype, qwen2_spec,
                                       read_generation_config)
from mindgrpo.models.safetensors_io import write_safetensors
from mindgrpo.models.vision import vision_parameters, vision_spec
from mindgrpo.models.weights import INDEX_FILE, SINGLE_FILE, VISION_PREFIXES, hf_parameters, host_array

PathLike = Union[str, Path]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json",
                   "added_tokens.json", "chat_template.jinja", "chat_template.json")
# a Qwen2.5-VL folder's image/video processor settings: without them AutoProcessor cannot load the export
PROCESSOR_FILES = ("preprocessor_config.json", "video_preprocessor_config.json")
VISION_PREFIX = "visual."  # the hub layout's vision tower prefix (transformers >= 4.52 also reads it)
DEFAULT_MAX_SHARD_SIZE = "5GB"  # save_pretrained's default
_SIZE_UNITS = {"KB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9, "TB": 10 ** 12,  # decimal, as huggingface_hub
               "KIB": 2 ** 10, "MIB": 2 ** 20, "GIB": 2 ** 30, "TIB": 2 ** 40, "B": 1}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([a-zA-Z]*)\s*$")
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


def parse_size(size: Union[int, str]) -> int:
    """Bytes from an int or a string like ``"5GB"`` (10**9, as transformers), ``"500MiB"`` (2**20) or ``"4096"``."""
    if isinstance(size, bool) or not isinstance(size, (int, str)):
        raise ValueError(f"max_shard_size={size!r}: give a number of bytes or a string like '5GB'")
    if isinstance(size, int):
        value = size
    else:
        match = _SIZE.match(size)
        unit = match.group(2).upper() if match else None
        if not match or (unit and unit not in _SIZE_UNITS):
            raise ValueError(f"max_shard_size={size!r}: expected a number with an optional unit "
                             f"({', '.join(u for u in _SIZE_UNITS)}), e.g. '5GB'")
        value = int(float(match.group(1)) * _SIZE_UNITS[unit or "B"])
    if value < 1:
        raise ValueError(f"max_shard_size={size!r}: must be at least one byte")
    return value


def plan_shards(sizes: Mapping[str, int], max_shard_size: int) -> List[List[str]]:
    """Group tensor names (in order) into shards of at most ``max_shard_size`` bytes, as save_pretrained does."""
    shards: List[List[str]] = []
    current: List[str] = []
    filled = 0
    for name, nbytes in sizes.items():
        if nbytes > max_shard_size:  # too big for any shard: alone in its own, as huggingface_hub does
            shards.append([name])
            continue
        if current and filled + nbytes > max_shard_size:
            shards.append(current)
            current, filled = [], 0
        current.append(name)
        filled += nbytes
    if current:
        shards.append(current)
    return shards


def shard_file_name(index: int, count: int) -> str:
    """transformers' shard name: ``model-00001-of-00003.safetensors`` (``index`` counts from 0)."""
    return f"model-{index + 1:05d}-of-{count:05d}.safetensors"


def _write_json(path: Path, data: Mapping) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _check_fits(shapes: Mapping[str, Sequence[int]], hf_config: Mapping) -> None:
    """The config we write must describe the weights we write, or from_pretrained would fail (or worse, not)."""
    spec = qwen2_spec(hf_config, source="hf_config")
    if "model.embed_tokens.weight" not in shapes:
        raise ValueError("the weights to export have no model.embed_tokens.weight: pass every weight of the model "
                         "under its Hugging Face name")
    embed = tuple(int(n) for n in shapes["model.embed_tokens.weight"])
    tied = "lm_head.weight" not in shapes
    layers = 1 + max((int(name.split(".")[2]) for name in shapes if name.startswith("model.layers.")), default=-1)
    if (embed != (spec.vocab_size, spec.hidden_size) or tied != spec.tie_word_embeddings
            or layers != spec.num_hidden_layers):
        raise ValueError(f"hf_config does not describe this model: it says vocab_size={spec.vocab_size}, "
                         f"hidden_size={spec.hidden_size}, num_hidden_layers={spec.num_hidden_layers}, "
                         f"tie_word_embeddings={spec.tie_word_embeddings}; the model has embeddings {embed}, "
                         f"{layers} layers, tied={tied}. Pass the config.json the model was built from")
    vision = [name for name in shapes if name.startswith(VISION_PREFIXES)]
    if not spec.is_vl:
        if vision:
            raise ValueError(f"hf_config describes a text model (model_type={hf_config.get('model_type')!r}) but the "
                             f"weights hold a vision tower ({vision[0]}, ...); pass the Qwen2.5-VL config.json")
        return
    _check_vision_fits(shapes, hf_config)


def _check_vision_fits(shapes: Mapping[str, Tuple[int, ...]], hf_config: Mapping) -> None:
    """A Qwen2.5-VL config needs the vision tower's weights, under ``visual.*``, of the shape its vision_config
    gives (depth, patch embedding, merger output); without them from_pretrained would initialise a random tower."""
    vision = vision_spec(hf_config, source="hf_config")
    names = [name for name in shapes if name.startswith(VISION_PREFIXES)]
    if not names:
        raise ValueError("hf_config describes a Qwen2.5-VL model but there are no vision tower weights: export a "
                         "model built with its tower (build_model's vision=True)")
    misplaced = [name for name in names if not name.startswith(VISION_PREFIX)]
    if misplaced:
        raise ValueError(f"vision weights must be named {VISION_PREFIX}* (the hub layout, beside model.* and "
                         f"lm_head.weight), got {misplaced[0]}")
    depth = 1 + max((int(name.split(".")[2]) for name in names if name.startswith("visual.blocks.")), default=-1)
    patch = tuple(shapes.get("visual.patch_embed.proj.weight", ()))
    merger = tuple(shapes.get("visual.merger.mlp.2.weight", ()))
    expected_patch = (vision.hidden_size, vision.in_channels, vision.temporal_patch_size, vision.patch_size,
                      vision.patch_size)
    expected_merger = (vision.out_hidden_size, vision.hidden_size * vision.merge_unit)
    if depth != vision.depth or patch != expected_patch or merger != expected_merger:
        raise ValueError(f"hf_config's vision_config does not describe this vision tower: it says depth="
                         f"{vision.depth}, patch embedding {expected_patch}, merger output {expected_merger}; the "
                         f"tower has {depth} blocks, {patch or 'no patch embedding'}, "
                         f"{merger or 'no merger'}. Pass the config.json the tower was built from")


def export_hf(model: ms.nn.Cell, out_dir: PathLike, *, hf_config: Mapping, tokenizer_dir: Optional[PathLike] = None,
              generation_config: Optional[Mapping] = None, dtype: str = "float32", overwrite: bool = False,
              max_shard_size: Union[int, str] = DEFAULT_MAX_SHARD_SIZE) -> Path:
    """Write ``model`` (a :class:`~mindgrpo.models.qwen2.Qwen2Model` whose Parameters hold full tensors) as a
    Hugging Face folder at ``out_dir`` (atomically) and return its path.

    ``hf_config`` is the source ``config.json`` dict (``read_hf_config``); ``dtype`` (float32/bfloat16/float16) is
    the storage type of the weights; ``max_shard_size`` (bytes, or a string like ``"5GB"``) is the largest
    safetensors file before the weights are split into shards. ``overwrite=True`` replaces an existing folder,
    else that is an error. The vision tower a Qwen2.5-VL model holds (``model.vision``) is written after the
    language model, as ``visual.*``; a Qwen2.5-VL ``hf_config`` needs it, a text one refuses it.
    """
    params = hf_parameters(model)
    if model.vision is not None:
        params.update({VISION_PREFIX + name: param for name, param in vision_parameters(model.vision.tower).items()})
    return export_hf_arrays(out_dir, {name: tuple(p.shape) for name, p in params.items()},
                            lambda name: host_array(params[name]), hf_config=hf_config, tokenizer_dir=tokenizer_dir,
                            generation_config=generation_config, dtype=dtype, overwrite=overwrite,
                            max_shard_size=max_shard_size)


def export_hf_arrays(out_dir: PathLike, shapes: Mapping[str, Sequence[int]], fetch: Callable[[str], np.ndarray], *,
                     hf_config: Mapping, tokenizer_dir: Optional[PathLike] = None,
                     generation_config: Optional[Mapping] = None, dtype: str = "float32", overwrite: bool = False,
                     max_shard_size: Union[int, str] = DEFAULT_MAX_SHARD_SIZE) -> Path:
    """Write the weights ``{hf_name: full_shape}`` as a Hugging Face folder at ``out_dir`` (atomically).

    ``fetch(hf_name)`` returns that full tensor (any float dtype; converted to ``dtype``). It is called exactly
    once per name, in the order of ``shapes``, while its file is being written, so only one tensor is held at a
    time. A fetch that gathers tensor-parallel slices is a collective: the ranks that do not write must run the
    same gathers in the same order (iterate over ``shapes``). Nothing is fetched when the arguments are refused.
    Other arguments as in :func:`export_hf`.
    """
    check_dtype("dtype", dtype)
    limit = parse_size(max_shard_size)
    shapes = {name: tuple(int(n) for n in shape) for name, shape in shapes.items()}
    out = Path(out_dir).absolute()
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} already exists; pass overwrite=True or choose another folder")
    _check_fits(shapes, hf_config)
    tokenizer_files = []
    if tokenizer_dir is not None:
        tokenizer_files = [Path(tokenizer_dir) / name for name in TOKENIZER_FILES
                           if (Path(tokenizer_dir) / name).is_file()]
        if not tokenizer_files:
            raise FileNotFoundError(f"no tokenizer files ({', '.join(TOKENIZER_FILES[:4])}, ...) in {tokenizer_dir}")
        if generation_config is None:
            generation_config = read_generation_config(tokenizer_dir)
        tokenizer_files += [Path(tokenizer_dir) / name for name in PROCESSOR_FILES
                            if (Path(tokenizer_dir) / name).is_file()]

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    tmp.mkdir()
    try:
        _write_json(tmp / CONFIG_FILE, _with_dtype(hf_config, dtype))
        if generation_config is not None:
            _write_json(tmp / GENERATION_CONFIG_FILE, generation_config)
        for path in tokenizer_files:
            shutil.copyfile(path, tmp / path.name)
        _write_weights(tmp, shapes, fetch, dtype, limit)
        _commit(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _with_dtype(hf_config: Mapping, dtype: str) -> dict:
    """The config with its stored dtype set to ``dtype``: transformers 4.x reads ``torch_dtype``, 5.x writes
    ``dtype``: keep both honest, also in a Qwen2.5-VL config's ``text_config`` / ``vision_config`` (copied, so the
    caller's dict is untouched)."""
    config = dict(hf_config)
    config["torch_dtype"] = dtype
    if "dtype" in config:
        config["dtype"] = dtype
    for group in ("text_config", "vision_config"):
        if isinstance(config.get(group), Mapping):
            config[group] = {key: dtype if key in ("torch_dtype", "dtype") else value
                             for key, value in config[group].items()}
    return config


def _write_weights(folder: Path, shapes: Dict[str, Tuple[int, ...]], fetch: Callable[[str], np.ndarray], dtype: str,
                   max_shard_size: int) -> None:
    sizes = {name: int(np.prod(shape, dtype=np.int64)) * _ITEMSIZE[dtype] for name, shape in shapes.items()}
    shards = plan_shards(sizes, max_shard_size)
    if len(shards) <= 1:
        write_safetensors(folder / SINGLE_FILE, shapes, fetch, dtype=dtype)
        return
    weight_map = {}
    for index, names in enumerate(shards):
        file = shard_file_name(index, len(shards))
        write_safetensors(folder / file, {name: shapes[name] for name in names}, fetch, dtype=dtype)
        weight_map.update({name: file for name in names})
    _write_json(folder / INDEX_FILE, {"metadata": {"total_size": sum(sizes.values())}, "weight_map": weight_map})


def _commit(tmp: Path, out: Path) -> None:
    """Rename ``tmp`` to ``out``; an existing ``out`` is moved aside first and deleted only after the swap."""
    if not out.exists():
        os.rename(tmp, out)
        return
    aside = out.with_name(f".{out.name}.old-{os.getpid()}-{secrets.token_hex(4)}")
    os.rename(out, aside)
    try:
        os.rename(tmp, out)
    except BaseException:
        os.rename(aside, out)
        raise
    shutil.rmtree(aside)
