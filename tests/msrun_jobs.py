"""msrun jobs for the tests that start one: a free port, a job run to its end (or left running), and a job killed the
moment a checkpoint of it is saved, as a crash would."""
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def msrun(args, log_dir: Path, *, workers: int = 2, wait: bool = True, timeout: int = 900):
    """Run ``args`` under ``msrun --worker_num=workers`` on this host; return the workers' log tails (the job must
    succeed), or the running job with ``wait=False`` (in a session of its own, for :func:`kill_when_saved`)."""
    cmd = ["msrun", f"--worker_num={workers}", f"--local_worker_num={workers}", "--master_addr=127.0.0.1",
           f"--master_port={free_port()}", f"--log_dir={log_dir}", "--join=True", *map(str, args)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    if not wait:
        return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    logs = "".join(p.read_text(errors="replace")[-3000:] for p in sorted(log_dir.glob("*.log")))
    assert done.returncode == 0, logs
    return logs


def kill_when_saved(proc: subprocess.Popen, saved: Path, marker: str, *, timeout: int = 900) -> None:
    """SIGKILL the job ``proc`` (msrun and every worker whose command line holds ``marker``) as soon as ``saved``
    exists: a crashed job. Returns once no process of it is left."""
    deadline = time.time() + timeout
    while not saved.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert saved.exists(), f"the job wrote no {saved}"
    # msrun starts its workers in sessions of their own: kill msrun's group, then the workers by their command line
    os.killpg(proc.pid, signal.SIGKILL)
    subprocess.run(["pkill", "-9", "-f", marker], check=False)
    proc.wait()
    deadline = time.time() + 30
    while subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode == 0:
        assert time.time() < deadline, "the killed job's workers are still alive"
        time.sleep(0.1)
