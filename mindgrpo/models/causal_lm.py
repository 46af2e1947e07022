"""Qwen2 as MindFormers builds it: ``LlamaForCausalLM`` configured as Qwen2, its weights loaded from a Hugging Face
folder (:func:`build_model`), with a forward for training and scoring that honours any mask (:class:`Qwen2CausalLM`).

This is one of mindgrpo's three Qwen2s (the table is in :mod:`mindgrpo.models`): it owns the Parameters. It runs
as the actor's and the reference's forward when ``rl_config.share_prompt`` is false and as the ``mindformers``
rollout backend's ``generate`` (role ``inference``); with tensor parallelism :func:`build_model` returns
a :class:`~mindgrpo.models.qwen2_sharded.Qwen2Shard` instead, whose slices only mindgrpo's own blocks
(:mod:`mindgrpo.models.qwen2_blocks`) run.

MindFormers' own forward derives positions from the sequence length (0..S-1) and the attention mask from the pad
token id, which is wrong for left padding, packed sequences and shared prompts. ``Qwen2CausalLM`` keeps MindFormers'
layers and Parameters (so names, sharding and weight conversion stay MindFormers') and replaces only the top-level
``construct``: it builds the additive mask and RoPE tables from the caller's mask and positions and returns the
hidden states after the final norm. ``logits(hidden)`` applies the (possibly tied) lm_head, so the trainer can
project only completion positions to the vocabulary.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

from mindspore import Tensor, nn, ops
from mindspore.common import dtype as mstype
from mindspore.nn.utils import no_init_parameters

from mindgrpo._lean_import import lean_mindformers_import
from mindgrpo.hf_config import Qwen2Spec, check_dtype, qwen2_spec, read_hf_config
from mindgrpo.models.qwen2_blocks import mask_bias
from mindgrpo.models.qwen2_sharded import Qwen2Shard
from mindgrpo.models.weights import load_hf_weights
from mindgrpo.parallel.layout import TPLayout

with lean_mindformers_import():  # without the packages MindFormers loads for features mindgrpo never uses
    from mindformers.models.llama import LlamaForCausalLM

PathLike = Union[str, Path]
ROLES = ("actor", "reference", "inference")


class Qwen2CausalLM(LlamaForCausalLM):
    """Qwen2 causal LM for training and scoring (roles ``actor`` and ``reference``).

    ``model(input_ids, attention_mask, position_ids=None)`` -> hidden states ``[B, S, H]`` after the final norm,
    in the compute dtype. Inputs:

    * ``input_ids``: int32 ``[B, S]``.
    * ``attention_mask``: ``[B, S]`` with 1 for real tokens (left and/or right padding; causality is added), or a
      full ``[B, S, S]`` mask used as given (no causality added), for packed sequences and shared prompts:
      bool/int with 1 where query i may attend to key j, or float and additive (0 = attend, large negative = not;
      keep it finite, see ``qwen2_blocks.MASKED_SCORE``).
    * ``position_ids``: int32 ``[B, S]``. Default for a ``[B, S]`` mask: ``cumsum(mask) - 1`` (clipped at 0), so a
      left-padded row gets the positions of the same tokens unpadded; required with a ``[B, S, S]`` mask.

    Positions must be below ``max(max_position_embeddings, seq_length)`` (the RoPE table size).
    """

    def __init__(self, config):
        super().__init__(config)
        self.compute_dtype = config.compute_dtype
        self.rope_table_size = self.model.freqs_mgr.freqs_cos.shape[0]

    def construct(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Optional[Tensor] = None) -> Tensor:
        seq_len = input_ids.shape[1]
        if seq_len > self.rope_table_size:
            raise ValueError("sequence longer than the RoPE table (max_position_embeddings)")
        if attention_mask.ndim == 2:
            keep = ops.cast(attention_mask, mstype.int32) > 0
            if position_ids is None:
                position_ids = ops.maximum(ops.cumsum(ops.cast(keep, mstype.int32), 1) - 1, 0)
            steps = ops.arange(seq_len)
            causal = ops.expand_dims(steps, 1) >= ops.expand_dims(steps, 0)  # [S, S]: key j <= query i
            bias = self._bias(ops.logical_and(ops.expand_dims(causal, 0), ops.expand_dims(keep, 1)))
        elif attention_mask.ndim == 3:
            if position_ids is None:
                raise ValueError("a [B, S, S] attention_mask needs explicit position_ids")
            if attention_mask.dtype in (mstype.float32, mstype.float16, mstype.bfloat16):
                bias = ops.cast(attention_mask, self.compute_dtype)  # already additive (0 or large negative)
            else:
                bias = self._bias(ops.cast(attention_mask, mstype.int32) > 0)
        else:
            raise ValueError("attention_mask must be [B, S] (1 = real token) or [B, S, S] (bool/int: 1 = may "
                             "attend; float: additive)")
        bias = ops.expand_dims(bias, 1)  # [B, 1, S, S], broadcast over heads

        freqs = self.model.freqs_mgr
        position_ids = ops.cast(position_ids, mstype.int32)
        cos = ops.expand_dims(ops.gather(freqs.freqs_cos, position_ids, 0), 1)  # [B, 1, S, head_dim]
        sin = ops.expand_dims(ops.gather(freqs.freqs_sin, position_ids, 0), 1)
        rope = (cos, sin, freqs.swap_mask)

        hidden = ops.cast(self.model.tok_embeddings(input_ids), self.compute_dtype)
        for layer in self.model.layers:
            hidden = layer(hidden, rope, bias)
        return self.model.norm_out(hidden)

    def _bias(self, allowed: Tensor) -> Tensor:
        """Additive attention bias from a boolean may-attend mask; built in float32 and cast once, because CPU has
        no bfloat16 Sub/Mul kernels."""
        return ops.cast(mask_bias(ops.cast(allowed, mstype.float32)), self.compute_dtype)

    def logits(self, hidden: Tensor) -> Tensor:
        """float32 logits for hidden states of any leading shape ``[..., H]`` (tied lm_head = the embedding)."""
        return ops.cast(self.lm_head(hidden), mstype.float32)


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


def build_model(model_dir: PathLike, *, role: str = "actor", compute_dtype: str = "float32",
                param_dtype: str | None = None, seq_length: int = 2048, load_weights: bool = True, tp_rank: int = 0,
                tp_size: int = 1, tp_group: str = "") -> nn.Cell:
    """Build a Qwen2 model from a Hugging Face folder (``config.json`` + safetensors, single or sharded).

    Roles: ``actor`` -> ``Qwen2CausalLM``, trainable. ``reference`` -> ``Qwen2CausalLM`` with every Parameter frozen
    (``requires_grad=False``, so it has no trainable params, no optimizer state, no grads) and in eval mode.
    ``inference`` -> MindFormers' plain ``LlamaForCausalLM`` in eval mode, for its ``generate()``.

    Parameters are in ``param_dtype``: by default float32 for the actor (``bfloat16`` keeps its fp32 master copy
    in the optimizer, :class:`mindgrpo.train.optim.AdamW`) and ``compute_dtype`` for the frozen roles (half the
    memory with a 16-bit compute dtype). ``seq_length`` sizes MindFormers' own causal mask (used by
    ``generate``); the ``Qwen2CausalLM`` forward accepts any length up to the RoPE table.

    Tensor parallelism (``tp_size > 1``, rank ``tp_rank`` of the MindSpore group ``tp_group``): the result is a
    :class:`~mindgrpo.models.qwen2_sharded.Qwen2Shard` holding only this rank's slices, read straight from the
    same folder (roles ``actor`` and ``reference``; MindFormers' forward does not run on slices).

    Parameters are created without initial values and filled from the checkpoint, so no second copy of the weights
    is made. With ``load_weights=False`` they get MindFormers' random init (tests, benchmarks).
    """
    if role not in ROLES:
        raise ValueError(f"role={role!r}: expected one of {', '.join(ROLES)}")
    check_dtype("compute_dtype", compute_dtype)
    if param_dtype is None:
        param_dtype = "float32" if role == "actor" else compute_dtype
    check_dtype("param_dtype", param_dtype)
    hf_config = read_hf_config(model_dir)
    spec = qwen2_spec(hf_config, source=str(Path(model_dir) / "config.json"))
    if tp_size > 1:
        if role == "inference":
            raise ValueError("role='inference' (MindFormers' generate) cannot run on tensor-parallel slices; use the "
                             "native rollout engine")
        if not load_weights:
            raise ValueError("tensor-parallel slices are read from the folder's weights: load_weights=False is for "
                             "the single-rank model")
        model = Qwen2Shard(spec, TPLayout.for_hf_config(hf_config, tp_size, tp_rank), tp_group,
                           compute_dtype=compute_dtype, param_dtype=param_dtype)
        load_hf_weights(model, model_dir)  # each tensor replaces its zeros, one at a time
    else:
        config = llama_config(spec, compute_dtype=compute_dtype, param_dtype=param_dtype, seq_length=seq_length)
        cls = LlamaForCausalLM if role == "inference" else Qwen2CausalLM
        with no_init_parameters():  # no random init we would overwrite at once
            model = cls(config)
        if load_weights:
            load_hf_weights(model, model_dir)
        else:
            model.init_parameters_data()
    model.hf_config, model.spec, model.role = hf_config, spec, role
    if role != "actor":
        for param in model.get_parameters():
            param.requires_grad = False
        model.set_train(False)
    return model
