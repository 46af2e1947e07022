"""The demo folder: `make_demo` builds it once, stamps it, and finds it again.

The folder is stamped with `demo.json` (recipe version, seed, file hashes, measured facts), written last. Everything
is built in a temporary sibling folder that is renamed into place, so an interrupted call leaves nothing
half-written, and a second call returns the stamped folder at once. Same seed, same files (on the same machine).
A lock in mindgrpo's cache lets one process build while the others (data-parallel ranks) wait for its stamp.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Tuple, Union

from mindgrpo.stamped import STAMP, stamped_build, write_json, write_jsonl
from mindgrpo.apps.demo.model import init_weights, model_config
from mindgrpo.apps.demo.problems import make_problems
from mindgrpo.apps.demo.tokenizer import train_tokenizer, write_tokenizer
from mindgrpo.apps.demo.warm_start import warm_start

RECIPE_VERSION = 2  # 2: the warm start on mindgrpo's own forward, stopping at TARGET_MATCH 0.20
STAMP_FORMAT = "mindgrpo-demo"
MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
               "tokenizer_config.json", "vocab.json", "merges.txt")
DEFAULT_WARM_START_STEPS = 400  # an upper bound: the warm start stops at TARGET_MATCH

PathLike = Union[str, os.PathLike]


@dataclass(frozen=True)
class DemoAssets:
    """Paths of a finished demo folder, and what `make_demo` measured while making it."""

    root: Path
    model_dir: Path  # Hugging Face folder: config, weights, tokenizer
    train_jsonl: Path
    test_jsonl: Path
    facts: Dict[str, object] = field(default_factory=dict)  # e.g. test_greedy_accuracy, parameters, vocab_size


def _asset_paths(root: Path) -> Tuple[Path, Path, Path]:
    return root / "model", root / "train.jsonl", root / "test.jsonl"


def default_demo_dir() -> Path:
    """Where the README's command keeps the demo: mindgrpo's per-user cache (see `mindgrpo._env.cache_dir`)."""
    from mindgrpo._env import cache_dir

    return Path(cache_dir()) / "demo"


def make_demo(out_dir: PathLike, *, seed: int = 0, warm_start_steps: int = DEFAULT_WARM_START_STEPS,
              force: bool = False) -> DemoAssets:
    """Build (or reuse) the demo in `out_dir`: `model/` (Hugging Face folder), `train.jsonl`, `test.jsonl` and the
    `demo.json` stamp. Returns the existing assets at once when `out_dir` holds a complete demo (every file hash
    checked) of the same recipe version, seed and `warm_start_steps`, unless `force`.

    `warm_start_steps` caps the supervised warm start, which stops earlier once the model answers TARGET_MATCH of
    its training batches exactly; 0 keeps the randomly initialised model. `out_dir` must be absent, empty or an
    earlier demo folder: anything else is refused rather than overwritten.
    """
    if warm_start_steps < 0:
        raise ValueError(f"warm_start_steps={warm_start_steps} must be >= 0 (0 skips the warm start)")
    root = Path(out_dir).expanduser().resolve()
    recipe = {"version": RECIPE_VERSION, "seed": int(seed), "warm_start_steps": int(warm_start_steps)}
    required = [f"model/{name}" for name in MODEL_FILES] + ["train.jsonl", "test.jsonl"]
    facts = stamped_build(root, STAMP_FORMAT, recipe, lambda tmp: _build(tmp, seed, warm_start_steps),
                          what="mindgrpo demo", required=required, force=force)
    return DemoAssets(root, *_asset_paths(root), facts)


def _build(root: Path, seed: int, warm_start_steps: int) -> Dict[str, object]:
    """Write every asset into `root`; returns the facts for the stamp."""
    from safetensors.numpy import save_file

    model_dir, train_path, test_path = _asset_paths(root)
    init_dir = root / "init" if warm_start_steps else model_dir
    init_dir.mkdir()
    train, test = make_problems(seed)
    write_jsonl(train_path, train)
    write_jsonl(test_path, test)
    tok = train_tokenizer(train)
    ids = write_tokenizer(tok, init_dir)
    config = model_config(tok.get_vocab_size(), ids)
    write_json(init_dir / "config.json", config)
    write_json(init_dir / "generation_config.json", {  # Qwen2.5-Instruct stops on <|im_end|> and <|endoftext|>
        "bos_token_id": config["bos_token_id"], "eos_token_id": [config["eos_token_id"], config["pad_token_id"]],
        "pad_token_id": config["pad_token_id"]})
    weights = init_weights(config, seed)
    save_file(weights, str(init_dir / "model.safetensors"), metadata={"format": "pt"})  # what transformers expects
    facts: Dict[str, object] = {"vocab_size": config["vocab_size"],
                                "parameters": int(sum(v.size for v in weights.values())),
                                "num_train": len(train), "num_test": len(test)}
    if warm_start_steps:
        facts.update(warm_start(init_dir, model_dir, train, test, max_steps=warm_start_steps, seed=seed))
        shutil.rmtree(init_dir)
    return facts
