#!/usr/bin/env python
"""The MindSpore / MindFormers pairs mindgrpo works with: the table docs/versions.md quotes ("Tested with") and
`setup.py`'s version range follow, and `mindgrpo doctor` reads (mindgrpo/compat.json).

    python tools/compat.py [--pairs 2.10.0:1.9.0:nodeps 2.9.0:1.9.0 2.7.2:1.8.0] [--out output/compat]

Each pair MINDSPORE:MINDFORMERS gets a fresh venv (``--system-site-packages``: torch, transformers and the test tools
come from this interpreter, MindSpore and MindFormers are the venv's own), then, in order:

1. ``pip install mindspore==M mindformers==F``: the pair, with MindFormers' own requirements. A pair ending in
   ``:nodeps`` installs MindFormers with ``--no-deps``: MindSpore 2.10 has no installable MindFormers of its own
   (2.0.0 requires hyper-parallel, which is not on PyPI), and 1.9.0 pins ``mindspore~=2.9.0``;
2. ``pip install -e .``: mindgrpo with its requirements, which must keep the pair (a range that excludes it would
   make pip replace it, and the row fails);
3. the embedded demo for 3 steps (``examples/grpo/main.py``, its model from the user's cache);
4. a fixed subset of the suite (SUBSET: models with the MindFormers parity tests, algorithm, fused op, rollout, and a
   two-worker msrun run), under ``pytest -n 2``.

A pair MINDSPORE:none is a fresh machine's quick start: a venv without the system's packages, MindSpore, then
``pip install -e .`` (which must not bring MindFormers: it is the ``mindformers`` extra), then the demo for 3 steps
from an empty cache (it builds its model); no subset (the test extra pins MindFormers).

A row passes when every step does. The results go to ``<out>/compat.json`` and ``<out>/table.md``, and, with
``--write-package-table``, into ``mindgrpo/compat.json``, replacing those pairs' rows and keeping the others (each
written under a temporary name, then renamed). One pair
takes 10 to 20 minutes on 2 cores, most of it the subset and the 800 MB MindSpore wheel.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parents[1]
PACKAGE_TABLE = REPO / "mindgrpo" / "compat.json"
# MindFormers releases and the MindSpore each requires (their wheels' Requires-Dist): 2.1.0 ~=2.11.0, 2.0.0 ~=2.10.0,
# 1.9.0 ~=2.9.0, 1.8.0 ~=2.7.2, 1.7.0 ~=2.7.1 (and transformers 4.51.3, against mindgrpo's 4.57.1), 1.6.0 ~=2.7.0rc1.
# MindSpore 2.8.0 has no MindFormers release; 2.0.0 requires hyper-parallel~=1.0.0, which PyPI does not serve.
DEFAULT_PAIRS = ("2.10.0:1.9.0:nodeps", "2.9.0:1.9.0", "2.7.2:1.8.0")
SUBSET = ("tests/test_models.py", "tests/test_algorithm.py", "tests/test_fused_loss.py", "tests/test_rollout.py",
          "tests/test_faults.py::test_msrun_two_ranks_train_in_lockstep")


def _run(args: List[str], log: Path, timeout: float, cwd: Path = REPO, env: Dict[str, str] = None) -> bool:
    with open(log, "a", encoding="utf-8") as handle:
        handle.write(f"\n$ {' '.join(args)}\n")
        handle.flush()
        try:
            done = subprocess.run(args, cwd=cwd, stdout=handle, stderr=subprocess.STDOUT, timeout=timeout,
                                  env=env)
        except subprocess.TimeoutExpired:
            handle.write(f"timed out after {timeout:.0f} s\n")
            return False
    return done.returncode == 0


def _installed(python: Path, name: str) -> str:
    done = subprocess.run([str(python), "-c", f"from importlib.metadata import version; print(version({name!r}))"],
                          capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else ""


def check_pair(mindspore: str, mindformers: str, out: Path, no_deps: bool = False) -> Dict[str, object]:
    """Install the pair and mindgrpo in a fresh venv and run the checks; the table's row."""
    import venv

    name = f"ms{mindspore}-mf{mindformers}" + ("-nodeps" if no_deps else "")
    root = out / name
    log = out / f"{name}.log"
    log.write_text(f"{name}\n", encoding="utf-8")
    row: Dict[str, object] = {"mindspore": mindspore, "mindformers": mindformers, "mindformers_no_deps": no_deps,
                              "steps": {}}
    start = time.perf_counter()
    fresh = mindformers == "none"  # a fresh machine: nothing from this interpreter, no MindFormers
    if not (root / "bin" / "python").exists():
        venv.EnvBuilder(system_site_packages=not fresh, with_pip=True).create(root)
    python = root / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    env = {**os.environ, "PYTHONNOUSERSITE": "1"}
    if fresh:  # nothing cached either: the demo builds its model and tokenizer in this venv
        env["MINDGRPO_CACHE"] = str(root / "cache")
    steps = row["steps"]
    if fresh:
        steps["install pair"] = _run(pip + [f"mindspore=={mindspore}"], log, 1800, env=env)
    elif no_deps:
        steps["install pair"] = _run(pip + [f"mindspore=={mindspore}"], log, 1800, env=env) and \
            _run(pip + ["--no-deps", f"mindformers=={mindformers}"], log, 1800, env=env)
    else:
        steps["install pair"] = _run(pip + [f"mindspore=={mindspore}", f"mindformers=={mindformers}"], log, 1800,
                                     env=env)
    steps["pip install -e ."] = steps["install pair"] and _run(pip + ["-e", str(REPO)], log, 1800, env=env) and \
        (_installed(python, "mindspore"), _installed(python, "mindformers") or "none") == (mindspore, mindformers)
    if steps["pip install -e ."]:
        run_dir = root / "demo_run"
        steps["demo, 3 steps"] = _run([str(python), "examples/grpo/main.py", "rl_config.max_steps=3",
                                       f"rl_config.output_dir={run_dir}", "rl_config.save_ckpt_interval=0"],
                                      log, 1800, env=env)
    if steps["pip install -e ."] and not fresh:
        report = root / "subset.txt"
        steps["suite subset"] = _run([str(python), "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider",
                                      *SUBSET], log, 3600, env=env)
        text = log.read_text(encoding="utf-8", errors="replace")
        counts = re.findall(r"^=*\s*(\d+ (?:passed|failed).*?) in [0-9.]+s", text, re.MULTILINE)
        row["subset"] = counts[-1] if counts else ""
        report.write_text(row["subset"] + "\n", encoding="utf-8")
    row["passed"] = all(steps.values()) and len(steps) == (3 if fresh else 4)
    row["minutes"] = round((time.perf_counter() - start) / 60, 1)
    return row


def table(rows: List[Dict[str, object]], machine: str) -> str:
    lines = ["| MindSpore | MindFormers | `pip install -e .` | demo, 3 steps | suite subset | result |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        steps = row["steps"]

        def mark(step: str) -> str:
            return "-" if step not in steps else ("ok" if steps[step] else "FAILED")

        mindformers = ("not installed (a fresh machine's `pip install -e .`)" if row["mindformers"] == "none" else
                       f"{row['mindformers']}" + (" (`--no-deps`)" if row.get("mindformers_no_deps") else ""))
        lines.append(f"| {row['mindspore']} | {mindformers} | {mark('pip install -e .')} | "
                     f"{mark('demo, 3 steps')} | {row.get('subset') or mark('suite subset')} | "
                     f"{'passed' if row['passed'] else 'failed'} |")
    return "\n".join(lines) + f"\n\n{machine}; subset: {', '.join(SUBSET)}\n"


def _key(row: Dict[str, object]) -> tuple:
    return row["mindspore"], row["mindformers"], bool(row.get("mindformers_no_deps"))


def merged(shipped: Dict[str, object], record: Dict[str, object]) -> Dict[str, object]:
    """The package table with this run's rows: each replaces the same pair's row (or is added); the other pairs
    keep theirs. Every row carries the date it was run."""
    rows = {_key(row): {"date": shipped.get("date", ""), **row} for row in shipped.get("pairs", [])}
    rows.update({_key(row): {"date": record["date"], **row} for row in record["pairs"]})
    return {**record, "pairs": list(rows.values())}


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", nargs="+", default=list(DEFAULT_PAIRS), metavar="MINDSPORE:MINDFORMERS")
    parser.add_argument("--out", type=Path, default=Path("output") / "compat")
    parser.add_argument("--write-package-table", action="store_true",
                        help="also write the results to mindgrpo/compat.json, which `mindgrpo doctor` reads")
    args = parser.parse_args(argv)
    pairs = []
    for pair in args.pairs:
        if not re.fullmatch(r"\d+\.\d+\.\d+(\.post\d+)?:(\d+\.\d+\.\d+(:nodeps)?|none)", pair):
            parser.error(f"--pairs {pair!r}: write MINDSPORE:MINDFORMERS[:nodeps] or MINDSPORE:none, e.g. 2.9.0:1.9.0")
        parts = pair.split(":")
        pairs.append((parts[0], parts[1], len(parts) == 3))
    args.out.mkdir(parents=True, exist_ok=True)
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    rows = []
    for mindspore, mindformers, no_deps in pairs:
        rows.append(check_pair(mindspore, mindformers, args.out.resolve(), no_deps))
        print(f"{mindspore}:{mindformers}: {'passed' if rows[-1]['passed'] else 'failed'} "
              f"({rows[-1]['minutes']} min) {rows[-1]['steps']} {rows[-1].get('subset', '')}", flush=True)
    record = {"machine": machine, "date": time.strftime("%Y-%m-%d"), "subset": list(SUBSET), "pairs": rows}
    _write(args.out / "compat.json", json.dumps(record, indent=1) + "\n")
    _write(args.out / "table.md", table(rows, machine))
    if args.write_package_table:
        _write(PACKAGE_TABLE, json.dumps(merged(json.loads(PACKAGE_TABLE.read_text(encoding="utf-8")), record),
                                         indent=1) + "\n")
    print(table(rows, machine))
    return 0 if all(row["passed"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
