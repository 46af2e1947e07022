"""How the demos write their files (JSON indented with sorted keys, JSON Lines rows; UTF-8) and fingerprint them
for their stamps (SHA-256). Plain writes: a whole demo folder is built aside and renamed into place (`publish`),
one builder at a time (`build_lock`, `build_aside`)."""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Sequence, TypeVar


T = TypeVar("T")


def write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def write_jsonl(path: Path, rows: Sequence[dict]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def publish(tmp: Path, root: Path) -> None:
    """Move the finished `tmp` folder to `root`, replacing a stale demo folder there."""
    if root.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{root.name}.old-", dir=root.parent))
        os.replace(root, old / root.name)
        try:
            os.replace(tmp, root)
        finally:
            shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, root)


def build_aside(root: Path, build: Callable[[Path], T]) -> T:
    """`build(tmp)` in a new temporary sibling folder of `root`, which then replaces `root` (`publish`); on any
    failure the temporary folder is removed and `root` is left as it was. Returns what `build` returns."""
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.tmp-", dir=root.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; the published folder is an ordinary one
        result = build(tmp)
        publish(tmp, root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return result


@contextlib.contextmanager
def build_lock(root: Path):
    """One builder per folder at a time: data-parallel ranks that all call `make_demo` wait for the first one and
    then find its stamp. The lock file lives in mindgrpo's cache, not next to the user's folder."""
    from mindgrpo._env import cache_dir

    locks = Path(cache_dir()) / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"demo-{hashlib.sha256(str(root).encode()).hexdigest()[:16]}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
