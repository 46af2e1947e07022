"""Read a Hugging Face Qwen2/Qwen2.5(-VL) ``config.json``: the model shape every check, plan and build starts from.

MindFormers' ``Qwen2ForCausalLM`` is inference-only and Ascend-only, so we build Qwen2 the MindRLHF way: a
``LlamaForCausalLM`` with q/k/v bias, HF-style half rotation (``use_rope_slice``), plain-ops RMSNorm and plain
attention. Everything that decides the architecture comes from ``config.json``; anything in it we cannot honour
(sliding windows, RoPE scaling, another activation) is an error rather than a silently different model.

Qwen2.5-VL's language model is Qwen2 with multimodal RoPE (M-RoPE: three position rows, t/h/w, each rotating its
``mrope_section`` share of the rotary dims). Its config.json comes in two spellings, both read here into the same
:class:`Qwen2Spec`: transformers >= 4.52 nests the text keys under ``text_config``; hub checkpoints keep them at
the top level with ``rope_scaling: {"type": "mrope", "mrope_section": [...]}``. The vision tower's keys
(``vision_config``) are read by :mod:`mindgrpo.models.vision`.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple, Union

PathLike = Union[str, Path]

CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
VL_MODEL_TYPES = ("qwen2_5_vl",)  # Qwen2 language model with M-RoPE, plus a vision tower
SUPPORTED_MODEL_TYPES = ("qwen2",) + VL_MODEL_TYPES
# Keys without which the network shape is unknown. HF has defaults for them, but those are Qwen2-7B's, and a
# config that omits them is far more likely truncated than meant to be 7B.
REQUIRED_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
DTYPES = ("float32", "bfloat16", "float16")


class ModelConfigError(ValueError):
    """A model's config.json is missing, unreadable or describes a model mindgrpo cannot build."""


@dataclass(frozen=True)
class Qwen2Spec:
    """The architecture of a Qwen2 model, normalised from config.json (the names follow Hugging Face)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    bos_token_id: Optional[int]
    eos_token_id: Optional[int]
    pad_token_id: Optional[int]
    # Qwen2.5-VL only (empty / None for a text model): the rotary half-dims of the t/h/w position rows, the token
    # ids of <|image_pad|> and <|vision_start|>, and how many patches per side the vision tower merges into a token.
    mrope_section: Tuple[int, ...] = ()
    image_token_id: Optional[int] = None
    vision_start_token_id: Optional[int] = None
    spatial_merge_size: Optional[int] = None

    @property
    def is_vl(self) -> bool:
        """Qwen2.5-VL's language model: M-RoPE positions and image tokens, and a vision tower beside it in the folder.
        :func:`qwen2_spec` gives a spec an ``mrope_section`` exactly when ``model_type`` is in
        :data:`VL_MODEL_TYPES`, the one place that decides."""
        return bool(self.mrope_section)


def read_hf_config(model_dir: PathLike) -> dict:
    """Load ``<model_dir>/config.json`` and check that it describes a Qwen2 model we can build.

    Returns the raw dict (export writes it back, so unknown keys are kept). Raises FileNotFoundError when the folder
    or file is missing and ModelConfigError for bad JSON, another model_type or missing/unsupported keys.
    """
    folder = Path(model_dir)
    if not folder.is_dir():
        raise FileNotFoundError(f"model folder {folder} does not exist: pass a Hugging Face model folder "
                                f"(config.json + model.safetensors), e.g. one written by save_pretrained")
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: {folder} is not a Hugging Face model folder "
                                f"(expected config.json next to model.safetensors)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ModelConfigError(f"{path}: invalid JSON at line {err.lineno}, column {err.colno}: {err.msg}") from err
    if not isinstance(config, dict):
        raise ModelConfigError(f"{path}: expected a JSON object, got {type(config).__name__}")
    qwen2_spec(config, source=str(path))  # validate now, so errors point at the file
    return config


def read_generation_config(model_dir: PathLike) -> Optional[dict]:
    """``<model_dir>/generation_config.json`` as a dict, or None when the model has none."""
    path = Path(model_dir) / GENERATION_CONFIG_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ModelConfigError(f"{path}: invalid JSON at line {err.lineno}, column {err.colno}: {err.msg}") from err


def language_model_config(config: Mapping[str, Any]) -> dict:
    """The keys that describe the language model, at the top level: a Qwen2.5-VL config's ``text_config`` merged
    over its top level (text keys win, as in transformers' ``Qwen2_5_VLConfig``; ``model_type`` stays the VL one).
    A text model's or hub-style VL config is returned as it is."""
    text = config.get("text_config")
    if not isinstance(text, Mapping):
        return dict(config)
    merged = {key: value for key, value in config.items() if key != "text_config"}
    merged.update({key: value for key, value in text.items() if key != "model_type"})
    return merged


def _mrope_section(config: Mapping[str, Any], head_dim: int, source: str) -> Tuple[int, ...]:
    """M-RoPE's rotary half-dims per t/h/w row, from ``rope_scaling`` (transformers 4.x, hub) or
    ``rope_parameters`` (transformers 5); they must cover the head's ``head_dim / 2`` rotary frequencies."""
    section = None
    for key in ("rope_scaling", "rope_parameters"):
        params = config.get(key)
        if isinstance(params, Mapping) and params.get("mrope_section") is not None:
            section = params["mrope_section"]
    if section is None:
        raise ModelConfigError(f"{source}: model_type={config.get('model_type')!r} needs rope_scaling.mrope_section "
                               "(the t/h/w split of the rotary dims, e.g. [16, 24, 24]); copy config.json from the "
                               "original model folder")
    if (not isinstance(section, (list, tuple)) or len(section) != 3
            or not all(isinstance(n, int) and n > 0 for n in section) or sum(section) != head_dim // 2):
        raise ModelConfigError(f"{source}: mrope_section={section!r} must be three positive integers summing to "
                               f"head_dim / 2 = {head_dim // 2}")
    return tuple(int(n) for n in section)


def _rope_theta(config: Mapping[str, Any], source: str) -> float:
    """RoPE base: transformers 4.x and real Qwen2.5 checkpoints write ``rope_theta``, transformers 5 writes
    ``rope_parameters.rope_theta``; some folders carry both, which must then agree."""
    top = config.get("rope_theta")
    params = config.get("rope_parameters") or {}
    nested = params.get("rope_theta") if isinstance(params, dict) else None
    if top is not None and nested is not None and not math.isclose(float(top), float(nested), rel_tol=1e-6):
        raise ModelConfigError(f"{source}: rope_theta={top} and rope_parameters.rope_theta={nested} disagree; "
                               "fix the file so both hold the model's RoPE base")
    rope_type = params.get("rope_type", "default") if isinstance(params, dict) else "default"
    scaling = config.get("rope_scaling")
    # M-RoPE computes plain RoPE frequencies (transformers maps type "mrope" to "default"); only VL models have it
    plain = ("default", "mrope") if config.get("model_type") in VL_MODEL_TYPES else ("default",)
    if rope_type not in plain or (scaling and scaling.get("rope_type", scaling.get("type")) not in plain):
        raise ModelConfigError(f"{source}: RoPE scaling ({scaling or params}) is not supported; mindgrpo builds "
                               "plain RoPE. Remove rope_scaling for contexts within max_position_embeddings")
    theta = top if top is not None else nested
    return 10000.0 if theta is None else float(theta)  # transformers' default when neither is given


def qwen2_spec(config: Mapping[str, Any], source: str = CONFIG_FILE) -> Qwen2Spec:
    """Validate a Qwen2 (or Qwen2.5-VL: its language model) config dict and normalise it; ``source`` names the file
    in error messages."""
    config = language_model_config(config)
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelConfigError(f"{source}: model_type={model_type!r}, but mindgrpo builds only "
                               f"{', '.join(SUPPORTED_MODEL_TYPES)} (Qwen2/Qwen2.5, Qwen2.5-VL) models")
    missing = [key for key in REQUIRED_KEYS if key not in config]
    if missing:
        raise ModelConfigError(f"{source}: missing key(s) {', '.join(missing)}; copy config.json from the "
                               "original model folder")
    if config.get("hidden_act", "silu") != "silu":
        raise ModelConfigError(f"{source}: hidden_act={config['hidden_act']!r} is not supported (Qwen2 uses silu)")
    if config.get("use_sliding_window", False):
        raise ModelConfigError(f"{source}: use_sliding_window=true is not supported; set it to false "
                               "(Qwen2.5 checkpoints ship with it off)")
    heads = int(config["num_attention_heads"])
    hidden = int(config["hidden_size"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    if hidden % heads or heads % kv_heads:
        raise ModelConfigError(f"{source}: hidden_size={hidden}, num_attention_heads={heads} and "
                               f"num_key_value_heads={kv_heads} must divide evenly")
    head_dim = hidden // heads
    if config.get("head_dim") not in (None, head_dim):
        raise ModelConfigError(f"{source}: head_dim={config['head_dim']} differs from hidden_size / "
                               f"num_attention_heads = {head_dim}; MindFormers' Llama cannot build that")

    def token(key: str) -> Optional[int]:
        value = config.get(key)
        return value[0] if isinstance(value, list) and value else value

    vl = model_type in VL_MODEL_TYPES
    vision = config.get("vision_config") or {}

    return Qwen2Spec(
        vocab_size=int(config["vocab_size"]), hidden_size=hidden,
        intermediate_size=int(config["intermediate_size"]), num_hidden_layers=int(config["num_hidden_layers"]),
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)), rope_theta=_rope_theta(config, source),
        max_position_embeddings=int(config.get("max_position_embeddings", 32768)),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        bos_token_id=token("bos_token_id"), eos_token_id=token("eos_token_id"), pad_token_id=token("pad_token_id"),
        mrope_section=_mrope_section(config, head_dim, source) if vl else (),
        # absent ids take transformers' Qwen2_5_VLConfig defaults (the real tokenizer's ids)
        image_token_id=int(config.get("image_token_id", 151655)) if vl else None,
        vision_start_token_id=int(config.get("vision_start_token_id", 151652)) if vl else None,
        spatial_merge_size=int(vision.get("spatial_merge_size", 2)) if vl else None)


def weight_shapes(spec: Qwen2Spec) -> Dict[str, tuple]:
    """Every Hugging Face weight name of the language model with its full ``[out, in]`` shape, in the order of the
    model's layers (tied models: no ``lm_head.weight``). The model, the planner and the tools all count from here."""
    h, d, i_size = spec.hidden_size, spec.head_dim, spec.intermediate_size
    q, kv = spec.num_attention_heads * d, spec.num_key_value_heads * d
    shapes = {"model.embed_tokens.weight": (spec.vocab_size, h)}
    for layer in range(spec.num_hidden_layers):
        p = f"model.layers.{layer}"
        shapes.update({
            f"{p}.input_layernorm.weight": (h,),
            f"{p}.self_attn.q_proj.weight": (q, h), f"{p}.self_attn.q_proj.bias": (q,),
            f"{p}.self_attn.k_proj.weight": (kv, h), f"{p}.self_attn.k_proj.bias": (kv,),
            f"{p}.self_attn.v_proj.weight": (kv, h), f"{p}.self_attn.v_proj.bias": (kv,),
            f"{p}.self_attn.o_proj.weight": (h, q),
            f"{p}.post_attention_layernorm.weight": (h,),
            f"{p}.mlp.gate_proj.weight": (i_size, h), f"{p}.mlp.up_proj.weight": (i_size, h),
            f"{p}.mlp.down_proj.weight": (h, i_size),
        })
    shapes["model.norm.weight"] = (h,)
    if not spec.tie_word_embeddings:
        shapes["lm_head.weight"] = (spec.vocab_size, h)
    return shapes


def check_dtype(name: str, value: str) -> str:
    if value not in DTYPES:
        raise ValueError(f"{name}={value!r}: expected one of {', '.join(DTYPES)}")
    return value
