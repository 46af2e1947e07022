"""One run per output folder: a lock file in ``rl_config.output_dir`` that a second run refuses to share.

Two runs writing the same folder would interleave ``metrics.jsonl``, prune each other's checkpoints and resume from
a mix. :func:`lock_output_dir` takes an exclusive ``flock`` on ``<output_dir>/.mindgrpo.lock`` and writes the
holder's pid and host into it. The kernel drops the lock when the process ends, however it ends (SIGKILL, OOM), so
the lock of a dead run needs no cleaning up: its file still names the dead pid, and the next run takes it over (a
pid file alone could not tell a dead run from a live process that reused its pid). The lock is held until the
process exits; trainers created again in the same process (a resume in a notebook) share it. On NFS, Linux maps
``flock`` to byte-range locks, so runs on two hosts exclude each other too.
"""
from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path
from typing import Dict

from mindgrpo.config import ConfigError

LOCK_NAME = ".mindgrpo.lock"
_held: Dict[Path, int] = {}  # lock path -> open descriptor holding the flock, for the life of this process


class RunLockError(ConfigError):
    """Another live run holds the output folder."""


def lock_output_dir(output_dir: str | os.PathLike) -> Path:
    """Lock `output_dir` for this process (creating the folder); raise RunLockError naming the other run if a live
    process holds it. Returns the lock file."""
    folder = Path(output_dir).absolute()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    if path in _held:
        return path
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.read(fd, 256).decode("utf-8", "replace").split()
        os.close(fd)
        who = f"process {holder[0]} on {holder[1]}" if len(holder) >= 2 else "another process"
        raise RunLockError(f"rl_config.output_dir = {folder} is in use by {who} (lock file {path}): two runs "
                           "would overwrite each other's metrics and checkpoints. Wait for that run to end, stop "
                           "it, or choose another rl_config.output_dir") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
    os.fsync(fd)
    _held[path] = fd
    return path
