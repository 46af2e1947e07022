"""``mindgrpo merge``: a LoRA adapter folder (a LoRA run's checkpoint ``model/``, PEFT's format) merged into its base
as a plain Hugging Face folder, which transformers (and vLLM) load without PEFT."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence


def adapter_folder(path: str, base: Optional[str] = None) -> Path:
    """The LoRA adapter folder `path` names: itself, or the newest verified checkpoint's ``model/`` of a LoRA run,
    its checkpoints/ folder or a step_N folder (found as ``mindgrpo eval`` finds them). A folder with no adapter
    is a ValueError saying what to pass."""
    from mindgrpo.apps.model_source import ModelSourceError, resolve_model
    from mindgrpo.models.lora import CONFIG_FILE, WEIGHTS_FILE, is_adapter_folder

    folder = Path(path).expanduser()
    if is_adapter_folder(folder):
        return folder
    wanted = (f"pass a LoRA adapter folder ({CONFIG_FILE} + {WEIGHTS_FILE}: a LoRA run's checkpoint model/), or "
              "the LoRA run's folder")
    # a run (config.yaml), checkpoints/ (step_N), a step_N (model/) or a model folder (config.json)
    if not (any((folder / name).exists() for name in ("config.yaml", "config.json", "model"))
            or any(folder.glob("step_*"))):
        raise ValueError(f"{folder} {'holds no LoRA adapter' if folder.is_dir() else 'does not exist'}; {wanted}")
    try:
        resolved = resolve_model(folder, base=base)
    except ModelSourceError as err:  # a run or checkpoint that cannot be used: the message says why
        raise ValueError(str(err)) from None
    if resolved.adapter_dir is None:
        raise ValueError(f"{folder} holds a full model ({resolved.weights_dir}), not a LoRA adapter: there is "
                         f"nothing to merge; {wanted}")
    return resolved.adapter_dir


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="mindgrpo merge", description=__doc__)
    parser.add_argument("adapter", help="LoRA adapter folder (adapter_config.json + adapter_model.safetensors), or a "
                                        "LoRA run, checkpoints/ or step_N folder (its newest verified checkpoint)")
    parser.add_argument("output", help="the merged Hugging Face folder to write (written whole, then renamed)")
    parser.add_argument("--base", help="the base model folder (default: the one adapter_config.json names)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                        help="the merged weights' dtype (default: the base's)")
    parser.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists")
    args = parser.parse_args(argv)
    from mindgrpo.models.lora import merge_peft

    try:
        adapter = adapter_folder(args.adapter, args.base)
        out = merge_peft(adapter, args.output, base=args.base, dtype=args.dtype, overwrite=args.overwrite)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"[mindgrpo] merged {adapter} into {out}")
    return 0
