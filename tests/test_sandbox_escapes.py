"""An adversary's tests of the python tool's sandbox (issue 46).

Every escape issue 46 found, and those an attacker would try next, runs in each sandbox that claims isolation and
runs here (``bwrap``; ``remote`` isolates on its service), three times: with the audit hook on, and with it switched
off from inside both ways the issue did (so what stops the attack is the kernel). Each run must leave the world as
it was: a canary standing for the run's checkpoint (under the test's folder) and one in the home folder unread,
unchanged and undeleted, the interpreter's own files unchanged, a process started outside alive, listening sockets
unreached, and nothing of the code still running afterwards.

Each attack is first run against the ``process`` sandbox, which isolates nothing, to show it is a working attack:
there it reaches the world. docs/sandbox.md names the test behind each sentence it says.
"""
import ast
import os
import socket
import subprocess
import sys
import sysconfig
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from mindgrpo.tools import SANDBOXES, SandboxLimits, run_python, sandbox_for
from mindgrpo.tools.bwrap import BwrapSandbox
from mindgrpo.tools.interpreter import read_roots
from mindgrpo.tools.seccomp import DENIED

from sandbox_attacks import ATTEMPT, PRELUDES, UNHOOK_GC, processes_named

ISOLATING = [mode for mode, make in SANDBOXES.items() if make("").isolates and mode != "remote"]
LIMITS = SandboxLimits(wall_seconds=10, cpu_seconds=5)
INTERPRETER_FILE = Path(sysconfig.get_paths()["stdlib"]) / "this.py"  # imported by nothing


CAP_SYS_RESOURCE = 24


def _capable(capability: int) -> bool:
    with open("/proc/self/status") as status:
        effective = next(line for line in status if line.startswith("CapEff:"))
    return bool(int(effective.split()[1], 16) >> capability & 1)


def _state(path: Path):
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return path.read_bytes(), stat.st_mode, stat.st_mtime_ns, stat.st_ino, stat.st_nlink


@dataclass
class World:
    """What sandboxed code must not reach, and what it may be told about (``fields``: put into the attacks)."""
    token: str
    canary: Path
    home: Path
    outside: subprocess.Popen
    tcp: socket.socket
    udp: socket.socket
    unix: socket.socket
    unix_name: str
    fd: int
    marker: str

    def __post_init__(self):
        self.before = [_state(p) for p in (self.canary, self.home, INTERPRETER_FILE)]
        self.listing = sorted(os.listdir(self.canary.parent))

    @property
    def fields(self) -> dict:
        return {"C": str(self.canary), "H": str(self.home), "I": str(INTERPRETER_FILE), "pid": self.outside.pid,
                "me": os.getpid(), "tcp": self.tcp.getsockname()[1], "udp": self.udp.getsockname()[1],
                "unix": self.unix_name, "fd": self.fd, "marker": self.marker}

    def reached(self, output: str) -> list:
        """What of the world the code reached (empty: nothing)."""
        found = []
        if self.token in output:
            found.append("read a canary or the trainer's environment")
        names = ("checkpoint canary", "home canary", "interpreter file")
        found += [f"changed the {name}" for name, before, path in
                  zip(names, self.before, (self.canary, self.home, INTERPRETER_FILE)) if _state(path) != before]
        if sorted(os.listdir(self.canary.parent)) != self.listing:
            found.append("changed the checkpoint folder")
        if self.outside.poll() is not None:
            found.append("killed the outside process")
        for name, server in (("tcp", self.tcp), ("unix", self.unix)):
            try:
                server.accept()[0].close()
                found.append(f"connected to the {name} server")
            except BlockingIOError:
                pass
        try:
            self.udp.recv(100)
            found.append("sent to the udp server")
        except BlockingIOError:
            pass
        if processes_named(self.marker):
            found.append("left a process running")
        return found


@pytest.fixture
def world(tmp_path, monkeypatch):
    token = uuid.uuid4().hex
    monkeypatch.setenv("MINDGRPO_TEST_SECRET", token)  # the trainer's environment, say a hub token
    canary = tmp_path / "run" / "checkpoint-10" / "model.safetensors"
    canary.parent.mkdir(parents=True)
    canary.write_text(f"weights {token}")
    home = Path.home() / f".mindgrpo-sandbox-canary-{token}"  # unique: pytest workers run side by side
    home.write_text(f"hub token {token}")
    fd = os.open(canary, os.O_RDWR)
    os.set_inheritable(fd, True)  # a descriptor the trainer would pass on, were it careless
    outside = subprocess.Popen(["sleep", "600"])
    tcp, udp = socket.socket(), socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    unix, unix_name = socket.socket(socket.AF_UNIX), f"mindgrpo-{token}"
    for server, address in ((tcp, ("127.0.0.1", 0)), (udp, ("127.0.0.1", 0)), (unix, "\0" + unix_name)):
        server.bind(address)
        server.setblocking(False)
    tcp.listen()
    unix.listen()
    state = World(token, canary, home, outside, tcp, udp, unix, unix_name, fd, f"mg{token[:12]}")
    try:
        yield state
    finally:
        for pid in processes_named(state.marker):  # only the process sandbox lets one live on
            os.kill(pid, 9)
        outside.kill()
        outside.wait()
        for server in (tcp, udp, unix):
            server.close()
        os.close(fd)
        home.unlink(missing_ok=True)
        if _state(INTERPRETER_FILE) != state.before[2]:  # never left changed, whatever the outcome
            INTERPRETER_FILE.write_bytes(state.before[2][0])
            INTERPRETER_FILE.chmod(state.before[2][1])
        Path(f"{INTERPRETER_FILE}.moved").unlink(missing_ok=True)


# Each attack's steps run through attempt(): a "DONE" line is a step that went through.
ATTACKS = {
    # issue 46: any file by its path, and by dir_fd (the kernel resolves the path against a descriptor the hook never
    # sees), with the other descriptor-relative calls
    "paths": '''
import os
for target in ({C!r}, {H!r}):
    attempt("read", lambda: open(target).read())
    attempt("write", lambda: open(target, "w").write("overwritten"))
    attempt("rename", lambda: os.rename(target, target + ".moved"))
    attempt("delete", lambda: os.remove(target))
    look("list", lambda: os.listdir(os.path.dirname(target)))
''',
    "dir_fd": '''
import os
fd = os.open(".", os.O_RDONLY)
os.makedirs("a/b/c/d/e/f/g/h/i/j")
os.chdir("a/b/c/d/e/f/g/h/i/j")
up = "../" * 12
for target in ({C!r}, {H!r}):
    rel = up + target.lstrip("/")
    attempt("read", lambda: os.read(os.open(rel, os.O_RDONLY, dir_fd=fd), 200))
    attempt("write", lambda: os.write(os.open(rel, os.O_WRONLY | os.O_TRUNC, dir_fd=fd), b"overwritten"))
    attempt("create", lambda: os.open(os.path.dirname(rel) + "/new", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
    attempt("rename", lambda: os.rename(rel, rel + ".moved", src_dir_fd=fd, dst_dir_fd=fd))
    attempt("delete", lambda: os.unlink(rel, dir_fd=fd))
    attempt("stat", lambda: os.stat(rel, dir_fd=fd))
    attempt("hard link", lambda: os.link(rel, "linked", src_dir_fd=fd))
    look("list", lambda: os.listdir(os.open(os.path.dirname(rel), os.O_RDONLY, dir_fd=fd)))
    look("scandir", lambda: [e.name for e in os.scandir(os.open(os.path.dirname(rel), os.O_RDONLY, dir_fd=fd))])
    look("fwalk", lambda: next(os.fwalk(os.path.dirname(rel), dir_fd=fd)))
''',
    # the trainer's processes and descriptors through /proc, and descriptors left open
    "proc": '''
import os
for path in ("/proc/self/root{C}", "/proc/1/root{C}", "/proc/{me}/root{C}", "/proc/{me}/environ",
             "/proc/{me}/cmdline", "/proc/{pid}/environ", "/proc/{me}/cwd", "/proc/self/fd/{fd}"):
    attempt(path, lambda: open(path, "rb").read())
attempt("parent's memory", lambda: open("/proc/{me}/mem", "rb").read(1))
attempt("inherited descriptor: read", lambda: os.pread({fd}, 200, 0))
attempt("inherited descriptor: write", lambda: os.pwrite({fd}, b"overwritten", 0))
''',
    # links made inside the scratch folder, pointing out
    "links": '''
import os
for target in ({C!r}, {H!r}):
    name = "to-" + os.path.basename(target)
    attempt("hard link", lambda: os.link(target, "hard-" + os.path.basename(target)))
    try:
        os.symlink(target, name)  # the hook refuses a link to outside the scratch folder; the kernel makes it
    except OSError:
        continue
    attempt("read through a symlink", lambda: open(name).read())
    attempt("write through a symlink", lambda: open(name, "r+").write("overwritten"))
''',
    # the interpreter's files: read-only, and out of reach of links made in the scratch folder
    "interpreter": '''
import mmap, os
attempt("hard link", lambda: os.link({I!r}, "hard-interpreter"))
try:
    os.symlink({I!r}, "to-interpreter")
    attempt("write through a symlink", lambda: open("to-interpreter", "a").write("# appended"))
except OSError:
    pass
attempt("append", lambda: open({I!r}, "a").write("# appended"))
attempt("truncate", lambda: os.truncate({I!r}, 0))
attempt("chmod", lambda: os.chmod({I!r}, 0o777))
attempt("utime", lambda: os.utime({I!r}, (0, 0)))
attempt("rename", lambda: os.rename({I!r}, {I!r} + ".moved"))
attempt("delete", lambda: os.remove({I!r}))
attempt("mmap for writing", lambda: mmap.mmap(os.open({I!r}, os.O_RDWR), 0))
''',
    # issue 46: killing an outside process (pidfd raises no audit event) and signalling the parent
    "signals": '''
import ctypes, os, signal
libc = ctypes.CDLL(None, use_errno=True)
def c(result):
    if result == -1:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return result
attempt("kill", lambda: os.kill({pid}, signal.SIGKILL))
attempt("killpg", lambda: os.killpg({pid}, signal.SIGKILL))
attempt("pidfd", lambda: signal.pidfd_send_signal(os.pidfd_open({pid}), signal.SIGKILL))
attempt("signal 0 to the parent", lambda: os.kill({me}, 0))
attempt("kill through libc", lambda: c(libc.kill({pid}, signal.SIGKILL)))
attempt("ptrace attach", lambda: c(libc.ptrace(16, {pid}, None, None)))
iov = (ctypes.c_char * 8)()
vec = (ctypes.c_void_p * 2)(ctypes.cast(iov, ctypes.c_void_p), 8)
attempt("process_vm_readv", lambda: c(libc.process_vm_readv({me}, vec, 1, vec, 1, 0)))
''',
    # processes, through the modules that start them without audit events too
    "processes": '''
import os, sys
def ran(status):
    if status != 0:
        raise OSError(f"status {{status}}")
    return status
rm = ["/bin/rm", "-f", {C!r}, {H!r}]
attempt("os.system", lambda: ran(os.system(" ".join(rm))))
attempt("posix.system", lambda: ran(__import__("posix").system(" ".join(rm))))
attempt("subprocess", lambda: __import__("subprocess").run(rm, check=True))
attempt("posix_spawn", lambda: ran(os.waitpid(os.posix_spawn(rm[0], rm, {{}}), 0)[1]))
def fork_exec():
    import _posixsubprocess
    read, write = os.pipe()
    args = ([a.encode() for a in rm], [rm[0].encode()], True, (write,), None, None, -1, -1, -1, -1, -1, -1, read,
            write, False, False)
    args += (-1, None, None, None, -1, None, False) if sys.version_info >= (3, 11) else (None, None, None, -1, None)
    return ran(os.waitpid(_posixsubprocess.fork_exec(*args), 0)[1])
attempt("_posixsubprocess.fork_exec", fork_exec)
def fork():
    child = os.fork()
    if child == 0:
        os.system(" ".join(rm))
        os._exit(0)
    return ran(os.waitpid(child, 0)[1])
attempt("fork", fork)
''',
    # issue 46: outliving the call, by a grandchild in a session of its own that acts later
    "outlive": '''
import os, time
def escape():
    child = os.fork()
    if child == 0:
        os.setsid()
        if os.fork() == 0:
            os.closerange(0, 1024)  # holds no pipe of the parent's: the parent sees the call end
            open("/proc/self/comm", "w").write({marker!r})
            time.sleep(1)
            for act in (lambda: open({C!r}, "w").write("written later"), lambda: os.kill({pid}, 9)):
                try:
                    act()
                except OSError:
                    pass
            time.sleep(600)  # whatever it could do, it lives on
        os._exit(0)
    return os.waitpid(child, 0)
attempt("double fork", escape)
''',
    # native code: system calls straight through libc, where no audit event is raised
    "libc": '''
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def c(result):
    if result == -1:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return result
attempt("open", lambda: os.read(c(libc.open({C!r}.encode(), os.O_RDONLY)), 200))
attempt("unlink", lambda: c(libc.unlink({H!r}.encode())))
import platform
openat, kill = {{"x86_64": (257, 62), "aarch64": (56, 129)}}[platform.machine()]  # raw system calls, no wrapper
attempt("syscall openat", lambda: os.read(c(libc.syscall(openat, -100, {C!r}.encode(), os.O_RDONLY)), 200))
attempt("syscall kill", lambda: c(libc.syscall(kill, {pid}, 9)))
attempt("new user namespace", lambda: c(libc.unshare(0x10000000)))
attempt("new mount namespace", lambda: c(libc.unshare(0x00020000)))
os.mkdir("mnt")  # mounted on and unmounted at once: the process sandbox shares this machine's mounts
attempt("mount", lambda: c(libc.mount(b"none", b"mnt", b"tmpfs", 0, None)) + c(libc.umount2(b"mnt", 0)))
attempt("setns", lambda: c(libc.setns(c(libc.open(b"/proc/{pid}/ns/mnt", os.O_RDONLY)), 0)))
''',
    # raising the limits from inside
    "limits": '''
import resource
for name in ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_NOFILE"):
    limit = getattr(resource, name)
    attempt("raise " + name, lambda: resource.setrlimit(limit, (resource.RLIM_INFINITY, resource.RLIM_INFINITY)))
attempt("allocate 2 GiB", lambda: len(bytearray(2 << 30)))
''',
    # issue 46: a listening port on this machine, an abstract unix socket, a name lookup
    "network": '''
import socket
attempt("tcp", lambda: socket.create_connection(("127.0.0.1", {tcp}), timeout=2))
attempt("unix", lambda: socket.socket(socket.AF_UNIX).connect("\\0" + {unix!r}))
try:
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", {udp}))
except OSError:
    pass
attempt("name lookup", lambda: socket.getaddrinfo("pypi.org", 443))
''',
}


def run_attack(attack: str, world: World, sandbox, prelude: str = "") -> str:
    """The attack's output; with the hook switched off, checked to have run every step (ended with END)."""
    result = sandbox.run(ATTEMPT + prelude + ATTACKS[attack].format(**world.fields) + "\nprint('END')", LIMITS)
    if attack == "outlive":
        time.sleep(2)  # the grandchild would act 1 s after the call
    assert not prelude or result.output.endswith("END\n"), result.output
    return result.output


@pytest.mark.parametrize("attack", ATTACKS)
def test_each_attack_reaches_the_world_from_the_process_sandbox_which_isolates_nothing(attack, world):
    """The control: with the hook switched off, each attack goes through in the ``process`` sandbox (the attack on
    the interpreter's files is not tried there: it would change this machine's Python)."""
    if attack == "interpreter":
        pytest.skip("it would change this machine's Python: the process sandbox mounts nothing read-only")
    if attack == "limits" and not _capable(CAP_SYS_RESOURCE):
        pytest.skip("raising a hard limit takes CAP_SYS_RESOURCE, which this machine's root does not hold")
    output = run_attack(attack, world, sandbox_for("process"), UNHOOK_GC)
    assert " DONE " in output or world.reached(output), output


@pytest.mark.parametrize("prelude", PRELUDES)
@pytest.mark.parametrize("attack", ATTACKS)
@pytest.mark.parametrize("mode", ISOLATING)
def test_no_attack_reaches_the_world(mode, attack, prelude, world):
    output = run_attack(attack, world, sandbox_for(mode), PRELUDES[prelude])
    assert not world.reached(output), output
    assert " DONE " not in output, output


@pytest.mark.parametrize("mode", ISOLATING)
def test_the_audit_hook_is_switched_off_from_inside_and_the_kernel_still_refuses(mode):
    """The hook is a readable-errors layer only: each issue-46 trick switches it off (the root folder, which it
    refuses to list, is listed), and what follows meets the kernel (the file is not there to open)."""
    for name, prelude in PRELUDES.items():
        output = run_python(ATTEMPT + prelude + 'import os\nattempt("list", lambda: os.listdir("/"))\n'
                            'attempt("open", lambda: open("/etc/hostname"))', LIMITS, sandbox_for(mode)).output
        if prelude:
            assert "list DONE" in output and "open FileNotFoundError" in output, (name, output)
        else:
            assert "list PermissionError" in output and "open PermissionError" in output, output


@pytest.mark.parametrize("mode", ISOLATING)
def test_the_sandbox_root_holds_only_the_interpreter_system_libraries_and_its_own_folders(mode):
    """Listed with the hook off: the top level is the sandbox's own, /tmp (the scratch folder) starts empty, /dev has
    four devices, /proc shows two processes (bwrap's PID 1 and the interpreter)."""
    code = UNHOOK_GC + 'import os\nfor path in ("/", "/tmp", "/dev", "/proc"):\n' \
                       '    print(path, sorted(n for n in os.listdir(path) if path != "/proc" or n.isdigit()))'
    lines = dict(line.split(" ", 1) for line in run_python(code, LIMITS, sandbox_for(mode)).output.splitlines())
    own = {"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "dev", "proc", "tmp"}
    interpreter = {Path(root).parts[1] for root in read_roots()}
    listed = {path: ast.literal_eval(names) for path, names in lines.items()}
    assert set(listed["/"]) <= own | interpreter and Path(__file__).resolve().parts[1] not in listed["/"]
    assert listed["/tmp"] == [] and listed["/dev"] == ["null", "random", "urandom", "zero"]
    assert listed["/proc"] == ["1", "2"]


def test_the_pid_namespace_alone_ends_what_outlives_the_call(world):
    """With process creation allowed in the seccomp filter, the outliving grandchild starts, and is gone when the
    call returns: PID 1 of the namespace went, and the kernel took every process in it along."""
    sandbox = BwrapSandbox(denied=tuple(name for name in DENIED if name not in ("fork", "vfork")))
    output = sandbox.run(ATTEMPT + UNHOOK_GC + ATTACKS["outlive"].format(**world.fields), LIMITS).output
    assert "double fork DONE" in output, output  # it did start
    assert processes_named(world.marker) == []
    time.sleep(2)
    assert not world.reached(output)


def test_the_namespace_dies_with_the_worker_that_started_it(world):
    """The process that called bwrap (a tool worker) is killed mid-call: bwrap and the namespace go with it, the
    grandchild that would outlive the call included (forks allowed, as above)."""
    code = ATTEMPT + UNHOOK_GC + ATTACKS["outlive"].format(**world.fields) + "import time\ntime.sleep(60)\n"
    worker = subprocess.Popen([sys.executable, "-c", "import sys\nfrom mindgrpo.tools.bwrap import BwrapSandbox\n"
                               "from mindgrpo.tools import SandboxLimits\nfrom mindgrpo.tools.seccomp import DENIED\n"
                               "BwrapSandbox(denied=tuple(n for n in DENIED if n not in ('fork', 'vfork')))"
                               ".run(sys.stdin.read(), SandboxLimits(wall_seconds=120))"],
                              stdin=subprocess.PIPE, text=True)
    worker.stdin.write(code)
    worker.stdin.close()
    deadline = time.monotonic() + 60
    while not processes_named(world.marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_named(world.marker), "the grandchild never started"
    worker.kill()
    worker.wait()
    deadline = time.monotonic() + 5
    while processes_named(world.marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_named(world.marker) == []
    time.sleep(2)
    assert not world.reached("")
