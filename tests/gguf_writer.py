"""A GGUF file of a Hugging Face Qwen2 folder, written with the gguf package as llama.cpp's converter lays it out
(tensor names, qwen2 metadata, the GPT-2 BPE tokenizer and the chat template), in float32: a local checkpoint for
`mindgrpo fetch FILE.gguf` that transformers' GGUF loader must turn back into the same weights and tokens."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

# Hugging Face name (with {i} for the layer) -> llama.cpp's GGUF name
TENSOR_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "model.layers.{i}.input_layernorm.weight": "blk.{i}.attn_norm.weight",
    "model.layers.{i}.post_attention_layernorm.weight": "blk.{i}.ffn_norm.weight",
    "model.layers.{i}.self_attn.q_proj.weight": "blk.{i}.attn_q.weight",
    "model.layers.{i}.self_attn.q_proj.bias": "blk.{i}.attn_q.bias",
    "model.layers.{i}.self_attn.k_proj.weight": "blk.{i}.attn_k.weight",
    "model.layers.{i}.self_attn.k_proj.bias": "blk.{i}.attn_k.bias",
    "model.layers.{i}.self_attn.v_proj.weight": "blk.{i}.attn_v.weight",
    "model.layers.{i}.self_attn.v_proj.bias": "blk.{i}.attn_v.bias",
    "model.layers.{i}.self_attn.o_proj.weight": "blk.{i}.attn_output.weight",
    "model.layers.{i}.mlp.gate_proj.weight": "blk.{i}.ffn_gate.weight",
    "model.layers.{i}.mlp.up_proj.weight": "blk.{i}.ffn_up.weight",
    "model.layers.{i}.mlp.down_proj.weight": "blk.{i}.ffn_down.weight",
}


def gguf_name(hf_name: str) -> str:
    parts = hf_name.split(".")
    if len(parts) > 2 and parts[1] == "layers":
        layer = parts[2]
        return TENSOR_NAMES[".".join(parts[:2] + ["{i}"] + parts[3:])].replace("{i}", layer)
    return TENSOR_NAMES[hf_name]


def write_qwen2_gguf(model_dir: Path, path: Path) -> Path:
    import gguf

    config = json.loads((model_dir / "config.json").read_text())
    tokenizer = json.loads((model_dir / "tokenizer.json").read_text())
    tokenizer_config = json.loads((model_dir / "tokenizer_config.json").read_text())
    writer = gguf.GGUFWriter(str(path), arch="qwen2")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    # the BPE vocabulary by id: the model's entries, then the added (special) tokens
    tokens = {token_id: text for text, token_id in tokenizer["model"]["vocab"].items()}
    special = {entry["id"]: entry["content"] for entry in tokenizer["added_tokens"]}
    tokens.update(special)
    vocab = [tokens.get(i, f"[PAD{i}]") for i in range(config["vocab_size"])]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(vocab)
    writer.add_token_types([gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL
                            for i in range(len(vocab))])
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in tokenizer["model"]["merges"]])
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_pad_token_id(config["pad_token_id"])
    writer.add_add_bos_token(False)
    writer.add_chat_template(tokenizer_config["chat_template"])
    for name, value in sorted(load_file(str(model_dir / "model.safetensors")).items()):
        writer.add_tensor(gguf_name(name), np.ascontiguousarray(value, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
