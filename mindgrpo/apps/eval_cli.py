"""Accuracy of a model folder on GSM8K or MATH-style problems: greedy pass@1 and sampled maj@k / pass@k, with
training's prompts and answer comparison.

MODEL is a Hugging Face folder (config.json + safetensors + tokenizer), a mindgrpo run folder
(rl_config.output_dir: its newest verified checkpoint is used), its checkpoints/ folder, or one step_N folder.
DATA is a GSM8K-format jsonl ({"question", "answer"} per line, the answer ending in "#### <number>") or MATH500/AIME-
style problems ({"problem", "answer"}, jsonl or parquet; answers compared with math-verify, as training's
accuracy_reward compares them): the file's form chooses, or --dataset-type, which refuses a file of the other form.

    mindgrpo eval MODEL DATA [--limit 100] [--samples 8 --temperature 0.7] [--output eval.jsonl]
    mindgrpo eval MODEL math500/test.jsonl --template r1_zero --max-new-tokens 2048
    python tools/eval_gsm8k.py MODEL DATA ...                    # the same, with this checkout's mindgrpo

Writes one JSON line per problem (question, completion(s), extracted answer, gold, correct, maj@k fields) to
--output and the summary next to it (eval.summary.json), both atomically; prints the summary, its last line as JSON.
See mindgrpo.apps.evaluation for the details.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional, Sequence

import mindgrpo  # noqa: F401  (configures MindSpore/MindFormers logging before they load)
from mindgrpo.choices import TOOL_SANDBOXES
from mindgrpo.apps.evaluation import evaluate, format_summary, summary_path
from mindgrpo.apps.model_source import add_model_arguments
from mindgrpo.data import PROMPT_TEMPLATES, READERS
from mindgrpo.data.readers import IMAGE_DATASETS


def parse_args(argv: Optional[Sequence[str]] = None, prog: Optional[str] = "mindgrpo eval") -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    parser.add_argument("data", help="the problems: GSM8K-format jsonl (gsm8k/test.jsonl), MATH-style jsonl or parquet")
    parser.add_argument("--output", help="per-problem results (jsonl); default: eval_<DATA name>.jsonl here")
    parser.add_argument("--template", choices=sorted(PROMPT_TEMPLATES),
                        help="prompt template; default: the run's training template, else gsm8k_hash")
    parser.add_argument("--dataset-type", "--dataset_type", choices=sorted(set(READERS) - IMAGE_DATASETS),
                        help="the data's format: gsm8k, math (MATH500/AIME: problem + answer, jsonl or parquet), "
                             "math17k, deepscaler; default: the one the file's form asks for")
    parser.add_argument("--limit", type=int, help="evaluate only the first N problems")
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32,
                        help="sequences decoded (and prefilled) together: memory grows with it; 64 holds 9 GB on a "
                             "0.5B model")
    parser.add_argument("--samples", type=int, default=0, metavar="K",
                        help="also sample K completions per problem for maj@K and pass@K (default 0: greedy only)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature for --samples")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling for --samples")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tools", nargs="*", metavar="TOOL",
                        help="tools the prompts offer and the rollouts answer (calculator, python, "
                             "package.module:function); default: the run's rl_config.tools; --tools alone: none")
    parser.add_argument("--max-tool-turns", type=int, default=4, help="tool-calling turns per completion")
    parser.add_argument("--tool-sandbox", default="bwrap", choices=TOOL_SANDBOXES,
                        help="where the python tool runs the model's code, as rl_config.tool_sandbox (docs/sandbox.md)")
    parser.add_argument("--tool-sandbox-url", default="",
                        help="the SandboxFusion /run_code URL for --tool-sandbox remote")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar or progress lines")
    return parser.parse_intermixed_args(argv)  # MODEL and DATA may stand before, between or after the options


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = "mindgrpo eval") -> int:
    args = parse_args(argv, prog)
    output = Path(args.output or f"eval_{Path(args.data).stem}.jsonl")
    try:
        result = evaluate(args.model, args.data, output=output, tokenizer=args.tokenizer, template=args.template,
                          limit=args.limit, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                          samples=args.samples, temperature=args.temperature, top_p=args.top_p, seed=args.seed,
                          compute_dtype=args.dtype, progress=not args.no_progress, base=args.base,
                          tools=args.tools, max_tool_turns=args.max_tool_turns, tool_sandbox=args.tool_sandbox,
                          tool_sandbox_url=args.tool_sandbox_url, dataset_type=args.dataset_type)
    except ValueError as err:  # EvaluationError, DataError, TokenizerError, bad sampling settings: all name the fix
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(format_summary(result.summary))
    print(f"results: {output}; summary: {summary_path(output)}")
    print(json.dumps(result.summary))
    return 0
