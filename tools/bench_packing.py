#!/usr/bin/env python
"""Time the reference pass and the update with padded and with packed micro-batches (``actor_config.
max_tokens_per_micro_batch``), on rollouts made up directly (no generation), and their peak RSS.

Workload: the `small` model (tools/benchlib.py: hidden 512, 8 layers), GRAPH mode, 4 prompts (120-170 tokens,
left-padded to 192) x 8 completions, 512 new tokens, beta 0.04 (a reference model), loss ``dapo``, one pass per
rollout. Layouts: ``padded`` is tools/bench_grpo.py's (update micro-batches of 16 completions, the reference pass
in one forward of 32); ``packed16`` and ``packed8`` pack 16 or 8 rows of 512 tokens per forward (8,192 or 4,096
tokens) in both passes. Length mixes: ``ragged`` (the 32 quantiles of a log-normal with median 128, a quarter of
the limit, and its top 10 % at the limit, as ``bench_grpo.py --length-mix ragged`` asks of the rollouts) and
``full`` (every completion at the limit).

Times: one process builds a ModelWorker per layout, compiles every graph (``ModelWorker.precompile``), then
alternates the layouts ``--repeats`` times (a reference pass and an update each), so a busy machine slows them
alike; the ratios are medians of the per-repeat ratios, of wall time and of the process's CPU time (all its
threads: steadier than wall time when other processes share the cores). Peak RSS: one process per layout (RSS is
per process) that compiles, runs a reference pass and an update. Also printed: graphs compiled after the first
repeat (must be 0) and the largest difference between the layouts' reference log-probs on real tokens.

    python tools/bench_packing.py [--mix ragged full] [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from benchlib import EOS, PAD, peak_rss_mib, write_small_model

PROMPTS, GENERATIONS, NEW_TOKENS, PROMPT_WIDTH = 4, 8, 512, 192
LAYOUTS = {"padded": 0, "packed16": 16 * NEW_TOKENS, "packed8": 8 * NEW_TOKENS}  # max_tokens_per_micro_batch


def completion_lengths(mix: str, rng: np.random.Generator) -> np.ndarray:
    """ragged: the quantiles of a log-normal with median limit / 4 and P(length >= limit) = 10 % (sigma =
    ln 4 / 1.2816), so the 32 lengths have exactly that shape, shuffled over the groups."""
    n = PROMPTS * GENERATIONS
    if mix == "full":
        return np.full(n, NEW_TOKENS)
    z = np.array([statistics.NormalDist().inv_cdf((i + 0.5) / n) for i in range(n)])
    lengths = np.clip(np.round(NEW_TOKENS / 4 * np.exp(np.log(4) / 1.2816 * z)), 1, NEW_TOKENS).astype(np.int64)
    return rng.permutation(lengths)


def rollouts(mix: str) -> SimpleNamespace:
    rng = np.random.default_rng(0)
    prompt_ids = np.full((PROMPTS, PROMPT_WIDTH), PAD, np.int32)
    prompt_mask = np.zeros_like(prompt_ids)
    for i, length in enumerate((130, 150, 170, 120)):
        prompt_ids[i, -length:] = rng.integers(0, 4000, length)
        prompt_mask[i, -length:] = 1
    lengths = completion_lengths(mix, rng)
    completion_mask = (np.arange(NEW_TOKENS) < lengths[:, None]).astype(np.int32)
    completion_ids = np.where(completion_mask > 0, rng.integers(0, 4000, completion_mask.shape), PAD).astype(np.int32)
    return SimpleNamespace(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids,
                           completion_mask=completion_mask)


def compiled_policy(model_dir: str, layout: str, data: SimpleNamespace):
    """A ModelWorker at the benchmark's settings with every graph of ``data``'s shapes compiled."""
    from mindgrpo.config import GRPOConfig, validate
    from mindgrpo.parallel.groups import DistInfo
    from mindgrpo.train.model_worker import ModelWorker

    config = GRPOConfig()
    rl = config.rl_config
    rl.batch_size, rl.num_generations, rl.num_iterations = PROMPTS, GENERATIONS, 1
    rl.max_prompt_length, rl.seq_length, rl.prompt_bucket = 256, 256 + NEW_TOKENS, 64
    rl.beta, rl.loss_type = 0.04, "dapo"
    config.actor_config.load = model_dir
    config.actor_config.micro_batch_size, config.ref_config.ref_model_batch_size = 16, 32
    config.actor_config.max_tokens_per_micro_batch = LAYOUTS[layout]
    config.generate_config.sampling_config.max_tokens = NEW_TOKENS
    policy = ModelWorker(validate(config, check_paths=False), DistInfo(), eos_token_id=EOS, pad_token_id=PAD)
    policy.precompile(SimpleNamespace(prompt_ids=data.prompt_ids, prompt_mask=np.ones_like(data.prompt_mask),
                                      completion_ids=np.zeros_like(data.completion_ids),
                                      completion_mask=np.ones_like(data.completion_mask)))
    return policy


def one_pass(policy, data, advantages) -> tuple:
    """(reference log-probs, {phase: wall seconds}, {phase: CPU seconds})."""
    clocks = [(time.perf_counter(), time.process_time())]
    ref_logp = policy.reference_logprobs(data)
    clocks.append((time.perf_counter(), time.process_time()))
    policy.update(data, advantages, None, ref_logp, total_steps=100)
    clocks.append((time.perf_counter(), time.process_time()))
    wall, cpu = ({phase: clocks[i + 1][k] - clocks[i][k] for i, phase in enumerate(("reference", "update"))}
                 for k in (0, 1))
    return ref_logp, wall, cpu


def child(model_dir: str, mix: str, what: str, repeats: int) -> dict:
    import mindgrpo  # noqa: F401  (configures the environment before MindSpore is used)
    import mindspore as ms

    ms.set_context(mode=ms.GRAPH_MODE)
    data = rollouts(mix)
    advantages = np.random.default_rng(1).standard_normal(len(data.completion_ids)).astype(np.float32)
    if what != "time":  # peak RSS of one layout
        one_pass(compiled_policy(model_dir, what, data), data, advantages)
        return {"peak_rss_mib": peak_rss_mib()}
    policies = {layout: compiled_policy(model_dir, layout, data) for layout in LAYOUTS}
    times = {(clock, layout, phase): [] for clock in ("wall", "cpu") for layout in LAYOUTS
             for phase in ("reference", "update")}
    logp, graphs = {}, {}
    for repeat in range(repeats):
        for layout in (list(LAYOUTS) if repeat % 2 == 0 else list(LAYOUTS)[::-1]):
            logp[layout], wall, cpu = one_pass(policies[layout], data, advantages)
            for clock, seconds in (("wall", wall), ("cpu", cpu)):
                for phase, value in seconds.items():
                    times[clock, layout, phase].append(value)
            if repeat == 0:  # the first update also compiles the gradient-norm and AdamW graphs
                graphs[layout] = policies[layout].compiled_graphs()
    real = data.completion_mask > 0
    return {"median_seconds": {" ".join(key): round(statistics.median(t), 2) for key, t in times.items()},
            "over_padded": {f"{layout} {clock} {phase}": round(statistics.median(
                b / a for a, b in zip(times[clock, "padded", phase], times[clock, layout, phase])), 3)
                for layout in LAYOUTS if layout != "padded" for clock in ("wall", "cpu")
                for phase in ("reference", "update")},
            "recompiles_after_warmup": {k: policies[k].compiled_graphs() - graphs[k] for k in LAYOUTS},
            "reference_logp_max_difference": max(float(np.abs(logp["padded"] - logp[k])[real].max())
                                                 for k in LAYOUTS)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mix", nargs="+", default=["ragged", "full"], choices=["ragged", "full"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", nargs=3, metavar=("MODEL", "MIX", "WHAT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child, args.repeats)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        model = write_small_model(Path(tmp) / "small")
        for mix in args.mix:
            lengths = rollouts(mix).completion_mask.sum(1)
            print(f"{mix}: completion lengths median {np.median(lengths):.0f}, p90 {np.percentile(lengths, 90):.0f}, "
                  f"at the limit {np.mean(lengths == NEW_TOKENS):.0%}, {lengths.sum()} of "
                  f"{lengths.size * NEW_TOKENS} tokens real", flush=True)
            for what in ("time", *LAYOUTS):
                run = subprocess.run([sys.executable, __file__, "--repeats", str(args.repeats), "--child", str(model),
                                      mix, what], capture_output=True, text=True, cwd=Path(__file__).parent)
                if run.returncode:
                    raise RuntimeError(f"{mix} {what} failed:\n{run.stderr[-3000:]}")
                print(f"  {what}: {run.stdout.strip().splitlines()[-1]}", flush=True)


if __name__ == "__main__":
    main()
