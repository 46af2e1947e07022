"""The demo's model: a tiny Qwen2.5 (hidden 64, 2 layers, 4 heads, 2 KV heads, tied embeddings, ~128k parameters),
its config.json and its initial weights as Hugging Face initialises them."""
from __future__ import annotations

from typing import Dict

import numpy as np


def model_config(vocab_size: int, special_ids: Dict[str, int]) -> dict:
    """config.json of the tiny Qwen2.5 (transformers 4.x spelling, as real Qwen2.5 checkpoints have it)."""
    pad, eos = special_ids["<|endoftext|>"], special_ids["<|im_end|>"]
    return {
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": pad, "eos_token_id": eos,
        "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 176,
        "max_position_embeddings": 512, "max_window_layers": 2, "model_type": "qwen2", "num_attention_heads": 4,
        "num_hidden_layers": 2, "num_key_value_heads": 2, "pad_token_id": pad, "rms_norm_eps": 1e-06,
        "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": None, "tie_word_embeddings": True,
        "torch_dtype": "float32", "use_cache": True, "use_sliding_window": False, "vocab_size": vocab_size,
    }


def init_weights(config: dict, seed: int) -> Dict[str, np.ndarray]:
    """Hugging Face names and initialisation: matrices and embeddings N(0, initializer_range), the pad embedding
    row zero, biases zero, RMSNorm scales one. Tied embeddings: no lm_head.weight."""
    rng = np.random.default_rng(seed)
    hidden, inter, std = config["hidden_size"], config["intermediate_size"], config["initializer_range"]
    kv = config["num_key_value_heads"] * hidden // config["num_attention_heads"]

    def normal(*shape: int) -> np.ndarray:
        return rng.normal(0.0, std, size=shape).astype(np.float32)

    weights = {"model.embed_tokens.weight": normal(config["vocab_size"], hidden)}
    weights["model.embed_tokens.weight"][config["pad_token_id"]] = 0.0  # nn.Embedding(padding_idx=pad)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for proj, rows in (("q", hidden), ("k", kv), ("v", kv)):
            weights[f"{p}self_attn.{proj}_proj.weight"] = normal(rows, hidden)
            weights[f"{p}self_attn.{proj}_proj.bias"] = np.zeros(rows, np.float32)
        weights[f"{p}self_attn.o_proj.weight"] = normal(hidden, hidden)
        weights[f"{p}mlp.gate_proj.weight"] = normal(inter, hidden)
        weights[f"{p}mlp.up_proj.weight"] = normal(inter, hidden)
        weights[f"{p}mlp.down_proj.weight"] = normal(hidden, inter)
        weights[f"{p}input_layernorm.weight"] = np.ones(hidden, np.float32)
        weights[f"{p}post_attention_layernorm.weight"] = np.ones(hidden, np.float32)
    weights["model.norm.weight"] = np.ones(hidden, np.float32)
    if not config["tie_word_embeddings"]:
        weights["lm_head.weight"] = normal(config["vocab_size"], hidden)
    return weights
