#!/usr/bin/env python
"""A real Qwen2.5 learning GSM8K, mindgrpo beside TRL + PEFT on the same job: one table, one command.

Both frameworks train the same fetched folder (`mindgrpo fetch qwen2.5-coder-0.5b-instruct`) with the recipe
`examples/grpo/qwen2_5_coder_0_5b_lora_gsm8k.yaml` for `--steps` steps per seed: the same prompts in the same
order (the first steps x 4 prompts mindgrpo's run reads for that seed, handed to TRL with its shuffling off), the
same template (gsm8k_hash), reward (mindgrpo's accuracy_reward, imported by the peer), LoRA settings (every linear, no
dropout), batch, lengths, temperature and constant learning rate (all read from the recipe's yaml and passed to
the peer), beta 0, dapo loss, and the activations recomputed in the backward (mindgrpo's `recompute`,
TRL's gradient checkpointing). Each run is its own process, alone on the machine, timed from its start to its
exit: building and compiling count. mindgrpo runs the user's path, `examples/grpo/main.py`, as a user would type it;
TRL runs `tools/trl_lora_peer.py` in TRL's interpreter (`--vs-trl`, made by `tools/make_trl_venv.sh`).

Then each run's adapters are evaluated by the same evaluator, `mindgrpo eval` (greedy pass@1 on the first
`--eval-limit` problems of GSM8K's test split, the same template and 256 new tokens), beside the base model's
score. The table gives, per framework and seed: median seconds per step (the first step excluded: compilation and
warm-up), wall time to the last step, peak RSS (the process's own, from wait4), held-out accuracy after the steps;
then each framework's mean and the seed-to-seed spread, and the targets: mindgrpo's accuracy no lower than TRL's by
more than the spread, its wall time at most 0.67x TRL's, its peak RSS at most TRL's.

    python tools/bench_real_qwen.py --vs-trl trlenv/bin/python --dataset-file data/gsm8k_train.mindrecord \\
        --gsm8k gsm8k/ --steps 8 --seeds 0 1 --out runs/side_by_side
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Dict, List

from benchlib import cpu_model
from user_path import run_measured, run_user_path

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "examples" / "grpo" / "qwen2_5_coder_0_5b_lora_gsm8k.yaml"
PROMPTS_PER_STEP = 4
WALL_TARGET = 0.67


def ordered_prompts(dataset_file: Path, seed: int, count: int) -> List[Dict[str, str]]:
    """The first ``count`` prompts a mindgrpo run of this seed reads, in order, as rendered text and gold."""
    from mindgrpo.data import render_prompt
    from mindgrpo.data.dataset import PromptDataset

    rows: List[Dict[str, str]] = []
    for batch in PromptDataset(dataset_file).batches(PROMPTS_PER_STEP, seed=seed):
        rows += [{"prompt": render_prompt("gsm8k_hash", q), "gold": g} for q, g in zip(batch.questions, batch.golds)]
        if len(rows) >= count:
            return rows[:count]
    raise ValueError(f"{dataset_file} holds fewer than {count} prompts")


def mindgrpo_run(args, seed: int, out: Path) -> Dict:
    run_dir = out / f"mindgrpo-seed{seed}"
    overrides = ["--actor_checkpoint_path", str(args.model), "--dataset_file", str(args.dataset_file),
                 f"rl_config.seed={seed}", f"rl_config.max_steps={args.steps}",
                 f"rl_config.save_ckpt_interval={args.steps}"]
    result = run_user_path(RECIPE, overrides, run_dir, out / f"mindgrpo-seed{seed}.log",
                           completions=PROMPTS_PER_STEP * 8, warmup=0)
    steps = [m["timing/all"] for m in result["metrics"]]
    return {"wall_s": result["wall_s"], "peak_rss_gib": round(result["peak_rss_mib"] / 1024, 2),
            "framework": "mindgrpo", "seed": seed, "model": str(run_dir),
            "median_step_s": round(statistics.median(steps[1:] or steps), 1), "rewards": result["rewards"]}


def recipe_settings() -> List[str]:
    """The recipe's values as the peer's flags, read from the yaml: the two runs cannot drift apart when the recipe
    changes."""
    from mindgrpo.config import load_config

    config = load_config(str(RECIPE))
    rl, actor, sampling = config.rl_config, config.actor_config, config.generate_config.sampling_config
    if rl.batch_size != PROMPTS_PER_STEP:
        raise ValueError(f"{RECIPE}: rl_config.batch_size is {rl.batch_size}; the bench pairs prompts by "
                         f"PROMPTS_PER_STEP = {PROMPTS_PER_STEP}: set both alike")
    return ["--prompts-per-step", str(rl.batch_size), "--num-generations", str(rl.num_generations),
            "--max-completion-length", str(sampling.max_tokens), "--temperature", str(sampling.temperature),
            "--learning-rate", str(actor.lr_schedule.learning_rate), "--lora-rank", str(actor.lora_rank),
            "--lora-alpha", str(actor.lora_alpha)]


def trl_run(args, seed: int, out: Path) -> Dict:
    prompts = out / f"prompts-seed{seed}.jsonl"
    rows = ordered_prompts(args.dataset_file, seed, args.steps * PROMPTS_PER_STEP)
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    adapter = out / f"trl-seed{seed}" / "adapter"
    cmd = [args.vs_trl, str(REPO / "tools" / "trl_lora_peer.py"), "--model", str(args.model), "--prompts",
           str(prompts), "--save", str(adapter), "--steps", str(args.steps), "--seed", str(seed), *recipe_settings()]
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    log = out / f"trl-seed{seed}.log"
    measured = run_measured(cmd, log, env)
    measured["peak_rss_gib"] = round(measured.pop("peak_rss_mib") / 1024, 2)
    result = json.loads([line for line in log.read_text().splitlines() if line.startswith("{")][-1])
    return {**measured, "framework": "trl", "seed": seed, "model": str(adapter),
            "median_step_s": result["median_step_s"], "rewards": [round(r, 4) for r in result["rewards"]],
            "versions": result["versions"]}


def evaluate(args, model: str, out: Path, name: str) -> float:
    """``mindgrpo eval``'s greedy pass@1 of ``model`` (a folder, a run or an adapter on ``--model``)."""
    result = out / f"eval-{name}.jsonl"
    cmd = [sys.executable, "-m", "mindgrpo", "eval", model, str(Path(args.gsm8k) / "test.jsonl"), "--template",
           "gsm8k_hash", "--limit", str(args.eval_limit), "--max-new-tokens", "256", "--batch-size",
           str(args.eval_batch), "--output", str(result), "--no-progress"]
    if (Path(model) / "adapter_config.json").is_file():
        cmd += ["--base", str(args.model)]
    run_measured(cmd, out / f"eval-{name}.log")
    return json.loads(result.with_name(f"{result.stem}.summary.json").read_text())["pass@1"]


def table(runs: List[Dict], base: float) -> List[str]:
    lines = ["| framework | seed | s/step | wall s | peak RSS GiB | held-out pass@1 | reward by step |",
             "|---|---|---|---|---|---|---|",
             f"| base model | | | | | {base:.3f} | |"]
    for r in runs:
        lines.append(f"| {r['framework']} | {r['seed']} | {r['median_step_s']} | {r['wall_s']} | {r['peak_rss_gib']} | "
                     f"{r['accuracy']:.3f} | {' '.join(f'{x:.2f}' for x in r['rewards'])} |")
    by = {f: [r for r in runs if r["framework"] == f] for f in ("mindgrpo", "trl")}
    mean = {f: {k: statistics.mean(r[k] for r in rs) for k in ("accuracy", "wall_s", "peak_rss_gib")}
            for f, rs in by.items() if rs}
    spread = max((max(r["accuracy"] for r in rs) - min(r["accuracy"] for r in rs) for rs in by.values() if rs),
                 default=0.0)
    lines.append("")
    for f, m in mean.items():
        lines.append(f"{f}: mean held-out {m['accuracy']:.3f}, mean wall {m['wall_s']:.0f} s, mean peak RSS "
                     f"{m['peak_rss_gib']:.2f} GiB")
    if len(mean) == 2:
        ours, peer = mean["mindgrpo"], mean["trl"]
        lines += [f"seed-to-seed spread of held-out accuracy (largest of the two frameworks): {spread:.3f}",
                  f"accuracy: mindgrpo - TRL = {ours['accuracy'] - peer['accuracy']:+.3f} (target: > -{spread:.3f}): "
                  f"{'met' if ours['accuracy'] - peer['accuracy'] >= -spread else 'NOT met'}",
                  f"wall time: {ours['wall_s'] / peer['wall_s']:.2f}x TRL's (target <= {WALL_TARGET}): "
                  f"{'met' if ours['wall_s'] / peer['wall_s'] <= WALL_TARGET else 'NOT met'}",
                  f"peak RSS: {ours['peak_rss_gib'] / peer['peak_rss_gib']:.2f}x TRL's (target <= 1): "
                  f"{'met' if ours['peak_rss_gib'] <= peer['peak_rss_gib'] else 'NOT met'}"]
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="the fetched folder (default: mindgrpo fetch's cache)")
    parser.add_argument("--dataset-file", type=Path, required=True,
                        help="the recipe's MindRecord (mindgrpo data ... --prompt_template gsm8k_hash)")
    parser.add_argument("--gsm8k", required=True, help="folder with GSM8K's test.jsonl")
    parser.add_argument("--vs-trl", help="TRL's interpreter (tools/make_trl_venv.sh); without it mindgrpo only")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--eval-limit", type=int, default=200)
    parser.add_argument("--eval-batch", type=int, default=64,
                        help="sequences decoded together; 64 holds 6.6 GB on the 0.5B model, 200 passed 18 GB")
    parser.add_argument("--out", type=Path, required=True, help="folder for the runs, logs and the table")
    args = parser.parse_args(argv)
    if args.model is None:
        from mindgrpo.apps.fetch import default_folder

        args.model = default_folder("qwen2.5-coder-0.5b-instruct")
    args.out.mkdir(parents=True, exist_ok=True)
    runs = []
    for seed in args.seeds:
        runs.append(mindgrpo_run(args, seed, args.out))
        if args.vs_trl:
            runs.append(trl_run(args, seed, args.out))
    base = evaluate(args, str(args.model), args.out, "base")
    for r in runs:
        r["accuracy"] = evaluate(args, r["model"], args.out, f"{r['framework']}-seed{r['seed']}")
    lines = [f"CPU: {cpu_model()}; {args.steps} steps; held-out: first {args.eval_limit} GSM8K test problems, "
             "greedy, 256 new tokens", ""] + table(runs, base)
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    (args.out / "runs.json").write_text(json.dumps({"base": base, "runs": runs}, indent=2) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
