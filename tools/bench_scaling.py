#!/usr/bin/env python
"""The scaling table: mindgrpo against TRL from 64 to 1,024 new tokens, full and ragged lengths, in one command.

    bash tools/make_trl_venv.sh trlenv                    # TRL's interpreter, once
    python tools/bench_scaling.py --vs-trl trlenv/bin/python --idle-wait 20    # 1-2 hours on 2 cores
    python tools/bench_scaling.py --sizes tiny --mixes full --new-tokens 64 --steps 1 0 --repeats 1 --smoke \
        --vs-trl trlenv/bin/python --out output/scaling_smoke                  # does everything run? (minutes)

Grid: tiny at 64, 256, 512 and 1,024 new tokens and `small` at 64, 256 and 512, each with every completion at the
limit (`full`) and with long-tailed lengths (`ragged`: median about a quarter of the limit, the top 10 % at it);
see tools/bench_grpo.py for the settings and tools/length_mix.py for the model copies (calibrated on first use,
then cached in `--model-cache`). Each setting runs `--repeats` (default 2) mindgrpo and TRL processes, alternating
(mindgrpo, TRL, TRL, mindgrpo, ...; which goes first alternates from setting to setting), and the table gives the
median over the repeats; `STEPS` gives each setting's steps: one or two warm-up steps, then 4 counted steps (at
least 4 is the rule: `--steps` refuses fewer). On a machine shared with other work, `--idle-wait 20`
makes each process wait (up to 20 minutes) until the CPUs are idle: TRL's OpenMP threads slow down many times over
when other processes compete for the cores, far more than mindgrpo's, so a table measured under load overstates
the ratios. The table shows the share of the CPUs that other processes used during each run.

Outputs, in `--out` (default docs/scaling):
    scaling.md    the table below, with the CPU model, its load, the commit measured and the command (paths
                  outside the clone replaced by placeholders, so the files can be committed)
    scaling.json  every run's JSON line and every comparison, per setting, with its wall time
    scaling.png   tokens/s against new tokens, one panel per size: both frameworks, full (solid) and ragged (dashed)

Table columns: seconds per step and tokens/s of each framework, their ratio (and the setting's target), the share of
each of mindgrpo's phases (rollout / reference / update / other) and of TRL's generate call, peak RSS of each (and
the ratio), the completion lengths each sampled (median / p90 / share at the limit) and mindgrpo's model FLOP
utilisation per phase. `--from-json scaling.json` writes the table and the plot again without running anything.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

import bench_grpo
from benchlib import REPO, bench_assets, cpu_model

GRID = [("tiny", 64), ("tiny", 256), ("tiny", 512), ("tiny", 1024), ("small", 64), ("small", 256), ("small", 512)]
MIXES = ("full", "ragged")
# (steps, warm-up steps) per (size, new tokens): 4 counted steps after the warm-up (two at 64 tokens, where the
# first steps are the noisiest part of a short run).
MIN_COUNTED = 4
STEPS = {("tiny", 64): (6, 2), ("tiny", 256): (5, 1), ("tiny", 512): (5, 1), ("tiny", 1024): (5, 1),
         ("small", 64): (6, 2), ("small", 256): (5, 1), ("small", 512): (5, 1)}
REPEATS = 2  # alternating processes per framework and setting
DEFAULT_OUT = REPO / "docs" / "scaling"


# ----------------------------------------------------------------------------------------------- outputs
def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _lengths(run: Dict) -> str:
    stats = run.get("lengths") or {}
    return f"{stats['median']:g} / {stats['p90']:g} / {stats['at_limit']:.0%}" if stats else "-"


def _load(run: Dict) -> str:
    others = run.get("others_cpu_share")
    return ("" if others is None else f"{others:.0%}, ") + f"load {run.get('load_average', float('nan')):.1f}"


def table_peak(settings: List[Dict]) -> float:
    """The highest float32 matmul peak any mindgrpo run of the table measured. Each run measures the peak for a
    second or two as it starts, and a short measurement can come out low (it varied from 180 to 390 GFLOP/s over
    one table), which would overstate that run's MFU: every MFU in the table is quoted against this one peak."""
    peaks = [r["matmul_peak_gflops"] for s in settings for r in s["runs"]["mindgrpo"] if r.get("matmul_peak_gflops")]
    return max(peaks, default=0.0)


def table_rows(settings: List[Dict]) -> List[List[str]]:
    rows = []
    peak = table_peak(settings)
    for s in settings:
        ours, peer, cmp_ = s["runs"]["mindgrpo"], s["runs"]["trl"], s.get("comparison") or {}
        o = bench_grpo.summary(ours) if ours else {}
        p = bench_grpo.summary(peer) if peer else {}

        def num(d: Dict, key: str, fmt: str) -> str:
            return format(d[key], fmt) if d.get(key) is not None else "-"

        ratio = cmp_.get("tokens_per_sec_ratio")
        mark = "" if ratio is None else (" ok" if ratio >= cmp_["target_tokens_per_sec_ratio"] else " **below**")
        shares = (" / ".join(f"{o[f'share_{k}']:.0%}" for k in ("rollout", "reference", "update", "other"))
                  if o else "-")
        mfu = "-"
        if ours and ours[0].get("mfu_phases") and peak:  # the first run's, against the table's peak
            mfu = " / ".join(f"{v * ours[0]['matmul_peak_gflops'] / peak:.0%}"
                             for v in ours[0]["mfu_phases"].values())
        rss_ratio = cmp_.get("peak_rss_mib_ratio")
        rows.append([
            s["size"], str(s["max_new_tokens"]), s["length_mix"],
            num(o, "sec_per_step", ".2f"), num(p, "sec_per_step", ".2f"),
            num(o, "tokens_per_sec", ",.0f"), num(p, "tokens_per_sec", ",.0f"),
            "-" if ratio is None else f"**{ratio:.2f}x** ({cmp_['target_tokens_per_sec_ratio']:g}x{mark})",
            shares, "-" if p.get("gen_fraction") is None else f"{p['gen_fraction']:.0%}",
            f"{num(o, 'peak_rss_mib', ',.0f')} / {num(p, 'peak_rss_mib', ',.0f')}"
            + ("" if rss_ratio is None else f" ({rss_ratio:.2f}x)"),
            _lengths(ours[0]) if ours else "-", _lengths(peer[0]) if peer else "-", mfu,
            f"{s['steps'] - s['warmup']} x {len(ours)} / {len(peer)}",
            " / ".join(_load(r) for r in ours + peer)])
    return rows


HEADER = ["size", "new tokens", "mix", "s/step mindgrpo", "s/step TRL", "tokens/s mindgrpo", "tokens/s TRL",
          "tokens/s ratio (target)", "mindgrpo rollout / ref / update / other", "TRL generate",
          "peak RSS MiB mindgrpo / TRL", "lengths mindgrpo (median / p90 / at limit)", "lengths TRL",
          "mindgrpo MFU rollout / ref / update", "counted steps x runs (mindgrpo / TRL)",
          "other processes' CPU share during / 1-min load after each run (mindgrpo / TRL)"]


def _process_minutes(report: Dict) -> float:
    """Minutes spent running benchmark processes (the rest: calibration, waiting for idle CPUs)."""
    return sum(r.get("process_s", 0) for s in report["settings"] for runs in s["runs"].values() for r in runs) / 60


def _trl_versions(report: Dict) -> str:
    versions = next((r["versions"] for s in report["settings"] for r in s["runs"]["trl"] if r.get("versions")), None)
    return ", ".join(f"{k} {v}" for k, v in versions.items()) if versions else "-"


def markdown(report: Dict) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(report["settings"])]
    notes = [f"Command: `{report['command']}`; code: {report.get('code', 'unknown')}"
             + (f"; {report['note']}" if report.get("note") else ""),
             f"Prompts: {report.get('prompts', 'GSM8K train')}; TRL: {_trl_versions(report)}",
             f"Machine: {report['machine']}; load before / after: "
             f"{report['load_before']} / {report.get('load_after', '-')}; "
             f"{report.get('seconds', 0) / 60:.0f} minutes, of which {_process_minutes(report):.0f} in benchmark "
             "processes" + ("" if report.get("complete") else " (incomplete)"),
             "Lengths are completion tokens including EOS (median / 90th percentile / share at the limit) over the "
             "counted steps of the first run. MFU: model FLOPs of the tokens actually sampled against the "
             f"highest float32 matmul peak measured in any run of the table ({table_peak(report['settings'])} "
             "GFLOP/s; see table_peak)."]
    return "\n".join(lines) + "\n\n" + "\n\n".join(notes) + "\n"


def plot(report: Dict, path: Path) -> Path:
    """tokens/s against new tokens, one panel per size (matplotlib's object-oriented API, no pyplot)."""
    from matplotlib.figure import Figure

    from mindgrpo.apps.plotting import save_figure

    sizes = list(dict.fromkeys(s["size"] for s in report["settings"]))
    fig = Figure(figsize=(5.2 * len(sizes), 4.2), layout="constrained")
    axes = fig.subplots(1, len(sizes), squeeze=False)[0]
    colors = {"mindgrpo": "tab:blue", "trl": "tab:orange"}
    for ax, size in zip(axes, sizes):
        for framework, label in (("mindgrpo", "mindgrpo"), ("trl", "TRL")):
            for mix, style, marker in (("full", "-", "o"), ("ragged", "--", "s")):
                points = sorted((s["max_new_tokens"], bench_grpo.summary(s["runs"][framework])["tokens_per_sec"])
                                for s in report["settings"] if s["size"] == size and s["length_mix"] == mix
                                and s["runs"][framework])
                if points:
                    ax.plot(*zip(*points), style, marker=marker, color=colors[framework], label=f"{label}, {mix}",
                            markerfacecolor="white" if mix == "ragged" else colors[framework])
        ax.set_xscale("log", base=2)
        ticks = sorted({s["max_new_tokens"] for s in report["settings"] if s["size"] == size})
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_xlabel("max new tokens")
        ax.set_ylabel("tokens/s (prompt + completion)")
        ax.set_ylim(bottom=0)
        ax.set_title(f"{size}: 4 prompts x 8 completions per step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save_figure(fig, path)


def write_outputs(report: Dict, out: Path) -> None:
    _write_atomic(out / "scaling.json", json.dumps(report, indent=1))
    _write_atomic(out / "scaling.md", markdown(report))
    if any(s["runs"]["mindgrpo"] or s["runs"]["trl"] for s in report["settings"]):
        plot(report, out / "scaling.png")


# ----------------------------------------------------------------------------------------------- run
def portable_command(argv: List[str]) -> str:
    """The command as it is recorded in the committed files: a path inside the clone relative to it, any other
    absolute path as a placeholder (`<TRL python>` for --vs-trl's, else `<name>`), so no machine path is kept."""
    words, previous = ["python", "tools/bench_scaling.py"], ""
    for arg in argv:
        flag, prefix, value = previous, "", arg
        if arg.startswith("--") and "=" in arg:
            flag, value = arg.split("=", 1)
            prefix = flag + "="
        if value.startswith("/"):
            path = Path(os.path.abspath(value))
            if path.is_relative_to(REPO):
                value = str(path.relative_to(REPO))
            else:
                value = "<TRL python>" if flag == "--vs-trl" else f"<{path.name}>"
        words.append(prefix + value)
        previous = arg
    return shlex.join(words)


def resumable(path: Path, args: argparse.Namespace) -> Dict[tuple, Dict]:
    """The finished settings of an earlier run in `path`, keyed by (size, new tokens, mix, steps, warm-up)."""
    if not path.exists():
        return {}
    done = {}
    for s in json.loads(path.read_text())["settings"]:
        if s["runs"]["mindgrpo"] and (s["runs"]["trl"] or not args.vs_trl):
            done[(s["size"], s["max_new_tokens"], s["length_mix"], s["steps"], s["warmup"])] = s
    return done


def code_version() -> str:
    """The measured checkout's commit, and whether it had local changes (read-only git calls)."""
    def git(*cmd: str) -> str:
        done = subprocess.run(["git", "-C", str(REPO), *cmd], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD")
    return f"{commit}{' with local changes' if git('status', '--porcelain') else ''}" if commit else "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="folder for scaling.md/.json/.png (%(default)s)")
    parser.add_argument("--sizes", nargs="+", default=["tiny", "small"], choices=["tiny", "small"])
    parser.add_argument("--mixes", nargs="+", default=list(MIXES), choices=MIXES)
    parser.add_argument("--new-tokens", type=int, nargs="+", choices=sorted({t for _, t in GRID}),
                        help="only these completion limits of the grid")
    parser.add_argument("--from-json", metavar="SCALING_JSON", help="only write the table and plot of a past run")
    parser.add_argument("--note", default="", help="a line for the table's notes (what code was measured, say)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the settings an interrupted run already wrote to --out/scaling.json")
    parser.add_argument("--steps", type=int, nargs=2, metavar=("STEPS", "WARMUP"),
                        help="the same steps and warm-up steps for every setting instead of STEPS; fewer than "
                             f"{MIN_COUNTED} counted steps only with --smoke")
    parser.add_argument("--smoke", action="store_true",
                        help="a quick check that everything runs (allows --steps 1 0 and --repeats 1); its table "
                             "is no measurement")
    bench_grpo.add_run_options(parser)
    parser.set_defaults(repeats=REPEATS)
    args = parser.parse_args()
    if args.steps and args.steps[0] - args.steps[1] < MIN_COUNTED and not args.smoke:
        parser.error(f"--steps {args.steps[0]} {args.steps[1]} counts {args.steps[0] - args.steps[1]} steps: a row "
                     f"of the table needs at least {MIN_COUNTED} (add --smoke for a quick check)")
    if args.vs_trl and args.repeats < REPEATS and not args.smoke:
        parser.error(f"--repeats {args.repeats}: a row of the table needs at least {REPEATS} alternating runs per "
                     "framework (add --smoke for a quick check)")
    out = Path(args.out)
    if args.from_json:
        report = json.loads(Path(args.from_json).read_text())
        write_outputs(report, out)
        print(markdown(report))
        return 0
    if not bench_grpo.check_inputs(args.vs_trl):
        return 2
    grid = [(size, tokens, mix) for size, tokens in GRID if size in args.sizes for mix in args.mixes
            if not args.new_tokens or tokens in args.new_tokens]
    start = time.perf_counter()
    report = {"command": portable_command(sys.argv[1:]), "machine": cpu_model(), "code": code_version(),
              "note": ("smoke run, not a measurement; " if args.smoke else "") + args.note,
              "prompts": bench_assets(Path(args.model_cache)).source,
              "load_before": [round(x, 2) for x in os.getloadavg()], "settings": [], "complete": False}
    for size, tokens, mix in grid:  # calibrate every model copy first, so the timings below exclude it
        bench_grpo.setting_model(size, mix, tokens, Path(args.model_cache))
    report["calibration_s"] = round(time.perf_counter() - start, 1)
    print(f"model copies ready in {report['calibration_s']} s", flush=True)
    done = resumable(out / "scaling.json", args) if args.resume else {}
    if done:
        report.update(resumed_seconds=sum(s["wall_s"] for s in done.values()),
                      load_before=json.loads((out / "scaling.json").read_text())["load_before"])
    failed = False
    with tempfile.TemporaryDirectory(prefix="bench_scaling_") as tmp:
        for i, (size, tokens, mix) in enumerate(grid):
            setting_args = copy.copy(args)
            setting_args.steps, setting_args.warmup = args.steps or STEPS[(size, tokens)]
            if (size, tokens, mix, setting_args.steps, setting_args.warmup) in done:
                report["settings"].append(done[(size, tokens, mix, setting_args.steps, setting_args.warmup)])
                continue
            began = time.perf_counter()
            result = bench_grpo.compare(size, tokens, mix, setting_args, Path(tmp), trl_first=i % 2 == 1)
            failed |= not result["runs"]["mindgrpo"] or bool(args.vs_trl and not result["runs"]["trl"])
            report["settings"].append({"size": size, "max_new_tokens": tokens, "length_mix": mix,
                                       "steps": setting_args.steps, "warmup": setting_args.warmup,
                                       "wall_s": round(time.perf_counter() - began, 1), **result})
            report["seconds"] = round(time.perf_counter() - start + report.get("resumed_seconds", 0), 1)
            write_outputs(report, out)
    report.update(complete=True, load_after=[round(x, 2) for x in os.getloadavg()])
    write_outputs(report, out)
    print(markdown(report), flush=True)
    print(f"wrote {out / 'scaling.md'}, {out / 'scaling.json'}, {out / 'scaling.png'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
