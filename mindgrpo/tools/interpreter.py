"""The interpreter that runs model-written code on this machine, and the ``process`` sandbox, which runs it as a plain
child process.

The interpreter (``python -I``: no user site, no ``PYTHON*`` variables) reads the code on stdin, sets its limits
(``resource``), arranges to die with the process that started it (``PR_SET_PDEATHSIG``) and installs an audit hook
(:pep:`578`) before it runs the code as a notebook cell would. The hook refuses starting processes, signalling,
loading native code, the network, and files outside the scratch folder (reading the interpreter's libraries aside),
each with a ``PermissionError`` the model can read. It runs inside the process it polices, so code written to
escape switches it off (issue 46 did, two ways): under ``bwrap`` it is only the layer that turns the kernel's
refusals into readable errors; in the ``process`` sandbox it is all there is.

The parent reads at most ``output_bytes`` of output (then kills: printing megabytes costs the run nothing) and kills
the child's whole session at ``wall_seconds``.
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
from typing import Callable, List, Optional, Sequence, Tuple

from mindgrpo.tools.sandbox import Sandbox, SandboxLimits, SandboxResult

# Runs the code as a notebook cell: its output, the value of a last bare expression, and on an exception the
# traceback of the model's own frames only. Needs `code`; also the whole program a remote sandbox is sent.
CELL = r'''
import ast, sys, traceback
scope = {"__name__": "__main__", "__builtins__": __builtins__}
try:
    tree = ast.parse(code, "<code>", "exec")
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, "<code>", "exec"), scope)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), "<code>", "eval"), scope)
        if value is not None:
            print(repr(value))
except BaseException as err:
    report = traceback.TracebackException.from_exception(err)
    report.stack = traceback.StackSummary.from_list([f for f in report.stack if f.filename == "<code>"])
    sys.stdout.flush()
    print("".join(report.format()), end="", file=sys.stderr)
    sys.exit(1)
'''

# Before the cell: the code from stdin, the limits, death with the parent, the hook. The hook's policy lives in this
# module's globals: it is a readable-errors layer, not a boundary (see the module docstring).
_GUARD = r'''
import json, os, resource, sys
cfg = json.loads(sys.argv[1])
scratch = cfg["scratch"]
code = sys.stdin.read()
null = os.open(os.devnull, os.O_RDONLY)
os.dup2(null, 0)  # stdin becomes /dev/null: the descriptors are 0, 1 and 2, nothing else
os.close(null)
for name, soft, hard in cfg["rlimits"]:
    resource.setrlimit(getattr(resource, name), (soft, hard))
import ctypes
ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL: die with the process that started the interpreter
del ctypes
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
'''

BOOT = _GUARD + CELL
"""The interpreter's program (``python -I -c BOOT CONFIG``, the code on stdin)."""

THREADS_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def read_roots() -> List[str]:
    """Folders the code may read (the audit hook's list; ``bwrap`` mounts them read-only): the interpreter's
    prefixes and libraries, so ``import`` works, and nothing of the run's."""
    paths = {sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable)),
             *(sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib"))}
    return sorted(p for p in paths if p and os.path.isdir(p))


def rlimits(limits: SandboxLimits, one_process: bool) -> List[Tuple[str, int, int]]:
    """The interpreter's resource limits. CPU: SIGXCPU at the limit (reported as such), SIGKILL a second later if it
    is caught. ``one_process``: ``RLIMIT_NPROC`` 1, which the kernel does not apply to root."""
    cpu = int(limits.cpu_seconds)
    values = [("RLIMIT_CPU", cpu, cpu + 1)] + [(name, value, value) for name, value in (
        ("RLIMIT_AS", int(limits.memory_bytes)), ("RLIMIT_FSIZE", int(limits.file_bytes)), ("RLIMIT_NOFILE", 64),
        ("RLIMIT_CORE", 0))]
    return values + ([("RLIMIT_NPROC", 1, 1)] if one_process else [])


def start(command: Sequence[str], code: str, *, env: dict, cwd: str = "/",
          pass_fds: Sequence[int] = ()) -> subprocess.Popen:
    """Start ``command`` (which runs :data:`BOOT`) in a new session, with no descriptor of ours but ``pass_fds``
    besides its stdin (``code``, then closed) and one pipe for stdout and stderr."""
    proc = subprocess.Popen(list(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            cwd=cwd, env=env, start_new_session=True, close_fds=True, pass_fds=tuple(pass_fds))
    try:
        proc.stdin.write(code.encode("utf-8", "replace"))
        proc.stdin.close()
    except BrokenPipeError:  # it died before reading: its output says why
        pass
    return proc


def kill_session(proc: subprocess.Popen) -> None:
    """SIGKILL to the session :func:`start` made: the interpreter and whatever it started and did not move out."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def collect(proc: subprocess.Popen, limits: SandboxLimits, kill: Callable[[subprocess.Popen], None] = kill_session,
            deadline: Optional[float] = None) -> Tuple[bytes, bool, bool]:
    """(output, timed out, truncated): read the output until the process ends, overruns its time (``deadline``, a
    :func:`time.monotonic` time: ``wall_seconds`` from now unless given) or prints too much; ``kill`` it in the last two
    cases. The end of its output is not its end (code may close stdout and stderr, then sleep): the deadline holds
    until it has exited. Returns once ``proc`` has exited, its stdout closed, whatever ``kill`` raises."""
    if deadline is None:
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
    if not (timed_out or truncated):
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
    try:
        if timed_out or truncated:
            kill(proc)
    finally:
        proc.stdout.close()
        proc.wait()
    return b"".join(chunks)[:limits.output_bytes], timed_out, truncated


@dataclass(frozen=True)
class ProcessSandbox(Sandbox):
    """``process``: the interpreter as a plain child process, in a scratch folder on disk (its home and temp folder,
    removed afterwards), with a minimal environment, the limits and the audit hook. **It isolates nothing from code
    written to escape it**: the hook can be switched off from inside, and the child has the trainer's user, file
    system, network and processes within reach. For trusted models, or machines where nothing else runs."""
    mode = "process"
    isolates = False

    def problem(self) -> str:
        return ""

    def describe(self) -> str:
        return "runs anywhere; isolates nothing from code written to escape (limits and an audit hook only)"

    def run(self, code: str, limits: SandboxLimits) -> SandboxResult:
        scratch = os.path.realpath(tempfile.mkdtemp(prefix="mindgrpo-sandbox-"))
        config = {"scratch": scratch, "read_roots": read_roots(),
                  "rlimits": rlimits(limits, one_process=os.geteuid() != 0)}
        env = {"PATH": "/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch, "LANG": "C.UTF-8", **THREADS_ENV}
        try:
            proc = start([sys.executable, "-I", "-c", BOOT, json.dumps(config)], code, env=env, cwd=scratch)
            output, timed_out, truncated = collect(proc, limits)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return SandboxResult(output.decode("utf-8", "replace"), proc.returncode, timed_out, truncated)
