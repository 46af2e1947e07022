#!/usr/bin/env python
"""Benchmark the rollout backends: generated tokens/s of `native` and `mindformers`, beside Hugging Face `generate`.

Backends: ``native`` (the KV-cache engine on its fused CPU decode kernels), ``native-plain`` (the same engine on
the plain-ops decode graph, ``generate_config.decode_impl: plain``), ``mindformers`` and Hugging Face ``hf``.

Workload (GRPO's): 4 GSM8K-like prompts (100-200 tokens; real GSM8K prompts when ../shared has the data and
the fixture tokenizer, random ids otherwise) x 8 samples = 32 sequences x 64 new tokens, temperature 1,
``min_tokens = max_tokens`` so every backend generates exactly the same number of tokens. Models: the tiny
fixture (../shared/fixtures/tiny-qwen2.5) and a random Qwen2 `small` (hidden 512, 8 layers, 8 heads, 2 KV heads,
intermediate 1408, vocab 4096, as in ../shared/peer/trl_grpo_bench.py), written once as a Hugging Face folder so
every framework loads the same weights.

Each (model, backend) runs in its own process, so the peak RSS column is that backend's alone. The first call
(graph compilation, HF warm-up) is reported separately; then the backends' timed rollouts are interleaved, so on
a shared machine they see the same load, and tokens/s comes from each backend's fastest run (the least disturbed,
as in tools/bench_data.py; the median time is printed too). The mindformers backend gets one timed run by default:
it recomputes the whole sequence per token and takes minutes on `small`. For the native backend, one more run
splits a decoding step into time inside the compiled graphs and time on the host. Ratios are
taken within this run: native / HF generate (target >= 2) and native / mindformers. The HF column is skipped
when torch or transformers is missing.

    python tools/bench_rollout.py [--sizes tiny small] [--backends native native-plain mindformers hf] [--repeats 5]
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from benchlib import EOS, FIXTURE, PAD, peak_rss_mib, write_small_model
from benchlib import GSM8K_TRAIN as GSM8K

TARGET_NATIVE_OVER_HF = 2.0
BACKENDS = ["native", "native-plain", "mindformers", "hf"]


# ----------------------------------------------------------------------------------------------- setup
def gsm8k_prompts(count: int, low: int, high: int, seed: int) -> List[List[int]]:
    """The first `count` GSM8K train prompts whose token length lies in [low, high]; random ids without the data."""
    try:
        import mindgrpo  # noqa: F401
        from mindgrpo.data import read_gsm8k, render_prompt
        from mindgrpo.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(FIXTURE)
        encoded = (tokenizer.encode(render_prompt("gsm8k_hash", row.question)) for row in read_gsm8k(GSM8K))
        prompts = list(itertools.islice((p for p in encoded if low <= len(p) <= high), count))
        if len(prompts) == count:
            return prompts
    except (OSError, ValueError, ImportError) as err:
        print(f"(GSM8K prompts unavailable: {err}; using random token ids)", file=sys.stderr)
    rng = np.random.default_rng(seed)
    return [rng.integers(0, PAD - 1, size=int(n)).tolist() for n in np.linspace(low + 12, high - 9, count)]


# ----------------------------------------------------------------------------------------------- workers
# A worker loads one backend, runs the first (compiling / warming-up) call, then answers "run" lines on stdin
# with one timed rollout each, so the driver can interleave backends: on a shared machine the load changes from
# minute to minute, and interleaved runs see the same conditions.
REPLY = "BENCH "  # prefix of the worker's answers (libraries may print to stdout too)


def mindgrpo_rollout(backend: str, model_dir: str, prompts: List[List[int]], n: int, max_tokens: int,
                     threads: Optional[int]) -> Tuple[Callable[[], int], Callable[[], Dict[str, float]]]:
    import mindgrpo  # noqa: F401  (before mindspore)
    import mindspore as ms
    from mindgrpo.models import build_model
    from mindgrpo.rollout import SamplingParams, build_rollout_engine

    if threads:
        ms.device_context.cpu.op_tuning.threads_num(threads)
    ms.set_context(mode=ms.GRAPH_MODE)
    actor = build_model(model_dir)
    # "native-plain": the native engine on the plain-ops decode graph, the fused kernels' reference twin
    options = {"decode_impl": "plain"} if backend == "native-plain" else {}
    engine = build_rollout_engine(backend.split("-")[0], actor, eos_token_id=EOS, pad_token_id=PAD,
                                  max_prompt_length=max(map(len, prompts)), max_batch_size=len(prompts) * n,
                                  **options)
    params = SamplingParams(max_tokens=max_tokens, min_tokens=max_tokens, temperature=1.0, n=n, seed=0)
    details = (lambda: native_loop_split(engine, prompts, params)) if backend.startswith("native") else dict
    return (lambda: engine.generate(prompts, params).num_tokens), details


def native_loop_split(engine, prompts: List[List[int]], params) -> Dict[str, float]:
    """Split one more native rollout into time inside the compiled graphs and time on the host (sampling, the
    Python decode loop, tensor transfers), per decoding step."""
    bucket = engine.bucket_for([p for p in prompts for _ in range(params.n)], params.max_tokens)
    in_graphs = [0.0]

    def timed(cell):
        def call(*args):
            start = time.perf_counter()
            out = cell(*args)
            out.asnumpy()  # wait for the graph to finish
            in_graphs[0] += time.perf_counter() - start
            return out
        return call

    bucket.prefill, bucket.decode = timed(bucket.prefill), timed(bucket.decode)
    start = time.perf_counter()
    engine.generate(prompts, params)
    total = time.perf_counter() - start
    return {"graph_ms_per_step": round(in_graphs[0] / params.max_tokens * 1e3, 2),
            "host_ms_per_step": round((total - in_graphs[0]) / params.max_tokens * 1e3, 2)}


def hf_rollout(model_dir: str, prompts: List[List[int]], n: int, max_tokens: int,
               threads: Optional[int]) -> Tuple[Callable[[], int], Callable[[], Dict[str, float]]]:
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

    def generate() -> int:
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                                 top_p=1.0, max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                                 num_return_sequences=n, pad_token_id=PAD, eos_token_id=EOS)
        return int((out[:, width:] != PAD).sum())

    return generate, lambda: {"torch_threads": torch.get_num_threads()}


def worker(args: argparse.Namespace) -> None:
    prompts = json.loads(Path(args.prompts_file).read_text())
    if args.worker == "hf":
        rollout, details = hf_rollout(args.model_dir, prompts, args.n, args.max_tokens, args.threads)
    else:
        rollout, details = mindgrpo_rollout(args.worker, args.model_dir, prompts, args.n, args.max_tokens,
                                            args.threads)

    def reply(**fields) -> None:
        print(REPLY + json.dumps(fields), flush=True)

    start = time.perf_counter()
    tokens = rollout()
    reply(first_call_s=time.perf_counter() - start, tokens=tokens)
    for command in sys.stdin:
        if command.strip() == "run":
            start = time.perf_counter()
            tokens = rollout()
            reply(seconds=time.perf_counter() - start, tokens=tokens)
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
               str(prompts_file), "--n", str(args.n), "--max-tokens", str(args.max_tokens)]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        self.backend = backend
        self.log = tempfile.TemporaryFile("w+")  # a file, not a pipe: a chatty library cannot block the worker
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.first = self._read()
        self.runs: List[float] = []

    def _read(self) -> Dict:
        for line in self.proc.stdout:
            if line.startswith(REPLY):
                return json.loads(line[len(REPLY):])
        self.log.seek(0)
        raise RuntimeError(f"{self.backend} worker exited ({self.proc.wait()}):\n{self.log.read()[-3000:]}")

    def run(self) -> None:
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        self.runs.append(self._read()["seconds"])

    def finish(self) -> Dict:
        self.proc.stdin.write("stop\n")
        self.proc.stdin.flush()
        final = self._read()
        self.proc.wait()
        best = min(self.runs)
        return {**final, "first_call_s": round(self.first["first_call_s"], 2), "tokens": self.first["tokens"],
                "seconds": round(best, 3), "median_s": round(statistics.median(self.runs), 3),
                "tokens_per_s": round(self.first["tokens"] / best, 1)}


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
              f"{args.max_tokens} new tokens, temperature 1, fp32, {os.cpu_count()} cores, threads: "
              f"{args.threads or 'framework defaults'}, load average {os.getloadavg()[0]:.1f}")
        failed = False
        for size in args.sizes:
            if size == "tiny" and not FIXTURE.exists():
                print(f"tiny: fixture {FIXTURE} not found, skipped")
                continue
            model_dir = FIXTURE if size == "tiny" else write_small_model(Path(tmp) / "small")
            results = measure(backends, model_dir, prompts_file, args)
            failed |= len(results) != len(backends)
            print(f"\n{size}:")
            print(f"  {'backend':<12}{'tokens/s':>10}{'best s':>9}{'median s':>10}{'first call s':>14}"
                  f"{'peak RSS MiB':>14}")
            for backend, r in results.items():
                if r:
                    print(f"  {backend:<12}{r['tokens_per_s']:>10}{r['seconds']:>9}{r['median_s']:>10}"
                          f"{r['first_call_s']:>14}{r['peak_rss_mib']:>14}")
            native = results.get("native")
            for name in ("native", "native-plain"):
                if results.get(name):
                    print(f"  {name} per step: {results[name]['graph_ms_per_step']} ms in graphs, "
                          f"{results[name]['host_ms_per_step']} ms on the host (sampling, loop, transfers)")
            for other, target in (("hf", TARGET_NATIVE_OVER_HF), ("native-plain", None), ("mindformers", None)):
                if native and results.get(other):
                    ratio = native["tokens_per_s"] / results[other]["tokens_per_s"]
                    verdict = ("" if target is None else
                               f"  (target >= {target}: {'met' if ratio >= target else 'MISSED'})")
                    print(f"  native / {other}: {ratio:.2f}x{verdict}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
