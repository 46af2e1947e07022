"""Crash-safe training checkpoints: one folder per step, committed by a rename, verified by a manifest.

Layout::

    <save_dir>/step_00000120/
        <part>/...            # one subfolder per writer passed to `CheckpointManager.save` (model, optimizer, ...)
        manifest.json         # written last: format version, step, time, meta, and size + sha256 of every file

A checkpoint is built in a hidden `.tmp-step_<N>-<pid>-<rand>/` folder next to the others and renamed into place
only once every file and the manifest are on disk, so a run killed at any moment leaves either the old set of
checkpoints or the new one, never a half-written `step_*` folder that resume could pick. Leftover `.tmp-*` folders
of dead processes are removed by the next `CheckpointManager`. `latest()` re-checks sizes and hashes, so a
checkpoint damaged after the fact (disk full on copy, a flipped bit, a user deleting a file) is skipped with a
warning and resume falls back to the previous good one.

The module is pure Python + numpy + safetensors so that tools can inspect checkpoints without MindSpore. A
`CheckpointManager` is not thread-safe, and only one process (rank 0) should save into a folder.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import random
import re
import secrets
import shutil
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from mindgrpo._io import atomic_write, commit_file, fsync, out_of_space, pid_alive, tmp_sibling

FORMAT_NAME = "mindgrpo-checkpoint"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"

_STEP_DIR = re.compile(r"^step_(\d+)$")
# Build folders, old copies moved aside while a step is replaced, and folders renamed away to be deleted.
_TMP_DIR = re.compile(r"^\.tmp-(?:(replaced|discard)-)?step_(\d+)-(\d+)-[0-9a-f]+$")
_PART_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_HASH_CHUNK = 4 << 20  # 4 MiB: large enough for full disk speed, small enough to hash 60 GB optimizer states


class CheckpointError(RuntimeError):
    """A checkpoint (or a file in it) is missing, incomplete, corrupt or cannot be written."""


class CheckpointWarning(UserWarning):
    """A checkpoint was skipped or a stale folder was left in place; the message names the folder and why."""


# ---------------------------------------------------------------------------------------------- files
def save_json(path: str | Path, obj: Any) -> None:
    """Atomically write `obj` as indented UTF-8 JSON. NaN/inf are refused: they are not valid JSON."""
    try:
        text = json.dumps(obj, indent=2, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"cannot write {path}: value is not JSON-serialisable ({e}); convert numpy/"
                              "MindSpore values with float()/int()/.tolist() and NaN/inf to None or a string") from e
    atomic_write(path, text + "\n")


def load_json(path: str | Path) -> Any:
    """Read a JSON file; errors name the file (and line) instead of a bare JSONDecodeError."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: file not found") from None
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{path}: not UTF-8 text ({e}); the file is corrupt") from e
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}:{e.lineno}: invalid JSON ({e.msg}); the file is corrupt or truncated") from e


def save_arrays(path: str | Path, arrays: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None) -> None:
    """Atomically write named numpy arrays as a safetensors file (optimizer moments, non-HF tensors)."""
    path = Path(path)
    tensors = {}
    for name, value in arrays.items():
        if not isinstance(value, np.ndarray):
            raise TypeError(f"save_arrays({path}): '{name}' is a {type(value).__name__}, not a numpy array; "
                            "convert MindSpore tensors with .asnumpy()")
        # safetensors serialises the raw buffer: a transposed (non C-contiguous) view would be saved scrambled.
        # (Not np.ascontiguousarray: it turns 0-d arrays into shape (1,).)
        tensors[name] = value if value.flags.c_contiguous else value.copy(order="C")
    from safetensors.numpy import save_file  # deferred: keeps `import mindgrpo.train.checkpoint` light

    tmp = tmp_sibling(path)
    try:
        save_file(tensors, str(tmp), metadata=dict(metadata) if metadata else None)
    except Exception as e:
        tmp.unlink(missing_ok=True)
        if out_of_space(e):
            raise CheckpointError(f"no space left to write {path} ({e}: disk full, over quota or over a file-size "
                                  "limit); free space, then resume with --resume_training") from e
        raise CheckpointError(f"cannot write {path}: {e}") from e
    commit_file(tmp, path)


def load_arrays(path: str | Path) -> dict[str, np.ndarray]:
    """Read a safetensors file written by `save_arrays` (or any safetensors file) into numpy arrays."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: file not found")
    from safetensors.numpy import load_file

    try:
        return load_file(str(path))
    except Exception as e:  # SafetensorError is not exported in a stable place; re-raise with the file name
        raise CheckpointError(f"{path}: not a readable safetensors file ({e}); the file is corrupt or truncated") from e


# ---------------------------------------------------------------------------------------------- RNG state
def _to_json(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return {"ndarray": value.tolist(), "dtype": str(value.dtype)}
    if isinstance(value, dict):
        return {k: _to_json(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_to_json(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _from_json(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"ndarray", "dtype"}:
            return np.asarray(value["ndarray"], dtype=value["dtype"])
        return {k: _from_json(v) for k, v in value.items()}
    return value


def rng_state(generator: np.random.Generator | None = None) -> dict[str, Any]:
    """JSON-serialisable state of Python's `random`, numpy's global RNG and optionally `generator`.

    MindSpore's seed state is not included (this module does not import MindSpore); the trainer adds it.
    """
    version, internal, gauss_next = random.getstate()
    kind, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    state: dict[str, Any] = {
        "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
        "numpy": {"kind": kind, "keys": keys.tolist(), "pos": int(pos), "has_gauss": int(has_gauss),
                  "cached_gaussian": float(cached_gaussian)},
    }
    if generator is not None:
        state["generator"] = _to_json(generator.bit_generator.state)
    return state


def set_rng_state(state: Mapping[str, Any], generator: np.random.Generator | None = None) -> None:
    """Restore what `rng_state` captured; `generator` gets the saved generator state (same bit generator type)."""
    try:
        py, npy = state["python"], state["numpy"]
        random.setstate((py["version"], tuple(py["internal"]), py["gauss_next"]))
        np.random.set_state((npy["kind"], np.asarray(npy["keys"], dtype=np.uint32), npy["pos"], npy["has_gauss"],
                             npy["cached_gaussian"]))
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"RNG state is malformed ({e!r}); pass what checkpoint.rng_state() returned") from e
    if generator is None:
        return
    if "generator" not in state:
        raise CheckpointError("RNG state holds no numpy Generator state: it was saved by rng_state() without a "
                              "generator; pass generator=None or re-save with the generator")
    saved = _from_json(state["generator"])
    current = type(generator.bit_generator).__name__
    if saved.get("bit_generator") != current:
        raise CheckpointError(f"saved generator state is for {saved.get('bit_generator')}, but the generator "
                              f"passed uses {current}; create it with the same bit generator")
    generator.bit_generator.state = saved


# ---------------------------------------------------------------------------------------------- checkpoints
def _hash_file(path: Path) -> tuple[int, str]:
    """(size, sha256) read in chunks; also fsyncs, since every file we hash is about to be committed."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
            size += len(chunk)
        os.fsync(f.fileno())
    return size, digest.hexdigest()


def _step_of(path: Path) -> int | None:
    match = _STEP_DIR.match(path.name)
    return int(match.group(1)) if match else None


class CheckpointManager:
    """Saves, verifies, finds and prunes the `step_<N>` checkpoints in `save_dir`."""

    def __init__(self, save_dir: str | Path, keep_last: int = 1):
        if not isinstance(keep_last, int) or keep_last < 1:
            raise ValueError(f"keep_last must be an integer >= 1 (number of checkpoints to keep), got {keep_last!r}")
        self.save_dir = Path(save_dir)
        self.keep_last = keep_last
        self.save_dir.mkdir(parents=True, exist_ok=True)
        self.cleanup_stale_tmp()

    def step_dir(self, step: int) -> Path:
        return self.save_dir / f"step_{step:08d}"

    def list(self) -> list[Path]:
        """All `step_<N>` folders, oldest step first, verified or not."""
        found = [(s, p) for p in self.save_dir.iterdir() if p.is_dir() and (s := _step_of(p)) is not None]
        return [p for _, p in sorted(found)]

    def save(self, step: int, writers: Mapping[str, Callable[[Path], None]], *,
             meta: Mapping[str, Any] | None = None) -> Path:
        """Build checkpoint `step` from `writers` (part name -> function filling an empty folder) and commit it.

        `meta` (JSON-serialisable: config, data position, ...) is stored in the manifest; `verify` returns it.
        Returns the committed `step_<N>` folder. Older checkpoints beyond `keep_last` are removed afterwards.
        """
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"checkpoint step must be a non-negative int, got {step!r}")
        if not writers:
            raise ValueError("save() needs at least one writer (part name -> callable(folder))")
        for name in writers:
            if not isinstance(name, str) or not _PART_NAME.match(name) or name == MANIFEST:
                raise ValueError(f"invalid checkpoint part name {name!r}: use letters, digits, '_', '-', '.' "
                                 f"(no slashes, not starting with '.', not {MANIFEST!r})")
        manifest: dict[str, Any] = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "step": step,
                                    "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                                    "created_unix": time.time(), "parts": sorted(writers), "meta": dict(meta or {})}
        try:  # fail before spending minutes on the writers
            json.dumps(manifest["meta"], allow_nan=False)
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"meta for checkpoint step {step} is not JSON-serialisable ({e}); use plain "
                                  "str/int/float/bool/list/dict values and no NaN/inf") from e

        self.cleanup_stale_tmp()
        tmp = self.save_dir / f".tmp-step_{step:08d}-{os.getpid()}-{secrets.token_hex(4)}"
        tmp.mkdir()
        try:
            for name, writer in writers.items():
                (tmp / name).mkdir()
                try:
                    writer(tmp / name)
                except Exception as e:
                    e.add_note(f"while writing part '{name}' of checkpoint step {step} into {tmp / name}")
                    raise
            manifest["files"] = self._describe_files(tmp)
            save_json(tmp / MANIFEST, manifest)
            fsync(tmp)
        except BaseException as err:
            shutil.rmtree(tmp, ignore_errors=True)
            if out_of_space(err) and not isinstance(err, CheckpointError):
                reason = getattr(err, "strerror", None) or err
                raise CheckpointError(f"no space left to write checkpoint step {step} into {self.save_dir} "
                                      f"({reason}: disk full, over quota or over a file-size limit). Its build "
                                      "folder was removed and the earlier checkpoints are intact: free space (or "
                                      "lower rl_config.save_max_ckpt_num), then resume with --resume_training"
                                      ) from err
            raise
        final = self._commit(tmp, step)
        self._prune(final, step)
        return final

    def _describe_files(self, root: Path) -> list[dict[str, Any]]:
        """Size and sha256 of every file under `root` (sorted, posix paths), fsyncing files and folders."""
        files = []
        for folder, dirnames, filenames in os.walk(root):  # does not descend into symlinked folders...
            dirnames.sort()
            for name in sorted(filenames) + dirnames:
                path = Path(folder, name)
                if path.is_symlink() or not (path.is_file() or path.is_dir()):  # ...which we refuse outright
                    raise CheckpointError(f"{path} is a symlink or special file; checkpoint writers must write "
                                          "regular files so the checkpoint is self-contained")
                if path.is_dir():
                    continue
                size, sha = _hash_file(path)
                files.append({"path": path.relative_to(root).as_posix(), "size": size, "sha256": sha})
            fsync(Path(folder))
        return files

    def _commit(self, tmp: Path, step: int) -> Path:
        """Rename the finished build folder to `step_<N>` (the commit point), replacing an older copy safely."""
        final = self.step_dir(step)
        if final.exists():
            # No atomic directory swap in the os module: move the old copy aside first. If we die between the two
            # renames, cleanup_stale_tmp() moves the old copy back, so step N never disappears.
            aside = self.save_dir / f".tmp-replaced-step_{step:08d}-{os.getpid()}-{secrets.token_hex(4)}"
            os.rename(final, aside)
            os.rename(tmp, final)
            fsync(self.save_dir)
            shutil.rmtree(aside)
        else:
            os.rename(tmp, final)
            fsync(self.save_dir)
        return final

    def _discard(self, path: Path) -> None:
        """Delete a checkpoint: rename it out of sight first, so a kill mid-delete leaves no partial `step_*`."""
        step = _step_of(path) or 0
        doomed = self.save_dir / f".tmp-discard-step_{step:08d}-{os.getpid()}-{secrets.token_hex(4)}"
        os.rename(path, doomed)
        shutil.rmtree(doomed)

    def _prune(self, saved: Path, step: int) -> None:
        """Keep `saved` and the newest `keep_last - 1` complete older checkpoints; delete every older folder.

        Completeness here is the cheap check (manifest, files, sizes): re-hashing every kept checkpoint on every
        save would cost minutes for large models, and `latest()` does the full check before resuming anyway.
        """
        kept = 1
        for path in reversed(self.list()):
            other = _step_of(path)
            if other == step:
                continue
            if other > step:
                warnings.warn(f"{path} has a higher step than the checkpoint just saved ({saved.name}); latest() "
                              "will prefer it. Delete it if it belongs to an abandoned run.", CheckpointWarning,
                              stacklevel=3)
                continue
            if kept < self.keep_last:
                try:
                    self.verify(path, check_hashes=False)
                    kept += 1
                    continue
                except CheckpointError:
                    pass  # incomplete: older than a complete checkpoint, so of no use to anyone
            self._discard(path)

    def verify(self, path: str | Path, *, check_hashes: bool = True) -> dict[str, Any]:
        """Check that `path` is a complete checkpoint and return its manifest; raise CheckpointError saying why not.

        `check_hashes=False` checks presence and sizes only (seconds instead of minutes for 100 GB checkpoints).
        Files in the folder that the manifest does not list are ignored.
        """
        path = Path(path)
        if not path.is_dir():
            raise CheckpointError(f"{path}: not a folder")
        manifest_path = path / MANIFEST
        if not manifest_path.is_file():
            raise CheckpointError(f"{path}: no {MANIFEST} (partial checkpoint: the save did not finish)")
        manifest = load_json(manifest_path)
        try:
            if manifest.get("format") != FORMAT_NAME:
                raise CheckpointError(f"{manifest_path}: not a {FORMAT_NAME} manifest")
            if manifest.get("format_version") != FORMAT_VERSION:
                raise CheckpointError(f"{manifest_path}: format_version {manifest.get('format_version')!r} is not "
                                      f"supported (this mindgrpo reads {FORMAT_VERSION}); upgrade mindgrpo")
            if _step_of(path) is not None and manifest.get("step") != _step_of(path):
                raise CheckpointError(f"{manifest_path}: records step {manifest.get('step')!r} but the folder is "
                                      f"{path.name}; it was renamed or copied over")
            entries = [(e["path"], int(e["size"]), str(e["sha256"])) for e in manifest["files"]]
            parts = [str(part) for part in manifest["parts"]]
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{manifest_path}: malformed manifest ({e!r})") from e
        for part in parts:  # a part may legitimately hold no files, so its folder is checked on its own
            if not (path / part).is_dir():
                raise CheckpointError(f"{path}: missing part folder {part}/")
        root = path.resolve()
        for rel, size, sha in entries:
            file = (path / rel).resolve()
            if root not in file.parents:
                raise CheckpointError(f"{manifest_path}: file entry {rel!r} points outside the checkpoint")
            if not file.is_file():
                raise CheckpointError(f"{path}: missing file {rel}")
            actual = file.stat().st_size
            if actual != size:
                raise CheckpointError(f"{path}: size mismatch for {rel} ({actual} bytes, manifest says {size}); "
                                      "the file is truncated or was modified")
            if check_hashes and _hash_file(file)[1] != sha:
                raise CheckpointError(f"{path}: sha256 mismatch for {rel}; the file is corrupt or was modified")
        return manifest

    def latest(self, *, check_hashes: bool = True) -> Path | None:
        """Newest checkpoint that passes `verify`; broken ones are skipped with a CheckpointWarning naming why."""
        for path in reversed(self.list()):
            try:
                self.verify(path, check_hashes=check_hashes)
                return path
            except CheckpointError as e:
                warnings.warn(f"skipping checkpoint: {e}", CheckpointWarning, stacklevel=2)  # e names the folder
        return None

    def cleanup_stale_tmp(self) -> None:
        """Remove `.tmp-*` folders left by killed saves; restore a replaced checkpoint whose swap was cut short.

        Folders of a process that is still running (another live run saving here) are left alone, with a warning.
        """
        for path in self.save_dir.iterdir():
            match = _TMP_DIR.match(path.name)
            if not match or not path.is_dir():
                continue
            kind, step, pid = match.group(1), int(match.group(2)), int(match.group(3))
            if pid != os.getpid() and pid_alive(pid):
                warnings.warn(f"left {path} in place: process {pid} that created it is still running. Delete it by "
                              "hand if no other run is saving into this folder.", CheckpointWarning, stacklevel=2)
                continue
            if kind == "replaced" and not self.step_dir(step).exists():
                os.rename(path, self.step_dir(step))  # killed mid-swap: the old copy is the only complete one
                fsync(self.save_dir)
                continue
            shutil.rmtree(path, ignore_errors=True)
