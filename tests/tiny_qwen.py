"""Tiny Qwen2 Hugging Face folders made locally (no ../shared needed), for tensor-parallel and layout tests.

Biases are non-zero and norm scales are not one, so a wrongly sliced bias or norm changes the results."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mindgrpo.models.safetensors_io import write_safetensors


def make_tiny_qwen2(folder: Path, *, heads: int = 4, kv_heads: int = 2, head_dim: int = 16, layers: int = 2,
                    intermediate: int = 96, vocab: int = 256, tied: bool = True, seed: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    hidden = heads * head_dim
    config = {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
        "hidden_size": hidden, "intermediate_size": intermediate, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "num_hidden_layers": layers, "vocab_size": vocab,
        "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": tied,
        "bos_token_id": vocab - 3, "pad_token_id": vocab - 3, "eos_token_id": vocab - 1, "torch_dtype": "float32",
        "use_sliding_window": False, "sliding_window": None, "attention_dropout": 0.0, "initializer_range": 0.02,
    }
    rng = np.random.default_rng(seed)

    def normal(*shape, std=0.08):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    weights = {"model.embed_tokens.weight": normal(vocab, hidden, std=0.2)}
    kv = kv_heads * head_dim
    for i in range(layers):
        p = f"model.layers.{i}."
        for proj, rows in (("q", hidden), ("k", kv), ("v", kv)):
            weights[f"{p}self_attn.{proj}_proj.weight"] = normal(rows, hidden)
            weights[f"{p}self_attn.{proj}_proj.bias"] = normal(rows, std=0.1)
        weights[f"{p}self_attn.o_proj.weight"] = normal(hidden, hidden)
        weights[f"{p}mlp.gate_proj.weight"] = normal(intermediate, hidden)
        weights[f"{p}mlp.up_proj.weight"] = normal(intermediate, hidden)
        weights[f"{p}mlp.down_proj.weight"] = normal(hidden, intermediate)
        weights[f"{p}input_layernorm.weight"] = 1.0 + normal(hidden, std=0.1)
        weights[f"{p}post_attention_layernorm.weight"] = 1.0 + normal(hidden, std=0.1)
    weights["model.norm.weight"] = 1.0 + normal(hidden, std=0.1)
    if not tied:
        weights["lm_head.weight"] = normal(vocab, hidden, std=0.2)
    (folder / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    write_safetensors(folder / "model.safetensors", {k: v.shape for k, v in weights.items()}, weights.__getitem__)
    return folder
