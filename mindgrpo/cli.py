"""``mindgrpo COMMAND [ARGS]`` (also ``python -m mindgrpo COMMAND``): every command line of mindgrpo in one table.

Commands:
  train         train a Qwen2.5 policy with GRPO: a yaml config, MindRLHF's flags, group.key=value overrides
                (no --config: the embedded demo); examples/grpo/main.py takes the same arguments
  data          convert a prompt dataset (GSM8K or MATH-style jsonl, DeepScaleR json, DAPO-Math-17k or geo3k
                parquet) into a MindRecord (as tools/rlhf_data.py, with MindRLHF's flags)
  eval          accuracy of a model, run or LoRA adapter folder on GSM8K or MATH-style problems (MATH500, AIME):
                greedy pass@1 and sampled maj@k / pass@k (as tools/eval_gsm8k.py)
  chat          talk to a model or run folder: its chat template, streamed answers, history; --prompt for one
                answer; --image for Qwen2.5-VL
  merge         a LoRA run's adapter folder merged into its base as a plain Hugging Face folder
  fetch         a real Qwen2.5 (qwen2.5-coder-0.5b-instruct, or any GGUF Qwen2 file) as a float32 Hugging Face
                folder: downloaded, checked, dequantized and cached
  plot          training curves of one or more runs as PNGs (as tools/plot_metrics.py)
  samples       a run's completions that match filters (step, reward, verifier, length, --grep), printed or as
                one HTML page: finding the "aha moment"
  doctor        check Python, MindSpore/MindFormers, the device, the fused op, msrun, the master port, folders,
                and with --config every path and the parallel layout
  plan          per-rank memory of each data x model parallel layout for a config, and the one that fits
  config-help   every config key with its type, default and documentation

`mindgrpo COMMAND --help` describes a command's options.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import Optional, Sequence

# Command -> "module:function" that runs it with the remaining arguments, imported only when chosen: `mindgrpo
# --help` stays instant, and a command loads only what it uses.
COMMANDS = {
    "train": "mindgrpo.apps.train_cli:main",
    "data": "mindgrpo.apps.data_cli:main",
    "eval": "mindgrpo.apps.eval_cli:main",
    "chat": "mindgrpo.apps.chat_cli:main",
    "merge": "mindgrpo.apps.merge_cli:main",
    "fetch": "mindgrpo.apps.fetch:main",
    "plot": "mindgrpo.apps.plot_cli:main",
    "samples": "mindgrpo.apps.samples_cli:main",
    "doctor": "mindgrpo.apps.doctor:main",
    "plan": "mindgrpo.apps.plan:main",
    "config-help": "mindgrpo.cli:config_help",
}


def config_help(argv: Optional[Sequence[str]] = None) -> int:
    """``mindgrpo config-help``: print every config key with its type, default and documentation."""
    parser = argparse.ArgumentParser(prog="mindgrpo config-help", description=config_help.__doc__)
    _, extra = parser.parse_known_args(argv)  # only --help is known
    if extra:
        print(f"error: config-help takes no arguments, got {' '.join(extra)}", file=sys.stderr)
        return 2
    from mindgrpo.config import describe

    print("\n".join(describe()))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"error: unknown command {command!r}; choose one of {', '.join(COMMANDS)} "
              "(python -m mindgrpo --help)", file=sys.stderr)
        return 2
    module, function = COMMANDS[command].split(":")
    return getattr(importlib.import_module(module), function)(rest)
