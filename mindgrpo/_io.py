"""Crash-safe file writing and the process checks around it, shared by checkpoints, metrics, data and evaluation.

Every output is written to a temporary sibling and renamed over its final name (`atomic_open`, `commit_file`), so a
reader sees the old file or the complete new one, never a half-written file. Temporary names carry the writer's
pid, so a later run can tell a dead writer's leftovers from a live one's (`pid_alive`). Pure Python: importing this
module loads no MindSpore.
"""
from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
from pathlib import Path
from typing import IO, Any, Iterator

NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)  # a full disk, a quota, RLIMIT_FSIZE


def out_of_space(err: BaseException) -> bool:
    """Whether `err` (or an error it was raised from) is a write that found no space: an OSError with one of
    NO_SPACE_ERRNOS, or safetensors' Rust I/O error, which carries only its text ("... (os error 28)")."""
    while err is not None:
        if isinstance(err, OSError) and err.errno in NO_SPACE_ERRNOS:
            return True
        code = re.search(r"\(os error (\d+)\)", str(err))
        if code and int(code.group(1)) in NO_SPACE_ERRNOS:
            return True
        err = err.__cause__
    return False


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists on this host (used to tell stale temp folders from live ones)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def fsync(path: Path) -> None:
    """Flush a file's data, or a folder's entries (a rename or creation inside it), to disk.

    Folders are skipped where the OS has no directory handles (Windows).
    """
    flags = os.O_RDONLY
    if path.is_dir():
        if not hasattr(os, "O_DIRECTORY"):
            return
        flags |= os.O_DIRECTORY
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def tmp_sibling(path: Path) -> Path:
    """A hidden, unique name next to `path` (same filesystem, so the final rename is atomic)."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")


def commit_file(tmp: Path, path: Path) -> None:
    """fsync `tmp`, rename it over `path` and fsync the folder; remove `tmp` if anything fails."""
    try:
        fsync(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync(path.parent)


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO[Any]]:
    """Open a temporary sibling of `path` for writing; on success it replaces `path`, on error it is removed.

    Readers see the old file or the complete new one, never a half-written file. `mode` is "w" or "wb".
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open mode must be 'w' or 'wb', got {mode!r}")
    path = Path(path)
    tmp = tmp_sibling(path)
    try:
        with open(tmp, mode, encoding=None if "b" in mode else encoding) as f:
            yield f
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    commit_file(tmp, path)


def atomic_write(path: str | Path, data: bytes | str) -> None:
    """Write `data` (text as UTF-8) to `path` atomically, see `atomic_open`."""
    with atomic_open(path, "wb") as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
