"""The VL demo's model folder: the text demo's tiny Qwen2.5 (its tokenizer recipe and weight initialisation) made a
Qwen2.5-VL: M-RoPE in the language model, Qwen2.5-VL's vision special tokens, a tiny vision tower (hidden 32, 2
blocks, the second with full attention) and the image processor settings, in the nested config spelling
transformers 4.57 saves (its Qwen2_5_VLForConditionalGeneration loads the folder)."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List

import numpy as np

from mindgrpo.stamped import write_json
from mindgrpo.apps.demo.model import init_weights, model_config
from mindgrpo.apps.demo.tokenizer import train_tokenizer, write_tokenizer

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
VISION_CONFIG = {"depth": 2, "fullatt_block_indexes": [1], "hidden_act": "silu", "hidden_size": 32,
                 "in_channels": 3, "initializer_range": 0.05, "intermediate_size": 64, "model_type": "qwen2_5_vl",
                 "num_heads": 2, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
                 "tokens_per_second": 2, "window_size": 112}
# Qwen2VLImageProcessor's settings (its defaults, pixels bounded so the demo's 84 x 84 pictures keep their size)
IMAGE_PROCESSOR = {"do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
                   "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
                   "image_processor_type": "Qwen2VLImageProcessor", "max_pixels": 12544, "merge_size": 2,
                   "min_pixels": 3136, "patch_size": 14, "resample": 3, "rescale_factor": 1 / 255,
                   "size": {"longest_edge": 12544, "shortest_edge": 3136}, "temporal_patch_size": 2}


def write_model(folder: Path, rows: List[dict], seed: int) -> Dict[str, object]:
    """Tokenizer, config.json, generation_config.json, preprocessor_config.json and random weights in `folder`;
    returns facts for the demo's summary. `rows` ({question, answer}) are the tokenizer's corpus."""
    from safetensors.numpy import save_file
    from tokenizers import AddedToken

    tok = train_tokenizer(rows)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in VISION_TOKENS])
    ids = write_tokenizer(tok, folder)
    _register_vision_tokens(folder, tok)
    text = model_config(tok.get_vocab_size(), ids)
    head_half = text["hidden_size"] // text["num_attention_heads"] // 2
    text.update(model_type="qwen2_5_vl_text", architectures=["Qwen2_5_VLForConditionalGeneration"],
                rope_scaling={"type": "default", "rope_type": "default",
                              "mrope_section": [head_half - 2 * (head_half * 3 // 8), head_half * 3 // 8,
                                                head_half * 3 // 8]})
    config = {"model_type": "qwen2_5_vl", "architectures": ["Qwen2_5_VLForConditionalGeneration"],
              "text_config": text, "tie_word_embeddings": text["tie_word_embeddings"],
              "vision_config": {**VISION_CONFIG, "out_hidden_size": text["hidden_size"]},
              "bos_token_id": text["bos_token_id"], "eos_token_id": text["eos_token_id"],
              "pad_token_id": text["pad_token_id"], "dtype": "float32",
              **{f"{name}_token_id": tok.token_to_id(f"<|{name}|>")
                 for name in ("vision_start", "vision_end", "video")},
              "image_token_id": tok.token_to_id("<|image_pad|>")}
    write_json(folder / "config.json", config)
    write_json(folder / "generation_config.json", {
        "bos_token_id": text["bos_token_id"], "eos_token_id": [text["eos_token_id"], text["pad_token_id"]],
        "pad_token_id": text["pad_token_id"]})
    write_json(folder / "preprocessor_config.json", IMAGE_PROCESSOR)
    weights = init_weights(text, seed)
    weights.update(_vision_weights(config, seed + 1))
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return {"vocab_size": text["vocab_size"], "parameters": int(sum(v.size for v in weights.values())),
            "vision_parameters": int(sum(v.size for k, v in weights.items() if k.startswith("visual.")))}


def _register_vision_tokens(folder: Path, tok) -> None:
    """tokenizer_config.json's added tokens, with the vision tokens (write_tokenizer lists the text ones)."""
    import json

    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    for token in VISION_TOKENS:
        config["added_tokens_decoder"][str(tok.token_to_id(token))] = {
            "content": token, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
            "special": True}
    write_json(path, config)


def _vision_weights(config: dict, seed: int) -> Dict[str, np.ndarray]:
    """The tower's tensors under the hub names (`visual.*`): matrices N(0, initializer_range), biases zero,
    RMSNorm scales one (shapes from mindgrpo's tower built for this config)."""
    from mindgrpo.models.vision import Qwen2_5VisionTower, vision_parameters, vision_spec

    rng = np.random.default_rng(seed)
    std = config["vision_config"]["initializer_range"]
    out = {}
    for name, param in sorted(vision_parameters(Qwen2_5VisionTower(vision_spec(config))).items()):
        shape = tuple(param.shape)
        if name.endswith("bias"):
            out["visual." + name] = np.zeros(shape, np.float32)
        elif "norm" in name or name.endswith("ln_q.weight"):
            out["visual." + name] = np.ones(shape, np.float32)
        else:
            out["visual." + name] = rng.normal(0.0, std, size=shape).astype(np.float32)
    return out
