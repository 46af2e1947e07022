#!/usr/bin/env python
"""End-to-end GRPO benchmark: mindgrpo's trainer at exactly the peer TRL benchmark's settings, optionally beside it.

Settings (those of ../shared/peer/trl_grpo_bench.py): 4 GSM8K train prompts x 8 completions per optimizer step,
64 new tokens, the `gsm8k_hash` prompt (a ChatML user turn ending 'Let's think step by step and output the final
answer after "####".'), temperature 1.0, beta 0.04, learning rate 1e-5, num_iterations 1, loss_type dapo (TRL's
default), fp32, reward 1 when the last `#### N` equals the gold answer. The optimizer step is TRL's (one per 32
completions, loss normalised over all of them); mindgrpo computes it in two micro-batches of two groups
(`--micro-batch 16`), which halves the training step's activation memory for a few percent of step time.
Models: the tiny fixture (../shared/fixtures/tiny-qwen2.5) and `small` (hidden 512, 8 layers, 8 heads, 2 KV
heads, intermediate 1408, the fixture's tokenizer), both randomly initialised Qwen2 as far as speed is concerned.

Each run is its own process (so peak RSS is its own). A mindgrpo run first compiles every graph its steps will need
(`GRPOTrainer.precompile`: every prompt width its batches reach), then runs `--steps` steps; the first `--warmup` are
excluded and the rest give the median. It prints one JSON line per run:

    sec_per_step     median wall time of a counted step (rollout, scoring, reference, update, weight sync, logging)
    tokens_per_sec   median over counted steps of (real prompt + completion tokens of the 32 rows) / step time,
                     counted as the peer counts them (each prompt once per completion)
    share_rollout / share_reference / share_update / share_other   fractions of the counted steps' time
    peak_rss_mib     peak resident memory of the process
    recompiles_after_warmup   graphs MindSpore compiled during the counted steps (must be 0)
    mfu              model FLOPs per second / this machine's measured float32 matmul peak; the FLOPs are those
                     mindgrpo's computation needs for the real tokens (rollout: each prompt prefilled once, then
                     64 decoding steps with a KV cache; reference forward and training step: each prompt once per
                     group, the vocabulary projected at completion positions only; backward = 2 x forward),
                     attention included, padding excluded
    mfu_phases       the same per phase (rollout / reference / update)

With `--vs-trl PYTHON` (the interpreter of a venv set up as the peer's docstring says) the peer runs too, with
mindgrpo and TRL alternating (`--repeats` each), and a last JSON line gives mindgrpo / TRL for every figure
(targets: tokens/s >= 2x on tiny and >= 1.5x on small, peak RSS <= TRL's).

    python tools/bench_grpo.py [--sizes tiny small] [--steps 10] [--warmup 2] [--vs-trl /path/to/venv/bin/python]

`--decode-impl plain` runs the rollout on the plain-ops decode graph instead of the fused CPU kernels, and
`--no-share-prompt` scores every completion's prompt again: each shows what that part of mindgrpo adds.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

from benchlib import FIXTURE, GSM8K_TRAIN, PEER, matmul_peak_gflops, peak_rss_mib, write_small_model

TARGETS = {"tiny": 2.0, "small": 1.5}  # tokens/s of mindgrpo / TRL
PROMPTS, GENERATIONS, NEW_TOKENS = 4, 8, 64
MAX_PROMPT_LENGTH = 256  # 3 of 7,473 prompts are longer
MICRO_BATCH = 2 * GENERATIONS  # two groups per training micro-batch (see the module docstring)
PROMPT_BUCKET = 64


# ----------------------------------------------------------------------------------------------- mindgrpo run
def bench_config(model_dir: Path, dataset: Path, out_dir: Path, steps: int, share_prompt: bool,
                 micro_batch: int = MICRO_BATCH, prompt_bucket: int = PROMPT_BUCKET, decode_impl: str = "fused"):
    """The peer's settings as a mindgrpo config."""
    from mindgrpo.config import GRPOConfig, validate

    config = GRPOConfig()
    rl = config.rl_config
    rl.dataset_file, rl.tokenizer_dir, rl.output_dir = str(dataset), str(FIXTURE), str(out_dir)
    rl.mode, rl.max_steps, rl.seed = "graph", steps, 0
    rl.batch_size, rl.num_generations, rl.num_iterations = PROMPTS, GENERATIONS, 1
    rl.max_prompt_length, rl.seq_length = MAX_PROMPT_LENGTH, MAX_PROMPT_LENGTH + NEW_TOKENS
    rl.beta, rl.loss_type, rl.kl_estimator, rl.scale_rewards = 0.04, "dapo", "k3", "group"
    rl.share_prompt, rl.prompt_bucket = share_prompt, prompt_bucket
    rl.save_ckpt_interval, rl.save_prompt_completions_data = 0, False
    actor = config.actor_config
    actor.load, actor.compute_dtype, actor.micro_batch_size = str(model_dir), "float32", micro_batch
    actor.optimizer.weight_decay, actor.optimizer.max_grad_norm = 0.0, 1.0  # TRL's AdamW defaults
    actor.lr_schedule.type, actor.lr_schedule.learning_rate = "linear", 1e-5  # TRL: linear decay from 1e-5
    actor.lr_schedule.warmup_steps = 0
    config.ref_config.ref_model_batch_size = PROMPTS * GENERATIONS  # no backward: its activations fit the pool
    gen = config.generate_config
    gen.backend, gen.infer_model_batch_size = "native", PROMPTS * GENERATIONS
    gen.decode_impl = decode_impl
    s = gen.sampling_config
    s.temperature, s.top_p, s.top_k, s.max_tokens = 1.0, 1.0, -1, NEW_TOKENS
    config.reward_config.verifier_function, config.reward_config.verifier_weight = ["accuracy_reward"], [1.0]
    return validate(config)


def convert_gsm8k(out: Path) -> Path:
    """GSM8K train as a mindgrpo prompt MindRecord with the peer's prompt (about 1.5 s)."""
    from mindgrpo.data import convert_dataset
    from mindgrpo.tokenizer import load_tokenizer

    if not out.exists():
        convert_dataset(GSM8K_TRAIN, out, load_tokenizer(FIXTURE), dataset_type="gsm8k", prompt_template="gsm8k_hash",
                        max_prompt_length=MAX_PROMPT_LENGTH, progress=False)
    return out


def step_flops(hf: dict, prompt_lengths: List[int], completion_lengths: List[int]) -> Dict[str, float]:
    """FLOPs one step needs per phase for these real tokens (see the module docstring)."""
    h, layers, v = hf["hidden_size"], hf["num_hidden_layers"], hf["vocab_size"]
    heads = hf["num_attention_heads"]
    kv = hf.get("num_key_value_heads", heads) * h // heads
    per_token = 2 * layers * (2 * h * h + 2 * h * kv + 3 * h * hf["intermediate_size"])  # matmuls of the layers
    head = 2 * h * v  # vocabulary projection of one position
    attn = 4 * layers * h  # QK^T and AV per (query, key) pair

    def pairs(n: int, start: int = 0) -> int:  # causal (query, key) pairs of n tokens after `start` context tokens
        return n * start + n * (n + 1) // 2

    g = GENERATIONS
    groups = [(prompt_lengths[i], completion_lengths[i * g:(i + 1) * g]) for i in range(len(prompt_lengths))]
    prompt_once = sum(per_token * p + attn * pairs(p) for p, _ in groups)
    completions = sum(per_token * c + head * c + attn * pairs(c, p) for p, cs in groups for c in cs)
    forward = prompt_once + completions  # reference forward, and the training forward
    return {"rollout": prompt_once + sum(head for _ in groups) + completions, "reference": forward,
            "update": 3 * forward}


def run_mindgrpo(size: str, model_dir: Path, work: Path, args: argparse.Namespace) -> Dict:
    import mindgrpo  # noqa: F401  (quiet logging before MindSpore loads)
    import mindspore as ms
    from mindgrpo.trainer import GRPOTrainer

    if args.threads:
        ms.device_context.cpu.op_tuning.threads_num(args.threads)
    peak = matmul_peak_gflops()
    config = bench_config(model_dir, convert_gsm8k(work / "gsm8k_train.mindrecord"), work / f"run_{size}",
                          args.steps, not args.no_share_prompt, args.micro_batch, args.prompt_bucket,
                          args.decode_impl)
    start = time.perf_counter()
    trainer = GRPOTrainer(config)
    trainer.precompile()
    setup_s = time.perf_counter() - start
    steps = []
    for i in range(args.steps):
        if i == args.warmup:
            graphs_before = trainer.policy.compiled_graphs()
        start = time.perf_counter()
        metrics = trainer.train_step()
        seconds = time.perf_counter() - start
        data = trainer.last_rollouts
        steps.append({"seconds": seconds, "metrics": metrics,
                      "tokens": int(data.prompt_lengths.sum() + data.completion_mask.sum()),
                      "flops": step_flops(trainer.policy.hf_config, data.prompt_lengths[::GENERATIONS].tolist(),
                                          data.completion_mask.sum(1).tolist())})
    recompiles = trainer.policy.compiled_graphs() - graphs_before
    trainer.metrics.close()
    counted = steps[args.warmup:] or steps
    total = sum(s["seconds"] for s in counted)
    phase_s = {phase: sum(s["metrics"][key] for s in counted) for phase, key in
               (("rollout", "timing/rollout"), ("reference", "timing/reference_model"), ("update", "timing/update"))}
    flops = {phase: sum(s["flops"][phase] for s in counted) for phase in phase_s}
    gflops = peak["peak_gflops"]
    return {
        "framework": "mindgrpo", "size": size, "model": model_dir.name, "share_prompt": not args.no_share_prompt,
        "loss_impl": config.rl_config.loss_impl, "decode_impl": args.decode_impl,
        "micro_batch": args.micro_batch,
        "prompt_bucket": args.prompt_bucket, "steps": len(steps), "counted_steps": len(counted),
        "batch": PROMPTS * GENERATIONS, "setup_and_compile_s": round(setup_s, 1),
        "sec_per_step": round(statistics.median(s["seconds"] for s in counted), 4),
        "tokens_per_sec": round(statistics.median(s["tokens"] / s["seconds"] for s in counted), 1),
        "mean_tokens_per_step": statistics.mean(s["tokens"] for s in counted),
        **{f"share_{phase}": round(t / total, 4) for phase, t in phase_s.items()},
        "share_other": round(1 - sum(phase_s.values()) / total, 4),
        "peak_rss_mib": peak_rss_mib(), "recompiles_after_warmup": recompiles,
        "matmul_peak_gflops": gflops,
        "mfu": round(sum(flops.values()) / total / 1e9 / gflops, 4),
        "mfu_phases": {phase: round(flops[phase] / phase_s[phase] / 1e9 / gflops, 4) for phase in phase_s},
    }


# ----------------------------------------------------------------------------------------------- driver
def run_process(cmd: List[str], label: str) -> Dict:
    """Run one benchmark process; its last JSON line is the result."""
    with tempfile.TemporaryFile("w+") as log:
        code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, text=True).returncode
        log.seek(0)
        text = log.read()
    for line in reversed(text.splitlines()):
        if line.startswith("{") and line.endswith("}"):
            return json.loads(line)
    raise RuntimeError(f"{label} run failed (exit {code}); its last output:\n{text[-4000:]}")


def ratios(ours: Dict, peer: Dict) -> Dict:
    keys = ("tokens_per_sec", "sec_per_step", "peak_rss_mib")
    return {f"{k}_ratio": round(ours[k] / peer[k], 3) for k in keys if peer.get(k)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["tiny", "small"], choices=["tiny", "small"])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2, help="leading steps excluded from the statistics")
    parser.add_argument("--repeats", type=int, default=1, help="alternating runs per framework with --vs-trl")
    parser.add_argument("--vs-trl", metavar="PYTHON", help="interpreter of a venv with torch and trl (see the peer)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for both frameworks")
    parser.add_argument("--no-share-prompt", action="store_true", help="score every completion's prompt again")
    parser.add_argument("--micro-batch", type=int, default=MICRO_BATCH,
                        help="completions per training forward/backward (actor_config.micro_batch_size)")
    parser.add_argument("--prompt-bucket", type=int, default=PROMPT_BUCKET, help="rl_config.prompt_bucket")
    parser.add_argument("--decode-impl", choices=["fused", "plain"], default="fused",
                        help="generate_config.decode_impl (the rollout's decode-step kernels)")
    parser.add_argument("--worker", choices=["tiny", "small"], help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--work-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(run_mindgrpo(args.worker, Path(args.model_dir), Path(args.work_dir), args)), flush=True)
        return 0
    for needed in (FIXTURE, GSM8K_TRAIN) + ((PEER,) if args.vs_trl else ()):
        if not needed.exists():
            print(f"error: {needed} not found (set MINDGRPO_SHARED to the shared reference folder)", file=sys.stderr)
            return 2

    failed = False
    with tempfile.TemporaryDirectory(prefix="bench_grpo_") as tmp:
        work = Path(tmp)
        for size in args.sizes:
            model_dir = FIXTURE if size == "tiny" else write_small_model(work / "small")
            ours_cmd = [sys.executable, __file__, "--worker", size, "--model-dir", str(model_dir), "--work-dir", tmp,
                        "--steps", str(args.steps), "--warmup", str(args.warmup)]
            ours_cmd += (["--threads", str(args.threads)] if args.threads else [])
            ours_cmd += (["--no-share-prompt"] if args.no_share_prompt else [])
            ours_cmd += ["--micro-batch", str(args.micro_batch), "--prompt-bucket", str(args.prompt_bucket),
                         "--decode-impl", args.decode_impl]
            peer_cmd = ([args.vs_trl, str(PEER), "--size", size, "--steps", str(args.steps), "--warmup",
                         str(args.warmup)] + (["--threads", str(args.threads)] if args.threads else [])
                        if args.vs_trl else None)
            runs: Dict[str, List[Dict]] = {"mindgrpo": [], "trl": []}
            for turn in range(args.repeats if args.vs_trl else 1):
                order = [("mindgrpo", ours_cmd)] + ([("trl", peer_cmd)] if peer_cmd else [])
                for name, cmd in (order if turn % 2 == 0 else order[::-1]):  # alternate who goes first
                    try:
                        result = run_process(cmd, f"{name} {size}")
                    except RuntimeError as err:
                        print(err, file=sys.stderr)
                        failed = True
                        continue
                    result["load_average"] = round(os.getloadavg()[0], 2)
                    runs[name].append(result)
                    print(json.dumps(result), flush=True)
            if runs["mindgrpo"] and runs["trl"]:
                ours, peer = (summary(runs[k]) for k in ("mindgrpo", "trl"))
                comparison = {"compare": "mindgrpo / trl", "size": size, **ratios(ours, peer),
                              "mindgrpo_tokens_per_sec": ours["tokens_per_sec"],
                              "trl_tokens_per_sec": peer["tokens_per_sec"],
                              "mindgrpo_peak_rss_mib": ours["peak_rss_mib"], "trl_peak_rss_mib": peer["peak_rss_mib"],
                              "trl_gen_fraction": peer.get("gen_fraction"),
                              "target_tokens_per_sec_ratio": TARGETS[size]}
                comparison["targets_met"] = (comparison["tokens_per_sec_ratio"] >= TARGETS[size]
                                             and comparison["peak_rss_mib_ratio"] <= 1.0)
                print(json.dumps(comparison), flush=True)
    return 1 if failed else 0


def summary(runs: List[Dict]) -> Dict:
    """Median over repeated runs of the figures compared."""
    return {k: statistics.median(r[k] for r in runs) if isinstance(runs[0].get(k), (int, float)) else runs[0].get(k)
            for k in runs[0]}


if __name__ == "__main__":
    sys.exit(main())
