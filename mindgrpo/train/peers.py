"""Which ranks of a multi-process run are gone: each rank registers its pid and host under
``<output_dir>/.ranks/``, and a rank whose training fails names the peers on its host whose process has ended.

When one msrun worker dies, MindSpore reports it only in msrun's ``scheduler.log`` ("The node: 1 is timed out");
the survivor ends about 30 s later with "Launch kernel failed, name:Default/AllReduce" or by a SIGTERM, and its own
log does not say who is gone. Only ranks on this host can be checked (by pid); ranks on other hosts are not named.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, List

from mindgrpo._io import pid_alive

REGISTRY = ".ranks"


class Terminated(BaseException):
    """SIGTERM arrived during training. A BaseException, like KeyboardInterrupt, so code that catches Exception
    (the reward scorer around a verifier) does not swallow it."""


def register(output_dir: str | os.PathLike, rank: int) -> Path:
    """Record this process as ``rank`` (atomically: a peer never reads half a file)."""
    folder = Path(output_dir) / REGISTRY
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"rank_{rank}.json"
    tmp = folder / f".rank_{rank}.json.tmp"
    tmp.write_text(json.dumps({"rank": rank, "pid": os.getpid(), "host": socket.gethostname()}))
    os.replace(tmp, path)
    return path


def lost_peers(output_dir: str | os.PathLike, rank: int, world_size: int) -> List[Dict]:
    """The other ranks of this run registered on this host whose process is gone, in rank order."""
    host, lost = socket.gethostname(), []
    for peer in range(world_size):
        if peer == rank:
            continue
        try:
            entry = json.loads((Path(output_dir) / REGISTRY / f"rank_{peer}.json").read_text())
        except (OSError, ValueError):
            continue
        if entry.get("host") == host and not _running(int(entry["pid"])):
            lost.append(entry)
    return lost


def describe_lost(lost: List[Dict], rank: int) -> str:
    gone = "; ".join(f"rank {p['rank']} (pid {p['pid']} on {p['host']})" for p in lost)
    return (f"{gone} stopped; this rank ({rank}) cannot continue without it. Start the run again with "
            "--resume_training: it continues from the newest complete checkpoint")


def _running(pid: int) -> bool:
    """Alive and not a zombie (a dead child its parent has not reaped yet still answers kill(pid, 0))."""
    if not pid_alive(pid):
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: trust kill(pid, 0)
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


@contextmanager
def sigterm_raises(output_dir: str | os.PathLike, rank: int, world_size: int, grace: float = 10.0):
    """Inside the block SIGTERM raises :class:`Terminated` in the main thread, so the caller can say why it stops.
    Python runs that handler only between bytecodes: if the main thread is blocked in a collective, a watchdog
    (woken through ``signal.set_wakeup_fd``) names the lost peers and exits with 143 after ``grace`` seconds, so a
    SIGTERM still ends the process. The previous handler is restored on exit. No-op outside the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_sigterm(signum, frame):
        raise Terminated(f"SIGTERM received by rank {rank} (pid {os.getpid()})")

    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    previous_handler = signal.signal(signal.SIGTERM, on_sigterm)
    previous_fd = signal.set_wakeup_fd(write_fd)
    threading.Thread(target=_exit_after_grace, args=(read_fd, grace, output_dir, rank, world_size),
                     name="mindgrpo-sigterm", daemon=True).start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous_fd)
        signal.signal(signal.SIGTERM, previous_handler)
        os.close(write_fd)  # the watchdog reads end-of-file and returns, unless a SIGTERM already armed it


def _exit_after_grace(read_fd: int, grace: float, output_dir, rank: int, world_size: int) -> None:
    with os.fdopen(read_fd, "rb", buffering=0) as signals:
        while got := signals.read(1):
            if got[0] == signal.SIGTERM:
                time.sleep(grace)
                lost = lost_peers(output_dir, rank, world_size)
                print(f"[mindgrpo] rank {rank}: still running {grace:.0f} s after SIGTERM, exiting. "
                      f"{describe_lost(lost, rank) if lost else ''}", file=sys.stderr, flush=True)
                os._exit(128 + signal.SIGTERM)
