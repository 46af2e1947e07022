"""``python -m mindgrpo doctor``: check this machine, and optionally a config, before a long run.

    python -m mindgrpo doctor                                     # the machine
    python -m mindgrpo doctor --config grpo.yaml [--actor_checkpoint_path ...] [group.key=value ...]
    python -m mindgrpo doctor --master_port 8119 --worker_num 8 --json
    python -m mindgrpo doctor --config grpo.yaml --worker_num 8 --device-memory 64GB   # and whether it fits

One line per check, ``ok``, ``info``, ``warn`` or ``FAIL``, then its name and what was found; a failed check adds a
``fix:`` line with the command or setting that fixes it. The exit code is 1 when any check FAILs, else 0.

Checks: Python and the pinned packages against mindgrpo's own requirements (the checkout's setup.py, else the
installed package metadata: one source of truth), the device MindSpore sees, the fused loss op (compiled into the
cache if needed, then run once against the plain-ops twin), the native rollout's decode kernels (likewise, against
numpy), msrun on PATH, the msrun master port (a port held by
another job, say a leftover scheduler or a Ray head, stops a launch with "address already in use"), writable
cache and output folders, which of the python tool's sandboxes run here, and with ``--config``: the values, every
input path, the batch sizes, the parallel layout and the rollout backend, exactly as the trainer will see them.
"""
from __future__ import annotations

import argparse
import ast
import importlib.metadata
import json
import os
import platform
import shutil
import socket
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, List, Optional, Sequence, Tuple

import mindgrpo
from mindgrpo import _env
from mindgrpo.ops.ascend import ASCEND_ONLY, vllm_installed

MSRUN_DEFAULT_PORT = 8118  # msrun's own default --master_port
PINNED = ("mindspore", "numpy")  # reported on their own lines; other requirements share one
# examples/grpo/main.py fills in the model and data of its embedded demo only when run without --config.
DEMO = "; the embedded demo needs neither: python examples/grpo/main.py"
_REPO = Path(mindgrpo.__file__).resolve().parents[1]


@dataclass
class Check:
    status: str   # "ok", "info", "warn" or "FAIL"
    name: str
    detail: str
    fix: str = ""


# ----------------------------------------------------------------------------------------------------------------
# Environment

def requirements() -> Tuple[str, List[str], str]:
    """(python_requires, install_requires, where they came from): the checkout's setup.py when running from a
    checkout (the installed metadata may be older), else the installed distribution's metadata."""
    setup_py = _REPO / "setup.py"
    if setup_py.is_file():
        for node in ast.walk(ast.parse(setup_py.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "setup":
                kwargs = {k.arg: k.value for k in node.keywords}
                try:
                    return (ast.literal_eval(kwargs["python_requires"]),
                            list(ast.literal_eval(kwargs["install_requires"])), str(setup_py))
                except (KeyError, ValueError):
                    break
    meta = importlib.metadata.metadata("mindgrpo")
    reqs = [r for r in importlib.metadata.requires("mindgrpo") or [] if "extra ==" not in r]
    return meta.get("Requires-Python", ""), reqs, "installed mindgrpo metadata"


def check_versions() -> Iterator[Check]:
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    try:
        python_requires, install_requires, source = requirements()
    except importlib.metadata.PackageNotFoundError:
        yield Check("warn", "requirements", "no setup.py next to mindgrpo and no installed metadata",
                    "pip install -e /path/to/mindgrpo")
        return
    version = platform.python_version()
    ok = SpecifierSet(python_requires).contains(version, prereleases=True)
    yield Check("ok" if ok else "FAIL", "python", f"{version} ({sys.executable}); supported {python_requires}",
                "" if ok else f"use a Python {python_requires}, e.g. pyenv install 3.11 && pyenv local 3.11")
    others: List[str] = []
    for text in install_requires:
        req = Requirement(text)
        try:
            found = importlib.metadata.version(req.name)
        except importlib.metadata.PackageNotFoundError:
            found = None
        good = found is not None and req.specifier.contains(found, prereleases=True)
        fix = "" if good else f'pip install "{text}"'
        if req.name in PINNED:
            yield Check("ok" if good else "FAIL", req.name,
                        f"{found or 'not installed'}; supported {req.specifier or 'any'}", fix)
        elif not good:
            others.append(f"{req.name} {found or 'missing'} (need {req.specifier or 'any'})")
    fix = "pip install " + " ".join(f'"{t}"' for t in install_requires if Requirement(t).name not in PINNED)
    yield (Check("FAIL", "other requirements", "; ".join(others), fix) if others else
           Check("ok", "other requirements", f"{len(install_requires) - len(PINNED)} more as in {source}"))


COMPAT_TABLE = Path(mindgrpo.__file__).resolve().parent / "compat.json"  # written by tools/compat.py


def _version_or_none(name: str) -> Optional[str]:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _read_table(table: Path) -> Optional[dict]:
    """tools/compat.py's record, or None when it cannot be read (every row names its pair)."""
    try:
        record = json.loads(table.read_text(encoding="utf-8"))
        record["pairs"] = [dict(row) for row in record["pairs"]]
        for row in record["pairs"]:
            row["mindspore"], row["mindformers"]
        return record
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check_tested_pair(table: Path = COMPAT_TABLE) -> Check:
    """The installed MindSpore and MindFormers against the pairs tools/compat.py ran (docs/versions.md's "Tested
    with")."""
    try:
        found = (importlib.metadata.version("mindspore"), _version_or_none("mindformers"))
    except importlib.metadata.PackageNotFoundError:
        return Check("FAIL", "tested pair", "mindspore is not installed", "pip install -e .")
    record = _read_table(table)
    if found[1] is None:  # only the mindformers rollout backend needs it: judge MindSpore alone
        tested = [row for row in (record["pairs"] if record else [])
                  if row.get("passed") and row["mindspore"] == found[0]]
        return Check("ok" if tested else "warn", "tested pair",
                     f"MindSpore {found[0]}{' passed tools/compat.py' if tested else ' is not among the tested pairs'};"
                     " MindFormers is not installed (only generate_config.backend: mindformers needs it)",
                     "" if tested else f"python tools/compat.py --pairs {found[0]}:<mindformers>")
    pair = f"MindSpore {found[0]} + MindFormers {found[1]}"
    if record is None:
        return Check("warn", "tested pair", f"{pair}; no readable table of tested pairs at {table}",
                     "python tools/compat.py --write-package-table")
    rows = {(row["mindspore"], row["mindformers"]): row for row in record["pairs"]}
    row = rows.get(found)
    tested = ", ".join(f"{ms}+{mf}" for (ms, mf), r in rows.items() if r.get("passed"))
    if row is None:
        return Check("warn", "tested pair", f"{pair} is not among the tested pairs ({tested})",
                     f"install a tested pair, or check this one: python tools/compat.py --pairs {found[0]}:{found[1]}")
    when = row.get("date", record.get("date", "?"))  # each row records its run's date (older tables: the table's)
    if not row.get("passed"):
        return Check("warn", "tested pair", f"{pair} failed tools/compat.py on {when}",
                     f"see the Tested with table in docs/versions.md; tested pairs: {tested}")
    return Check("ok", "tested pair", f"{pair}: passed tools/compat.py on {when} "
                                      f"({record.get('machine', '')})")


def detect_device() -> Tuple[str, int]:
    """The device target MindSpore picks by default and how many devices of it it reports."""
    import mindspore as ms

    target = ms.get_context("device_target")
    try:
        count = int(ms.hal.device_count()) if target != "CPU" else 1
    except Exception:  # noqa: BLE001  (a driver problem: report the target anyway)
        count = 0
    return target, count


def check_device(target: str, count: int) -> Iterator[Check]:
    if target == "Ascend":
        yield Check("ok" if count else "FAIL", "device", f"Ascend, {count} device(s) visible",
                    "" if count else "check the driver with npu-smi info and ASCEND_RT_VISIBLE_DEVICES")
    elif target == "CPU":
        yield Check("ok", "device", f"CPU ({os.cpu_count()} cores); data parallel only")
        yield Check("info", "ascend-only", f"not available on CPU: {', '.join(ASCEND_ONLY)}")
    else:
        yield Check("warn", "device", f"{target}: mindgrpo targets CPU (development) and Ascend (training)",
                    "install the CPU or Ascend build of mindspore==2.9.0")


def check_decode_kernels(target: str, decode_impl: str = "fused", backend: str = "native") -> Check:
    """Compile (or find in the cache) the native rollout's fused decode kernels and run one against numpy."""
    if backend != "native" or decode_impl != "fused" or target != "CPU":
        reason = (f"the {backend} rollout backend" if backend != "native" else
                  "generate_config.decode_impl=plain" if decode_impl != "fused" else f"{target} (they are CPU only)")
        return Check("info", "decode kernels", f"not used with {reason}")
    import numpy as np

    import mindspore as ms
    from mindspore import Tensor

    from mindgrpo.ops import KernelBuildError, build_cpu_kernel
    from mindgrpo.ops.build import DECODE_STEP_SOURCE
    from mindgrpo.ops.decode_step import decode_step_ops

    fix = "install g++ (apt-get install g++) and run python -m mindgrpo.ops, or set generate_config.decode_impl=plain"
    previous_mode = ms.get_context("mode")
    try:
        library = build_cpu_kernel(DECODE_STEP_SOURCE)
        ms.set_context(mode=ms.PYNATIVE_MODE)
        x = np.random.default_rng(0).normal(size=(64, 8)).astype(np.float32)
        weight = np.linspace(0.5, 1.5, 64, dtype=np.float32)
        ours = decode_step_ops().rms_norm(Tensor(x), Tensor(weight), Tensor([1e-6], ms.float32)).asnumpy()
        diff = float(np.abs(ours - x / np.sqrt((x ** 2).mean(0) + 1e-6) * weight[:, None]).max())
    except (KernelBuildError, RuntimeError, TypeError, ValueError) as err:
        return Check("FAIL", "decode kernels", f"do not build or run: {str(err).splitlines()[0]}", fix)
    finally:
        ms.set_context(mode=previous_mode)
    if diff > 1e-4:
        return Check("FAIL", "decode kernels", f"run but RMSNorm differs from numpy by {diff:.2e}", fix)
    return Check("ok", "decode kernels", f"CPU kernels run, RMSNorm matches numpy ({diff:.1e}); {library}")


def check_head_kernel(target: str, head_impl: str = "fused") -> Check:
    """Compile (or find in the cache) the fused vocabulary head, which links MindSpore's own oneDNN, and run its
    log-probs against numpy's log-softmax."""
    if head_impl != "fused" or target != "CPU":
        reason = "actor_config.head_impl=plain" if head_impl != "fused" else f"{target} (it is CPU only)"
        return Check("info", "head kernel", f"not used with {reason}")
    import numpy as np

    import mindspore as ms
    from mindspore import Tensor

    from mindgrpo.ops import KernelBuildError, build_cpu_kernel
    from mindgrpo.ops.build import HEAD_LOGPROBS_SOURCE
    from mindgrpo.ops.head_logprobs import head_logprobs

    fix = "install g++ (apt-get install g++) and run python -m mindgrpo.ops, or set actor_config.head_impl=plain"
    rng = np.random.default_rng(0)
    hidden, weight = rng.normal(size=(5, 16)).astype(np.float32), rng.normal(size=(300, 16)).astype(np.float32)
    ids = rng.integers(0, 300, 5).astype(np.int32)
    previous_mode = ms.get_context("mode")
    try:
        library = build_cpu_kernel(HEAD_LOGPROBS_SOURCE)
        ms.set_context(mode=ms.PYNATIVE_MODE)
        ours, _ = head_logprobs(Tensor(hidden), Tensor(weight), Tensor(ids), Tensor([1.0], ms.float32), "score")
        logits = hidden @ weight.T
        top = logits.max(1, keepdims=True)
        reference = (logits - top - np.log(np.exp(logits - top).sum(1, keepdims=True)))[np.arange(5), ids]
        diff = float(np.abs(ours.asnumpy() - reference).max())
    except (KernelBuildError, RuntimeError, TypeError, ValueError) as err:
        return Check("FAIL", "head kernel", f"does not build or run: {str(err).splitlines()[0]}", fix)
    finally:
        ms.set_context(mode=previous_mode)
    if diff > 1e-4:
        return Check("FAIL", "head kernel", f"runs but its log-probs differ from numpy by {diff:.2e}", fix)
    return Check("ok", "head kernel", f"CPU kernel runs (oneDNN GEMM), log-probs match numpy ({diff:.1e}); {library}")


def check_fused_op(target: str, runs_fused: bool = True) -> Check:
    """Compile (or find in the cache) the fused loss kernel, run it once and compare it with the plain ops.
    ``runs_fused``: whether the run's loss uses the kernel (``LossConfig.runs_fused``); a broken kernel is only
    a warning for a run that never calls it (loss_impl plain, or a setting that falls back to the plain ops)."""
    import numpy as np

    import mindspore as ms
    from mindspore import Tensor

    from mindgrpo.algorithm.loss import LossConfig, plain_token_loss
    from mindgrpo.ops import KernelBuildError, build_cpu_kernel, fused_token_loss, hyper_params

    fix = ("python -m mindgrpo.ops --ascend (with CANN), or set rl_config.loss_impl=plain" if target == "Ascend"
           else "install g++ (apt-get install g++) and run python -m mindgrpo.ops, or set rl_config.loss_impl=plain")
    failed = "FAIL" if runs_fused else "warn"
    start = time.perf_counter()
    previous_mode = ms.get_context("mode")
    try:
        where = f"; {build_cpu_kernel()}" if target == "CPU" else ""
        ms.set_context(mode=ms.PYNATIVE_MODE)
        rng = np.random.default_rng(0)
        logp, old, ref = (Tensor(rng.normal(-1.0, 0.3, (4, 16)).astype(np.float32)) for _ in range(3))
        adv = Tensor(rng.normal(size=4).astype(np.float32))
        mask = Tensor((rng.random((4, 16)) > 0.2).astype(np.float32))
        cfg = LossConfig.trl(beta=0.04)
        hyper = hyper_params(cfg.beta, cfg.epsilon_low, cfg.epsilon_high, cfg.kl_estimator,
                             cfg.use_bias_correction_kl, True)
        fused = fused_token_loss(logp, old, ref, adv, mask, hyper)
        plain = plain_token_loss(logp, old, ref, adv, mask, cfg)
        diff = max(float(np.abs(f.asnumpy() - p.asnumpy()).max()) for f, p in zip(fused, plain))
    except (KernelBuildError, RuntimeError, NotImplementedError, TypeError, ValueError) as err:
        return Check(failed, "fused loss op", f"does not build or run: {str(err).splitlines()[0]}", fix)
    finally:
        ms.set_context(mode=previous_mode)
    seconds = time.perf_counter() - start
    if diff > 1e-4:
        return Check(failed, "fused loss op", f"runs but differs from the plain ops by {diff:.2e}", fix)
    return Check("ok", "fused loss op", f"{target} kernel runs, matches plain ops ({diff:.1e}), {seconds:.1f} s{where}")


def check_msrun(workers: int) -> Check:
    path = shutil.which("msrun")
    if path:
        return Check("ok", "msrun", path)
    needed = f"needed for {workers} workers" if workers > 1 else "needed for multi-worker runs"
    return Check("FAIL" if workers > 1 else "warn", "msrun", f"not on PATH; {needed}",
                 "pip install mindspore==2.9.0 (msrun comes with it) and add its bin folder to PATH")


def port_free(port: int) -> bool:
    """True when nothing holds ``port`` on any local address (a listener on 127.0.0.1 blocks the wildcard too)."""
    with socket.socket() as probe:
        # SO_REUSEADDR, as servers set it: sockets in TIME_WAIT from a finished job do not block a new one.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError:
            return False
    return True


def next_free_port(port: int, tries: int = 200) -> Optional[int]:
    return next((p for p in range(port + 1, min(65536, port + 1 + tries)) if port_free(p)), None)


def check_port(port: int, source: str) -> Check:
    if not 1 <= port <= 65535:
        return Check("FAIL", "master port", f"{port} ({source}) is not a TCP port", "--master_port 8118")
    if port_free(port):
        return Check("ok", "master port", f"{port} is free ({source})")
    free = next_free_port(port)
    return Check("FAIL", "master port",
                 f"{port} ({source}) is already in use by another process (a running or leftover msrun job, "
                 "a Ray head, another service); msrun would fail with 'address already in use'",
                 f"use --master_port {free} (msrun), MASTER_PORT={free} bash scripts/run_grpo_8p.sh ..., or "
                 f"find the holder with: ss -ltnp 'sport = :{port}'")


def _existing_ancestor(path: Path) -> Path:
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def check_writable(name: str, folder: str) -> Check:
    """Create and delete a probe file in ``folder`` or its nearest existing parent (os.access lies for root)."""
    target = Path(folder).expanduser().resolve()
    base = _existing_ancestor(target)
    try:
        if not base.is_dir():
            raise NotADirectoryError(f"{base} is a file")
        fd, probe = tempfile.mkstemp(prefix=".mindgrpo-doctor-", dir=base)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        return Check("FAIL", name, f"{target}: cannot write ({err})",
                     f"choose a writable folder, or fix permissions: chown -R $USER {base}")
    free_gib = shutil.disk_usage(base).free / 2**30
    status = "warn" if free_gib < 1 else "ok"
    return Check(status, name, f"{target} ({free_gib:.0f} GiB free)",
                 "free some disk space or choose another folder" if status == "warn" else "")


# ----------------------------------------------------------------------------------------------------------------
# Config

def _one_line(text: str) -> str:
    return "; ".join(part.strip(" -") for part in str(text).splitlines() if part.strip(" -"))


def check_paths(config) -> Iterator[Check]:
    """Every input path of the config: set when required, present, and holding what the trainer will read."""
    from mindgrpo.config import get_key, path_keys

    rl = config.rl_config
    tokenizer = config.tokenizer_dir or "/path/to/Qwen2.5"
    convert = (f"python tools/rlhf_data.py --tokenizer_dir {tokenizer} --file_path /path/to/gsm8k/train.jsonl "
               f"--output_path {rl.dataset_file or 'data/gsm8k_train.mindrecord'} --dataset_type gsm8k "
               f"--prompt_template r1_zero --max_prompt_length {rl.max_prompt_length}")
    download = "huggingface-cli download Qwen/Qwen2.5-7B --local-dir {path}, or pass --actor_checkpoint_path DIR"
    for key in path_keys("input"):
        value = get_key(config, key)
        if not value:
            if key == "actor_config.load":
                yield Check("FAIL", key, "not set: the Hugging Face Qwen2.5 folder the policy starts from",
                            "pass --actor_checkpoint_path /path/to/Qwen2.5-7B (config.json + *.safetensors)" + DEMO)
            elif key == "rl_config.dataset_file":
                yield Check("FAIL", key, "not set: the MindRecord of prompts",
                            f"convert your data: {convert}, then pass --dataset_file" + DEMO)
            continue
        path = Path(value)
        if not path.exists():
            fix = convert if key == "rl_config.dataset_file" else download.format(path=path) if key.endswith(
                ".load") else f"point {key} at an existing folder"
            yield Check("FAIL", key, f"{path}: no such file or folder", fix)
        elif key == "rl_config.dataset_file":
            index = Path(f"{path}.db")
            yield (Check("ok", key, str(path)) if index.is_file() else
                   Check("FAIL", key, f"{path} has no MindRecord index {index.name} next to it", convert))
        elif key.endswith(".load"):
            missing = [n for n in ("config.json",) if not (path / n).is_file()]
            if not any(path.glob("*.safetensors")):
                missing.append("*.safetensors")
            yield (Check("FAIL", key, f"{path} lacks {', '.join(missing)}", download.format(path=path))
                   if missing else Check("ok", key, str(path)))
        elif key == "rl_config.tokenizer_dir":
            yield _tokenizer_check(key, path)
        else:
            yield Check("ok", key, str(path))
    if not rl.tokenizer_dir and config.actor_config.load and Path(config.actor_config.load).is_dir():
        yield _tokenizer_check("tokenizer", Path(config.actor_config.load))  # rl_config.tokenizer_dir's fallback


def _tokenizer_check(name: str, folder: Path) -> Check:
    if (folder / "tokenizer.json").is_file() or all((folder / n).is_file() for n in ("vocab.json", "merges.txt")):
        return Check("ok", name, str(folder))
    return Check("FAIL", name, f"{folder} has no tokenizer.json (nor vocab.json + merges.txt)",
                 "copy the model's tokenizer files there, or set rl_config.tokenizer_dir (--tokenizer_dir)")


def check_batches(config) -> Iterator[Check]:
    """The trainer's static-shape rule (mindgrpo.config.micro_batch_problems), with the nearest size that works."""
    from mindgrpo.config import Derived, get_key, micro_batch_problems

    completions = Derived(config).completions_per_rank
    for key, problem in micro_batch_problems(config).items():
        size = get_key(config, key)
        divisors = [d for d in range(1, completions + 1) if completions % d == 0 and d <= size] or [1]
        yield Check("FAIL", "batch sizes", problem, f"{key}={divisors[-1]}")
        return
    yield Check("ok", "batch sizes", f"{completions} completions per rank per step, micro-batches of "
                f"{config.actor_config.micro_batch_size} (update) and {config.ref_config.ref_model_batch_size} (ref)")


def _model_spec(config):
    """The actor's shape from its config.json (:mod:`mindgrpo.hf_config`: no MindSpore, no MindFormers), or None
    when it cannot be read (the path check reports a missing one)."""
    from mindgrpo.hf_config import ModelConfigError, qwen2_spec, read_hf_config

    try:
        return qwen2_spec(read_hf_config(config.actor_config.load))
    except (OSError, ModelConfigError):
        return None


def check_layout(config, workers: int, device: str) -> Iterator[Check]:
    """The actor's layout, as the trainer checks it, and the reference/rollout layouts when they are set."""
    from mindgrpo.config import ConfigError, check_parallel_layout

    model = _model_spec(config)
    for group in ("actor_config", "ref_config", "generate_config"):
        layout = getattr(config, group).parallel_config
        product = layout.data_parallel * layout.model_parallel * layout.pipeline_stage
        if group != "actor_config" and product == 1:
            continue  # left at the default: the trainer does not use it
        try:
            check_parallel_layout(layout, world_size=workers, device_target=device, key=f"{group}.parallel_config",
                                  model=model)
        except ConfigError as err:
            yield Check("FAIL", f"layout {group}", _one_line(str(err).split(":", 1)[1]),
                        f"set {group}.parallel_config so data_parallel x model_parallel x pipeline_stage = "
                        f"{workers} (msrun --worker_num), with model_parallel dividing the model's heads and "
                        "vocabulary (`python -m mindgrpo plan` lists the layouts that work)")
            continue
        yield Check("ok", f"layout {group}", f"dp {layout.data_parallel} x mp {layout.model_parallel} x pp "
                    f"{layout.pipeline_stage} = {workers} worker(s) on {device}"
                    + ("" if model else " (heads/layers not checked: no readable actor config.json)"))


def check_memory(config, workers: int, device_memory: int) -> Check:
    """Whether the actor's layout fits devices of ``device_memory`` bytes, from :mod:`mindgrpo.apps.plan`."""
    from mindgrpo.hf_config import ModelConfigError, read_hf_config
    from mindgrpo.apps.plan import format_bytes, plan_layouts

    try:
        hf_config = read_hf_config(config.actor_config.load)
    except (OSError, ModelConfigError) as err:
        return Check("info", "memory", f"not planned: {_one_line(err)}")
    plan = plan_layouts(config, workers, device_memory, hf_config)
    layout = config.actor_config.parallel_config
    ours = next((lay for lay in plan["layouts"] if lay["data_parallel"] == layout.data_parallel
                 and lay["model_parallel"] == layout.model_parallel and layout.pipeline_stage == 1), None)
    if ours is None:
        return Check("info", "memory", "not planned: the layout above is not one the trainer runs")
    where = f"dp {layout.data_parallel} x mp {layout.model_parallel} on {format_bytes(device_memory)} devices"
    if ours["fits"]:
        return Check("ok", "memory", f"{where}: {format_bytes(ours['bytes']['total'])} per rank, within the "
                     f"{format_bytes(plan['budget'])} budget (python -m mindgrpo plan for the breakdown)")
    rec = plan["recommended"]
    fix = (f"actor_config.parallel_config.data_parallel={rec['data_parallel']} "
           f"actor_config.parallel_config.model_parallel={rec['model_parallel']} (the smallest model_parallel that "
           "fits; python -m mindgrpo plan --config ... --device-memory ... shows every layout)" if rec else
           plan["advice"][0])
    return Check("FAIL", "memory", f"{where} cannot fit: {ours['why_not']}", fix)


def check_backend(config, device: str) -> Iterator[Check]:
    gen, rl = config.generate_config, config.rl_config
    if gen.backend == "vllm":
        if device != "Ascend":
            yield Check("FAIL", "rollout backend", f"vllm needs Ascend NPUs; this run is on {device}",
                        "generate_config.backend=native (or run on an Ascend host)")
        elif not vllm_installed():
            yield Check("FAIL", "rollout backend", "vllm selected but vllm-mindspore is not installed",
                        'pip install "mindgrpo[ascend]"')
        else:
            yield Check("ok", "rollout backend", "vllm (vllm-mindspore installed)")
        yield Check("warn", "vllm backend", "never run by mindgrpo: written against vllm-mindspore's API; only its "
                    "weight resharding (training TP -> vLLM TP) is tested, on CPU. Treat the first run as a bring-up",
                    "generate_config.backend=native is the tested rollout engine")
    else:
        yield Check("ok", "rollout backend", gen.backend)
    dtypes = {config.actor_config.compute_dtype, config.ref_config.compute_dtype}
    if device == "CPU" and "bfloat16" in dtypes:
        yield Check("warn", "compute dtype", "bfloat16 compute on CPU is untested (it is the Ascend recipe's dtype)",
                    "actor_config.compute_dtype=float32 ref_config.compute_dtype=float32")
    if rl.device_target not in ("auto", device):
        yield Check("FAIL", "device target", f"rl_config.device_target = {rl.device_target}, but MindSpore sees "
                    f"{device} here", f"run on an {rl.device_target} host, or set rl_config.device_target=auto")


def check_tool_sandboxes(config=None) -> Iterator[Check]:
    """Which of the python tool's sandboxes run on this machine. The one a config's python tool uses
    (``rl_config.tool_sandbox``) FAILs where it cannot run, as the run would refuse to start; ``bwrap``, the
    default, warns."""
    from mindgrpo.tools.registry import SANDBOXES, sandbox_for

    rl = config.rl_config if config is not None else None
    chosen = rl.tool_sandbox if rl is not None and "python" in rl.tools else None
    for mode in SANDBOXES:
        sandbox = sandbox_for(mode, rl.tool_sandbox_url if rl is not None else "")
        problem = sandbox.problem()
        status = "ok" if not problem else "FAIL" if mode == chosen else "warn" if mode == "bwrap" else "info"
        yield Check(status, f"tool sandbox {mode}", _one_line(problem or sandbox.describe()))


def check_config(config_path, overrides, flags):
    """Load and validate (values only; paths are checked one by one later). A generator of Checks that returns
    the config, or None when it does not load. Value problems are reported each on its own line, and the later
    checks still run on the loaded config, so one doctor run lists everything to fix."""
    from mindgrpo.config import ConfigError, load_config, validate

    source = config_path or "the overrides"
    try:
        config = load_config(config_path, overrides, flags)
    except ConfigError as err:
        missing = config_path is not None and not Path(config_path).expanduser().is_file()
        yield Check("FAIL", "config", _one_line(err), "pass an existing yaml, e.g. --config "
                    "examples/grpo/grpo_demo.yaml" if missing else f"edit {source} (python -m mindgrpo "
                    "config-help lists every key)")
        return None
    try:
        validate(config, check_paths=False)
    except ConfigError as err:
        for problem in str(err).splitlines()[1:]:  # the first line is the heading, then one "  - " per problem
            yield Check("FAIL", "config value", problem.strip(" -"), f"edit {source} or override the key "
                        "(group.key=value)")
        return config
    yield Check("ok", "config", f"{config.config_path or 'defaults'} loads and its values validate")
    return config


def iter_checks(config_path: Optional[str] = None, overrides: Sequence[str] = (), flags: Optional[dict] = None, *,
                master_port: Optional[int] = None, workers: Optional[int] = None,
                device_memory: Optional[int] = None) -> Iterator[Check]:
    """Every check, in order, as it completes (the op compile can take seconds; callers print as they go)."""
    config = None
    if config_path is not None or overrides or flags:
        config = yield from check_config(config_path, overrides, flags)
    yield from check_versions()
    yield check_tested_pair()
    device, count = detect_device()
    yield from check_device(device, count)
    if config is not None:
        yield check_fused_op(device, config.rl_config.runs_fused)
    else:
        yield check_fused_op(device)
    generate = config.generate_config if config else None
    yield check_decode_kernels(device, generate.decode_impl if generate else "fused",
                               generate.backend if generate else "native")
    yield check_head_kernel(device, config.actor_config.head_impl if config else "fused")
    layout = config.actor_config.parallel_config if config else None
    world = workers or (layout.data_parallel * layout.model_parallel * layout.pipeline_stage if layout else 1)
    yield check_msrun(world)
    if master_port is None:
        env_port = os.environ.get("MASTER_PORT")
        port, source = (int(env_port), "$MASTER_PORT") if env_port and env_port.isdigit() else (
            MSRUN_DEFAULT_PORT, "msrun's default; --master_port to check another")
    else:
        port, source = master_port, "--master_port"
    yield check_port(port, source)
    yield check_writable("cache folder", _env.cache_dir())
    yield from check_tool_sandboxes(config)
    if config is None:
        yield check_writable("output folder", "output")  # rl_config.output_dir's default, relative to the cwd
        return
    yield check_writable("rl_config.output_dir", config.rl_config.output_dir)
    yield check_writable("checkpoint folder", config.checkpoint_dir)
    yield from check_paths(config)
    yield from check_batches(config)
    target = device if config.rl_config.device_target == "auto" else config.rl_config.device_target
    yield from check_layout(config, world, target)
    if device_memory:
        yield check_memory(config, world, device_memory)
    yield from check_backend(config, device)


def run_checks(*args, **kwargs) -> List[Check]:
    return list(iter_checks(*args, **kwargs))


def format_check(check: Check) -> str:
    line = f"{check.status:<5} {check.name:<26} {check.detail}"
    return line + (f"\n{'':5} {'':26} fix: {check.fix}" if check.fix and check.status in ("FAIL", "warn") else "")


def summary(checks: Sequence[Check]) -> str:
    counts = {s: sum(c.status == s for c in checks) for s in ("ok", "info", "warn", "FAIL")}
    return ", ".join(f"{n} {s}" for s, n in counts.items())


# ----------------------------------------------------------------------------------------------------------------
# Command line

def build_parser() -> argparse.ArgumentParser:
    from mindgrpo.config import CLI_FLAGS

    parser = argparse.ArgumentParser(prog="python -m mindgrpo doctor", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="grpo_config.yaml to check (paths, batch sizes, parallel layout, backend)")
    parser.add_argument("--master_port", type=int, help=f"msrun master port to check (default: $MASTER_PORT, "
                                                        f"else {MSRUN_DEFAULT_PORT})")
    parser.add_argument("--worker_num", type=int, help="msrun workers the run will use (default: the product of "
                                                       "actor_config.parallel_config, or 1)")
    parser.add_argument("--device-memory", "--device_memory", dest="device_memory", type=_device_memory,
                        help="memory of one device (64GB, 65536MB, bytes): with --config, check the layout fits")
    parser.add_argument("--json", action="store_true", help="print the checks as one JSON object")
    for flag, key in CLI_FLAGS.items():
        if flag == "resume_training":
            parser.add_argument("--resume_training", action="store_true", default=None, help=f"sets {key}")
        else:
            parser.add_argument(f"--{flag}", help=f"sets {key}")
    parser.add_argument("overrides", nargs="*", metavar="group.key=value", help="config overrides, as main.py")
    return parser


def _device_memory(text: str) -> int:
    from mindgrpo.apps.plan import PlanError, parse_bytes

    try:
        return parse_bytes(text)
    except PlanError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def main(argv: Optional[Sequence[str]] = None) -> int:
    from mindgrpo.config import CLI_FLAGS

    args = build_parser().parse_intermixed_args(argv)  # flags and overrides in any order
    flags = {flag: getattr(args, flag) for flag in CLI_FLAGS if getattr(args, flag) is not None}
    checks: List[Check] = []
    if not args.json:
        print(f"mindgrpo doctor: mindgrpo {mindgrpo.__version__} from {Path(mindgrpo.__file__).parent}", flush=True)
    for check in iter_checks(args.config, args.overrides, flags, master_port=args.master_port,
                             workers=args.worker_num, device_memory=args.device_memory):
        checks.append(check)
        if not args.json:
            print(format_check(check), flush=True)
    failed = any(c.status == "FAIL" for c in checks)
    if args.json:
        print(json.dumps({"ok": not failed, "summary": summary(checks), "checks": [asdict(c) for c in checks]},
                         indent=1))
    else:
        print(f"\n{summary(checks)}" + (": fix the FAIL lines above, then run the doctor again" if failed else ""))
    return 1 if failed else 0
