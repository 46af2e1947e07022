"""Qwen2 as MindFormers builds it: ``LlamaForCausalLM`` configured as Qwen2, its weights loaded from a Hugging Face
folder (:func:`build_mindformers_model`). This is all of MindFormers that mindgrpo runs: the ``mindformers``
rollout backend's ``generate``, on a copy of the actor's weights (:func:`mindgrpo.models.weights.sync_weights`).
Training, scoring and the native rollout engine run :class:`mindgrpo.models.qwen2.Qwen2Model`, whose Parameter
names are MindFormers', so the copy goes by name; ``tests/test_models.py`` holds the two forwards to each other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Union

from mindspore import nn
from mindspore.nn.utils import no_init_parameters

from mindgrpo._lean_import import lean_mindformers_import
from mindgrpo.hf_config import Qwen2Spec, check_dtype, qwen2_spec, read_hf_config
from mindgrpo.models.weights import load_hf_weights

with lean_mindformers_import():  # without the packages MindFormers loads for features mindgrpo never uses
    from mindformers.models.llama import LlamaForCausalLM

PathLike = Union[str, Path]


def llama_config(spec: Qwen2Spec, *, compute_dtype: str, param_dtype: str, seq_length: int):
    """The MindFormers ``LlamaConfig`` that makes ``LlamaForCausalLM`` compute exactly Qwen2."""
    from mindformers.models.llama import LlamaConfig  # heavy import, only when a model is built

    check_dtype("compute_dtype", compute_dtype)
    check_dtype("param_dtype", param_dtype)
    pad = spec.pad_token_id if spec.pad_token_id is not None else spec.eos_token_id
    return LlamaConfig(
        batch_size=1, seq_length=seq_length, vocab_size=spec.vocab_size, hidden_size=spec.hidden_size,
        num_layers=spec.num_hidden_layers, num_heads=spec.num_attention_heads, n_kv_heads=spec.num_key_value_heads,
        intermediate_size=spec.intermediate_size, max_position_embedding=spec.max_position_embeddings,
        rms_norm_eps=spec.rms_norm_eps, theta=spec.rope_theta, tie_word_embeddings=spec.tie_word_embeddings,
        qkv_has_bias=True, attn_proj_has_bias=False, qkv_concat=False,
        use_rope_slice=True,  # HF rotate_half (concat(-x2, x1)), not the interleaved swap matrix
        fused_rms_norm=False, use_flash_attention=False,  # the fused kernels are Ascend-only
        compute_dtype=compute_dtype, param_init_type=param_dtype, embedding_init_type=param_dtype,
        # HF Qwen2 normalises and softmaxes in fp32 whatever the weights are; RoPE tables stay fp32 too.
        layernorm_compute_type="float32", softmax_compute_type="float32", rotary_dtype="float32",
        pad_token_id=0 if pad is None else pad,
        bos_token_id=0 if spec.bos_token_id is None else spec.bos_token_id,
        eos_token_id=0 if spec.eos_token_id is None else spec.eos_token_id,
        use_past=False, is_dynamic=False, checkpoint_name_or_path="")


def build_mindformers_model(model_dir: PathLike, *, compute_dtype: str = "float32", seq_length: int = 2048,
                            load_weights: bool = True) -> nn.Cell:
    """MindFormers' ``LlamaForCausalLM`` configured as Qwen2, from a Hugging Face folder, frozen and in eval mode,
    for its ``generate()`` (the ``mindformers`` rollout backend). Its weights are in ``compute_dtype``;
    ``seq_length`` sizes MindFormers' causal mask. Parameters are created without initial values and filled from
    the checkpoint, so no second copy of the weights is made; with ``load_weights=False`` they get MindFormers'
    random init, and :func:`mindgrpo.models.weights.sync_weights` copies a :class:`~mindgrpo.models.qwen2.Qwen2Model`'s
    weights in by name."""
    spec = qwen2_spec(read_hf_config(model_dir), source=str(Path(model_dir) / "config.json"))
    if spec.is_vl:
        raise ValueError(f"{model_dir} is a Qwen2.5-VL model: MindFormers' generate has no vision tower; use the "
                         "native rollout engine")
    config = llama_config(spec, compute_dtype=compute_dtype, param_dtype=compute_dtype, seq_length=seq_length)
    with no_init_parameters():  # no random init we would overwrite at once
        model = LlamaForCausalLM(config)
    if load_weights:
        load_hf_weights(model, model_dir)
    else:
        model.init_parameters_data()
    for param in model.get_parameters():
        param.requires_grad = False
    model.set_train(False)
    return model
