#!/usr/bin/env python
"""End-to-end GRPO benchmark: mindgrpo's trainer at exactly the peer TRL benchmark's settings, optionally beside it.

Settings (those of the TRL peer, tools/trl_peer.py): 4 GSM8K-format prompts x 8 completions per optimizer step,
`--max-new-tokens` new tokens (64 by default), the `gsm8k_hash` prompt (a ChatML user turn ending 'Let's think step
by step and output the final answer after "####".'), temperature 1.0 (no top-k, no top-p), beta 0.04, learning rate
1e-5, num_iterations 1, loss_type dapo (TRL's default), fp32, reward 1 when the last `#### N` equals the gold answer.
The optimizer step is TRL's (one per 32 completions, loss normalised over all of them); mindgrpo computes it in
packed forwards (`actor_config.max_tokens_per_micro_batch`, `--packed-rows`): the completions end to end without
their padding, in rows of `--max-new-tokens` tokens, 8 rows (at most 4,096 tokens) per forward, so the number of
forwards follows the tokens sampled and their memory stays level as the limit grows. `--packed-rows 0` gives
padded micro-batches of `--micro-batch` completions (16: two groups) instead. Models (`benchlib.bench_assets`,
made locally and cached in `--model-cache`): tiny (hidden 128, 4 layers, 4 heads, 2 KV heads, intermediate 352) and
`small` (hidden 512, 8 layers, 8 heads, 2 KV heads, intermediate 1408), randomly initialised Qwen2 with a
4,096-token vocabulary and a byte-level BPE tokenizer trained on the prompts. The prompts are GSM8K's train split
when `$MINDGRPO_GSM8K` names its train.jsonl (or the shared reference folder beside the clone holds it), else the
embedded demo's GSM8K-format one-digit problems (shorter prompts): each JSON line says which (`prompts`).

Length mix (`--length-mix`, see tools/length_mix.py). Both frameworks load the same untied copy of the model whose
only edit is the EOS row of `lm_head`, and sample as they normally do:
    full     every completion runs to `--max-new-tokens` (EOS suppressed: the unedited random model samples EOS
             with about 1/4,000 chance per token, so 2 % of its rows stop before 64 tokens and a quarter
             before 1,024)
    ragged   long-tailed lengths, calibrated per (size, limit): median about a quarter of the limit, the top 10 %
             at the limit, as R1-Zero style runs sample them
Both stop on <|im_end|> only. Copies are cached in `--model-cache`, so only the first run calibrates.

Each run is its own process (so peak RSS is its own). A mindgrpo run first compiles every graph its steps will need
(`GRPOTrainer.precompile`: every prompt width its batches reach), then runs `--steps` steps; the first `--warmup` are
excluded and the rest give the median. It prints one JSON line per run:

    sec_per_step     median wall time of a counted step (rollout, scoring, reference, update, weight sync, logging)
    phase_seconds    mean seconds per counted step of each phase: rollout, reference, update, other
    tokens_per_sec   median over counted steps of (real prompt + completion tokens of the 32 rows) / step time,
                     counted as the peer counts them (each prompt once per completion; completions up to and
                     including their EOS)
    share_rollout / share_reference / share_update / share_other   fractions of the counted steps' time
    peak_rss_mib     peak resident memory of the process
    recompiles_after_warmup   graphs MindSpore compiled during the counted steps (must be 0)
    lengths          the completion lengths this framework sampled in the counted steps: median, p90, at_limit
                     (the share that reached the limit), mean, count; the TRL line has the same
    eos_ids          the ids that ended a completion in this framework
    mfu              model FLOPs per second / this machine's measured float32 matmul peak; the FLOPs are those
                     mindgrpo's computation needs for the tokens actually sampled (rollout: each prompt prefilled
                     once, then one decoding step with a KV cache per generated token after the first; reference
                     forward and training step: each prompt once per group, the vocabulary projected at completion
                     positions only; backward = 2 x forward), attention included, padding and finished rows excluded
    mfu_phases       the same per phase (rollout / reference / update)
    cpu              the CPU model and logical CPU count; `prompts`: where the prompts came from

With `--vs-trl PYTHON` (TRL's interpreter: `bash tools/make_trl_venv.sh trlenv` makes one) the peer runs too
(tools/trl_peer.py, whose JSON line has the same figures and phase shares), on the same model copy and prompts,
mindgrpo and TRL alternating (`--repeats` each); a last JSON line per size gives mindgrpo / TRL for every figure and
the target of that setting, and a plain line the phase breakdown of both per step.

    python tools/bench_grpo.py [--sizes tiny small] [--max-new-tokens 64] [--length-mix full] [--steps 10]
                               [--warmup 2] [--vs-trl trlenv/bin/python]

tools/bench_scaling.py runs the whole grid (sizes x lengths x mixes) and writes the table and plot.
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

from benchlib import (ASSETS_CACHE, OthersCpu, bench_assets, cpu_model, matmul_peak_gflops, peak_rss_mib,
                      wait_until_idle)
from length_mix import length_stats, model_for

PROMPTS, GENERATIONS, NEW_TOKENS = 4, 8, 64
MAX_PROMPT_LENGTH = 256  # 3 of GSM8K's 7,473 train prompts are longer
MICRO_BATCH = 2 * GENERATIONS  # two groups per training micro-batch (see the module docstring)
PROMPT_BUCKET = 64
PACKED_ROWS = 8  # packed training rows of `--max-new-tokens` per forward (0: padded micro-batches) ...
PACKED_TOKENS = 4096  # ... holding at most this many tokens (4 rows at 1,024: the forwards' memory stays level)


def target(size: str, new_tokens: int, mix: str) -> float:
    """The tokens/s ratio mindgrpo / TRL that this setting must reach (issue 19; 64 tokens: the earlier targets)."""
    if new_tokens == 64:
        return 2.0 if size == "tiny" else 1.5
    if size == "small" and new_tokens == 512:
        return 3.0 if mix == "ragged" else 1.75
    return 1.5


# ----------------------------------------------------------------------------------------------- mindgrpo run
def bench_config(model_dir: Path, dataset: Path, out_dir: Path, steps: int, share_prompt: bool,
                 micro_batch: int = MICRO_BATCH, prompt_bucket: int = PROMPT_BUCKET, decode_impl: str = "fused",
                 new_tokens: int = NEW_TOKENS, packed_rows: int = PACKED_ROWS, prompts: int = PROMPTS,
                 param_dtype: str = "float32", generations: int = GENERATIONS, lora_rank: int = 0,
                 recompute: bool = False):
    """The peer's settings as a mindgrpo config (`param_dtype`: the actor's weights, see actor_config.param_dtype;
    `lora_rank`: LoRA adapters on every linear at lora_alpha 2 x rank, 0 = full-parameter)."""
    from mindgrpo.config import GRPOConfig, validate

    config = GRPOConfig()
    rl = config.rl_config
    rl.dataset_file, rl.tokenizer_dir, rl.output_dir = str(dataset), str(model_dir), str(out_dir)
    rl.mode, rl.max_steps, rl.seed = "graph", steps, 0
    rl.batch_size, rl.num_generations, rl.num_iterations = prompts, generations, 1
    rl.max_prompt_length, rl.seq_length = MAX_PROMPT_LENGTH, MAX_PROMPT_LENGTH + new_tokens
    rl.beta, rl.loss_type, rl.kl_estimator, rl.scale_rewards = 0.04, "dapo", "k3", "group"
    rl.share_prompt, rl.prompt_bucket = share_prompt, prompt_bucket
    rl.save_ckpt_interval, rl.save_prompt_completions_data = 0, False
    actor = config.actor_config
    actor.load, actor.compute_dtype, actor.micro_batch_size = str(model_dir), "float32", micro_batch
    actor.param_dtype = param_dtype
    actor.lora_rank, actor.lora_alpha, actor.recompute = lora_rank, 2.0 * lora_rank, recompute
    rows = min(packed_rows, max(1, PACKED_TOKENS // new_tokens))
    actor.max_tokens_per_micro_batch = rows * new_tokens if share_prompt else 0  # packing needs the shared prompt
    actor.optimizer.weight_decay, actor.optimizer.max_grad_norm = 0.0, 1.0  # TRL's AdamW defaults
    actor.lr_schedule.type, actor.lr_schedule.learning_rate = "linear", 1e-5  # TRL: linear decay from 1e-5
    actor.lr_schedule.warmup_steps = 0
    config.ref_config.ref_model_batch_size = prompts * generations  # no backward: its activations fit the pool
    gen = config.generate_config
    gen.backend, gen.infer_model_batch_size = "native", prompts * generations
    gen.decode_impl = decode_impl
    s = gen.sampling_config
    s.temperature, s.top_p, s.top_k, s.max_tokens = 1.0, 1.0, -1, new_tokens
    config.reward_config.verifier_function, config.reward_config.verifier_weight = ["accuracy_reward"], [1.0]
    return validate(config)


def convert_prompts(prompts: Path, tokenizer_dir: Path, out: Path) -> Path:
    """The prompt rows as a mindgrpo prompt MindRecord with the `gsm8k_hash` template (about 1.5 s for GSM8K)."""
    from mindgrpo.data import convert_dataset
    from mindgrpo.data.tokenizer import load_tokenizer

    if not out.exists():
        convert_dataset(prompts, out, load_tokenizer(tokenizer_dir), dataset_type="gsm8k",
                        prompt_template="gsm8k_hash", max_prompt_length=MAX_PROMPT_LENGTH, progress=False)
    return out


def peer_prompts(prompts: Path, out: Path) -> Path:
    """The same rows for the TRL peer: each prompt rendered with mindgrpo's `gsm8k_hash` template, and its gold
    number, so both frameworks tokenize the same text."""
    import mindgrpo  # noqa: F401  (quiet logging)
    from mindgrpo.data import render_prompt

    if not out.exists():
        rows = [json.loads(line) for line in prompts.read_text(encoding="utf-8").splitlines() if line.strip()]
        text = "".join(json.dumps({"prompt": render_prompt("gsm8k_hash", r["question"]),
                                   "gold": r["answer"].split("####")[-1].strip()}) + "\n" for r in rows)
        tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out)
    return out


def step_flops(hf: dict, prompt_lengths: List[int], completion_lengths: List[int],
               generations: int = GENERATIONS) -> Dict[str, float]:
    """FLOPs one step needs per phase for these real tokens (see the module docstring)."""
    h, layers, v = hf["hidden_size"], hf["num_hidden_layers"], hf["vocab_size"]
    heads = hf["num_attention_heads"]
    kv = hf.get("num_key_value_heads", heads) * h // heads
    per_token = 2 * layers * (2 * h * h + 2 * h * kv + 3 * h * hf["intermediate_size"])  # matmuls of the layers
    head = 2 * h * v  # vocabulary projection of one position
    attn = 4 * layers * h  # QK^T and AV per (query, key) pair

    def pairs(n: int, start: int = 0) -> int:  # causal (query, key) pairs of n tokens after `start` context tokens
        return n * start + n * (n + 1) // 2

    g = generations
    groups = [(prompt_lengths[i], completion_lengths[i * g:(i + 1) * g]) for i in range(len(prompt_lengths))]
    prompt_once = sum(per_token * p + attn * pairs(p) for p, _ in groups)
    completions = sum(per_token * c + head * c + attn * pairs(c, p) for p, cs in groups for c in cs)
    forward = prompt_once + completions  # reference forward, and the training forward
    # Rollout: the prefill's last position samples each completion's first token; every later token is one decode
    # step of the token before it, so a completion of c tokens costs c - 1 decode steps (none once it has ended).
    decode = sum((per_token + head) * (c - 1) + attn * pairs(c - 1, p) for p, cs in groups for c in cs if c)
    return {"rollout": prompt_once + head * len(groups) + decode, "reference": forward, "update": 3 * forward}


def run_mindgrpo(size: str, model_dir: Path, work: Path, args: argparse.Namespace) -> Dict:
    import mindgrpo  # noqa: F401  (quiet logging before MindSpore loads)
    import mindspore as ms
    from mindgrpo.train.trainer import GRPOTrainer

    if args.threads:
        ms.device_context.cpu.op_tuning.threads_num(args.threads)
    peak = matmul_peak_gflops()
    dataset = convert_prompts(Path(args.prompts), model_dir, work / f"prompts_{model_dir.name}.mindrecord")
    config = bench_config(model_dir, dataset, work / f"run_{size}",
                          args.steps, not args.no_share_prompt, args.micro_batch, args.prompt_bucket,
                          args.decode_impl, args.max_new_tokens, args.packed_rows, args.prompts_per_step,
                          args.param_dtype, args.generations, args.lora_rank, args.recompute)
    start = time.perf_counter()
    trainer = GRPOTrainer(config)
    if not args.no_precompile:
        trainer.precompile()
    setup_s = time.perf_counter() - start
    steps = []
    for i in range(args.steps):
        if i == args.warmup:
            graphs_before = trainer.worker.compiled_graphs()
        start = time.perf_counter()
        metrics = trainer.train_step()
        seconds = time.perf_counter() - start
        data = trainer.last_rollouts
        lengths = data.completion_mask.sum(1).tolist()
        steps.append({"seconds": seconds, "metrics": metrics, "lengths": lengths,
                      "tokens": int(data.prompt_lengths.sum() + data.completion_mask.sum()),
                      "flops": step_flops(trainer.worker.hf_config,
                                          data.prompt_lengths[::args.generations].tolist(), lengths,
                                          args.generations)})
    recompiles = trainer.worker.compiled_graphs() - graphs_before
    trainer.metrics.close()
    counted = steps[args.warmup:] or steps
    total = sum(s["seconds"] for s in counted)
    phase_s = {phase: sum(s["metrics"][key] for s in counted) for phase, key in
               (("rollout", "timing/rollout"), ("reference", "timing/reference_model"), ("update", "timing/update"))}
    flops = {phase: sum(s["flops"][phase] for s in counted) for phase in phase_s}
    gflops = peak["peak_gflops"]
    return {
        "framework": "mindgrpo", "size": size, "model": model_dir.name, "max_new_tokens": args.max_new_tokens,
        "length_mix": args.length_mix, "share_prompt": not args.no_share_prompt,
        "loss_impl": config.rl_config.loss_impl, "decode_impl": args.decode_impl, "param_dtype": args.param_dtype,
        "micro_batch": args.micro_batch, "max_tokens_per_micro_batch": config.actor_config.max_tokens_per_micro_batch,
        "prompt_bucket": args.prompt_bucket, "steps": len(steps), "counted_steps": len(counted),
        "batch": args.prompts_per_step * args.generations, "setup_and_compile_s": round(setup_s, 1),
        "lora_rank": args.lora_rank, "recompute": args.recompute,
        "sec_per_step": round(statistics.median(s["seconds"] for s in counted), 4),
        "tokens_per_sec": round(statistics.median(s["tokens"] / s["seconds"] for s in counted), 1),
        "mean_tokens_per_step": statistics.mean(s["tokens"] for s in counted),
        **{f"share_{phase}": round(t / total, 4) for phase, t in phase_s.items()},
        "share_other": round(1 - sum(phase_s.values()) / total, 4),
        "phase_seconds": {**{phase: round(t / len(counted), 4) for phase, t in phase_s.items()},
                          "other": round((total - sum(phase_s.values())) / len(counted), 4)},
        "peak_rss_mib": peak_rss_mib(), "planned_rss_mib": planned_rss_mib(config, trainer.worker.hf_config),
        "recompiles_after_warmup": recompiles,
        "lengths": length_stats([n for s in counted for n in s["lengths"]], args.max_new_tokens),
        "eos_ids": [trainer.tokenizer.eos_token_id],
        "matmul_peak_gflops": gflops,
        "mfu": round(sum(flops.values()) / total / 1e9 / gflops, 4),
        "mfu_phases": {phase: round(flops[phase] / phase_s[phase] / 1e9 / gflops, 4) for phase in phase_s},
        "cpu": cpu_model(), "prompts": args.prompts_source,
    }


def planned_rss_mib(config, hf_config) -> int:
    """What `mindgrpo plan --device cpu` predicts this one-process run's peak RSS to be (the planner's own
    accounting, checked here against the measured peak)."""
    from mindgrpo.apps.plan import plan_layouts

    layout = plan_layouts(config, 1, 1 << 50, hf_config, device="cpu")["layouts"][0]
    return round(layout["bytes"]["total"] / 2 ** 20)


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


def summary(runs: List[Dict]) -> Dict:
    """Median over repeated runs of the figures compared (numbers, and the numbers of `phase_seconds`)."""
    def median(key: str):
        first = runs[0].get(key)
        if isinstance(first, (int, float)) and not isinstance(first, bool):
            return statistics.median(r[key] for r in runs)
        if key == "phase_seconds" and first:
            return {phase: statistics.median(r[key][phase] for r in runs) for phase in first}
        return first
    return {k: median(k) for k in runs[0]}


def setting_model(size: str, mix: str, new_tokens: int, cache: Path) -> Path:
    """The model copy both frameworks load for this setting (calibrated on first use, then cached)."""
    assets = bench_assets(cache)
    return model_for(assets.model(size), assets.tokenizer_dir, assets.prompts, mix, new_tokens, cache,
                     name=f"{assets.root.name}-{size}")


def phase_line(size: str, new_tokens: int, mix: str, ours: Dict, peer: Optional[Dict]) -> str:
    """Where a step goes in each framework, in seconds per step: rollout + reference + update (+ other)."""
    def phases(result: Dict) -> str:
        shares = {k: result.get(f"share_{k}") for k in ("rollout", "reference", "update", "other")}
        step = result["sec_per_step"]
        return f"{step:.2f} s/step = " + " + ".join(f"{k} {share * step:.2f}" for k, share in shares.items()
                                                    if share is not None)
    line = f"{size} {new_tokens} {mix}: mindgrpo {phases(ours)}"
    return line + (f"; TRL {phases(peer)}" if peer else "") + f" [{ours.get('cpu', 'unknown CPU')}]"


def compare(size: str, new_tokens: int, mix: str, args: argparse.Namespace, work: Path,
            trl_first: bool = False, log=print) -> Dict:
    """Run one setting (mindgrpo, and TRL with --vs-trl, alternating): {"runs": {...}, "comparison": ...}."""
    model_dir = setting_model(size, mix, new_tokens, Path(args.model_cache))
    assets = bench_assets(Path(args.model_cache))
    ours_cmd = [sys.executable, __file__, "--worker", size, "--model-dir", str(model_dir), "--work-dir", str(work),
                "--prompts", str(assets.prompts), "--prompts-source", assets.source,
                "--steps", str(args.steps), "--warmup", str(args.warmup), "--max-new-tokens", str(new_tokens),
                "--length-mix", mix, "--micro-batch", str(args.micro_batch), "--prompt-bucket",
                str(args.prompt_bucket), "--decode-impl", args.decode_impl, "--packed-rows", str(args.packed_rows),
                "--prompts-per-step", str(args.prompts_per_step), "--param-dtype", args.param_dtype]
    ours_cmd += (["--threads", str(args.threads)] if args.threads else [])
    ours_cmd += (["--no-share-prompt"] if args.no_share_prompt else [])
    peer_cmd = None
    if args.vs_trl:
        peer_cmd = [args.vs_trl, str(Path(__file__).with_name("trl_peer.py")), "--model", str(model_dir),
                    "--prompts", str(peer_prompts(assets.prompts, work / f"peer_{assets.root.name}.jsonl")),
                    "--max-completion-length", str(new_tokens), "--steps", str(args.steps),
                    "--warmup", str(args.warmup), "--prompts-per-step", str(args.prompts_per_step)]
        peer_cmd += (["--threads", str(args.threads)] if args.threads else [])
    runs: Dict[str, List[Dict]] = {"mindgrpo": [], "trl": []}
    for turn in range(args.repeats if peer_cmd else 1):
        order = [("mindgrpo", ours_cmd)] + ([("trl", peer_cmd)] if peer_cmd else [])
        for name, cmd in (order[::-1] if (turn % 2 == 1) != trl_first and peer_cmd else order):  # alternate
            busy = wait_until_idle(args.idle_below, args.idle_wait * 60) if args.idle_wait else None
            began = time.perf_counter()
            try:
                with OthersCpu() as others:
                    result = run_process(cmd, f"{name} {size} {new_tokens} {mix}")
            except RuntimeError as err:
                print(err, file=sys.stderr)
                continue
            result.update(size=size, length_mix=mix, process_s=round(time.perf_counter() - began, 1),
                          cpu_busy_before=busy, others_cpu_share=others.share,
                          load_average=round(os.getloadavg()[0], 2))
            runs[name].append(result)
            log(json.dumps(result))
    comparison = None
    if runs["mindgrpo"] and runs["trl"]:
        ours, peer = (summary(runs[k]) for k in ("mindgrpo", "trl"))
        comparison = {"compare": "mindgrpo / trl", "size": size, "max_new_tokens": new_tokens, "length_mix": mix,
                      **ratios(ours, peer),
                      "mindgrpo_tokens_per_sec": ours["tokens_per_sec"], "trl_tokens_per_sec": peer["tokens_per_sec"],
                      "mindgrpo_peak_rss_mib": ours["peak_rss_mib"], "trl_peak_rss_mib": peer["peak_rss_mib"],
                      "trl_gen_fraction": peer.get("gen_fraction"),
                      "target_tokens_per_sec_ratio": target(size, new_tokens, mix)}
        comparison["targets_met"] = (comparison["tokens_per_sec_ratio"] >= comparison["target_tokens_per_sec_ratio"]
                                     and comparison["peak_rss_mib_ratio"] <= 1.0)
        log(json.dumps(comparison))
    if runs["mindgrpo"]:
        log(phase_line(size, new_tokens, mix, summary(runs["mindgrpo"]), summary(runs["trl"]) if runs["trl"] else None))
    return {"runs": runs, "comparison": comparison}


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """Options shared with tools/bench_scaling.py."""
    parser.add_argument("--vs-trl", metavar="PYTHON",
                        help="TRL's interpreter, to run the peer (tools/trl_peer.py) too: "
                             "`bash tools/make_trl_venv.sh trlenv` makes one, then pass trlenv/bin/python")
    parser.add_argument("--repeats", type=int, default=1, help="alternating runs per framework with --vs-trl")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for both frameworks")
    parser.add_argument("--model-cache", default=str(ASSETS_CACHE),
                        help="folder of the benchmark models, tokenizer and prompts and of the calibrated model "
                             "copies, reused by later runs (default: %(default)s)")
    parser.add_argument("--idle-wait", type=float, default=0, metavar="MINUTES",
                        help="on a shared machine: before each process, wait up to this long for the CPUs to be "
                             "at most --idle-below busy (default 0: do not wait)")
    parser.add_argument("--idle-below", type=float, default=0.2, metavar="FRACTION",
                        help="CPU busy fraction that counts as idle for --idle-wait (default 0.2)")
    parser.add_argument("--no-share-prompt", action="store_true", help="score every completion's prompt again")
    parser.add_argument("--micro-batch", type=int, default=MICRO_BATCH,
                        help="completions per training forward/backward (actor_config.micro_batch_size)")
    parser.add_argument("--packed-rows", type=int, default=PACKED_ROWS,
                        help="packed training forwards of this many rows of --max-new-tokens, at most "
                             f"{PACKED_TOKENS} tokens (actor_config.max_tokens_per_micro_batch; default "
                             "%(default)s; 0: padded micro-batches of --micro-batch)")
    parser.add_argument("--prompt-bucket", type=int, default=PROMPT_BUCKET, help="rl_config.prompt_bucket")
    parser.add_argument("--decode-impl", choices=["fused", "plain"], default="fused",
                        help="generate_config.decode_impl (the rollout's decode-step kernels)")
    parser.add_argument("--prompts-per-step", type=int, default=PROMPTS,
                        help="prompts per optimizer step, --generations completions each (default %(default)s)")
    parser.add_argument("--generations", type=int, default=GENERATIONS,
                        help="completions per prompt (rl_config.num_generations; default %(default)s)")
    parser.add_argument("--lora-rank", type=int, default=0,
                        help="mindgrpo's actor_config.lora_rank (alpha 2 x rank); 0: full-parameter")
    parser.add_argument("--recompute", action="store_true", help="mindgrpo's actor_config.recompute")
    parser.add_argument("--no-precompile", action="store_true",
                        help="compile in the first step, as a run's first step does (with --warmup 0 the step's "
                             "time includes compiling; a precompile would run a whole rollout first)")
    parser.add_argument("--param-dtype", choices=["float32", "bfloat16"], default="float32",
                        help="mindgrpo's actor weights (actor_config.param_dtype); TRL runs float32")


def check_inputs(vs_trl: Optional[str]) -> bool:
    """TRL's interpreter, when asked for, runs and imports trl (one clear line otherwise)."""
    if not vs_trl:
        return True
    try:
        done = subprocess.run([vs_trl, "-c", "import trl"], capture_output=True, text=True, timeout=600)
    except OSError as err:
        done = subprocess.CompletedProcess([], 1, "", str(err))
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        print(f"error: --vs-trl {vs_trl}: cannot import trl ({last}); make TRL's interpreter with "
              "`bash tools/make_trl_venv.sh trlenv` and pass --vs-trl trlenv/bin/python", file=sys.stderr)
        return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["tiny", "small"], choices=["tiny", "small"])
    parser.add_argument("--max-new-tokens", type=int, default=NEW_TOKENS, help="completion limit (default 64)")
    parser.add_argument("--length-mix", choices=["full", "ragged"], default="full",
                        help="full: every completion reaches the limit; ragged: median limit/4, top 10%% at it")
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps per run (default 10)")
    parser.add_argument("--warmup", type=int, default=2, help="leading steps excluded from the statistics")
    add_run_options(parser)
    parser.add_argument("--worker", metavar="LABEL", help=argparse.SUPPRESS)  # the size named in the results
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--work-dir", help=argparse.SUPPRESS)
    parser.add_argument("--prompts", help=argparse.SUPPRESS)
    parser.add_argument("--prompts-source", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.max_new_tokens < 4:
        parser.error(f"--max-new-tokens must be at least 4 (ragged lengths have a median of a quarter of it), "
                     f"got {args.max_new_tokens}")
    if args.worker:
        if not (args.model_dir and args.work_dir and args.prompts):
            parser.error("--worker needs --model-dir, --work-dir and --prompts (the driver passes them)")
        print(json.dumps(run_mindgrpo(args.worker, Path(args.model_dir), Path(args.work_dir), args)), flush=True)
        return 0
    if not check_inputs(args.vs_trl):
        return 2
    failed = False
    with tempfile.TemporaryDirectory(prefix="bench_grpo_") as tmp:
        for size in args.sizes:
            result = compare(size, args.max_new_tokens, args.length_mix, args, Path(tmp))
            failed |= not result["runs"]["mindgrpo"] or bool(args.vs_trl and not result["runs"]["trl"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
