"""Convert a prompt dataset (GSM8K jsonl, DeepScaleR json, DAPO-Math-17k or geo3k parquet) into a mindgrpo MindRecord.

Accepts MindRLHF's flags, so existing launch scripts work unchanged (``mindgrpo data`` takes the same flags):

    python tools/rlhf_data.py --vocab_path qwen2.5/vocab.json --merges_file_path qwen2.5/merges.txt \\
        --file_path gsm8k/train.jsonl --output_path data/gsm8k_train.mindrecord --dataset_type gsm8k \\
        --max_prompt_length 512 --seq_length 1024

or, with a Hugging Face model folder: ``--tokenizer_dir Qwen2.5-0.5B-Instruct``. Bad rows are reported on stderr as
``file:line: reason`` and skipped; ``--strict`` stops at the first one (exit code 1, nothing written). Image datasets
(``--dataset_type geo3k``, best with ``--prompt_template geo3k``) also read ``preprocessor_config.json`` beside the
tokenizer: Qwen2.5-VL's image settings fix how many image tokens each prompt holds.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

import mindgrpo  # noqa: F401  (before MindSpore: keeps its logs out of the way)
from mindgrpo.data import PROMPT_TEMPLATES, READERS, DataError, RowError, convert_dataset
from mindgrpo.data.readers import IMAGE_DATASETS
from mindgrpo.data.tokenizer import TokenizerError, load_tokenizer
from mindgrpo.tools import offered_signatures


def build_parser(prog: Optional[str] = "mindgrpo data") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    tok = parser.add_argument_group("tokenizer (either --tokenizer_dir, or --vocab_path with --merges_file_path)")
    tok.add_argument("--tokenizer_dir", help="model folder with tokenizer.json (or vocab.json + merges.txt)")
    tok.add_argument("--vocab_path", help="Qwen2 vocab.json (MindRLHF flag)")
    tok.add_argument("--merges_file_path", help="Qwen2 merges.txt (MindRLHF flag)")
    parser.add_argument("--file_path", required=True, help="source dataset file")
    parser.add_argument("--output_path", required=True, help="MindRecord to write (its index goes to <path>.db)")
    parser.add_argument("--dataset_type", "--dataset-type", required=True, choices=sorted(READERS),
                        help="source file format (a file of another form is refused, naming the type it needs)")
    parser.add_argument("--prompt_template", default="r1_zero", choices=sorted(PROMPT_TEMPLATES),
                        help="; ".join(f"{t.name}: {t.description}" for t in PROMPT_TEMPLATES.values()))
    parser.add_argument("--max_prompt_length", type=int, default=512,
                        help="prompts are right-padded to this many tokens; longer ones are skipped")
    parser.add_argument("--seq_length", type=int, default=None,
                        help="training sequence length (prompt + completion); must exceed --max_prompt_length")
    parser.add_argument("--pad_token_id", type=int, default=None, help="default: the tokenizer's pad token")
    parser.add_argument("--tools", nargs="+", default=[], metavar="TOOL",
                        help="offer these tools in every prompt (Qwen2.5's system turn), as rl_config.tools lists "
                             "them: calculator, python, or package.module:function")
    parser.add_argument("--strict", action="store_true", help="stop at the first bad row and write nothing")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output")
    parser.add_argument("--no_progress", action="store_true", help="no progress bar")
    return parser


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = "mindgrpo data") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if args.tokenizer_dir and args.vocab_path:
        parser.error("pass either --tokenizer_dir or --vocab_path/--merges_file_path, not both")
    if not args.tokenizer_dir and not (args.vocab_path and args.merges_file_path):
        parser.error("a tokenizer is needed: --tokenizer_dir, or both --vocab_path and --merges_file_path")
    if args.max_prompt_length < 1:
        parser.error(f"--max_prompt_length must be >= 1, got {args.max_prompt_length}")
    if args.seq_length is not None and args.max_prompt_length >= args.seq_length:
        parser.error(f"--max_prompt_length ({args.max_prompt_length}) must be smaller than --seq_length "
                     f"({args.seq_length}) to leave room for the completion")

    def report(err: RowError) -> None:
        print(err, file=sys.stderr)

    try:
        tokenizer = (load_tokenizer(args.tokenizer_dir) if args.tokenizer_dir
                     else load_tokenizer(args.vocab_path, args.merges_file_path))
        image_config = None
        if args.dataset_type in IMAGE_DATASETS:  # the image processor ships beside the tokenizer
            from mindgrpo.data.images import ImageProcessorConfig
            image_config = ImageProcessorConfig.from_pretrained(args.tokenizer_dir or Path(args.vocab_path).parent)
        summary = convert_dataset(
            args.file_path, args.output_path, tokenizer, dataset_type=args.dataset_type,
            prompt_template=args.prompt_template, max_prompt_length=args.max_prompt_length,
            pad_token_id=args.pad_token_id, strict=args.strict, overwrite=args.overwrite,
            progress=not args.no_progress, on_error=report, image_config=image_config,
            tools=offered_signatures(args.tools))
    except (DataError, TokenizerError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(summary.format())
    return 0
