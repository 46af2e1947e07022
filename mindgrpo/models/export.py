"""Export a model back to a Hugging Face folder that ``transformers.AutoModelForCausalLM.from_pretrained`` loads.

Written: ``config.json`` (the source config with the stored dtype updated), ``model.safetensors`` under HF names
(tied models: no ``lm_head.weight``, as ``save_pretrained`` does), ``generation_config.json`` (given, or copied from
``tokenizer_dir``), and the tokenizer files of ``tokenizer_dir``. Everything goes to a hidden temporary folder next
to ``out_dir`` that is renamed into place at the end, so a crash never leaves a half-written model behind.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
from pathlib import Path
from typing import Mapping, Optional, Union

import mindspore as ms

from mindgrpo.models.hf_config import (CONFIG_FILE, GENERATION_CONFIG_FILE, check_dtype, qwen2_spec,
                                       read_generation_config)
from mindgrpo.models.safetensors_io import write_safetensors
from mindgrpo.models.weights import SINGLE_FILE, hf_parameters, host_array

PathLike = Union[str, Path]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json",
                   "added_tokens.json", "chat_template.jinja", "chat_template.json")


def _write_json(path: Path, data: Mapping) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _check_fits(model: ms.nn.Cell, hf_config: Mapping) -> None:
    """The config we write must describe the weights we write, or from_pretrained would fail (or worse, not)."""
    spec = qwen2_spec(hf_config, source="hf_config")
    params = hf_parameters(model)
    embed = params["model.embed_tokens.weight"].shape
    tied = "lm_head.weight" not in params
    layers = 1 + max(int(name.split(".")[2]) for name in params if name.startswith("model.layers."))
    if (tuple(embed) != (spec.vocab_size, spec.hidden_size) or tied != spec.tie_word_embeddings
            or layers != spec.num_hidden_layers):
        raise ValueError(f"hf_config does not describe this model: it says vocab_size={spec.vocab_size}, "
                         f"hidden_size={spec.hidden_size}, num_hidden_layers={spec.num_hidden_layers}, "
                         f"tie_word_embeddings={spec.tie_word_embeddings}; the model has embeddings {tuple(embed)}, "
                         f"{layers} layers, tied={tied}. Pass the config.json the model was built from")


def export_hf(model: ms.nn.Cell, out_dir: PathLike, *, hf_config: Mapping, tokenizer_dir: Optional[PathLike] = None,
              generation_config: Optional[Mapping] = None, dtype: str = "float32", overwrite: bool = False) -> Path:
    """Write ``model`` as a Hugging Face folder at ``out_dir`` (atomically) and return its path.

    ``hf_config`` is the source ``config.json`` dict (``read_hf_config``); ``dtype`` (float32/bfloat16/float16) is
    the storage type of the weights. ``overwrite=True`` replaces an existing folder, else that is an error.
    """
    check_dtype("dtype", dtype)
    out = Path(out_dir).absolute()
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} already exists; pass overwrite=True or choose another folder")
    _check_fits(model, hf_config)
    tokenizer_files = []
    if tokenizer_dir is not None:
        tokenizer_files = [Path(tokenizer_dir) / name for name in TOKENIZER_FILES
                           if (Path(tokenizer_dir) / name).is_file()]
        if not tokenizer_files:
            raise FileNotFoundError(f"no tokenizer files ({', '.join(TOKENIZER_FILES[:4])}, ...) in {tokenizer_dir}")
        if generation_config is None:
            generation_config = read_generation_config(tokenizer_dir)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    tmp.mkdir()
    try:
        config = dict(hf_config)
        config["torch_dtype"] = dtype  # transformers 4.x reads torch_dtype, 5.x writes dtype: keep both honest
        if "dtype" in config:
            config["dtype"] = dtype
        _write_json(tmp / CONFIG_FILE, config)
        if generation_config is not None:
            _write_json(tmp / GENERATION_CONFIG_FILE, generation_config)
        for path in tokenizer_files:
            shutil.copyfile(path, tmp / path.name)
        params = hf_parameters(model)
        write_safetensors(tmp / SINGLE_FILE, {name: tuple(p.shape) for name, p in params.items()},
                          lambda name: host_array(params[name]), dtype=dtype)
        _commit(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


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
