"""One tensor-parallel rank's slices of a Qwen2 model, as Parameters under MindFormers' names.

With ``model_parallel > 1`` no rank builds the full model: :class:`Qwen2Shard` holds only this rank's slices (see
:mod:`mindgrpo.parallel.layout` for which), which ``build_model`` fills straight from the Hugging Face
safetensors files, one slice at a time, so a rank's resident weights are about ``1/model_parallel`` of the model
plus the replicated norms, and one HF folder serves every layout with no conversion.

It is a container, not a forward: its Cells mirror the attribute paths of MindFormers' ``LlamaForCausalLM``
(``model.layers[i].attention.wq.weight``, ``model.tok_embeddings.embedding_weight``, ``lm_head.weight``, ...), so
Parameter names, the HF name mapping, checkpoints and :func:`mindgrpo.models.qwen2_blocks.decoder_weights` work
unchanged, and mindgrpo's own Qwen2 math (:mod:`mindgrpo.models.qwen2_blocks`, with the collectives of
:mod:`mindgrpo.parallel.layers`) runs it: the shared-prompt forward for training and scoring, the native
engine for rollouts. MindFormers' forward would compute wrong results on slices, so it is never called here
(the config refuses ``share_prompt: false`` and the ``mindformers`` rollout backend under tensor parallelism).
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Mapping, Optional

import numpy as np

import mindspore as ms
from mindspore import Parameter, Tensor, nn

from mindgrpo.hf_config import Qwen2Spec
from mindgrpo.parallel.layout import TPLayout


class _Weight(nn.Cell):
    """A Cell that only holds ``weight`` (and ``bias`` when given)."""

    def __init__(self, weight: Parameter, bias: Optional[Parameter] = None):
        super().__init__()
        self.weight = weight
        self.has_bias = bias is not None
        if bias is not None:
            self.bias = bias


class _Embedding(nn.Cell):
    def __init__(self, weight: Parameter):
        super().__init__()
        self.embedding_weight = weight


class _Attention(nn.Cell):
    def __init__(self, make, prefix: str):
        super().__init__()
        self.wq = _Weight(make(f"{prefix}.self_attn.q_proj.weight"), make(f"{prefix}.self_attn.q_proj.bias"))
        self.wk = _Weight(make(f"{prefix}.self_attn.k_proj.weight"), make(f"{prefix}.self_attn.k_proj.bias"))
        self.wv = _Weight(make(f"{prefix}.self_attn.v_proj.weight"), make(f"{prefix}.self_attn.v_proj.bias"))
        self.wo = _Weight(make(f"{prefix}.self_attn.o_proj.weight"))


class _FeedForward(nn.Cell):
    def __init__(self, make, prefix: str):
        super().__init__()
        self.w1 = _Weight(make(f"{prefix}.mlp.gate_proj.weight"))
        self.w2 = _Weight(make(f"{prefix}.mlp.down_proj.weight"))
        self.w3 = _Weight(make(f"{prefix}.mlp.up_proj.weight"))


class _Layer(nn.Cell):
    def __init__(self, make, index: int):
        super().__init__()
        prefix = f"model.layers.{index}"
        self.attention_norm = _Weight(make(f"{prefix}.input_layernorm.weight"))
        self.attention = _Attention(make, prefix)
        self.ffn_norm = _Weight(make(f"{prefix}.post_attention_layernorm.weight"))
        self.feed_forward = _FeedForward(make, prefix)


class _Body(nn.Cell):
    def __init__(self, make, num_layers: int):
        super().__init__()
        self.tok_embeddings = _Embedding(make("model.embed_tokens.weight"))
        self.layers = nn.CellList([_Layer(make, i) for i in range(num_layers)])
        self.norm_out = _Weight(make("model.norm.weight"))


def full_shapes(spec: Qwen2Spec) -> Mapping[str, tuple]:
    """Every HF weight name of the model with its full shape (tied models: no ``lm_head.weight``)."""
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


class Qwen2Shard(nn.Cell):
    """This rank's slices of a Qwen2 model as zero Parameters in ``param_dtype``, to be filled by
    :func:`mindgrpo.models.weights.load_hf_weights` (zeros are calloc'd: untouched pages cost no memory)."""

    def __init__(self, spec: Qwen2Spec, layout: TPLayout, tp_group: str, *, compute_dtype: str, param_dtype: str):
        super().__init__()
        self.tp_layout, self.tp_group = layout, tp_group
        self.full_shapes = dict(full_shapes(spec))
        dtype = getattr(ms, param_dtype)

        def make(hf_name: str) -> Parameter:
            zeros = Tensor.from_numpy(np.zeros(layout.local_shape(hf_name, self.full_shapes[hf_name]), np.float32))
            return Parameter(zeros if dtype == ms.float32 else zeros.astype(dtype))

        self.model = _Body(make, spec.num_hidden_layers)
        embedding = self.model.tok_embeddings.embedding_weight
        self.lm_head = _Weight(embedding if spec.tie_word_embeddings else make("lm_head.weight"))
        # what decoder_weights() reads from a MindFormers config
        self.config = SimpleNamespace(
            vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, num_heads=spec.num_attention_heads,
            n_kv_heads=spec.num_key_value_heads, rms_norm_eps=spec.rms_norm_eps, theta=spec.rope_theta,
            extend_method="None", qkv_concat=False, compute_dtype=getattr(ms, compute_dtype))
