"""Tiny Qwen2 Hugging Face folders made locally (no ../shared needed), for tensor-parallel, layout and depth tests.

Biases are non-zero and norm scales are not one, so a wrongly sliced bias or norm changes the results.
``make_skinny_qwen2`` keeps a real Qwen2.5's depth, heads and vocabulary and shrinks only the widths."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Optional

import numpy as np

from mindgrpo.models.safetensors_io import write_safetensors


def make_tiny_qwen2(folder: Path, *, heads: int = 4, kv_heads: int = 2, head_dim: int = 16, layers: int = 2,
                    intermediate: int = 96, vocab: int = 256, tied: bool = True, seed: int = 0,
                    special_ids: Optional[dict] = None) -> Path:
    """``special_ids``: bos/pad/eos token ids of the tokenizer the folder will carry (default: the last ids)."""
    folder.mkdir(parents=True, exist_ok=True)
    hidden = heads * head_dim
    config = {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
        "hidden_size": hidden, "intermediate_size": intermediate, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "num_hidden_layers": layers, "vocab_size": vocab,
        "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": tied,
        "bos_token_id": vocab - 3, "pad_token_id": vocab - 3, "eos_token_id": vocab - 1, "torch_dtype": "float32",
        "use_sliding_window": False, "sliding_window": None, "attention_dropout": 0.0, "initializer_range": 0.02,
        **(special_ids or {}),
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


# Qwen2.5's real shapes that the step graphs and the vocabulary projection depend on: depth, heads, untied vocabulary
# (the 7B and 32B checkpoints' embedding and lm_head have 152,064 rows).
QWEN2_5_7B = {"layers": 28, "heads": 28, "kv_heads": 4, "vocab": 152_064}
QWEN2_5_32B = {"layers": 64, "heads": 40, "kv_heads": 8, "vocab": 152_064}
SPECIAL_IDS = ("bos_token_id", "pad_token_id", "eos_token_id")


def make_skinny_qwen2(folder: Path, tokenizer_dir: Path, *, layers: int, heads: int, kv_heads: int, vocab: int,
                      head_dim: int = 4, intermediate: int = 32, seed: int = 0) -> Path:
    """A random Qwen2 folder with a real model's depth, heads and untied vocabulary and tiny widths (hidden =
    heads * head_dim), carrying ``tokenizer_dir``'s tokenizer (the demo's) padded out to ``vocab`` tokens.

    The padding tokens (``t<id>``) are in the BPE vocabulary without merges: encoding never produces them, so
    prompts tokenize as with the original, but a sampled one decodes to text (a random model samples them almost
    always; unknown ids would decode to nothing, and every completion would be empty)."""
    special = json.loads((tokenizer_dir / "config.json").read_text(encoding="utf-8"))
    make_tiny_qwen2(folder, heads=heads, kv_heads=kv_heads, head_dim=head_dim, layers=layers,
                    intermediate=intermediate, vocab=vocab, tied=False, seed=seed,
                    special_ids={key: special[key] for key in SPECIAL_IDS})
    for name in ("tokenizer_config.json", "generation_config.json", "merges.txt"):
        shutil.copy(tokenizer_dir / name, folder / name)
    tokenizer = json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))
    bpe = tokenizer["model"]["vocab"]
    # The special tokens join the BPE vocabulary at their ids: the tokenizers library would otherwise renumber them
    # after the padded vocabulary.
    bpe.update({token["content"]: token["id"] for token in tokenizer["added_tokens"]})
    taken = set(bpe.values())
    padding = {f"t{i}": i for i in range(vocab) if i not in taken}
    if set(padding) & set(bpe):
        raise ValueError(f"{tokenizer_dir}: its vocabulary already has padding-style tokens t<id>")
    bpe.update(padding)
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False), encoding="utf-8")
    (folder / "vocab.json").write_text(json.dumps(bpe, ensure_ascii=False), encoding="utf-8")
    return folder
