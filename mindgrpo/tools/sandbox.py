"""The ``python`` tool's sandbox: model-written code in a separate interpreter, cut off from the run.

What it does, in layers (each one alone stops some of what model-written code tries):

- **A fresh interpreter** (``python -I``: no user site, no ``PYTHON*`` variables), in its own session, in a scratch
  folder that is also its ``HOME`` and ``TMPDIR``, removed afterwards; it gets the code on stdin and nothing else
  from the trainer (a minimal environment: no tokens, no paths of the run).
- **Limits** (``resource``): CPU seconds, address space (a 10 GB allocation fails with ``MemoryError``), the size of
  any file it writes, open files, core dumps off, and, for a non-root user, one process (a fork bomb cannot start).
- **No network**: where the kernel lets it, the interpreter first moves into new user and network namespaces
  (``unshare``), which have no interface but a down loopback; in any case Python's audit hook refuses connecting,
  binding and name lookups.
- **An audit hook** (:pep:`578`), installed before the code runs and impossible to remove from Python, refuses
  starting processes (``fork``, ``exec``, ``subprocess``, ``os.system``), signalling other processes, loading
  native code (``ctypes``), and opening, listing, changing or deleting files outside the scratch folder, except
  reading the interpreter's own libraries.
- **The parent watches**: it reads at most ``output_bytes`` of output (then kills: printing megabytes costs the run
  nothing), kills the whole session at ``wall_seconds``, and the interpreter dies with the process that started it
  (``PR_SET_PDEATHSIG``).

What it does not protect against is in the README ("The python tool's sandbox"): it is not a security boundary
against code written to escape it (a C extension already importable from site-packages that starts processes or
opens files without Python's audit events, or a kernel exploit). For untrusted code at scale, run the code in an
external sandbox service instead (a user tool that posts it to one, as verl's SandboxFusion).
"""
from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass

# Runs in the sandboxed interpreter before the model's code: limits, namespaces, death with the parent, the hook.
# Then the code runs as a notebook cell would: its output, and the value of a last bare expression.
_BOOT = r'''
import ast, json, os, resource, sys
cfg = json.loads(sys.argv[1])
scratch = cfg["scratch"]
code = sys.stdin.read()
sys.stdin = open(os.devnull)
# CPU: SIGXCPU at the limit (reported as such), SIGKILL a second later if it is caught
resource.setrlimit(resource.RLIMIT_CPU, (cfg["cpu_seconds"], cfg["cpu_seconds"] + 1))
for name, value in (("RLIMIT_AS", cfg["memory_bytes"]), ("RLIMIT_FSIZE", cfg["file_bytes"]),
                    ("RLIMIT_NOFILE", 64), ("RLIMIT_CORE", 0)):
    resource.setrlimit(getattr(resource, name), (value, value))
if os.geteuid() != 0:  # root is exempt from RLIMIT_NPROC; the hook below refuses fork there too
    resource.setrlimit(resource.RLIMIT_NPROC, (1, 1))
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL: die with the process that started the sandbox
CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
    libc.unshare(CLONE_NEWNET)
del ctypes, libc
read_roots = tuple(os.path.realpath(p) for p in cfg["read_roots"]) + (scratch,)
devices = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")

def inside(path, roots):
    if isinstance(path, int):
        return True  # an already open descriptor
    try:
        path = os.path.realpath(os.fsdecode(path))
    except (TypeError, ValueError):
        return False
    return path in devices or any(path == r or path.startswith(r + os.sep) for r in roots)

DENIED = ("os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "subprocess.Popen",
          "os.kill", "os.killpg", "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "ctypes.call_function",
          "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
          "socket.gethostbyname", "socket.gethostbyaddr", "os.setuid", "os.setgid", "os.chroot", "pty.spawn",
          "sys._current_frames")
WRITES = ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.symlink", "os.link",
          "os.truncate", "os.utime", "shutil.rmtree", "shutil.copyfile", "shutil.move", "os.chdir", "os.chflags",
          "os.lchown", "os.lchmod", "os.setxattr", "os.removexattr", "os.mkfifo", "os.mknod")
READS = ("os.listdir", "os.scandir", "glob.glob", "os.listxattr", "os.getxattr")

def hook(event, args):
    if event in DENIED or event.startswith("os.exec") or event.startswith("os.spawn"):
        raise PermissionError(f"{event} is not allowed in the sandbox")
    if event == "open":
        path, mode, flags = args
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND))
        if not inside(path, (scratch,) if writing else read_roots):
            raise PermissionError(f"the sandbox may not {'write' if writing else 'read'} {path}: only files under "
                                  "its scratch folder (the current directory)")
    elif event in WRITES:
        for path in args[:2]:
            if isinstance(path, (str, bytes, os.PathLike)) and not inside(path, (scratch,)):
                raise PermissionError(f"{event} outside the sandbox's scratch folder is not allowed")
    elif event in READS:
        path = args[0] if args else "."
        if isinstance(path, (str, bytes, os.PathLike)) and not inside(path, read_roots):
            raise PermissionError(f"{event} outside the sandbox's scratch folder is not allowed")
    elif event == "import" and args[0] in ("_posixsubprocess", "_ctypes", "_xxsubinterpreters", "_testcapi"):
        raise PermissionError(f"importing {args[0]} is not allowed in the sandbox")

sys.addaudithook(hook)
del hook
import traceback
scope = {"__name__": "__main__", "__builtins__": __builtins__}
try:
    tree = ast.parse(code, "<code>", "exec")
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, "<code>", "exec"), scope)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), "<code>", "eval"), scope)
        if value is not None:
            print(repr(value))
except BaseException as err:  # the model reads its own frames only, not the sandbox's
    report = traceback.TracebackException.from_exception(err)
    report.stack = traceback.StackSummary.from_list([f for f in report.stack if f.filename == "<code>"])
    sys.stdout.flush()
    print("".join(report.format()), end="", file=sys.stderr)
    sys.exit(1)
'''


@dataclass(frozen=True)
class SandboxLimits:
    """What one run of model-written code may use."""
    wall_seconds: float = 10.0
    """Killed (with everything it started) after this long."""
    cpu_seconds: int = 5
    memory_bytes: int = 1 << 30
    """Address space: numpy alone maps about 0.4 GB."""
    output_bytes: int = 16 << 10
    """stdout and stderr together; more is cut (the process is killed) and the text says so."""
    file_bytes: int = 16 << 20
    """The largest file it may write in its scratch folder."""


@dataclass(frozen=True)
class SandboxResult:
    output: str
    """stdout and stderr, interleaved as written (cut at ``output_bytes``)."""
    exit_code: int
    timed_out: bool = False
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def text(self) -> str:
        """What the model reads back: the output, and why it stopped when it did not finish cleanly."""
        notes = []
        if self.truncated:
            notes.append("[output truncated: too long]")
        elif self.timed_out:
            notes.append("[killed: time limit]")
        elif self.exit_code == -signal.SIGXCPU:
            notes.append("[killed: CPU time limit]")
        elif self.exit_code < 0:
            notes.append(f"[killed by signal {-self.exit_code}]")
        return "\n".join([self.output.rstrip("\n")] + notes).strip("\n")


def _read_roots() -> list:
    """Folders the code may read: the interpreter's libraries, so ``import`` works (nothing of the run's)."""
    paths = {sys.prefix, sys.base_prefix, *(sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib",
                                                                                 "platlib"))}
    return sorted(p for p in paths if p and os.path.isdir(p))


def run_python(code: str, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Run ``code`` in the sandbox and return what it printed."""
    scratch = os.path.realpath(tempfile.mkdtemp(prefix="mindgrpo-sandbox-"))
    config = {"scratch": scratch, "cpu_seconds": int(limits.cpu_seconds), "memory_bytes": int(limits.memory_bytes),
              "file_bytes": int(limits.file_bytes), "read_roots": _read_roots()}
    env = {"PATH": "/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch, "LANG": "C.UTF-8",
           "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    try:
        proc = subprocess.Popen([sys.executable, "-I", "-c", _BOOT, json.dumps(config)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=scratch, env=env,
                                start_new_session=True)
        try:
            proc.stdin.write(code.encode("utf-8", "replace"))
            proc.stdin.close()
        except BrokenPipeError:
            pass
        output, timed_out, truncated = _collect(proc, limits)
        return SandboxResult(output=output.decode("utf-8", "replace"), exit_code=proc.returncode,
                             timed_out=timed_out, truncated=truncated)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _collect(proc: subprocess.Popen, limits: SandboxLimits):
    """Read the output until the process ends, overruns its time or prints too much; kill it in the last two
    cases (its whole session, so nothing it started survives)."""
    deadline = time.monotonic() + limits.wall_seconds
    chunks, size, timed_out, truncated = [], 0, False, False
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            if not selector.select(timeout=left):
                continue
            data = os.read(proc.stdout.fileno(), 65536)
            if not data:
                break
            chunks.append(data)
            size += len(data)
            if size > limits.output_bytes:
                truncated = True
                break
    if timed_out or truncated:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.stdout.close()
    proc.wait()
    return b"".join(chunks)[:limits.output_bytes], timed_out, truncated
