#!/usr/bin/env python
"""What isolation costs a python-tool call: its wall time in the bwrap sandbox (namespaces, a file system of its
own, the seccomp filter) against the process sandbox (the interpreter with limits and an audit hook, isolating
nothing: what the python tool ran before issue 46), and against a calculator call.

Two measures, each variant called in turn within every repeat (interleaved: load on the machine falls on all alike),
the median over `--repeats` reported:
- a call as a rollout makes it: ToolRunner.run([ToolCall(...)]) through a warm tool worker process (the first call,
  which starts the worker, is not counted), for `calculator("6 * 7")`, `python("print(6 * 7)")` in each sandbox;
- the sandbox alone (Sandbox.run in this process), for `print(6 * 7)` and `import numpy` (the python tool's usual
  heavy import: 0.1 s of loading that no sandbox can save).

Prints the CPU model, how busy the machine was (other processes' share of its CPU time while this ran), one line
per measure, the ratios bwrap / process and python-in-bwrap / calculator, and the lines as JSON last.

    python tools/bench_sandbox.py [--repeats 30]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

from benchlib import OthersCpu, cpu_model

PROGRAMS = {"print": "print(6 * 7)", "numpy": "import numpy\nint(numpy.arange(10).sum())"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()

    from mindgrpo.tools import SandboxLimits, ToolCall, ToolRunner, resolve_tools, sandbox_for

    sandboxes = {mode: sandbox_for(mode) for mode in ("process", "bwrap")}
    for mode, sandbox in sandboxes.items():
        problem = sandbox.problem()
        if problem:
            raise SystemExit(f"the {mode} sandbox cannot run here: {problem}")
    runners = {"calculator": (ToolRunner(resolve_tools(["calculator"]), 1, 30), ToolCall("calculator",
                                                                                        {"expression": "6 * 7"}))}
    for mode, sandbox in sandboxes.items():
        runners[f"python ({mode})"] = (ToolRunner(resolve_tools(["python"], sandbox), 1, 30),
                                       ToolCall("python", {"code": PROGRAMS["print"]}))
    seconds = {name: [] for name in runners}
    seconds.update({f"{mode} sandbox, {program}": [] for program in PROGRAMS for mode in sandboxes})
    try:
        for runner, call in runners.values():  # starts each worker
            assert runner.run([call])[0].text == "42"
        with OthersCpu() as others:
            for _ in range(args.repeats):
                for name, (runner, call) in runners.items():
                    start = time.perf_counter()
                    runner.run([call])
                    seconds[name].append(time.perf_counter() - start)
                for program, code in PROGRAMS.items():
                    for mode, sandbox in sandboxes.items():
                        start = time.perf_counter()
                        result = sandbox.run(code, SandboxLimits())
                        seconds[f"{mode} sandbox, {program}"].append(time.perf_counter() - start)
                        assert result.ok, result.text()
    finally:
        for runner, _ in runners.values():
            runner.close()
    ms = {name: round(statistics.median(values) * 1e3, 2) for name, values in seconds.items()}
    ratios = {"bwrap / process, a call": ms["python (bwrap)"] / ms["python (process)"],
              "bwrap / process, sandbox alone, print": ms["bwrap sandbox, print"] / ms["process sandbox, print"],
              "bwrap / process, sandbox alone, numpy": ms["bwrap sandbox, numpy"] / ms["process sandbox, numpy"],
              "python in bwrap / calculator, a call": ms["python (bwrap)"] / ms["calculator"]}
    print(f"CPU: {cpu_model()}; other processes used {others.share:.0%} of it meanwhile; median of {args.repeats}")
    for name, value in ms.items():
        print(f"  {name:<28} {value:8.2f} ms")
    for name, value in ratios.items():
        print(f"  {name:<40} {value:6.2f}x")
    added = round(ms["python (bwrap)"] - ms["python (process)"], 2)
    print(f"  isolation adds {added:.2f} ms to a python call")
    print(json.dumps({"cpu": cpu_model(), "others_cpu_share": others.share, "repeats": args.repeats, "ms": ms,
                      "ratios": {k: round(v, 3) for k, v in ratios.items()}, "added_ms": added}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
