#!/usr/bin/env python
"""The peer: TRL's `GRPOTrainer` at the settings of tools/bench_grpo.py, timed as mindgrpo's trainer is timed.

It runs in TRL's own interpreter (TRL 1.16 needs transformers 5, mindgrpo's environment pins 4.57.1): make one with
`bash tools/make_trl_venv.sh trlenv`, then tools/bench_grpo.py and tools/bench_scaling.py start this script with
`--vs-trl trlenv/bin/python`. It imports neither mindgrpo nor MindSpore. The driver hands it the same model folder
mindgrpo loads and the prompts already rendered with mindgrpo's `gsm8k_hash` template, so both frameworks see the
same tokens.

One optimizer step = `--prompts-per-step` prompts x `--num-generations` completions, one batch (no gradient
accumulation, no vLLM, fp32, no gradient checkpointing: TRL turns it on by default, mindgrpo keeps activations),
temperature 1 with no top-k/top-p, beta 0.04, learning rate 1e-5 with TRL's linear decay, `loss_type dapo` (TRL's
default). Reward: 1 when the last `#### N` of the completion equals the gold number. The last line printed is one
JSON object:

    sec_per_step     median wall time of the counted steps (the first `--warmup` are excluded)
    tokens_per_sec   median over counted steps of (real prompt + completion tokens of the batch) / step time
    share_rollout    TRL's generate call, share of the counted steps' time (also `gen_fraction`, its old name)
    share_reference  the rest of building the batch: rewards and the reference model's log-probs
    share_update     the rest of the step: the policy forward, backward and optimizer
    peak_rss_mib     peak resident memory of this process
    lengths          completion lengths sampled in the counted steps (median, p90, at_limit, mean, count)
    eos_ids          the ids that end a completion in TRL
    cpu, torch_threads, versions
"""
from __future__ import annotations

import argparse
import json
import re
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchlib import cpu_model  # numpy-only modules beside this script: no mindgrpo, no MindSpore
from length_mix import length_stats

ANSWER = re.compile(r"####\s*(-?[\d,]*\.?\d+)")


def to_number(text):
    try:
        return float(text.replace(",", ""))
    except (AttributeError, ValueError):
        return None


def gsm8k_reward(completions, gold, **_):
    """1.0 when the last `#### <number>` of a completion equals the gold number, else 0.0."""
    found = [ANSWER.findall(text) for text in completions]
    return [float(bool(f) and to_number(f[-1]) is not None and to_number(f[-1]) == to_number(g))
            for f, g in zip(found, gold)]


class PhaseTimer:
    """Per optimizer step: wall time, time in TRL's generate call and in the rest of building the batch, the real
    token counts and completion lengths (TRL's trainer callbacks open and close each step; the two wrapped methods
    run inside it, once per step at these settings)."""

    def __init__(self):
        self.steps = []

    def on_step_begin(self):
        self.current = {"start": time.perf_counter(), "generate_s": 0.0, "build_s": 0.0}

    def on_step_end(self):
        self.current["seconds"] = time.perf_counter() - self.current.pop("start")
        self.steps.append(self.current)

    def wrap(self, trainer) -> None:
        generate, build = trainer._generate_single_turn, trainer._generate_and_score_completions

        def timed_generate(*args, **kwargs):
            start = time.perf_counter()
            out = generate(*args, **kwargs)
            self.current["generate_s"] += time.perf_counter() - start
            return out

        def timed_build(*args, **kwargs):
            start = time.perf_counter()
            batch = build(*args, **kwargs)
            self.current["build_s"] += time.perf_counter() - start
            self.current["tokens"] = int(batch["prompt_mask"].sum() + batch["completion_mask"].sum())
            self.current["lengths"] = batch["completion_mask"].sum(1).tolist()
            return batch

        trainer._generate_single_turn, trainer._generate_and_score_completions = timed_generate, timed_build


def step_edges(timer: PhaseTimer, callback_base):
    """A transformers TrainerCallback (`callback_base`, imported with TRL) that opens and closes the timer's steps."""
    class StepEdges(callback_base):
        def on_step_begin(self, *args, **kwargs):
            timer.on_step_begin()

        def on_step_end(self, *args, **kwargs):
            timer.on_step_end()

    return StepEdges()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="Hugging Face folder with its tokenizer")
    parser.add_argument("--prompts", required=True, help='jsonl of {"prompt": rendered text, "gold": number}')
    parser.add_argument("--prompts-per-step", type=int, default=4)
    parser.add_argument("--num-generations", type=int, default=8)
    parser.add_argument("--max-completion-length", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2, help="leading steps excluded from the statistics")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    args = parser.parse_args(argv)
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    if args.threads:
        torch.set_num_threads(args.threads)
    rows = [json.loads(line) for line in Path(args.prompts).read_text(encoding="utf-8").splitlines() if line]
    if not rows or not {"prompt", "gold"} <= set(rows[0]):
        print(f"error: {args.prompts}: expected jsonl rows with 'prompt' and 'gold'", file=sys.stderr)
        return 2
    dataset = Dataset.from_dict({"prompt": [r["prompt"] for r in rows], "gold": [r["gold"] for r in rows]})
    batch = args.prompts_per_step * args.num_generations
    with tempfile.TemporaryDirectory(prefix="trl_peer_") as run_dir:  # nothing is saved
        config = GRPOConfig(
            output_dir=run_dir, max_steps=args.steps, seed=args.seed, per_device_train_batch_size=batch,
            gradient_accumulation_steps=1, num_generations=args.num_generations,
            max_completion_length=args.max_completion_length, temperature=1.0, top_p=1.0, beta=0.04,
            learning_rate=1e-5, num_iterations=1, loss_type="dapo", use_vllm=False, bf16=False, fp16=False,
            use_cpu=True, gradient_checkpointing=False, logging_steps=1, report_to=[], disable_tqdm=True,
            save_strategy="no")
        trainer = GRPOTrainer(model=args.model, reward_funcs=gsm8k_reward, args=config, train_dataset=dataset)
        timer = PhaseTimer()
        trainer.add_callback(step_edges(timer, TrainerCallback))
        timer.wrap(trainer)
        trainer.train()
    counted = timer.steps[args.warmup:] or timer.steps
    total = sum(s["seconds"] for s in counted)
    generate = sum(s["generate_s"] for s in counted)
    build = sum(s["build_s"] for s in counted)
    print(json.dumps({
        "framework": "trl", "model": Path(args.model).name, "max_new_tokens": args.max_completion_length,
        "params": sum(p.numel() for p in trainer.model.parameters()), "torch_threads": torch.get_num_threads(),
        "loss_type": "dapo", "steps": len(timer.steps), "counted_steps": len(counted), "batch": batch,
        "sec_per_step": round(statistics.median(s["seconds"] for s in counted), 4),
        "tokens_per_sec": round(statistics.median(s["tokens"] / s["seconds"] for s in counted), 1),
        "mean_tokens_per_step": statistics.mean(s["tokens"] for s in counted),
        "share_rollout": round(generate / total, 4), "share_reference": round((build - generate) / total, 4),
        "share_update": round(1 - build / total, 4), "gen_fraction": round(generate / total, 4),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "lengths": length_stats([n for s in counted for n in s["lengths"]], args.max_completion_length),
        "eos_ids": list(trainer.eos_token_ids), "cpu": cpu_model(),
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__},
    }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
