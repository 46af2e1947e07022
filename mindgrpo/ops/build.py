"""Compile the C++ CPU kernels once each and cache their shared libraries.

Three libraries: the fused GRPO loss (``grpo_token_loss_cpu.cc``), the native rollout's decode step
(``decode_step_cpu.cc``) and the vocabulary head's log-probs (``head_logprobs_cpu.cc``, linked to the oneDNN library
MindSpore ships, whose GEMM it calls). A library lives in ``mindgrpo._env.cache_dir()/kernels`` under a name that carries a
hash of its source, the shared headers next to it, the compiler's identity and the exact command line, so an edited
source, another compiler or other flags give a new file and a stale library is never loaded. ``build.sh`` runs
this ahead of time (``python -m mindgrpo.ops``); otherwise the first use compiles it (a few seconds with g++ 12).
The compiler writes to a temporary file in the cache folder that is then renamed, so concurrent processes never see
half a library.

Environment: ``CXX`` picks the compiler (default ``g++``); ``MINDGRPO_CACHE`` moves the cache (see ``_env``).
Libraries of older sources are left in place (another checkout may still use them); deleting the folder is safe.
"""
from __future__ import annotations

import functools
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import mindgrpo  # noqa: F401  (configures logging before anything imports MindSpore)
from mindgrpo import _env

KERNEL_DIR = Path(__file__).resolve().parent / "kernels"
CPU_SOURCE = KERNEL_DIR / "grpo_token_loss_cpu.cc"
DECODE_STEP_SOURCE = KERNEL_DIR / "decode_step_cpu.cc"
HEAD_LOGPROBS_SOURCE = KERNEL_DIR / "head_logprobs_cpu.cc"
# -O3 vectorises the per-element loops (the exp is written to vectorise); OpenMP splits rows over the threads each
# kernel asks for (the loss kernel stays single-threaded below ~32k tokens per thread; the head kernel's chunks of
# vocabulary rows always use them).
CXXFLAGS = ("-std=c++17", "-O3", "-fno-trapping-math", "-fPIC", "-shared", "-fopenmp", "-Wall")
COMPILE_TIMEOUT_S = 300


@dataclass(frozen=True)
class Kernel:
    """A C++ source compiled into one library: the setting that runs without it (for the error when it cannot be
    built), and whether it links oneDNN (the head kernel calls ``dnnl_sgemm`` from MindSpore's own libdnnl)."""
    source: Path
    without: str
    onednn: bool = False


KERNELS = {kernel.source.name: kernel for kernel in (
    Kernel(CPU_SOURCE, "Set rl_config.loss_impl: plain (LossConfig(loss_impl='plain')) to run without it."),
    Kernel(DECODE_STEP_SOURCE, "Set generate_config.decode_impl: plain to run without it."),
    Kernel(HEAD_LOGPROBS_SOURCE, "Set actor_config.head_impl: plain to run without it.", onednn=True),
)}
SOURCES = tuple(kernel.source for kernel in KERNELS.values())


def _without(source: Path) -> str:
    """How to run without the kernel built from ``source``, for the error when it cannot be built."""
    return KERNELS[source.name].without


class KernelBuildError(RuntimeError):
    """The C++ kernel could not be compiled; the message holds the exact command and the compiler's output."""


def _compiler(source: Path) -> str:
    cxx = os.environ.get("CXX", "g++")
    path = shutil.which(cxx)
    if path is None:
        raise KernelBuildError(
            f"C++ compiler {cxx!r} not found (set CXX, or install g++); it is needed once to build {source.name}. "
            f"{_without(source)}")
    return path


@functools.lru_cache(maxsize=None)
def _compiler_identity(cxx: str) -> str:
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60, check=False).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KernelBuildError(f"could not run {cxx} --version: {exc}") from exc
    return out.splitlines()[0] if out else cxx


def _link_flags(source: Path) -> list[str]:
    """A oneDNN kernel links the copy MindSpore ships (the library its CPU MatMul runs on, already loaded in the
    process), found next to MindSpore's own libraries."""
    if not KERNELS[source.name].onednn:
        return []
    libs = sorted((Path(_mindspore_dir()) / "lib").glob("libdnnl.so*"))
    if not libs:
        raise KernelBuildError(f"no libdnnl.so in {Path(_mindspore_dir()) / 'lib'} (MindSpore's CPU build ships it); "
                               f"{_without(source)}")
    return [f"-L{libs[0].parent}", f"-l:{libs[0].name}", f"-Wl,-rpath,{libs[0].parent}"]


def _mindspore_dir() -> str:
    """MindSpore's package folder, found without importing it (``doctor`` reads this module on a broken install)."""
    import importlib.util

    spec = importlib.util.find_spec("mindspore")
    if spec is None or not spec.submodule_search_locations:
        raise KernelBuildError("MindSpore is not installed")
    return list(spec.submodule_search_locations)[0]


def _command(cxx: str, source: Path, output: Path) -> list[str]:
    return [cxx, *CXXFLAGS, str(source), "-o", str(output), *_link_flags(source)]


def cpu_library_path(source: Path | None = None) -> Path:
    """Where the library for ``source`` (default: the fused loss), its headers, the compiler and flags lives (it may
    not exist yet)."""
    source = Path(source or CPU_SOURCE)
    cxx = _compiler(source)
    digest = hashlib.sha256()
    digest.update(source.read_bytes())
    for header in sorted(source.parent.glob("*.h")):
        digest.update(header.name.encode() + header.read_bytes())
    # The output path is left out of the key: it depends on the key.
    digest.update(shlex.join(_command(cxx, source, Path("OUT"))).encode())
    digest.update(_compiler_identity(cxx).encode())
    digest.update(platform.machine().encode())
    return Path(_env.cache_dir()) / "kernels" / f"{source.stem}-{digest.hexdigest()[:16]}.so"


def build_cpu_kernel(source: Path | None = None, force: bool = False) -> Path:
    """Compile ``source`` (default: the fused loss) if its cached library is missing (or ``force``); return the
    library path."""
    source = Path(source or CPU_SOURCE)
    target = cpu_library_path(source)
    if target.exists() and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.stem}-", suffix=".so.tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    cmd = _command(_compiler(source), source, tmp)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S, check=False)
        if proc.returncode != 0:
            raise KernelBuildError(
                f"compiling {source.name} failed (exit {proc.returncode}).\n"
                f"command: {shlex.join(cmd)}\nstderr:\n{proc.stderr.strip() or '(empty)'}")
        os.chmod(tmp, 0o755)  # mkstemp makes it private; a shared MINDGRPO_CACHE must be loadable by others
        os.replace(tmp, target)
    except subprocess.TimeoutExpired as exc:
        raise KernelBuildError(f"compiler timed out after {COMPILE_TIMEOUT_S}s.\ncommand: {shlex.join(cmd)}") from exc
    finally:
        tmp.unlink(missing_ok=True)
    return target
