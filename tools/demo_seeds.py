#!/usr/bin/env python
"""The embedded demo over several seeds: the figures docs/demo.md quotes for it, from one command.

    python tools/demo_seeds.py [--seeds 0 1 2 3 4] [--configs grpo nolearn length dapo] [--out output/demo_seeds]

Each (config, seed) is one `examples/grpo/main.py` run of 100 steps (`rl_config.seed=N`: data order and sampling;
the warm-started demo model is the same), one after the other:

    grpo      the demo as shipped (`python examples/grpo/main.py`)
    nolearn   the same with the learning rate at 0: what the accuracy does when nothing is learned
    length    the same trained on another reward, the completion's length (`length_reward` below): the weights
              move as much, with no signal about the answers
    dapo      examples/grpo/dapo_demo.yaml on the demo's model and data
    lora      examples/grpo/lora_demo.yaml: LoRA adapters on the frozen demo model
    tools     the tool demo (`--demo tools`, examples/grpo/tool_demo.yaml, 40 steps): 3-digit by 2-digit products
              with the calculator tool
    notools   the same model, budget and problems without the tool (`rl_config.tools=[]`)

The sampled accuracy is `grpo/rewards/accuracy_reward`, that of a step's (first round of) completions. It prints,
per config, the mean over the seeds of every 10 steps and of the whole run (docs/recipes.md's DAPO table), each seed's
rise (the mean of the last 20 steps minus that of the first 20) and its wall time; and the held-out accuracy: greedy
pass@1 of the run's final checkpoint on the demo's 200 test problems (`mindgrpo eval`, 16 new tokens; the tool demo's
own 200, 64 tokens, with the run's tools), against the warm-started model's (the figure tests/test_demo_learns.py
checks). It writes the same as `summary.md` under `--out`.
One run takes one to a few minutes on 2 cores.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import numpy as np

REPO = Path(__file__).resolve().parents[1]
MAIN = REPO / "examples" / "grpo" / "main.py"
METRIC = "grpo/rewards/accuracy_reward"
CONFIGS = ("grpo", "nolearn", "length", "dapo", "lora", "tools", "notools")
YAML = {"dapo": "dapo_demo.yaml", "lora": "lora_demo.yaml"}
TOOL_CONFIGS = {"tools": ["calculator"], "notools": []}  # the tool demo, with and without its tool
STEPS = {"tools": 40, "notools": 40}  # the others: 100


def length_reward(completion: str, gold: str, **_context) -> float:
    """The `length` control's reward: the completion's length, whatever its answer (imported by name,
    `demo_seeds:length_reward`, with tools/ on PYTHONPATH)."""
    return len(completion) / 64.0


def command(config: str, seed: int, run_dir: Path, demo_flags: Dict[str, str]) -> List[str]:
    args = [sys.executable, str(MAIN)]
    if config in TOOL_CONFIGS:  # the tool demo makes its own model and data
        args += ["--demo", "tools"] + (["rl_config.tools=[]"] if not TOOL_CONFIGS[config] else [])
    elif config in YAML:
        args += ["--config", str(REPO / "examples" / "grpo" / YAML[config]),
                 *(item for flag, value in demo_flags.items() for item in (f"--{flag}", value))]
    args += [f"rl_config.seed={seed}", f"rl_config.output_dir={run_dir.resolve()}"]
    if config == "length":
        # the demo's verifiers stay, weighted 0, so the sampled accuracy is still logged
        args += ["reward_config.verifier_function=[accuracy_reward,hash_format_reward,demo_seeds:length_reward]",
                 "reward_config.verifier_weight=[0.0,0.0,1.0]"]
    return args + (["actor_config.lr_schedule.learning_rate=0"] if config == "nolearn" else [])


def held_out_accuracy(model: Path, test_jsonl: Path) -> float:
    """Greedy pass@1 on the demo's test problems, as tests/test_demo_learns.py measures it."""
    from mindgrpo.apps import demo
    from mindgrpo.apps.evaluation import evaluate

    return evaluate(model, test_jsonl, template="gsm8k_hash", max_new_tokens=demo.MAX_NEW_TOKENS, batch_size=64,
                    progress=False).accuracy


def tool_held_out_accuracy(model: Path, tools: List[str]) -> float:
    """Greedy pass@1 on the tool demo's test problems, offering and answering `tools` as its training did."""
    from mindgrpo.apps import demo_tools
    from mindgrpo.apps.evaluation import evaluate

    built = demo_tools.make_tool_demo(demo_tools.default_tool_demo_dir())
    return evaluate(model, built.test_jsonl, template=demo_tools.PROMPT_TEMPLATE, max_new_tokens=64, batch_size=64,
                    tools=tools, max_tool_turns=1, progress=False).accuracy


def run(config: str, seed: int, out: Path, demo_flags: Dict[str, str]) -> Dict:
    """One run; its per-step accuracy and wall time. A run folder that already holds 100 steps is read again."""
    from mindgrpo.train.metrics import read_metrics

    run_dir = out / f"{config}-seed{seed}"
    metrics = run_dir / "metrics.jsonl"
    start = time.perf_counter()
    if not (metrics.exists() and len(read_metrics(metrics)) >= STEPS.get(config, 100)):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), str(REPO / "tools"),
                                                                         os.environ.get("PYTHONPATH")]))}
        done = subprocess.run(command(config, seed, run_dir, demo_flags), cwd=out, capture_output=True, text=True,
                              env=env)  # this checkout's mindgrpo, whichever one pip has installed
        if done.returncode != 0:
            raise RuntimeError(f"{config} seed {seed} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    rows = read_metrics(metrics)
    return {"accuracy": [r[METRIC] for r in rows], "seconds": time.perf_counter() - start, "run_dir": run_dir}


def summary(results: Dict[str, Dict[int, Dict]], held_out: Dict = None) -> str:
    """The tables; `held_out` maps "warm start" and each (config, seed) to its held-out greedy accuracy."""
    lines = []
    steps = min(len(r["accuracy"]) for runs in results.values() for r in runs.values())
    blocks = [(i, min(i + 10, steps)) for i in range(0, steps, 10)]
    lines.append("| config | " + " | ".join(f"{a + 1}-{b}" for a, b in blocks) + " | all |")
    lines.append("|---" * (len(blocks) + 2) + "|")
    for config, runs in results.items():
        acc = np.array([r["accuracy"][:steps] for r in runs.values()])  # [seeds, steps]
        lines.append(f"| {config} | " + " | ".join(f"{acc[:, a:b].mean():.3f}" for a, b in blocks)
                     + f" | {acc.mean():.3f} |")
    lines.append("")
    for config, runs in results.items():
        rises = {seed: np.mean(r["accuracy"][-20:]) - np.mean(r["accuracy"][:20]) for seed, r in runs.items()}
        each = ", ".join(f"seed {s}: {np.mean(runs[s]['accuracy'][:20]):.3f} -> "
                         f"{np.mean(runs[s]['accuracy'][-20:]):.3f} ({rise:+.3f})" for s, rise in rises.items())
        minutes = ", ".join(f"{r['seconds'] / 60:.1f}" for r in runs.values())
        lines.append(f"{config}: first 20 -> last 20 steps, {each}; mean rise {np.mean(list(rises.values())):+.3f} "
                     f"(min {min(rises.values()):+.3f}, max {max(rises.values()):+.3f}); minutes per run {minutes}")
    if held_out:
        lines.append("")
        if "warm start" in held_out:
            lines.append(f"held-out greedy accuracy (200 test problems), warm start {held_out['warm start']:.3f}:")
        for config, runs in results.items():
            own = ("warm start", config) in held_out  # the tool demo's model, measured with the config's tools
            start = held_out[("warm start", config) if own else "warm start"]
            gains = {seed: held_out[config, seed] - start for seed in runs}
            each = ", ".join(f"seed {s}: {held_out[config, s]:.3f} ({g:+.3f})" for s, g in gains.items())
            lines.append(f"{config}: {each}; mean {np.mean(list(gains.values())):+.3f} "
                         f"(min {min(gains.values()):+.3f}, max {max(gains.values()):+.3f})"
                         + (f"; its warm start {start:.3f}" if own else ""))
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS))
    parser.add_argument("--out", type=Path, default=Path("output") / "demo_seeds",
                        help="run folders and summary.md (a finished run found there is read, not run again)")
    parser.add_argument("--no-eval", action="store_true", help="skip the held-out greedy evaluation")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))  # this checkout's mindgrpo
    import mindgrpo  # noqa: F401  (quiet logging)
    from mindgrpo.apps.demo import default_demo_dir, make_demo
    from mindgrpo.apps.train_cli import demo_flags

    args.out.mkdir(parents=True, exist_ok=True)
    flags = demo_flags("text", args.out / "demo")  # the demo model (cached) and its converted data
    results: Dict[str, Dict[int, Dict]] = {}
    for config in args.configs:
        for seed in args.seeds:
            results.setdefault(config, {})[seed] = run(config, seed, args.out, flags)
            print(f"{config} seed {seed}: {results[config][seed]['seconds'] / 60:.1f} min", flush=True)
    held_out = None
    if not args.no_eval:
        from mindgrpo.apps import demo_tools

        held_out = {}
        for config, runs in results.items():
            if config in TOOL_CONFIGS:
                tools = TOOL_CONFIGS[config]
                model = demo_tools.make_tool_demo(demo_tools.default_tool_demo_dir()).model_dir
                held_out["warm start", config] = tool_held_out_accuracy(model, tools)
                for seed, result in runs.items():
                    held_out[config, seed] = tool_held_out_accuracy(result["run_dir"], tools)
                continue
            assets = make_demo(default_demo_dir())
            held_out.setdefault("warm start", held_out_accuracy(assets.model_dir, assets.test_jsonl))
            for seed, result in runs.items():
                held_out[config, seed] = held_out_accuracy(result["run_dir"], assets.test_jsonl)
    text = summary(results, held_out)
    tmp = args.out / f".summary.md.{os.getpid()}"
    tmp.write_text(text)
    os.replace(tmp, args.out / "summary.md")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
