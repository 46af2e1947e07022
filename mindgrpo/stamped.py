"""Folders mindgrpo makes once and finds again: the demos' assets and the models `mindgrpo fetch` converts.

Files are written plainly (JSON indented with sorted keys, JSON Lines rows; UTF-8) and fingerprinted for the stamp
(SHA-256): the whole folder is built aside and renamed into place (`publish`), one builder at a time (`build_lock`,
`build_aside`), and stamped last (`stamped_build`), so that a finished folder is found again, a half-built one
never looks finished, and anything else in its place is refused, never overwritten."""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence, TypeVar


T = TypeVar("T")


def write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def write_jsonl(path: Path, rows: Sequence[dict]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def file_sha256(path: Path) -> str:
    """The file's SHA-256, read in 4 MiB pieces (a model's weights are GBs)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def publish(tmp: Path, root: Path) -> None:
    """Move the finished `tmp` folder to `root`, replacing a stale stamped folder there (put back if the move of
    `tmp` fails)."""
    if not root.exists():
        os.replace(tmp, root)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{root.name}.old-", dir=root.parent))
    os.replace(root, old / root.name)
    try:
        os.replace(tmp, root)
    except BaseException:
        os.replace(old / root.name, root)
        shutil.rmtree(old, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)


def sweep_leftovers(root: Path) -> None:
    """Remove what builders of `root` killed half-way left beside it (`.<name>.tmp-*`, `.<name>.old-*`); called with
    the build lock held, so no live builder's folder is among them."""
    for leftover in list(root.parent.glob(f".{root.name}.tmp-*")) + list(root.parent.glob(f".{root.name}.old-*")):
        shutil.rmtree(leftover, ignore_errors=True)


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
    """One builder per folder at a time: data-parallel ranks that all call `make_demo` (or two processes fetching
    one model) wait for the first one and then find its stamp. The lock file lives in mindgrpo's cache, not next to
    the user's folder."""
    from mindgrpo._env import cache_dir

    locks = Path(cache_dir()) / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(str(Path(root).resolve()).encode()).hexdigest()[:16]  # one lock per folder, however named
    with open(locks / f"build-{key}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


STAMP = "demo.json"  # the demos' stamp; other folders name theirs (`stamped_build`'s stamp_name)


def read_stamp(root: Path, stamp_format: str, stamp_name: str = STAMP) -> Optional[dict]:
    """The stamp `stamp_name` of a folder of `stamp_format`, or None (absent, unreadable, or another format)."""
    try:
        stamp = json.loads((root / stamp_name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return stamp if isinstance(stamp, dict) and stamp.get("format") == stamp_format else None


def _intact(root: Path, stamp: dict, required: Sequence[str]) -> bool:
    """Every file the stamp lists still has its recorded hash, and the `required` ones are among them."""
    files = stamp.get("files") or {}
    return set(required) <= set(files) and all((root / rel).is_file() and file_sha256(root / rel) == digest
                                               for rel, digest in files.items())


def stamped_build(root: Path, stamp_format: str, recipe: dict, build: Callable[[Path], Dict[str, object]], *,
                  what: str, required: Sequence[str] = (), force: bool = False,
                  stamp_name: str = STAMP) -> Dict[str, object]:
    """The facts of the folder `root`: found again when its stamp (the file `stamp_name`) names `stamp_format` and
    `recipe` and every file is intact (unless `force`), else built by `build(tmp)` aside (`build_aside`) and
    stamped last with the recipe, each file's SHA-256 and the facts `build` returns. One builder at a time
    (`build_lock`). A `root` that holds anything but a folder of this format is refused (`what` names it in the
    error), never overwritten."""
    with build_lock(root):
        stamp = read_stamp(root, stamp_format, stamp_name)
        if not force and stamp is not None and stamp.get("recipe") == recipe and _intact(root, stamp, required):
            return dict(stamp.get("facts") or {})
        sweep_leftovers(root)
        if root.exists() and (not root.is_dir() or (any(root.iterdir()) and stamp is None)):
            raise FileExistsError(f"{root} exists and is not a {what} folder (no {stamp_name}); pass an empty or new "
                                  "folder, or delete this one")

        def build_and_stamp(tmp: Path) -> Dict[str, object]:
            facts = build(tmp)
            files = {f.relative_to(tmp).as_posix(): file_sha256(f) for f in sorted(tmp.rglob("*")) if f.is_file()}
            write_json(tmp / stamp_name, {"format": stamp_format, "recipe": recipe, "files": files, "facts": facts})
            return facts

        return build_aside(root, build_and_stamp)
