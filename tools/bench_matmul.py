#!/usr/bin/env python
"""Matmul micro-benchmark: the `small` model's products in every phase of a GRPO step, per layout, in MindSpore,
torch, numpy and oneDNN.

The reference forward and the training step of `small` (hidden 512, 8 layers, 2 KV heads, intermediate 1408, vocabulary
4,096; `tools/benchlib.py::SMALL`) multiply every weight as ``x [rows, in] @ W[out, in]^T`` (``MatMul(transpose_b)``
in ``Qwen2Blocks._linear_rows``); the backward of that product is ``dx = dy @ W`` (no transpose) and
``dW = dy^T @ x`` (``transpose_a``). This tool times exactly those shapes, at the benchmark's batch (4 prompts x 8
completions, prompts padded to ``--prompt-width``, reference rows ``4 P + 32 T``, update micro-batches of two groups,
``2 P + 16 T``, vocabulary projected at the completion positions only), for three layouts of the same linear layer:

    xWt   today: y = x W^T (NT), dx = dy W (NN), dW = dy^T x (TN), W stored [out, in]
    xW    weights stored [in, out]: y = x W (NN), dx = dy W^T (NT), dW = x^T dy (TN)
    WxT   feature-major activations: yT = W xT (NN), dxT = W^T dyT (TN), dW = dyT xT^T (NT)

and for the fused products a layer could use instead of separate ones: q|k|v as one [768, 512] weight and gate|up
as one [2816, 512] weight. The rollout's products are forward only: the prefill in the layout it runs, row-major
like the reference (``xWt``: the 4 padded prompts' rows, the vocabulary at each prompt's last token), and a decode
step in every layout (the engine runs ``WxT``, feature-major: ``W[out, in] @ xT[in, B]``, ``FusedDecodeGraph``),
B = `--decode-rows` live rows (32: the whole batch; compaction makes it 8 or 16 as rows finish; more rows per step is
what decoding more prompts at once, `rl_config.steps_per_generation`, gives). Decoding a token is thin products
(B = 32 against 512-2,816 features): a kernel that runs them far below its large-matrix rate makes the rollout slow,
as MindSpore 2.9's CPU MatMul did on an Intel Xeon.

Backends, all timed in one process and interleaved (each round runs every case on every backend back to back; rounds
are repeated and medians taken), so that a background load shifts all of them alike:

    ms-graph     MindSpore GRAPH mode, a Cell holding ``ops.MatMul(transpose_a, transpose_b)`` (what the trainer runs)
    ms-pynative  the same primitive called eagerly
    torch        ``torch.mm`` on transposed views (torch's threads: ``--torch-threads``)
    numpy        ``np.matmul`` on transposed views (OpenBLAS)
    onednn-1t    MindSpore's own ``libdnnl.so.3`` called directly on one thread, timed by that thread's CPU time:
                 the kernel's efficiency per core, which a background load does not change

Each line gives GFLOP/s (median and best over rounds) and the median over rounds of the ratio to the peak measured in
the same round (MindSpore GRAPH, 1024^3 without transposes, as ``benchlib.matmul_peak_gflops``). For MindSpore it
also gives GFLOP per CPU-second of the whole process (both of its kernel threads; a waiting thread that spins counts),
and a last block sums each layout over the layer's matmuls per phase (reference: forward only; update: forward,
dx and dW), as time per phase and GFLOP/s.

    python tools/bench_matmul.py [--tokens 64 512] [--rounds 5] [--backends ms-graph ms-pynative torch numpy onednn-1t]
                                 [--decode-rows 8 32 128] [--json out.json]
    python tools/bench_matmul.py --backends ms-graph torch --rounds 3      # the step's shapes, MindSpore vs torch

(64 tokens, all backends, 5 rounds: about 4 minutes on 2 cores; 512 tokens with ms-graph, onednn-1t and numpy,
3 rounds: about 6 minutes.)

The kernel path is printed first: MindSpore 2.9's CPU ``MatMul``/``BatchMatMul`` run oneDNN's ``brg_matmul`` (set
``ONEDNN_VERBOSE=1`` to see every call) on MindSpore's thread pool (``runtime:threadpool``), with as many threads as
cores (``ms.device_context.cpu.op_tuning.threads_num`` does not change that count: ``--ms-threads``,
``--cpu-affinity`` try MindSpore's thread settings; each process prints its threads).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import REPO, SMALL, cpu_model  # noqa: E402

PROMPTS, GENERATIONS, MICRO_GROUPS = 4, 8, 2  # tools/bench_grpo.py: 4 x 8 per step, micro-batches of 2 groups
LAYOUTS = ("xWt", "xW", "WxT")
# The layout each phase runs today (qwen2_blocks.py: `_linear_rows` in the prefill and the training forwards, the
# feature-major fused decode step); the rollout's phases are timed in that layout only, forward only.
STEP_LAYOUT = {"prefill": "xWt", "decode": "WxT", "reference": "xWt", "update": "xWt"}
PEAK = "peak 1024^3 NN"
# role -> (operand a is transposed, operand b is transposed) and (m, k, n) in terms of rows r, in i, out o
ROLES = {
    "xWt": {"fwd": ("NT", "r i o"), "dx": ("NN", "r o i"), "dW": ("TN", "o r i")},
    "xW": {"fwd": ("NN", "r i o"), "dx": ("NT", "r o i"), "dW": ("TN", "i r o")},
    "WxT": {"fwd": ("NN", "o i r"), "dx": ("TN", "i o r"), "dW": ("NT", "o r i")},
}


@dataclass(frozen=True)
class Case:
    """One product ``[m, k] @ [k, n]``; ``trans`` says which operands are stored transposed (``TN``: a is [k, m])."""
    phase: str  # reference | update (or peak)
    linear: str  # q, kv, o, gate, down, lm_head, qkv, gate_up
    layout: str
    role: str  # fwd | dx | dW
    m: int
    k: int
    n: int
    trans: str  # NN, NT, TN

    @property
    def flops(self) -> int:
        return 2 * self.m * self.k * self.n

    @property
    def label(self) -> str:
        shape = f"{self.m}x{self.k}x{self.n}"
        return f"{self.phase:9s} {self.linear:7s} {self.layout:4s} {self.role:3s} {self.trans} {shape}"


def linears(cfg: dict) -> Dict[str, Tuple[int, int, int]]:
    """name -> (out, in, uses per layer) of the decoder's weight products; lm_head counts once (per layer 0)."""
    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    kv = cfg["num_key_value_heads"] * h // cfg["num_attention_heads"]
    return {"q": (h, h, 1), "kv": (kv, h, 2), "o": (h, h, 1), "gate": (i, h, 2), "down": (h, i, 1),
            "lm_head": (cfg["vocab_size"], h, 0), "qkv": (h + 2 * kv, h, 0), "gate_up": (2 * i, h, 0)}


def phase_rows(tokens: int, prompt_width: int, decode_rows: Tuple[int, ...] = (PROMPTS * GENERATIONS,)
               ) -> Dict[str, Tuple[int, int]]:
    """phase -> (decoder rows, vocabulary rows): the prefill (each padded prompt once, the vocabulary at its last
    token), a decode step of B live rows (`decode` for the whole batch, `decode B` for others), the shared-prompt
    forward over all 32 rows (reference) or one micro-batch of two groups (update); the training forwards project
    the vocabulary at completion positions only."""
    ref_groups, upd_groups = PROMPTS, MICRO_GROUPS
    decode = {("decode" if b == PROMPTS * GENERATIONS else f"decode {b}"): (b, b) for b in decode_rows}
    return {"prefill": (PROMPTS * prompt_width, PROMPTS), **decode,
            "reference": (ref_groups * prompt_width + ref_groups * GENERATIONS * tokens,
                          ref_groups * GENERATIONS * tokens),
            "update": (upd_groups * prompt_width + upd_groups * GENERATIONS * tokens,
                       upd_groups * GENERATIONS * tokens)}


def model_cases(tokens: int, prompt_width: int, cfg: dict = SMALL, only: Optional[List[str]] = None,
                decode_rows: Tuple[int, ...] = (PROMPTS * GENERATIONS,)) -> List[Case]:
    """Every distinct product of the phases, per layout: the update's forward, dx and dW, the other phases'
    forward; the prefill in the layout it runs only (it is the reference forward's layout on fewer rows)."""
    cases = []
    for phase, (rows, vocab_rows) in phase_rows(tokens, prompt_width, decode_rows).items():
        for name, (out, inp, _) in linears(cfg).items():
            if only and name not in only:
                continue
            r = vocab_rows if name == "lm_head" else rows
            for layout in ((STEP_LAYOUT[phase],) if phase == "prefill" else LAYOUTS):
                for role, (trans, order) in ROLES[layout].items():
                    if phase != "update" and role != "fwd":
                        continue
                    dims = {"r": r, "i": inp, "o": out}
                    m, k, n = (dims[c] for c in order.split())
                    cases.append(Case(phase, name, layout, role, m, k, n, trans))
    return cases


def phase_totals(cases: List[Case], seconds: Dict[Case, float], cfg: dict = SMALL) -> List[dict]:
    """Time of the weight products per phase (layers x uses per layer, plus lm_head; the update runs
    ``PROMPTS // MICRO_GROUPS`` micro-batches; a decode phase is one decoding step) per layout and fusion choice."""
    uses = {name: u for name, (_, _, u) in linears(cfg).items()}
    layers = cfg["num_hidden_layers"]
    out = []
    for phase in dict.fromkeys(c.phase for c in cases):
        micro_batches = PROMPTS // MICRO_GROUPS if phase == "update" else 1
        for layout in LAYOUTS:
            for fused in (False, True):
                counts = dict(uses, lm_head=1)  # per layer, except lm_head: once per forward
                if fused:
                    counts.update(q=0, kv=0, gate=0, qkv=1, gate_up=1)
                timed = [c for c in cases if c.phase == phase and c.layout == layout and c in seconds]
                if {name for name, n in counts.items() if n} - {c.linear for c in timed}:
                    continue  # some product of this choice was not timed (--linears)
                total = flops = 0.0
                for case in timed:
                    n = micro_batches * counts[case.linear] * (1 if case.linear == "lm_head" else layers)
                    total += n * seconds[case]
                    flops += n * case.flops
                out.append({"phase": phase, "layout": layout, "fused_qkv_gate_up": fused,
                            "seconds": round(total, 4), "gflops": round(flops / total / 1e9, 1)})
    return out


# ----------------------------------------------------------------------------------------------------- backends
def _operands(case: Case, rng: np.random.Generator) -> Tuple[np.ndarray, np.ndarray]:
    a_shape = (case.k, case.m) if case.trans[0] == "T" else (case.m, case.k)
    b_shape = (case.n, case.k) if case.trans[1] == "T" else (case.k, case.n)
    return (rng.standard_normal(a_shape, dtype=np.float32), rng.standard_normal(b_shape, dtype=np.float32))


def _views(case: Case, a, b):
    """The [m, k] and [k, n] operands as transposed views where the case stores them transposed."""
    return (a.T if case.trans[0] == "T" else a), (b.T if case.trans[1] == "T" else b)


def mindspore_backend(graph: bool) -> Callable[[Case, np.ndarray, np.ndarray], Callable[[], object]]:
    import mindspore as ms
    from mindspore import Tensor, nn, ops

    ms.set_context(mode=ms.GRAPH_MODE)  # eager primitive calls still run op by op (PyNative) in this context

    class Product(nn.Cell):
        def __init__(self, trans_a: bool, trans_b: bool):
            super().__init__()
            self.matmul = ops.MatMul(transpose_a=trans_a, transpose_b=trans_b)

        def construct(self, a, b):
            return self.matmul(a, b)

    cells: Dict[str, object] = {}

    def make(case: Case, a: np.ndarray, b: np.ndarray):
        ta, tb = Tensor(a), Tensor(b)
        if case.trans not in cells:
            flags = (case.trans[0] == "T", case.trans[1] == "T")
            cells[case.trans] = Product(*flags) if graph else ops.MatMul(transpose_a=flags[0], transpose_b=flags[1])
        fn = cells[case.trans]

        def run():
            return fn(ta, tb)
        return run

    make.sync = lambda out: out.asnumpy()  # type: ignore[attr-defined]
    return make


def torch_backend(threads: int):
    import torch

    torch.set_num_threads(threads)

    def make(case: Case, a: np.ndarray, b: np.ndarray):
        ta, tb = _views(case, torch.from_numpy(a), torch.from_numpy(b))
        return lambda: torch.mm(ta, tb)
    make.sync = lambda out: None  # type: ignore[attr-defined]
    return make


def numpy_backend():
    def make(case: Case, a: np.ndarray, b: np.ndarray):
        va, vb = _views(case, a, b)
        return lambda: np.matmul(va, vb)
    make.sync = lambda out: None  # type: ignore[attr-defined]
    return make


class OneDNN:
    """MindSpore's bundled oneDNN called through its C API with no thread pool: one thread, the calling one."""
    SRC, WEIGHTS, DST, CPU, F32 = 1, 33, 17, 1, 3

    class Arg(ctypes.Structure):
        _fields_ = [("arg", ctypes.c_int), ("memory", ctypes.c_void_p)]

    def __init__(self):
        import mindspore as ms

        self.lib = ctypes.CDLL(os.path.join(os.path.dirname(ms.__file__), "lib", "libdnnl.so.3"))
        self.engine, self.stream = ctypes.c_void_p(), ctypes.c_void_p()
        self._check(self.lib.dnnl_engine_create(ctypes.byref(self.engine), self.CPU, 0))
        self._check(self.lib.dnnl_stream_create(ctypes.byref(self.stream), self.engine, 1))

    @staticmethod
    def _check(status: int) -> None:
        if status != 0:
            raise RuntimeError(f"oneDNN C API call failed with status {status}")

    def _desc(self, rows: int, cols: int, transposed: bool):
        """[rows, cols] logical, stored row-major or (transposed) column-major."""
        dims = (ctypes.c_int64 * 2)(rows, cols)
        strides = (ctypes.c_int64 * 2)(*((1, rows) if transposed else (cols, 1)))
        desc = ctypes.c_void_p()
        self._check(self.lib.dnnl_memory_desc_create_with_strides(ctypes.byref(desc), 2, dims, self.F32, strides))
        return desc

    def __call__(self, case: Case, a: np.ndarray, b: np.ndarray):
        c = np.empty((case.m, case.n), np.float32)
        descs = (self._desc(case.m, case.k, case.trans[0] == "T"), self._desc(case.k, case.n, case.trans[1] == "T"),
                 self._desc(case.m, case.n, False))
        pd, prim = ctypes.c_void_p(), ctypes.c_void_p()
        self._check(self.lib.dnnl_matmul_primitive_desc_create(ctypes.byref(pd), self.engine, descs[0], descs[1],
                                                               None, descs[2], None))
        self._check(self.lib.dnnl_primitive_create(ctypes.byref(prim), pd))
        mems = []
        for desc, array in zip(descs, (a, b, c)):
            mem = ctypes.c_void_p()
            self._check(self.lib.dnnl_memory_create(ctypes.byref(mem), desc, self.engine,
                                                    array.ctypes.data_as(ctypes.c_void_p)))
            mems.append(mem)
        args = (self.Arg * 3)(self.Arg(self.SRC, mems[0]), self.Arg(self.WEIGHTS, mems[1]),
                              self.Arg(self.DST, mems[2]))
        lib, stream = self.lib, self.stream

        def run():
            self._check(lib.dnnl_primitive_execute(prim, stream, 3, args))
            self._check(lib.dnnl_stream_wait(stream))
        run.out = c  # type: ignore[attr-defined]  (the product, rewritten by every call)
        run.keep_alive = (a, b, descs, pd, prim, mems, args)  # type: ignore[attr-defined]
        return run


def onednn_backend():
    make = OneDNN()
    make.sync = lambda out: None  # type: ignore[attr-defined]
    return make


def process_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# ------------------------------------------------------------------------------------------------------- timing
def time_cases(backends: Dict[str, Callable], cases: List[Case], rounds: int, block_gflop: float,
               log=print) -> Dict[str, Dict[Case, dict]]:
    """Interleaved timing: every round runs every case once on every backend, back to back, each as a block of
    calls of about ``block_gflop``; returns per backend and case the GFLOP/s (wall; onednn-1t: per CPU-second of
    its one thread), GFLOP per CPU-second of the process and the ratios to the peak case of the same round:
    MindSpore GRAPH's (``of_peak``, the peak ``benchlib.matmul_peak_gflops`` quotes) and this backend's own
    (``of_own_peak``). Operands exist for one case at a time (at 512 tokens all of them would not fit)."""
    peak_case = Case("peak", "1024^3", "-", "-", 1024, 1024, 1024, "NN")
    rng = np.random.default_rng(0)
    samples: Dict[str, Dict[Case, dict]] = {name: {c: {"gflops": [], "cpu_gflops": [], "own": []}
                                                   for c in [peak_case] + cases} for name in backends}
    for r in range(rounds):
        start = time.perf_counter()
        for case in [peak_case] + cases:
            a, b = _operands(case, rng)
            reps = max(1, round(block_gflop * 1e9 / case.flops))
            for name, make in backends.items():
                thread_clock = name == "onednn-1t"
                fn = make(case, a, b)
                make.sync(fn())  # compiles the graph in the first round, warms caches in every round
                cpu0, t0 = (time.thread_time() if thread_clock else process_cpu_seconds()), time.perf_counter()
                for _ in range(reps):
                    out = fn()
                make.sync(out)
                wall = time.perf_counter() - t0
                cpu = (time.thread_time() if thread_clock else process_cpu_seconds()) - cpu0
                rate = case.flops * reps / 1e9
                s = samples[name][case]
                s["gflops"].append(rate / (cpu if thread_clock else wall))
                s["cpu_gflops"].append(rate / cpu if cpu > 0 else float("nan"))
                s["own"].append(s["gflops"][-1] / samples[name][peak_case]["gflops"][-1])
                del fn, out
        log(f"round {r + 1}/{rounds}: {time.perf_counter() - start:.1f} s")
    reference = "ms-graph" if "ms-graph" in samples else None
    summary: Dict[str, Dict[Case, dict]] = {}
    for name, per_case in samples.items():
        summary[name] = {}
        peaks = samples[reference][peak_case]["gflops"] if reference else samples[name][peak_case]["gflops"]
        for case, s in per_case.items():
            summary[name][case] = {"gflops": round(statistics.median(s["gflops"]), 1),
                                   "best_gflops": round(max(s["gflops"]), 1),
                                   "cpu_gflops": round(statistics.median(s["cpu_gflops"]), 1),
                                   "of_peak": round(statistics.median(g / p for g, p in zip(s["gflops"], peaks)), 3),
                                   "of_own_peak": round(statistics.median(s["own"]), 3),
                                   "seconds": case.flops / 1e9 / statistics.median(s["gflops"])}
    return summary


def kernel_path() -> str:
    """oneDNN's own description of the engine MindSpore uses (ISA, runtime, threads), from one verbose call."""
    import subprocess

    code = ("import mindgrpo, numpy as np, mindspore as ms\nfrom mindspore import Tensor, ops\n"
            "ops.MatMul(transpose_b=True)(Tensor(np.ones((64, 32), np.float32)), "
            "Tensor(np.ones((48, 32), np.float32))).asnumpy()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, ONEDNN_VERBOSE="1"), timeout=300, cwd=str(REPO)).stdout
    keep = [line.split(",", 3)[-1] for line in out.splitlines()
            if line.startswith("onednn_verbose") and (",info,cpu," in line or ",exec," in line)]
    return "\n".join(keep) or "(no oneDNN verbose output: MindSpore's MatMul did not run oneDNN)"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[64], help="new tokens per completion")
    parser.add_argument("--prompt-width", type=int, default=128, help="padded prompt width (GSM8K: one 128 bucket)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--block-gflop", type=float, default=4.0, help="work per timed block (several calls)")
    parser.add_argument("--backends", nargs="+", default=["ms-graph", "ms-pynative", "torch", "numpy", "onednn-1t"],
                        choices=["ms-graph", "ms-pynative", "torch", "numpy", "onednn-1t"])
    parser.add_argument("--torch-threads", type=int, default=2)
    parser.add_argument("--ms-threads", type=int, help="ms.device_context.cpu.op_tuning.threads_num (set first)")
    parser.add_argument("--cpu-affinity", action="store_true", help="ms.runtime.set_cpu_affinity(True)")
    parser.add_argument("--linears", nargs="+", choices=list(linears(SMALL)), help="only these products")
    parser.add_argument("--phases", nargs="+", choices=list(STEP_LAYOUT), help="only these phases")
    parser.add_argument("--decode-rows", type=int, nargs="+", default=[PROMPTS * GENERATIONS],
                        help="live rows B of the decode steps timed (default: the batch, 32)")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    args = parser.parse_args(argv)
    import mindgrpo  # noqa: F401  (quiet logging before MindSpore loads)
    if args.ms_threads or args.cpu_affinity:
        import mindspore as ms

        if args.ms_threads:
            ms.device_context.cpu.op_tuning.threads_num(args.ms_threads)
        if args.cpu_affinity:
            ms.runtime.set_cpu_affinity(True)

    print(f"CPU: {cpu_model()}; load average {os.getloadavg()[0]:.2f}")
    print("MindSpore's MatMul kernel path (ONEDNN_VERBOSE):\n" + kernel_path())
    factories = {"ms-graph": lambda: mindspore_backend(graph=True), "ms-pynative": lambda: mindspore_backend(False),
                 "torch": lambda: torch_backend(args.torch_threads), "numpy": numpy_backend,
                 "onednn-1t": onednn_backend}
    backends = {name: factories[name]() for name in args.backends}
    report = {"cpu": cpu_model(), "runs": []}
    for tokens in args.tokens:
        decode_rows = tuple(args.decode_rows)
        cases = [c for c in model_cases(tokens, args.prompt_width, only=args.linears, decode_rows=decode_rows)
                 if not args.phases or c.phase.split()[0] in args.phases]
        rows = phase_rows(tokens, args.prompt_width, decode_rows)
        print(f"\n== {tokens} new tokens, prompt width {args.prompt_width}: (decoder, vocabulary) rows {rows}")
        summary = time_cases(backends, cases, args.rounds, args.block_gflop)
        print(f"{'backend':11s} {'phase':9s} {'linear':7s} {'lay':4s} {'role':3s} tr shape"
              f"{'':14s} GF/s(med) GF/s(best) of-peak of-own GF/cpu-s")
        for name, per_case in summary.items():
            for case, s in per_case.items():
                print(f"{name:11s} {case.label:44s} {s['gflops']:8.1f} {s['best_gflops']:9.1f} "
                      f"{s['of_peak']:7.2f} {s['of_own_peak']:6.2f} {s['cpu_gflops']:8.1f}")
        print("\nweight products of one step per phase (layers x uses + lm_head; update: both micro-batches), "
              "median seconds (onednn-1t: CPU seconds of one core) and GFLOP/s:")
        totals = {}
        for name, per_case in summary.items():
            totals[name] = phase_totals(cases, {c: s["seconds"] for c, s in per_case.items()})
            for row in totals[name]:
                print(f"{name:11s} {row['phase']:9s} {row['layout']:4s} fused={str(row['fused_qkv_gate_up']):5s} "
                      f"{row['seconds']:8.3f} s {row['gflops']:7.1f} GF/s")
        print_step_products(summary, cases)
        print(f"threads of this process: {thread_names()}")
        report["runs"].append({"tokens": tokens, "prompt_width": args.prompt_width, "cases": [
            {"backend": name, **asdict(case), **{k: v for k, v in s.items() if k != "seconds"}}
            for name, per_case in summary.items() for case, s in per_case.items()], "phase_totals": totals})
    if args.json:
        tmp = args.json.with_suffix(args.json.suffix + ".tmp")
        tmp.write_text(json.dumps(report, indent=1))
        tmp.replace(args.json)
    return 0


def print_step_products(summary: Dict[str, Dict[Case, dict]], cases: List[Case]) -> None:
    """The products a GRPO step runs (each phase in its STEP_LAYOUT), one line each, every backend's median GFLOP/s
    side by side: where MindSpore's kernel falls behind torch's on this CPU, and at which shapes."""
    names = list(summary)
    print("\nthe step's products (prefill and decode: the rollout; update: forward, dx, dW), median GFLOP/s:")
    print(f"{'phase':9s} {'linear':7s} {'role':4s} {'[m, k] @ [k, n]':22s} " + " ".join(f"{n:>11s}" for n in names))
    for case in cases:
        if case.layout != STEP_LAYOUT[case.phase.split()[0]]:
            continue
        shape = f"[{case.m}, {case.k}] @ [{case.k}, {case.n}]"
        print(f"{case.phase:9s} {case.linear:7s} {case.role:4s} {shape:22s} "
              + " ".join(f"{summary[n][case]['gflops']:11.1f}" for n in names))


def thread_names() -> Dict[str, int]:
    """Name -> count of this process's threads (MindSpore's kernels run on ActorThread_* and KernelThread_*)."""
    names: Dict[str, int] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
        except OSError:
            continue
        names[name] = names.get(name, 0) + 1
    return names


if __name__ == "__main__":
    sys.exit(main())
