"""``mindgrpo merge``: a LoRA adapter folder (a LoRA run's checkpoint ``model/``, PEFT's format) merged into its base
as a plain Hugging Face folder, which transformers (and vLLM) load without PEFT."""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="mindgrpo merge", description=__doc__)
    parser.add_argument("adapter", help="LoRA adapter folder (adapter_config.json + adapter_model.safetensors)")
    parser.add_argument("output", help="the merged Hugging Face folder to write (written whole, then renamed)")
    parser.add_argument("--base", help="the base model folder (default: the one adapter_config.json names)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                        help="the merged weights' dtype (default: the base's)")
    parser.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists")
    args = parser.parse_args(argv)
    from mindgrpo.models.lora import merge_peft

    try:
        out = merge_peft(args.adapter, args.output, base=args.base, dtype=args.dtype, overwrite=args.overwrite)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"[mindgrpo] merged {args.adapter} into {out}")
    return 0
