"""The python tool's bwrap sandbox (mindgrpo/tools/bwrap.py, seccomp.py): what the code runs in, the seccomp filter
checked against the kernel's own numbering, and the refusal where the kernel refuses namespaces, on every path that
runs the python tool (a training run's preflight, ``mindgrpo eval``, the tool runner, ``run_python``) and in
``mindgrpo doctor``. The escapes themselves are tests/test_sandbox_escapes.py."""
import ast
import os
import re
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mindgrpo.config import ConfigError, GRPOConfig
from mindgrpo.tools import SandboxLimits, ToolCall, ToolRunner, ToolSpecError, resolve_tools, run_python, sandbox_for
from mindgrpo.tools import bwrap, interpreter
from mindgrpo.tools.bwrap import BWRAP_ENV, ENV, SANDBOX_UID, SCRATCH, find_bwrap
from mindgrpo.tools.seccomp import ARCHES, CLONE_THREAD, DENIED, program

from conftest import small_run_config
from sandbox_attacks import UNHOOK_GC, processes_named

LIMITS = SandboxLimits(wall_seconds=10, cpu_seconds=5)


@pytest.fixture
def refusing_kernel(tmp_path, monkeypatch):
    """``$MINDGRPO_BWRAP`` on a machine whose kernel refuses user namespaces: the real bwrap, started inside a user
    namespace that may create none (what ``sysctl user.max_user_namespaces=0`` does to a whole machine), so the kernel
    itself refuses and bwrap says so in its own words."""
    real, _ = find_bwrap()
    script = tmp_path / "bwrap"
    script.write_text("#!/bin/sh\nexec unshare --user --map-root-user sh -c "
                      f"'echo 0 > /proc/sys/user/max_user_namespaces && exec \"$0\" \"$@\"' {real} \"$@\"\n")
    script.chmod(0o755)
    monkeypatch.setenv(BWRAP_ENV, str(script))
    return script


REFUSAL = r"= bwrap: .*bwrap \(\$MINDGRPO_BWRAP\) cannot start the sandbox on this machine \(bwrap: Creating new " \
          r"namespace failed: .*max_\*_namespaces.*\); allow user namespaces \(sysctl .* or choose the sandbox remote" \
          r" .* or process \(isolates nothing"


# ------------------------------------------------------------------------------------------------ refusal
def test_where_the_kernel_refuses_namespaces_a_run_with_the_python_tool_stops_before_building_anything(
        refusing_kernel, tmp_path, demo_plain, demo_prompts):
    from mindgrpo.train.preflight import run_tools
    from mindgrpo.train.trainer import GRPOTrainer

    out = tmp_path / "run"
    config = small_run_config(out, demo_prompts, demo_plain.model_dir, max_prompt_length=64, seq_length=128,
                              max_tokens=32, verifiers=["accuracy"], tools=["python"])
    with pytest.raises(ConfigError) as refused:
        GRPOTrainer(config)
    message = str(refused.value)
    assert "\n" not in message and re.match(r"^rl_config\.tool_sandbox " + REFUSAL, message), message
    assert not out.exists()  # nothing was built or written
    config.rl_config.tool_sandbox = "process"  # the explicit, unisolated choice is the user's to make
    assert [tool.sandbox.mode for tool in run_tools(config)] == ["process"]


def test_eval_the_tool_runner_and_run_python_refuse_too(refusing_kernel, demo_plain):
    from mindgrpo.apps.evaluation import EvaluationError, evaluate

    with pytest.raises(EvaluationError, match=r"^--tool-sandbox " + REFUSAL):
        evaluate(demo_plain.model_dir, demo_plain.test_jsonl, tools=["python"], limit=2, progress=False)
    with pytest.raises(ToolSpecError, match=r"^the python tool's sandbox " + REFUSAL):
        ToolRunner(resolve_tools(["python"]), processes=1, timeout=10)
    result = run_python("print('ran')", LIMITS)  # called directly: bwrap's refusal is the answer, the code never ran
    assert not result.ok and "ran" not in result.output.split() and "Creating new namespace failed" in result.output


def test_the_doctor_reports_the_sandboxes_this_machine_supports(refusing_kernel, monkeypatch):
    from mindgrpo.apps.doctor import check_tool_sandboxes

    checks = {check.name: check for check in check_tool_sandboxes()}
    assert checks["tool sandbox bwrap"].status == "warn" and "max_*_namespaces" in checks["tool sandbox bwrap"].detail
    assert checks["tool sandbox process"].status == "ok" and "isolates nothing" in checks["tool sandbox process"].detail
    assert checks["tool sandbox remote"].status == "info" and "tool_sandbox_url" in checks["tool sandbox remote"].detail
    config = GRPOConfig()
    config.rl_config.tools = ["python"]
    assert [c.status for c in check_tool_sandboxes(config) if c.name == "tool sandbox bwrap"] == ["FAIL"]
    config.rl_config.tool_sandbox = "process"
    assert [c.status for c in check_tool_sandboxes(config) if c.name == "tool sandbox bwrap"] == ["warn"]
    monkeypatch.delenv(BWRAP_ENV)  # this machine's own bwrap
    bwrap = next(c for c in check_tool_sandboxes() if c.name == "tool sandbox bwrap")
    assert bwrap.status == "ok" and "namespaces" in bwrap.detail and "seccomp" in bwrap.detail


# ------------------------------------------------------------------------------------------------ the sandbox
def test_the_code_runs_in_new_namespaces_without_privileges_descriptors_or_environment_of_the_trainers():
    code = UNHOOK_GC + ('import os, socket\nprint(open("/proc/self/status").read())\n'
                        'print("NS", {n: os.readlink(f"/proc/self/ns/{n}") for n in os.listdir("/proc/self/ns")})\n'
                        'print("FDS", sorted(os.listdir("/proc/self/fd")))\nprint("ENV", dict(os.environ))\n'
                        'print("NET", socket.if_nameindex())\nprint("WHERE", os.getcwd(), os.getuid())')
    output = run_python(code, LIMITS).output
    status = dict(re.findall(r"^(\w+):\s+(.*)$", output, re.M))
    assert status["CapEff"] == status["CapBnd"] == status["CapPrm"] == "0" * 16, output
    assert status["NoNewPrivs"] == "1" and status["Seccomp"] == "2"  # 2: a filter is in force
    lines = dict(line.split(" ", 1) for line in output.splitlines() if line[:4] in ("NS {", "FDS ", "ENV ", "NET ",
                                                                                  "WHER"))
    inside = ast.literal_eval(lines["NS"])
    for name in ("pid", "mnt", "net", "user", "ipc", "uts", "cgroup"):
        assert inside[name] != os.readlink(f"/proc/self/ns/{name}"), name
    assert ast.literal_eval(lines["FDS"]) == ["0", "1", "2", "3"]  # 3: the listing's own
    assert ast.literal_eval(lines["ENV"]) == {**ENV, "PWD": SCRATCH} and ast.literal_eval(lines["NET"]) == [(1, "lo")]
    assert lines["WHERE"] == f"{SCRATCH} {SANDBOX_UID}"


def test_the_scratch_folder_is_the_only_writable_place_and_it_is_bounded():
    interpreter = os.path.dirname(os.__file__)
    code = UNHOOK_GC + f'''
import os
for folder in ("/", "/usr", "/etc", "/dev", "/root", {interpreter!r}, "/tmp"):
    try:
        open(os.path.join(folder, "written"), "w").close()
        print(folder, "writable")
    except OSError as err:
        print(folder, err.errno)
try:
    for i in range(20):
        open(f"part{{i}}", "w").write("x" * (15 << 20))
except OSError as err:
    print("filled", i, err.errno)
'''
    output = run_python(code, SandboxLimits(scratch_bytes=64 << 20, file_bytes=16 << 20)).output
    erofs = 30
    assert output.splitlines()[:7] == [f"{folder} {erofs}" for folder in ("/", "/usr", "/etc", "/dev", "/root",
                                                                           interpreter)] + ["/tmp writable"], output
    assert output.splitlines()[7] == "filled 4 28", output  # ENOSPC after 4 x 15 MiB in 64 MiB


def test_the_configured_sandbox_travels_with_the_tool_into_its_worker_processes():
    for mode, uid in (("bwrap", SANDBOX_UID), ("process", os.getuid())):
        runner = ToolRunner(resolve_tools(["python"], sandbox_for(mode)), processes=1, timeout=20)
        try:
            assert runner.run([ToolCall("python", {"code": "import os\nos.getuid()"})])[0].text == str(uid), mode
        finally:
            runner.close()


def _bwrap_script(tmp_path, monkeypatch, body: str) -> Path:
    """``$MINDGRPO_BWRAP``: a shell script (``$REAL``: this machine's bwrap)."""
    script = tmp_path / "bwrap"
    script.write_text(f"#!/bin/sh\nREAL='{find_bwrap()[0]}'\n{body}\n")
    script.chmod(0o755)
    monkeypatch.setenv(BWRAP_ENV, str(script))
    return script


def test_one_deadline_holds_for_the_whole_call_bwraps_start_included(tmp_path, monkeypatch):
    """A bwrap slow to make the namespace (here 4 s late) spends the call's wall time, not time on top of it."""
    _bwrap_script(tmp_path, monkeypatch, 'sleep 4\nexec "$REAL" "$@"')
    start = time.monotonic()
    result = run_python("import time\ntime.sleep(60)", SandboxLimits(wall_seconds=6))
    assert result.text() == "[killed: time limit]"
    assert time.monotonic() - start < 6 + 3  # 10 s when the wait for the namespace came first


def test_killing_a_namespace_whose_pid_1_is_gone_still_kills_and_reaps_bwrap():
    """Code that ends right at the deadline: its PID 1 has exited and bwrap reaped it when the kill comes. That is no
    error, and bwrap (a stand-in here, still running) is killed and reaped, its pipe closed."""
    gone = subprocess.Popen(["true"])
    init = os.pidfd_open(gone.pid)
    gone.wait()  # exited and reaped, as bwrap reaps its PID 1
    stand_in = interpreter.start([sys.executable, "-c", "import time\ntime.sleep(60)"], "", env={})
    try:
        _, timed_out, _ = interpreter.collect(stand_in, SandboxLimits(wall_seconds=0.5),
                                              kill=lambda p: bwrap._kill(init, p))
    finally:
        os.close(init)
        if stand_in.returncode is None:
            interpreter.kill_session(stand_in)
            stand_in.wait()
    assert timed_out and stand_in.returncode == -signal.SIGKILL and stand_in.stdout.closed


def test_a_refusal_is_not_remembered_once_the_kernel_allows_namespaces(refusing_kernel, monkeypatch):
    """A problem is probed again at the next check (it may have passed: a probe slowed past its wall time, no
    descriptors left); a success is probed once per process."""
    refusal = refusing_kernel.read_text()
    with monkeypatch.context() as here:
        here.delenv(BWRAP_ENV)
        real, _ = find_bwrap()
    sandbox = sandbox_for("bwrap")
    assert "cannot start the sandbox on this machine" in sandbox.problem()
    refusing_kernel.write_text(f"#!/bin/sh\nexec '{real}' \"$@\"\n")  # the same binary, the namespaces allowed
    assert sandbox.problem() == ""
    refusing_kernel.write_text(refusal)
    assert sandbox.problem() == ""


def test_describe_does_not_wait_for_a_bwrap_that_never_answers(tmp_path, monkeypatch):
    _bwrap_script(tmp_path, monkeypatch, "exec sleep 60")
    monkeypatch.setattr(bwrap, "VERSION_SECONDS", 0.5)
    start = time.monotonic()
    assert "no answer to --version within 0.5 s" in sandbox_for("bwrap").describe()
    assert time.monotonic() - start < 30


# ------------------------------------------------------------------------------------------------ seccomp
def decide(filter_: bytes, nr: int, arch: int, arg0: int = 0) -> int:
    """What the kernel does with a call, run through the filter as classic BPF (the five instructions it uses)."""
    ops = [struct.unpack_from("=HBBI", filter_, at) for at in range(0, len(filter_), 8)]
    data = struct.pack("=iIQ6Q", nr, arch, 0, arg0, 0, 0, 0, 0, 0)
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = ops[pc]
        if code == 0x20:  # ld [k]
            acc, pc = struct.unpack_from("=I", data, k)[0], pc + 1
        elif code in (0x15, 0x35, 0x45):  # jeq, jge, jset
            taken = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += 1 + (jt if taken else jf)
        else:
            assert code == 0x06, hex(code)  # ret k
            return k


ALLOW, EPERM, ENOSYS = 0x7FFF0000, 0x00050001, 0x00050026
THREAD = 0x3D0F00  # what glibc's pthread_create passes: CLONE_VM | FS | FILES | SIGHAND | THREAD | SYSVSEM | ...
SAFE = {"x86_64": {"read": 0, "write": 1, "mmap": 9, "openat": 257}, "aarch64": {"read": 63, "write": 64,
                                                                                "mmap": 222, "openat": 56}}


@pytest.mark.parametrize("machine", ARCHES)
def test_the_seccomp_filter_refuses_what_it_lists_and_lets_the_interpreter_work(machine):
    arch = ARCHES[machine]
    filter_ = program(machine)
    for name in DENIED:
        if name in arch.numbers:
            assert decide(filter_, arch.numbers[name], arch.audit) == EPERM, name
    for name, nr in SAFE[machine].items():
        assert decide(filter_, nr, arch.audit) == ALLOW, name
    clone = arch.numbers["clone"]
    assert decide(filter_, clone, arch.audit, THREAD) == ALLOW
    assert decide(filter_, clone, arch.audit, 17) == EPERM  # SIGCHLD alone: a fork
    assert decide(filter_, clone, arch.audit, THREAD | 0x10000000) == EPERM  # a thread in a new user namespace
    assert decide(filter_, arch.numbers["clone3"], arch.audit) == ENOSYS  # the C library falls back to clone
    assert decide(filter_, 0, 0x40000003) == EPERM  # another ABI (32-bit x86)
    if arch.x32:
        assert decide(filter_, 0x40000000 | SAFE[machine]["read"], arch.audit) == EPERM
    forks = program(machine, denied=tuple(n for n in DENIED if n not in ("fork", "vfork")))
    assert decide(forks, clone, arch.audit, 17) == ALLOW and decide(forks, clone, arch.audit, 17 | 0x10000000) == EPERM
    assert CLONE_THREAD & THREAD


HEADERS = {"x86_64": Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
           "aarch64": Path("/usr/include/asm-generic/unistd.h")}


@pytest.mark.parametrize("machine", ARCHES)
def test_the_system_call_numbers_are_the_kernels(machine):
    """Against the kernel's own headers (Debian's linux-libc-dev, which the image has)."""
    if not HEADERS[machine].is_file():
        pytest.skip(f"no {HEADERS[machine]} on this machine")
    numbers = {name: int(nr) for name, nr in re.findall(r"#define __NR_(\w+)\s+(\d+)\b", HEADERS[machine].read_text())}
    assert {name: numbers.get(name) for name in ARCHES[machine].numbers} == ARCHES[machine].numbers


def test_what_the_sandbox_does_not_hide():
    """Read-only, the code sees the system's libraries (/usr), the interpreter's folders with every installed package,
    and this machine's CPU and kernel; outside, its processes are the trainer's user (root here), with no capability."""
    import threading

    import numpy

    marker = f"mgu{os.getpid()}"
    os_release = Path("/usr/lib/os-release")
    files = [os_release] if os_release.is_file() else []
    files += [Path(numpy.__file__), Path("/proc/version")]
    code = UNHOOK_GC + f"open('/proc/self/comm', 'w').write({marker!r})\nimport time\n" + "".join(
        f"print(open({str(path)!r}).read() == {path.read_text()!r})\n" for path in files) + \
        "print(next(line for line in open('/proc/cpuinfo') if line.startswith('model name')))\ntime.sleep(3)\n"
    outcome = {}
    call = threading.Thread(target=lambda: outcome.update(result=run_python(code, LIMITS)))
    call.start()
    try:
        for _ in range(100):
            found = processes_named(marker)
            if found:
                with open(f"/proc/{found[0]}/status") as status:
                    fields = dict(line.split(":", 1) for line in status)
                break
            time.sleep(0.05)
    finally:
        call.join()
    assert int(fields["Uid"].split()[0]) == os.getuid() and int(fields["CapEff"], 16) == 0
    lines = outcome["result"].output.splitlines()
    assert lines[:len(files)] == ["True"] * len(files), lines
    with open("/proc/cpuinfo") as cpuinfo:
        assert lines[len(files)] == next(line for line in cpuinfo if line.startswith("model name")).rstrip("\n")
