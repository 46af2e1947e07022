#!/usr/bin/env python
"""Benchmark the rollout backends: generated tokens/s of `native` and `mindformers`, beside Hugging Face `generate`.

Backends: ``native`` (the KV-cache engine on its fused CPU decode kernels), ``native-plain`` (the same engine on
the plain-ops decode graph, ``generate_config.decode_impl: plain``), ``native-nocompact`` (``native`` decoding every
row of a batch until its last one ends, the engine's ``compact=False``), ``mindformers`` and Hugging Face ``hf``.

Workload (GRPO's): 4 GSM8K-like prompts (100-200 tokens; real GSM8K prompts, tokenized by the benchmarks' tokenizer
(`benchlib.bench_assets`), when `$MINDGRPO_GSM8K` names GSM8K's train.jsonl, random ids otherwise) x 8 samples = 32
sequences x 64 new tokens, temperature 1. Length mix ``full`` (default): ``min_tokens = max_tokens``, so every
backend generates exactly the same number of tokens. ``ragged``: long-tailed lengths as in R1-Zero-style runs. The
random models' next-token distributions are near uniform (8.2 nats of entropy out of ln 4096 = 8.3), so ``K`` stop
ids (passed as extra EOS ids to Hugging Face) end a completion with probability about ``K / vocab`` per step: ``K =
vocab * ln(10) / max_tokens`` makes the lengths about geometric, 10 % of them at the limit and the median near 0.3 x
the limit (the rows' distributions differ, so the tail comes out somewhat heavier); the sampled lengths are printed.
Models: random Qwen2s, tiny (hidden 128, 4 layers, 4 heads, 2 KV heads, intermediate 352) and `small` (hidden 512,
8 layers, 8 heads, 2 KV heads, intermediate 1408), vocab 4096 (`benchlib.TINY`, `benchlib.SMALL`), each written
once as a Hugging Face folder so every framework loads the same weights.

Each (model, backend) runs in its own process, so the peak RSS column is that backend's alone. The first call
(graph compilation, HF warm-up) is reported separately; then the backends' timed rollouts are interleaved, so on
a shared machine they see the same load, and tokens/s comes from each backend's fastest run (the least disturbed,
as in tools/bench_data.py; the median time is printed too). The mindformers backend gets one timed run by default:
it recomputes the whole sequence per token and takes minutes on `small`. For the native backend, one more run
splits a decoding step into time inside the compiled graphs and time on the host, and counts the decode columns
computed (decode steps x batch, the work compaction saves). Ratios are taken within this run: native / HF
generate (target >= 2), native / mindformers, and native against native-nocompact (rollout time and decode
columns; both sample the very same tokens). The HF column is skipped when torch or transformers is missing.

    python tools/bench_rollout.py [--sizes tiny small] [--backends native native-plain mindformers hf] [--repeats 5]
    python tools/bench_rollout.py --sizes small --max-tokens 512 --length-mix ragged --backends native native-nocompact
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from benchlib import (EOS, PAD, SIZES, bench_assets, copy_bandwidth, gsm8k_source, matmul_peak_gflops, peak_rss_mib,
                      write_model)

TARGET_NATIVE_OVER_HF = 2.0
BACKENDS = ["native", "native-plain", "native-nocompact", "mindformers", "hf"]
VOCAB = 4096  # both models'


# ----------------------------------------------------------------------------------------------- setup
def gsm8k_prompts(count: int, low: int, high: int, seed: int) -> List[List[int]]:
    """The first `count` GSM8K train prompts whose token length lies in [low, high]; random ids without the data."""
    try:
        import mindgrpo  # noqa: F401
        from mindgrpo.data import read_gsm8k, render_prompt
        from mindgrpo.data.tokenizer import load_tokenizer

        if gsm8k_source() is None:
            raise FileNotFoundError("no GSM8K train.jsonl ($MINDGRPO_GSM8K)")
        assets = bench_assets()  # its tokenizer has GSM8K's specials at PAD and EOS, as the models here
        tokenizer = load_tokenizer(assets.tokenizer_dir)
        encoded = (tokenizer.encode(render_prompt("gsm8k_hash", row.question)) for row in read_gsm8k(assets.prompts))
        prompts = list(itertools.islice((p for p in encoded if low <= len(p) <= high), count))
        if len(prompts) == count:
            return prompts
    except (OSError, ValueError, ImportError) as err:
        print(f"(GSM8K prompts unavailable: {err}; using random token ids)", file=sys.stderr)
    rng = np.random.default_rng(seed)
    return [rng.integers(0, PAD - 1, size=int(n)).tolist() for n in np.linspace(low + 12, high - 9, count)]


def stop_ids(length_mix: str, max_tokens: int) -> List[int]:
    """The extra stop ids of a length mix (see the module docstring): none for ``full``, for ``ragged`` K ids spread
    over the vocabulary, away from the special tokens at its end."""
    if length_mix == "full":
        return []
    count = max(1, round(VOCAB * math.log(10) / max_tokens))
    return np.linspace(7, PAD - 7, count).astype(int).tolist()


# ----------------------------------------------------------------------------------------------- workers
# A worker loads one backend, runs the first (compiling / warming-up) call, then answers "run" lines on stdin
# with one timed rollout each, so the driver can interleave backends: on a shared machine the load changes from
# minute to minute, and interleaved runs see the same conditions.
REPLY = "BENCH "  # prefix of the worker's answers (libraries may print to stdout too)


def mindgrpo_rollout(backend: str, model_dir: str, prompts: List[List[int]], n: int, max_tokens: int,
                     stops: List[int], threads: Optional[int]
                     ) -> Tuple[Callable[[], np.ndarray], Callable[[], Dict[str, float]]]:
    import mindgrpo  # noqa: F401  (before mindspore)
    import mindspore as ms
    from mindgrpo.models import build_model
    from mindgrpo.rollout import SamplingParams, build_rollout_engine

    if threads:
        ms.device_context.cpu.op_tuning.threads_num(threads)
    ms.set_context(mode=ms.GRAPH_MODE)
    actor = build_model(model_dir)
    # "native-plain": the native engine on the plain-ops decode graph, the fused kernels' reference twin;
    # "native-nocompact": every row of a batch decoded until the last one ends
    options = {"native-plain": {"decode_impl": "plain"}, "native-nocompact": {"compact": False}}.get(backend, {})
    engine = build_rollout_engine(backend.split("-")[0], actor, eos_token_id=EOS, pad_token_id=PAD,
                                  max_prompt_length=max(map(len, prompts)), max_batch_size=len(prompts) * n,
                                  **options)
    params = SamplingParams(max_tokens=max_tokens, min_tokens=0 if stops else max_tokens, temperature=1.0,
                            num_generations=n, seed=0, stop_token_ids=stops)
    hf = json.loads((Path(model_dir) / "config.json").read_text())
    details = (lambda: native_loop_split(engine, prompts, params, hf)) if backend.startswith("native") else dict
    return (lambda: engine.generate(prompts, params).completion_mask.sum(1)), details


def decode_limits(hf: Dict, prompt_lengths: List[int], completion_lengths: List[int]) -> Dict[str, float]:
    """The bytes a rollout's decoding steps must read and the FLOPs they must compute, for the tokens sampled.

    A decoding step (one per generated token after the first; the prefill's logits give the first) reads every
    float32 weight of the decoder layers and the vocabulary projection once, whatever its batch, and each live row's
    K and V cache up to its position; it multiplies each live row by those weights and attends over that cache.
    Padding and finished rows are not counted: these are the least work the step needs, so time / (bytes /
    bandwidth) says how close the decoding runs to reading memory at full speed, and time / (FLOPs / peak) how
    close to the matmul peak."""
    h, layers, vocab = hf["hidden_size"], hf["num_hidden_layers"], hf["vocab_size"]
    kv = hf.get("num_key_value_heads", hf["num_attention_heads"]) * h // hf["num_attention_heads"]
    layer_weights = 2 * h * h + 2 * h * kv + 3 * h * hf["intermediate_size"]
    steps = max(completion_lengths) - 1  # decoding steps of the batch (finished rows leave it)
    context = sum(p * (c - 1) + (c - 1) * c // 2 for p, c in zip(prompt_lengths, completion_lengths) if c > 1)
    weight_bytes = 4 * (layers * layer_weights + vocab * h)
    kv_bytes = 4 * 2 * layers * kv * context  # K and V of every (row, step) pair's positions
    tokens = sum(max(c - 1, 0) for c in completion_lengths)
    flops = 2 * tokens * (layers * layer_weights + vocab * h) + 4 * layers * h * context
    return {"bytes": steps * weight_bytes + kv_bytes, "kv_share_of_bytes": kv_bytes / (steps * weight_bytes + kv_bytes),
            "flops": flops, "steps": steps}


def native_loop_split(engine, prompts: List[List[int]], params, hf: Dict) -> Dict[str, float]:
    """Split one more native rollout into time inside the compiled graphs and time on the host (sampling, the
    Python decode loop, tensor transfers), per decoding step, and count the decode columns computed (the batch of
    every decode step: compaction shrinks it as rows end). Then put the decoding graphs' time against this
    machine's limits, measured now (:func:`decode_limits`): the memory-copy bandwidth and the matmul peak."""
    bucket = engine.bucket_for([p for p in prompts for _ in range(params.num_generations)], params.max_tokens)
    in_graphs = {"prefill": 0.0, "decode": 0.0}
    steps, columns = [0], [0]

    def timed(cell, batch=0):
        def call(*args):
            start = time.perf_counter()
            out = cell(*args)
            out.asnumpy()  # wait for the graph to finish
            in_graphs["decode" if batch else "prefill"] += time.perf_counter() - start
            steps[0] += batch > 0
            columns[0] += batch
            return out
        return call

    bucket.prefill = timed(bucket.prefill)
    bucket.decode = {batch: timed(graph, batch) for batch, graph in bucket.decode.items()}
    start = time.perf_counter()
    out = engine.generate(prompts, params)
    total = time.perf_counter() - start
    graphs = sum(in_graphs.values())
    per_step = 1e3 / (steps[0] + 1)  # the prefill's logits give the first token
    limits = decode_limits(hf, [len(p) for p in prompts for _ in range(params.num_generations)],
                           out.completion_mask.sum(1).tolist())
    bandwidth, peak = copy_bandwidth(), matmul_peak_gflops()["peak_gflops"]
    return {"graph_ms_per_step": round(graphs * per_step, 2),
            "host_ms_per_step": round((total - graphs) * per_step, 2),
            "decode_steps": steps[0], "decode_columns": columns[0],
            "decode_graph_s": round(in_graphs["decode"], 3), "copy_bandwidth_gb_s": round(bandwidth / 1e9, 2),
            "matmul_peak_gflops": peak,
            "decode_memory_bound_s": round(limits["bytes"] / bandwidth, 3),
            "decode_of_memory_bound": round(limits["bytes"] / bandwidth / in_graphs["decode"], 3),
            "decode_kv_share_of_bytes": round(limits["kv_share_of_bytes"], 3),
            "decode_mfu": round(limits["flops"] / 1e9 / peak / in_graphs["decode"], 3)}


def hf_rollout(model_dir: str, prompts: List[List[int]], n: int, max_tokens: int, stops: List[int],
               threads: Optional[int]) -> Tuple[Callable[[], np.ndarray], Callable[[], Dict[str, float]]]:
    import torch
    from transformers import Qwen2ForCausalLM

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), PAD, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, prompt in enumerate(prompts):  # left padding, as decoder-only generation needs
        ids[i, width - len(prompt):] = torch.tensor(prompt)
        mask[i, width - len(prompt):] = 1

    def generate() -> np.ndarray:
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                                 top_p=1.0, max_new_tokens=max_tokens, min_new_tokens=0 if stops else max_tokens,
                                 num_return_sequences=n, pad_token_id=PAD, eos_token_id=[EOS, *stops])
        return (out[:, width:] != PAD).sum(1).numpy()

    return generate, lambda: {"torch_threads": torch.get_num_threads()}


def worker(args: argparse.Namespace) -> None:
    prompts = json.loads(Path(args.prompts_file).read_text())
    stops = stop_ids(args.length_mix, args.max_tokens)
    if args.worker == "hf":
        rollout, details = hf_rollout(args.model_dir, prompts, args.n, args.max_tokens, stops, args.threads)
    else:
        rollout, details = mindgrpo_rollout(args.worker, args.model_dir, prompts, args.n, args.max_tokens, stops,
                                            args.threads)

    def reply(**fields) -> None:
        print(REPLY + json.dumps(fields), flush=True)

    start = time.perf_counter()
    lengths = rollout()
    reply(first_call_s=time.perf_counter() - start, lengths=lengths.tolist())
    for command in sys.stdin:
        if command.strip() == "run":
            start = time.perf_counter()
            lengths = rollout()
            reply(seconds=time.perf_counter() - start, lengths=lengths.tolist())
        else:
            reply(peak_rss_mib=peak_rss_mib(), **details())
            return


# ----------------------------------------------------------------------------------------------- driver
def hf_available() -> bool:
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


class Worker:
    """One backend in its own process (so its peak RSS is its own), driven line by line."""

    def __init__(self, backend: str, model_dir: Path, prompts_file: Path, args: argparse.Namespace):
        cmd = [sys.executable, __file__, "--worker", backend, "--model-dir", str(model_dir), "--prompts-file",
               str(prompts_file), "--n", str(args.n), "--max-tokens", str(args.max_tokens), "--length-mix",
               args.length_mix]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        self.backend = backend
        self.max_tokens = args.max_tokens
        self.log = tempfile.TemporaryFile("w+")  # a file, not a pipe: a chatty library cannot block the worker
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.first = self._read()
        self.runs: List[float] = []
        self.tokens: List[int] = []  # per timed run: each run samples anew (the same seed, so the same lengths)

    def _read(self) -> Dict:
        for line in self.proc.stdout:
            if line.startswith(REPLY):
                return json.loads(line[len(REPLY):])
        self.log.seek(0)
        raise RuntimeError(f"{self.backend} worker exited ({self.proc.wait()}):\n{self.log.read()[-3000:]}")

    def run(self) -> None:
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        reply = self._read()
        self.runs.append(reply["seconds"])
        self.tokens.append(sum(reply["lengths"]))

    def finish(self) -> Dict:
        self.proc.stdin.write("stop\n")
        self.proc.stdin.flush()
        final = self._read()
        self.proc.wait()
        best = int(np.argmin(self.runs))
        lengths = np.array(self.first["lengths"])
        return {**final, "first_call_s": round(self.first["first_call_s"], 2), "tokens": self.tokens[best],
                "seconds": round(self.runs[best], 3), "median_s": round(statistics.median(self.runs), 3),
                "tokens_per_s": round(self.tokens[best] / self.runs[best], 1),
                "lengths": f"median {np.median(lengths):.0f}, p90 {np.percentile(lengths, 90):.0f}, "
                           f"{(lengths >= self.max_tokens).mean():.0%} at the limit"}


def measure(backends: List[str], model_dir: Path, prompts_file: Path, args: argparse.Namespace) -> Dict:
    """Start every backend's worker, then time the backends' rollouts in turns (rotating the order)."""
    workers, results = {}, {}
    try:
        for backend in backends:  # loading and the first call happen one backend at a time
            workers[backend] = Worker(backend, model_dir, prompts_file, args)
        for turn in range(max(args.repeats, args.mindformers_repeats)):
            order = backends[turn % len(backends):] + backends[:turn % len(backends)]
            for backend in order:
                limit = args.mindformers_repeats if backend == "mindformers" else args.repeats
                if len(workers[backend].runs) < limit:
                    workers[backend].run()
        for backend, w in workers.items():
            results[backend] = w.finish()
    except RuntimeError as err:
        print(f"  failed: {err}", file=sys.stderr)
    finally:
        for w in workers.values():
            if w.proc.poll() is None:
                w.proc.kill()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["tiny", "small"], choices=["tiny", "small"])
    parser.add_argument("--backends", nargs="+", default=["native", "native-plain", "mindformers", "hf"],
                        choices=BACKENDS)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--length-mix", choices=["full", "ragged"], default="full",
                        help="full: every completion to the limit; ragged: long-tailed lengths (module docstring)")
    parser.add_argument("--repeats", type=int, default=5, help="timed rollouts per backend, interleaved")
    parser.add_argument("--mindformers-repeats", type=int, default=1,
                        help="timed repeats for the (slow, cache-less) mindformers backend")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for every framework (torch.set_num_threads, MindSpore's CPU kernel threads); "
                             "default: each framework's own choice")
    parser.add_argument("--worker", choices=BACKENDS, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--prompts-file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0

    backends = [b for b in args.backends if b != "hf" or hf_available()]
    if "hf" in args.backends and "hf" not in backends:
        print("(torch/transformers not importable: Hugging Face column skipped)")
    with tempfile.TemporaryDirectory(prefix="bench_rollout_") as tmp:
        prompts = gsm8k_prompts(args.prompts, 100, 200, seed=0)
        prompts_file = Path(tmp) / "prompts.json"
        prompts_file.write_text(json.dumps(prompts))
        print(f"workload: {args.prompts} prompts (lengths {sorted(map(len, prompts))}) x {args.n} samples x "
              f"{args.max_tokens} new tokens ({args.length_mix}), temperature 1, fp32, {os.cpu_count()} cores, "
              f"threads: {args.threads or 'framework defaults'}, load average {os.getloadavg()[0]:.1f}")
        failed = False
        for size in args.sizes:
            model_dir = write_model(Path(tmp) / size, SIZES[size])
            results = measure(backends, model_dir, prompts_file, args)
            failed |= len(results) != len(backends)
            print(f"\n{size}:")
            print(f"  {'backend':<18}{'tokens/s':>10}{'best s':>9}{'median s':>10}{'first call s':>14}"
                  f"{'peak RSS MiB':>14}  lengths (first call)")
            for backend, r in results.items():
                if r:
                    print(f"  {backend:<18}{r['tokens_per_s']:>10}{r['seconds']:>9}{r['median_s']:>10}"
                          f"{r['first_call_s']:>14}{r['peak_rss_mib']:>14}  {r['lengths']}")
            native = results.get("native")
            for name in ("native", "native-plain", "native-nocompact"):
                if results.get(name):
                    print(f"  {name} per step: {results[name]['graph_ms_per_step']} ms in graphs, "
                          f"{results[name]['host_ms_per_step']} ms on the host (sampling, loop, transfers); "
                          f"{results[name]['decode_steps']} decode steps, {results[name]['decode_columns']} "
                          f"decode columns")
                    r = results[name]
                    print(f"  {name} decoding against its limits: {r['decode_graph_s']} s in the decode graphs; "
                          f"reading the weights and live KV cache once per step at the copy bandwidth "
                          f"({r['copy_bandwidth_gb_s']} GB/s) takes {r['decode_memory_bound_s']} s "
                          f"({r['decode_of_memory_bound']:.0%} of the bound; "
                          f"KV cache {r['decode_kv_share_of_bytes']:.0%} "
                          f"of the bytes), model FLOP utilisation {r['decode_mfu']:.0%} of "
                          f"{r['matmul_peak_gflops']} GFLOP/s")
            for other, target in (("hf", TARGET_NATIVE_OVER_HF), ("native-plain", None), ("mindformers", None)):
                if native and results.get(other):
                    ratio = native["tokens_per_s"] / results[other]["tokens_per_s"]
                    verdict = ("" if target is None else
                               f"  (target >= {target}: {'met' if ratio >= target else 'MISSED'})")
                    print(f"  native / {other}: {ratio:.2f}x{verdict}")
            baseline = results.get("native-nocompact")
            if native and baseline:
                print(f"  native / native-nocompact (same tokens): rollout time "
                      f"{native['seconds'] / baseline['seconds']:.2f}x, decode columns "
                      f"{native['decode_columns'] / baseline['decode_columns']:.2f}x, tokens/s "
                      f"{native['tokens_per_s'] / baseline['tokens_per_s']:.2f}x")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
