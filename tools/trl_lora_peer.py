#!/usr/bin/env python
"""The peer of the real-model recipe: TRL 1.16's `GRPOTrainer` with a PEFT `LoraConfig`, at the settings of
`examples/grpo/qwen2_5_coder_0_5b_lora_gsm8k.yaml`, on the prompts mindgrpo's run reads, in its order.

It runs in TRL's own interpreter (`bash tools/make_trl_venv.sh trlenv`; TRL 1.16 needs transformers 5, mindgrpo's
environment pins 4.57.1); `tools/bench_real_qwen.py` starts it. It imports no MindSpore: the reward is mindgrpo's
own `accuracy_reward` (pure Python), the recipe's one reward, so both frameworks score completions with the same
function. The prompts
come as a jsonl of `{"prompt": rendered text, "gold": answer}` rows, the first `steps x prompts_per_step` prompts
of mindgrpo's run for the same seed, and TRL reads them in that order (`shuffle_dataset=False`): every step of both
runs sees the same prompts.

One optimizer step = `--prompts-per-step` prompts x `--num-generations` completions in one batch (no gradient
accumulation, no vLLM, float32, gradient checkpointing as mindgrpo's `recompute`), temperature `--temperature`,
beta 0, `loss_type dapo`, group-scaled rewards, constant learning rate, rank `--lora-rank` adapters (alpha
`--lora-alpha`, no dropout) on every linear of the decoder. The adapters are saved with `save_model` (a PEFT folder
`mindgrpo eval --base MODEL` reads). The last line printed is one JSON object: per-step seconds, the phases' shares,
rewards, peak RSS of this process, versions and the CPU.
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

from benchlib import cpu_model  # numpy-only modules beside this script: no MindSpore
from trl_peer import PhaseTimer, step_edges

TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def accuracy(completions, gold, **_):
    """mindgrpo's accuracy_reward, per completion (TRL passes the dataset's extra columns by name)."""
    from mindgrpo.rewards.verifiers import accuracy_reward

    return [accuracy_reward(text, answer) for text, answer in zip(completions, gold)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="Hugging Face folder with its tokenizer")
    parser.add_argument("--prompts", required=True, help='jsonl of {"prompt": rendered text, "gold": answer}, in order')
    parser.add_argument("--save", required=True, help="folder for the trained adapters (PEFT)")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prompts-per-step", type=int, default=4)
    parser.add_argument("--num-generations", type=int, default=8)
    parser.add_argument("--max-completion-length", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--lora-alpha", type=float, default=32)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    import peft
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    rows = [json.loads(line) for line in Path(args.prompts).read_text(encoding="utf-8").splitlines() if line]
    needed = args.steps * args.prompts_per_step
    if len(rows) < needed or not {"prompt", "gold"} <= set(rows[0]):
        print(f"error: {args.prompts}: expected at least {needed} jsonl rows with 'prompt' and 'gold'", file=sys.stderr)
        return 2
    dataset = Dataset.from_dict({"prompt": [r["prompt"] for r in rows], "gold": [r["gold"] for r in rows]})
    config = GRPOConfig(
        output_dir=str(Path(args.save).parent / "trl_run"), max_steps=args.steps, seed=args.seed,
        per_device_train_batch_size=args.prompts_per_step * args.num_generations, gradient_accumulation_steps=1,
        num_generations=args.num_generations, max_completion_length=args.max_completion_length,
        temperature=args.temperature, top_p=1.0, top_k=0, beta=0.0, loss_type="dapo", scale_rewards="group",
        num_iterations=1, learning_rate=args.learning_rate,
        lr_scheduler_type="constant", weight_decay=0.0,
        max_grad_norm=1.0, shuffle_dataset=False, use_vllm=False, bf16=False, fp16=False, use_cpu=True,
        gradient_checkpointing=True, logging_steps=1, report_to=[], disable_tqdm=True, save_strategy="no")
    lora = peft.LoraConfig(r=args.lora_rank, lora_alpha=args.lora_alpha, lora_dropout=0.0,
                           target_modules=TARGET_MODULES, task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=args.model, reward_funcs=accuracy, args=config,
                          train_dataset=dataset, peft_config=lora)
    timer = PhaseTimer()
    trainer.add_callback(step_edges(timer, TrainerCallback))
    timer.wrap(trainer)
    trainer.train()
    trainer.save_model(args.save)
    rewards = [entry["reward"] for entry in trainer.state.log_history if "reward" in entry]
    steps = [s["seconds"] for s in timer.steps]
    print(json.dumps({
        "framework": "trl", "steps": len(steps), "seconds_per_step": steps,
        "median_step_s": round(statistics.median(steps[1:] or steps), 2),
        "wall_s": round(time.perf_counter() - started, 1),
        "share_rollout": round(sum(s["generate_s"] for s in timer.steps) / sum(steps), 4),
        "rewards": rewards, "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "cpu": cpu_model(), "torch_threads": torch.get_num_threads(),
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "peft": peft.__version__,
                     "torch": torch.__version__},
    }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
