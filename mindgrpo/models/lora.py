"""LoRA adapters on the decoder's linear layers: what they are (:class:`LoraSpec`), their Parameters on a
:class:`~mindgrpo.models.qwen2.Qwen2Model`, PEFT's initialisation and PEFT's folder format.

A targeted linear ``y = x W^T (+ b)`` becomes ``y = x W^T (+ b) + s (x A^T) B^T`` with ``A [rank, in]``,
``B [out, rank]`` and ``s = alpha / rank`` (PEFT's ``LoraLayer``, unmerged: the graphs of
:mod:`mindgrpo.models.qwen2_blocks` add the low-rank product beside the frozen one). A starts Kaiming-uniform
(``a = sqrt(5)``: U(-1/sqrt(in), 1/sqrt(in))) and B at zero, as PEFT initialises them, so a fresh adapter changes
nothing: step 1's KL against the backbone is exactly 0.

Under tensor parallelism each rank holds the slices :mod:`mindgrpo.parallel.layout` gives (B split as a
column-parallel weight, A as a row-parallel one, the other half replicated); initialisation and PEFT folders are
full-size, drawn or read whole and sliced, so every layout holds slices of the same adapters.

The adapters are float32 whatever the backbone's dtype (``actor_config.param_dtype``), and are the only trainable
Parameters of a LoRA actor: the optimizer's state, the gradients and the checkpoints are theirs alone.

A PEFT folder (``adapter_config.json`` + ``adapter_model.safetensors``, tensors named
``base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight``) is what :func:`save_peft` writes and
:func:`load_peft` reads; ``peft.PeftModel.from_pretrained`` loads it onto the transformers base
(``tests/test_lora.py`` holds the logits equal).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Mapping, Optional, Tuple, Union

import numpy as np

from mindgrpo.choices import LORA_TARGET_MODULES as TARGET_MODULES

PathLike = Union[str, Path]

# HF module -> (the decoder layer's sub-Cell, its weight Cell in MindFormers' naming, the HF parent module), in
# the model's Cell order (w1 = gate, w2 = down, w3 = up): the order of trainable_params() and so of the optimizer
MODULE_CELLS = {"q_proj": ("attention", "wq", "self_attn"), "k_proj": ("attention", "wk", "self_attn"),
                "v_proj": ("attention", "wv", "self_attn"), "o_proj": ("attention", "wo", "self_attn"),
                "gate_proj": ("feed_forward", "w1", "mlp"), "down_proj": ("feed_forward", "w2", "mlp"),
                "up_proj": ("feed_forward", "w3", "mlp")}

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."  # PeftModel wraps the CausalLM: its tensors are named from there


@dataclass(frozen=True)
class LoraSpec:
    """Rank, scaling and targets of a model's adapters (``actor_config.lora_*``)."""
    rank: int
    alpha: float
    target_modules: Tuple[str, ...] = TARGET_MODULES

    def __post_init__(self):
        if self.rank <= 0:
            raise ValueError(f"lora rank must be positive, got {self.rank}")
        unknown = sorted(set(self.target_modules) - set(TARGET_MODULES))
        if unknown or not self.target_modules:
            raise ValueError(f"lora target_modules {list(self.target_modules)}: expected a non-empty subset of "
                             f"{', '.join(TARGET_MODULES)}")
        # canonical order, so a spec's identity (and a graph's key) does not depend on how the list was written
        object.__setattr__(self, "target_modules", tuple(m for m in MODULE_CELLS if m in self.target_modules))

    @property
    def scale(self) -> float:
        return float(self.alpha) / float(self.rank)

    @property
    def weight_fields(self) -> Tuple[str, ...]:
        """The targeted weights in MindFormers' naming (``wq``, ``w1``, ...)."""
        return tuple(MODULE_CELLS[m][1] for m in self.target_modules)


def adapter_shapes(spec: LoraSpec, full_shapes: Mapping[str, tuple], num_layers: int) -> Dict[str, tuple]:
    """The full (unsliced) shape of each adapter, keyed and ordered as :func:`adapter_parameters` keys them, from
    the backbone's full HF shapes: A [rank, in], B [out, rank]."""
    shapes = {}
    for index in range(num_layers):
        for module in spec.target_modules:
            prefix = f"model.layers.{index}.{MODULE_CELLS[module][2]}.{module}"
            out_features, in_features = full_shapes[f"{prefix}.weight"]
            shapes[f"{prefix}.lora_A.weight"] = (spec.rank, in_features)
            shapes[f"{prefix}.lora_B.weight"] = (out_features, spec.rank)
    return shapes


def attach_adapters(model, spec: LoraSpec) -> None:
    """Give each targeted weight Cell of ``model`` (a Qwen2Model) float32 ``lora_a`` [rank, in] and ``lora_b``
    [out, rank] Parameters (this rank's slices: sized from its slice of the weight), zeros until
    :func:`init_adapters` or :func:`load_peft` fills them."""
    from mindspore import Parameter, Tensor  # deferred: reading a PEFT folder (eval, the CLI) loads no MindSpore

    for index, layer in enumerate(model.model.layers):
        for module in spec.target_modules:
            block, field, _ = MODULE_CELLS[module]
            cell = getattr(getattr(layer, block), field)
            out_features, in_features = cell.weight.shape
            # named as their Cell path, as the backbone's are (a Parameter added after construction is not renamed)
            prefix = f"model.layers.{index}.{block}.{field}"
            cell.lora_a = Parameter(Tensor(np.zeros((spec.rank, in_features), np.float32)), name=f"{prefix}.lora_a")
            cell.lora_b = Parameter(Tensor(np.zeros((out_features, spec.rank), np.float32)), name=f"{prefix}.lora_b")


def adapter_parameters(model) -> Dict[str, "Parameter"]:
    """The adapters of a Qwen2Model keyed by their name in a PEFT folder without :data:`PEFT_PREFIX`
    (``model.layers.N.self_attn.q_proj.lora_A.weight``), in the model's Parameter order; empty without LoRA."""
    spec = model.lora
    if spec is None:
        return {}
    found = {}
    for index, layer in enumerate(model.model.layers):
        for module in spec.target_modules:
            block, field, parent = MODULE_CELLS[module]
            cell = getattr(getattr(layer, block), field)
            prefix = f"model.layers.{index}.{parent}.{module}"
            found[f"{prefix}.lora_A.weight"] = cell.lora_a
            found[f"{prefix}.lora_B.weight"] = cell.lora_b
    return found


def init_adapters(model, seed: int = 0) -> None:
    """PEFT's initialisation: A ~ U(-1/sqrt(in), 1/sqrt(in)) (``kaiming_uniform_(a=sqrt(5))``), B = 0; drawn at
    full shape and sliced (``model.layout``), so every tensor-parallel layout starts from the same adapters."""
    from mindspore import Tensor

    rng = np.random.default_rng(seed)
    for name, param in adapter_parameters(model).items():
        shape = model.adapter_shapes[name]
        if ".lora_A." in name:
            bound = 1.0 / np.sqrt(shape[1])
            value = rng.uniform(-bound, bound, shape).astype(np.float32)
        else:
            value = np.zeros(shape, np.float32)
        param.set_data(Tensor(np.ascontiguousarray(model.layout.take(name, value))))


def peft_config(spec: LoraSpec, base_model: str) -> dict:
    """``adapter_config.json`` as PEFT writes it for a ``LoraConfig`` of this spec (no dropout, no bias)."""
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
            "r": spec.rank, "lora_alpha": spec.alpha, "target_modules": list(spec.target_modules),
            "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False, "inference_mode": True,
            "init_lora_weights": True, "use_rslora": False, "use_dora": False, "modules_to_save": None,
            "layers_to_transform": None, "layers_pattern": None, "rank_pattern": {}, "alpha_pattern": {},
            "revision": None}


def save_peft(arrays: Mapping[str, np.ndarray], spec: LoraSpec, out_dir: PathLike, *, base_model: str) -> Path:
    """Write a PEFT folder from host arrays keyed as :func:`adapter_parameters` keys them; atomically (a temporary
    folder beside ``out_dir``, then a rename), replacing ``out_dir`` if it exists."""
    from safetensors.numpy import save_file

    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        save_file({PEFT_PREFIX + name: np.ascontiguousarray(value, np.float32) for name, value in arrays.items()},
                  str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        (tmp / CONFIG_FILE).write_text(json.dumps(peft_config(spec, base_model), indent=2), encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def read_peft_spec(adapter_dir: PathLike) -> LoraSpec:
    """The :class:`LoraSpec` of a PEFT folder's ``adapter_config.json`` (LoRA on Qwen2 linears, no extras)."""
    path = Path(adapter_dir) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: an adapter folder holds {CONFIG_FILE} and {WEIGHTS_FILE} "
                                "(as PEFT's save_pretrained writes them)")
    config = json.loads(path.read_text(encoding="utf-8"))
    if config.get("peft_type") != "LORA":
        raise ValueError(f"{path}: peft_type {config.get('peft_type')!r}; only LORA adapters are read")
    extras = {key: config[key] for key in ("use_dora", "use_rslora", "modules_to_save") if config.get(key)}
    if config.get("bias", "none") != "none":
        extras["bias"] = config["bias"]
    if extras:
        raise ValueError(f"{path}: {extras} is not supported; only plain LoRA adapters are read (no DoRA, rsLoRA, "
                         "trained biases or modules_to_save)")
    targets = config.get("target_modules")
    targets = [targets] if isinstance(targets, str) else list(targets or [])
    return LoraSpec(rank=int(config["r"]), alpha=float(config["lora_alpha"]), target_modules=tuple(targets))


def read_peft_arrays(adapter_dir: PathLike) -> Dict[str, np.ndarray]:
    """A PEFT folder's tensors keyed as :func:`adapter_parameters` keys them (without :data:`PEFT_PREFIX`)."""
    from safetensors.numpy import load_file

    arrays = {}
    for name, value in load_file(str(Path(adapter_dir) / WEIGHTS_FILE)).items():
        name = name[len(PEFT_PREFIX):] if name.startswith(PEFT_PREFIX) else name
        # PEFT names tensors with the adapter's name ("lora_A.default.weight") only in memory; saved ones drop it
        arrays[name.replace(".default.", ".")] = value
    return arrays


def is_adapter_folder(folder: PathLike) -> bool:
    return (Path(folder) / CONFIG_FILE).is_file() and (Path(folder) / WEIGHTS_FILE).is_file()


def adapter_base(adapter_dir: PathLike, base: Optional[PathLike] = None) -> Path:
    """The base model folder of a PEFT folder: ``base`` when given, else its ``base_model_name_or_path`` (mindgrpo
    writes the absolute path of ``actor_config.load``), which must be a local folder."""
    if base is not None:
        return Path(base).expanduser()
    config_path = Path(adapter_dir) / CONFIG_FILE
    named = json.loads(config_path.read_text(encoding="utf-8")).get("base_model_name_or_path") or ""
    if not named or not (Path(named) / "config.json").is_file():
        raise FileNotFoundError(f"{config_path}: base_model_name_or_path = {named!r} is not a local model folder; "
                                "pass the base model's folder (--base, or base= from Python)")
    return Path(named)


def load_peft(model, adapter_dir: PathLike) -> None:
    """Fill ``model``'s adapters from a PEFT folder, strictly: its rank, alpha and targets must be the model's and
    every tensor must match by name and shape."""
    from mindspore import Tensor

    folder = Path(adapter_dir)
    stored_spec = read_peft_spec(folder)
    if stored_spec != model.lora:
        raise ValueError(f"{folder / CONFIG_FILE}: rank {stored_spec.rank}, alpha {stored_spec.alpha}, targets "
                         f"{list(stored_spec.target_modules)}, but actor_config asks for rank {model.lora.rank}, "
                         f"alpha {model.lora.alpha}, targets {list(model.lora.target_modules)}; set "
                         "actor_config.lora_rank / lora_alpha / lora_target_modules to the adapter's")
    path = folder / WEIGHTS_FILE
    arrays = read_peft_arrays(folder)
    params = adapter_parameters(model)
    missing, unexpected = sorted(set(params) - set(arrays)), sorted(set(arrays) - set(params))
    if missing or unexpected:
        raise ValueError(f"{path}: adapters do not fit the model: missing {missing[:4]}, unexpected {unexpected[:4]}")
    for name, param in params.items():
        if tuple(arrays[name].shape) != tuple(model.adapter_shapes[name]):
            raise ValueError(f"{path}: {name} is {tuple(arrays[name].shape)}, the model's is "
                             f"{tuple(model.adapter_shapes[name])}")
        param.set_data(Tensor(np.ascontiguousarray(model.layout.take(name, arrays[name]), np.float32)))


def merge_peft(adapter_dir: PathLike, out_dir: PathLike, *, base: Optional[PathLike] = None,
               dtype: Optional[str] = None, overwrite: bool = False) -> Path:
    """A Hugging Face folder of the base with the adapters merged in, ``W + s B A`` (in float32, then ``dtype``:
    by default the base's stored dtype), which transformers loads without PEFT. One tensor at a time: the merge
    holds no second model. Text models (a Qwen2.5-VL base's vision tower is not carried over: load the adapter
    with PEFT instead)."""
    from mindgrpo.hf_config import qwen2_spec, read_hf_config
    from mindgrpo.models.export import export_hf_arrays
    from mindgrpo.models.safetensors_io import SafetensorsReader
    from mindgrpo.models.weights import checkpoint_files

    base_dir = adapter_base(adapter_dir, base)
    spec = read_peft_spec(adapter_dir)
    hf_config = read_hf_config(base_dir)
    if qwen2_spec(hf_config).is_vl:
        raise ValueError(f"{base_dir} is a Qwen2.5-VL model: merging its adapters is not supported; load "
                         f"{adapter_dir} onto it with peft.PeftModel.from_pretrained")
    files = checkpoint_files(base_dir)
    readers = {path: SafetensorsReader(path) for path in set(files.values())}
    adapters = read_peft_arrays(adapter_dir)
    targets = {name[:-len(".lora_A.weight")] for name in adapters if name.endswith(".lora_A.weight")}
    unmatched = sorted(t for t in targets if f"{t}.weight" not in files)
    if unmatched:
        raise ValueError(f"{adapter_dir}: adapters for {unmatched[:4]}, which {base_dir} does not have: the adapter "
                         "belongs to another base")

    def fetch(name: str) -> np.ndarray:
        weight = readers[files[name]].read(name)
        target = name[:-len(".weight")]
        if target in targets:
            update = adapters[f"{target}.lora_B.weight"].astype(np.float32) @ adapters[f"{target}.lora_A.weight"]
            weight = weight + np.float32(spec.scale) * update
        return weight

    stored = str(hf_config.get("torch_dtype") or hf_config.get("dtype") or "float32")
    shapes = {name: readers[files[name]].shape(name) for name in files}
    has_tokenizer = (base_dir / "tokenizer.json").is_file() or (base_dir / "vocab.json").is_file()
    return export_hf_arrays(out_dir, shapes, fetch, hf_config=hf_config,
                            tokenizer_dir=base_dir if has_tokenizer else None, dtype=dtype or stored,
                            overwrite=overwrite)
