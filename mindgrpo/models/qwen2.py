"""mindgrpo's Qwen2 model: one type at every tensor-parallel degree, which owns its weights, its shape
(:class:`~mindgrpo.hf_config.Qwen2Spec`), its :class:`~mindgrpo.parallel.layout.TPLayout` (the whole model at
``model_parallel`` 1) and its tensor-parallel group; :func:`build_model` makes it from a Hugging Face folder.

No rank builds more than its slices (see :mod:`mindgrpo.parallel.layout` for which): :func:`build_model` fills them
straight from the Hugging Face safetensors files, one tensor at a time, so a rank's resident weights are about
``1/model_parallel`` of the model plus the replicated norms, and one HF folder serves every layout with no conversion.

It holds weights, not a forward: its Cells mirror the attribute paths of MindFormers' ``LlamaForCausalLM``
(``model.layers[i].attention.wq.weight``, ``model.tok_embeddings.embedding_weight``, ``lm_head.weight``, ...), so
Parameter names, the HF name mapping and checkpoints are MindFormers', and MindFormers' own model (the
``mindformers`` rollout backend, :mod:`mindgrpo.models.causal_lm`) takes a copy by name. Its passes are named
methods, each a Cell over these very Parameters (no copy) running mindgrpo's Qwen2 math
(:mod:`mindgrpo.models.qwen2_blocks`, with the collectives of :mod:`mindgrpo.parallel.layers`):
:meth:`Qwen2Model.full_sequence`, :meth:`~Qwen2Model.completions`, :meth:`~Qwen2Model.shared_prompt` and
:meth:`~Qwen2Model.packed`; the native rollout engine's prefill and decode graphs are built on the same blocks
(:mod:`mindgrpo.rollout.backends.native_graphs`), beside the KV cache they own.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Optional, Union

import numpy as np

import mindspore as ms
from mindspore import Parameter, Tensor, nn

from mindgrpo.hf_config import Qwen2Spec, check_dtype, qwen2_spec, read_hf_config, weight_shapes
from mindgrpo.models.full_sequence import CompletionForward, FullSequenceForward
from mindgrpo.models.lora import (LoraSpec, adapter_shapes, attach_adapters, init_adapters, load_peft,
                                  read_peft_spec)
from mindgrpo.models.packed_prompt import PackedPromptForward
from mindgrpo.models.passes import ModelPass
from mindgrpo.models.prompt_images import PromptVision
from mindgrpo.models.qwen2_blocks import DecoderSpec, Qwen2Weights, layer_fields
from mindgrpo.models.shared_prompt import SharedPromptForward
from mindgrpo.models.vision import Qwen2_5VisionTower, load_vision_weights, vision_spec
from mindgrpo.models.weights import hf_parameters, load_hf_weights
from mindgrpo.parallel.layout import TPLayout

PathLike = Union[str, Path]
ROLES = ("actor", "reference", "inference")
INIT_STD = 0.02  # Qwen2's initializer_range: the random weights of load_weights=False


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
        # MindFormers' order (the order of trainable_params(), which the global gradient norm sums in)
        self.ffn_norm = _Weight(make(f"{prefix}.post_attention_layernorm.weight"))
        self.attention_norm = _Weight(make(f"{prefix}.input_layernorm.weight"))
        self.attention = _Attention(make, prefix)
        self.feed_forward = _FeedForward(make, prefix)


class _Body(nn.Cell):
    def __init__(self, make, num_layers: int):
        super().__init__()
        self.tok_embeddings = _Embedding(make("model.embed_tokens.weight"))
        self.layers = nn.CellList([_Layer(make, i) for i in range(num_layers)])
        self.norm_out = _Weight(make("model.norm.weight"))


def is_norm(hf_name: str) -> bool:
    return hf_name.endswith("norm.weight")


def _random_value(hf_name: str, shape: tuple, rng: np.random.Generator) -> np.ndarray:
    """Qwen2's initialisation: norms 1, biases 0, matrices N(0, initializer_range)."""
    if is_norm(hf_name):
        return np.ones(shape, np.float32)
    if hf_name.endswith(".bias"):
        return np.zeros(shape, np.float32)
    return rng.normal(0.0, INIT_STD, shape).astype(np.float32)


class Qwen2Model(nn.Cell):
    """A Qwen2 (or Qwen2.5-VL's language model) rank: this rank's slices in ``param_dtype`` under MindFormers'
    names, and everything a caller needs to know about them.

    * ``spec``: the architecture (:class:`~mindgrpo.hf_config.Qwen2Spec`); ``hf_config`` the ``config.json`` dict it
      was read from (export writes it back).
    * ``layout``: which slice of each HF tensor this rank holds (``layout.tp == 1``: all of it); ``group`` the
      MindSpore communication group of its tensor-parallel ranks ("" at one rank).
    * ``full_shapes``: every HF weight name with its full (unsliced) shape.
    * Parameters are in ``param_dtype``, RMSNorm scales always in float32.
    * ``role``: ``actor`` (trainable) or a frozen one (``reference``, ``inference``: no Parameter requires a
      gradient, eval mode).
    * ``compute_dtype``: the matmuls' dtype (``float32``, ``bfloat16``, ``float16``); weights stored in another
      dtype are cast at use.
    * ``lora``: the LoRA adapters' :class:`~mindgrpo.models.lora.LoraSpec`, or None. With adapters the backbone is
      frozen: an actor's adapters (float32, on the targeted weight Cells as ``lora_a``/``lora_b``) are its only
      trainable Parameters, and every pass can run with them (the policy) or without (the reference);
      ``adapter_shapes`` their full shapes by PEFT name (empty without LoRA).
    * ``vision``: a Qwen2.5-VL model's frozen vision tower with its language model's image token ids
      (:class:`~mindgrpo.models.prompt_images.PromptVision`), or None: a text model, or a Qwen2.5-VL reference,
      which reads its actor's image features. ``is_vl`` says which kind of model it is (its spec decides).

    The Parameters start as zeros (calloc'd: untouched pages cost no memory), to be filled by
    :func:`mindgrpo.models.weights.load_hf_weights` or :meth:`init_random`.
    """

    def __init__(self, spec: Qwen2Spec, hf_config: Mapping, layout: TPLayout, group: str = "", *, role: str,
                 compute_dtype: str, param_dtype: str, lora: Optional[LoraSpec] = None,
                 vision_tower: Optional[Qwen2_5VisionTower] = None):
        super().__init__()
        if role not in ROLES:
            raise ValueError(f"role={role!r}: expected one of {', '.join(ROLES)}")
        if vision_tower is not None and not spec.is_vl:
            raise ValueError("a vision tower needs a Qwen2.5-VL model; this config.json describes a text model")
        self.lora = lora
        # a plain attribute, not a sub-Cell: the tower's Parameters are no part of the language model's (its
        # trainable_params, its HF names, its exports and syncs)
        self.vision = None if vision_tower is None else PromptVision(vision_tower, spec)
        self.spec, self.hf_config, self.layout, self.group, self.role = spec, dict(hf_config), layout, group, role
        self.full_shapes = weight_shapes(spec)
        self.adapter_shapes = (adapter_shapes(lora, self.full_shapes, spec.num_hidden_layers) if lora is not None
                               else {})
        self.compute_dtype = check_dtype("compute_dtype", compute_dtype)
        dtype = self.param_dtype = getattr(ms, check_dtype("param_dtype", param_dtype))

        # A frozen LoRA backbone's embedding table and head are stored float32 on CPU (the bf16 values, exactly):
        # MindSpore's CPU backend has no bf16 Gather or MatMul, so every graph would otherwise keep its own float32
        # cast of them (2.2 GB each for Qwen2.5-7B, in every compiled graph's memory), where this holds one.
        wide_tables = lora is not None and dtype == ms.bfloat16 and ms.get_context("device_target") == "CPU"

        def make(hf_name: str) -> Parameter:
            zeros = Tensor.from_numpy(np.zeros(layout.local_shape(hf_name, self.full_shapes[hf_name]), np.float32))
            # RMSNorm scales stay float32 in every dtype (as MindFormers keeps them): a few KB, and exact
            wide = is_norm(hf_name) or (wide_tables and hf_name in ("model.embed_tokens.weight", "lm_head.weight"))
            return Parameter(zeros if dtype == ms.float32 or wide else zeros.astype(dtype))

        self.model = _Body(make, spec.num_hidden_layers)
        embedding = self.model.tok_embeddings.embedding_weight
        self.lm_head = _Weight(embedding if spec.tie_word_embeddings else make("lm_head.weight"))
        embedding.name = "model.tok_embeddings.embedding_weight"  # a tied head took it over: MindFormers' name
        if lora is not None:  # a frozen backbone, then the adapters: an actor's only trainable Parameters
            for param in self.get_parameters():
                param.requires_grad = False
            attach_adapters(self, lora)
        if role != "actor":  # a reference or a rollout model: nothing trains
            for param in self.get_parameters():
                param.requires_grad = False
            self.set_train(False)

    @property
    def is_vl(self) -> bool:
        """A Qwen2.5-VL language model (M-RoPE, image tokens), with or without its own tower (``vision``)."""
        return self.spec.is_vl

    def load_weights(self, model_dir: PathLike) -> None:
        """This rank's slices of a Hugging Face folder's weights, strictly (every name and shape must match), and
        its vision tower's when it holds one."""
        load_hf_weights(self, model_dir, self.layout)
        if self.vision is not None:
            load_vision_weights(self.vision.tower, model_dir)

    def init_random(self, seed: int = 0) -> None:
        """Random weights as Qwen2 initialises them (tests, benchmarks), drawn at full shape and sliced, so every
        layout holds slices of the same model."""
        rng = np.random.default_rng(seed)
        for name, param in hf_parameters(self).items():
            value = self.layout.take(name, _random_value(name, self.full_shapes[name], rng))
            tensor = Tensor.from_numpy(np.ascontiguousarray(value))
            if self.param_dtype == ms.bfloat16 and param.dtype == ms.float32:  # a table kept wide: bf16 values
                tensor = tensor.astype(ms.bfloat16).astype(ms.float32)
            param.set_data(tensor if param.dtype == ms.float32 else tensor.astype(param.dtype))
        if self.lora is not None:
            init_adapters(self, seed)

    def init_adapters(self, seed: int = 0) -> None:
        """Fresh adapters as PEFT initialises them (B = 0: the policy starts as the backbone)."""
        init_adapters(self, seed)

    def load_adapters(self, adapter_dir: PathLike) -> None:
        """The adapters from a PEFT folder (:func:`mindgrpo.models.lora.load_peft`, strict)."""
        load_peft(self, adapter_dir)

    def decoder_weights(self, adapters: bool = True) -> Qwen2Weights:
        """This rank's Parameters (the very objects: no copy) in the order the decoder graphs index them, with the
        decoder's spec: what every pass and the native rollout engine's graphs run on. With ``adapters`` (and LoRA)
        each layer's adapters follow its backbone weights; without them the graphs are the backbone's."""
        spec, body = self.spec, self.model
        lora = self.lora if adapters else None
        decoder = DecoderSpec(
            vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, num_layers=spec.num_hidden_layers,
            num_heads=spec.num_attention_heads, num_kv_heads=spec.num_key_value_heads, head_dim=spec.head_dim,
            rms_norm_eps=spec.rms_norm_eps, rope_theta=spec.rope_theta, qkv_bias=True, tp_layout=self.layout,
            tp_group=self.group, mrope_section=tuple(spec.mrope_section),
            lora_fields=lora.weight_fields if lora else (), lora_scale=lora.scale if lora else 0.0)
        params = [body.tok_embeddings.embedding_weight, body.norm_out.weight, self.lm_head.weight]
        for layer in body.layers:
            attn, ffn = layer.attention, layer.feed_forward
            by_field = {"attention_norm": layer.attention_norm.weight, "wq": attn.wq.weight, "bq": attn.wq.bias,
                        "wk": attn.wk.weight, "bk": attn.wk.bias, "wv": attn.wv.weight, "bv": attn.wv.bias,
                        "wo": attn.wo.weight, "ffn_norm": layer.ffn_norm.weight, "w1": ffn.w1.weight,
                        "w2": ffn.w2.weight, "w3": ffn.w3.weight}
            cells = {"wq": attn.wq, "wk": attn.wk, "wv": attn.wv, "wo": attn.wo, "w1": ffn.w1, "w2": ffn.w2,
                     "w3": ffn.w3}
            for field in decoder.lora_fields:
                by_field[f"{field}.lora_a"], by_field[f"{field}.lora_b"] = cells[field].lora_a, cells[field].lora_b
            params += [by_field[name] for name in layer_fields(decoder.qkv_bias, decoder.lora_fields)]
        return Qwen2Weights(decoder, params, self.compute_dtype)

    # ---------------------------------------------------------------------------------------------- passes
    # ``adapters``: with LoRA, False runs the frozen backbone alone (the reference policy); no effect without LoRA.
    def full_sequence(self, max_positions: int, adapters: bool = True) -> FullSequenceForward:
        """Every position of padded rows: ``(input_ids, attention_mask, position_ids=None, image_features=None,
        image_rows=None)`` -> float32 logits ``[B, S, V]``
        (:class:`~mindgrpo.models.full_sequence.FullSequenceForward`)."""
        return FullSequenceForward(self, max_positions, adapters)

    # The training-side passes (:class:`~mindgrpo.models.passes.ModelPass`). ``head_outside``: the pass returns the
    # normed final states and the head weight instead of the logits, for a caller that applies the head itself
    # (mindgrpo.ops.head_logprobs).
    def completions(self, max_positions: int, adapters: bool = True, head_outside: bool = False) -> ModelPass:
        """``[prompt | completion]`` rows: ``(input_ids, attention_mask, completion_ids)`` -> the completions' logits
        (:class:`~mindgrpo.models.full_sequence.CompletionForward`)."""
        return CompletionForward(self, max_positions, adapters, head_outside=head_outside)

    def shared_prompt(self, num_generations: int, max_positions: int, recompute: bool = False,
                      adapters: bool = True, head_outside: bool = False) -> ModelPass:
        """Each group's prompt once, its completions attending to it
        (:class:`~mindgrpo.models.shared_prompt.SharedPromptForward`)."""
        return SharedPromptForward(self, num_generations, max_positions, recompute=recompute, adapters=adapters,
                                   head_outside=head_outside)

    def packed(self, max_positions: int, recompute: bool = False, adapters: bool = True,
               head_outside: bool = False) -> ModelPass:
        """Several groups' prompts and completions packed into fixed rows
        (:class:`~mindgrpo.models.packed_prompt.PackedPromptForward`)."""
        return PackedPromptForward(self, max_positions, recompute=recompute, adapters=adapters,
                                   head_outside=head_outside)


def build_model(model_dir: PathLike, *, role: str = "actor", compute_dtype: str = "float32",
                param_dtype: str | None = None, load_weights: bool = True, tp_rank: int = 0, tp_size: int = 1,
                tp_group: str = "", lora: Optional[LoraSpec] = None, adapter_dir: PathLike | None = None,
                vision: bool = True) -> Qwen2Model:
    """A :class:`Qwen2Model` from a Hugging Face folder (``config.json`` + safetensors, single or sharded).

    Roles: ``actor`` is trainable; ``reference`` and ``inference`` are frozen (no trainable Parameters, no
    optimizer state, no gradients) and in eval mode.

    Parameters are in ``param_dtype``: by default float32 for the actor (``bfloat16`` keeps its fp32 master copy
    in the optimizer, :class:`mindgrpo.train.optim.AdamW`) and ``compute_dtype`` for the frozen roles (half the
    memory with a 16-bit compute dtype).

    Tensor parallelism (``tp_size > 1``, rank ``tp_rank`` of the MindSpore group ``tp_group``): the model holds
    only this rank's slices, read straight from the same folder. With ``load_weights=False`` the weights are
    random (:meth:`Qwen2Model.init_random`).

    ``lora``: LoRA adapters on a frozen backbone (an actor trains them; the other roles run them), read from
    ``adapter_dir`` (a PEFT folder, whose own spec is used when ``lora`` is not given) or, without one, initialised
    as PEFT does (B = 0).

    A Qwen2.5-VL folder's model holds its frozen vision tower (in ``compute_dtype``, the folder's weights; left at
    MindSpore's initialisation with ``load_weights=False``); ``vision=False`` leaves it out (a reference model,
    which reads its actor's image features).
    """
    check_dtype("compute_dtype", compute_dtype)
    if param_dtype is None:
        param_dtype = "float32" if role == "actor" else compute_dtype
    if lora is None and adapter_dir is not None:
        lora = read_peft_spec(adapter_dir)
    hf_config = read_hf_config(model_dir)
    spec = qwen2_spec(hf_config, source=str(Path(model_dir) / "config.json"))
    layout = TPLayout.of(spec, tp_size, tp_rank)
    layout.validate()
    tower = (Qwen2_5VisionTower(vision_spec(hf_config, source=str(Path(model_dir) / "config.json")), compute_dtype)
             if vision and spec.is_vl else None)
    model = Qwen2Model(spec, hf_config, layout, tp_group, role=role, compute_dtype=compute_dtype,
                       param_dtype=param_dtype, lora=lora, vision_tower=tower)
    if load_weights:
        model.load_weights(model_dir)  # each tensor replaces its zeros, one at a time
        if lora is not None and adapter_dir is None:
            model.init_adapters()
    else:
        model.init_random()
    if lora is not None and adapter_dir is not None:
        model.load_adapters(adapter_dir)
    return model
