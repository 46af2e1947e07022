"""Checkpoints: round-trip, manifest verification, pruning, replacement, crash safety (SIGKILL) and RNG state."""
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from mindgrpo.train.checkpoint import (CheckpointError, CheckpointManager, CheckpointWarning, load_arrays, load_json,
                                 rng_state, save_arrays, save_json, set_rng_state)


def _writers(value: float):
    """Two parts: a safetensors 'model' and a JSON 'trainer' state, both depending on `value`."""
    def model(folder: Path) -> None:
        save_arrays(folder / "weights.safetensors", {"w": np.full((4, 3), value, np.float32), "step": np.array(1)})

    def trainer(folder: Path) -> None:
        save_json(folder / "state.json", {"value": value})

    return {"model": model, "trainer": trainer}


def _value(path: Path) -> float:
    return load_json(path / "trainer" / "state.json")["value"]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _tmp_folders(save_dir: Path) -> list[str]:
    return sorted(p.name for p in save_dir.iterdir() if p.name.startswith(".tmp-"))


def test_round_trip_and_manifest(tmp_path):
    arrays = {
        "transposed": np.arange(12, dtype=np.float32).reshape(3, 4).T,  # non-contiguous view
        "ids": np.array([[1, -2], [3, 4]], dtype=np.int64),
        "mask": np.array([True, False]),
        "scalar": np.array(2.5, dtype=np.float64),
    }

    def model(folder: Path) -> None:
        save_arrays(folder / "optimizer.safetensors", arrays)
        (folder / "nested").mkdir()
        save_json(folder / "nested" / "config.json", {"hidden": 8, "name": "tiny ü"})

    manager = CheckpointManager(tmp_path / "ckpt", keep_last=2)
    path = manager.save(7, {"model": model}, meta={"epoch": 1, "lr": 1e-5})

    assert path == tmp_path / "ckpt" / "step_00000007"
    assert manager.latest() == path
    assert manager.list() == [path]
    assert _tmp_folders(tmp_path / "ckpt") == []
    loaded = load_arrays(path / "model" / "optimizer.safetensors")
    assert sorted(loaded) == sorted(arrays)
    for name, array in arrays.items():
        assert loaded[name].dtype == array.dtype and np.array_equal(loaded[name], array), name
    assert load_json(path / "model" / "nested" / "config.json") == {"hidden": 8, "name": "tiny ü"}

    manifest = manager.verify(path)
    assert manifest["step"] == 7 and manifest["meta"] == {"epoch": 1, "lr": 1e-5}
    assert manifest["parts"] == ["model"] and manifest["format_version"] == 1
    listed = {entry["path"]: entry for entry in manifest["files"]}
    assert sorted(listed) == ["model/nested/config.json", "model/optimizer.safetensors"]
    for rel, entry in listed.items():
        data = (path / rel).read_bytes()
        assert entry["size"] == len(data) and entry["sha256"] == hashlib.sha256(data).hexdigest()


def _flip_byte(path: Path) -> None:
    file = path / "model" / "weights.safetensors"
    data = bytearray(file.read_bytes())
    data[len(data) - 5] ^= 0x01  # inside the tensor data: size unchanged, contents wrong
    file.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    file = path / "model" / "weights.safetensors"
    file.write_bytes(file.read_bytes()[:-3])


CORRUPTIONS = {
    "flipped byte": (_flip_byte, "sha256 mismatch for model/weights.safetensors"),
    "truncated file": (_truncate, "size mismatch for model/weights.safetensors"),
    "missing file": (lambda p: (p / "trainer" / "state.json").unlink(), "missing file trainer/state.json"),
    "missing manifest": (lambda p: (p / "manifest.json").unlink(), "no manifest.json"),
    "garbage manifest": (lambda p: (p / "manifest.json").write_text('{"format": "mindgrpo-chec'), "invalid JSON"),
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_latest_skips_corrupt_checkpoint(tmp_path, kind):
    corrupt, reason = CORRUPTIONS[kind]
    manager = CheckpointManager(tmp_path, keep_last=3)
    good = manager.save(1, _writers(1.0))
    bad = manager.save(2, _writers(2.0))
    corrupt(bad)

    with pytest.raises(CheckpointError, match=reason):
        manager.verify(bad)
    with pytest.warns(CheckpointWarning, match=f"step_00000002.*{reason}"):
        assert manager.latest() == good
    assert _value(good) == 1.0


def test_latest_none_when_nothing_usable(tmp_path):
    manager = CheckpointManager(tmp_path)
    assert manager.latest() is None
    path = manager.save(3, _writers(3.0))
    (path / "manifest.json").unlink()
    with pytest.warns(CheckpointWarning, match="no manifest.json"):
        assert manager.latest() is None


def test_empty_part_is_allowed_but_must_exist(tmp_path):
    manager = CheckpointManager(tmp_path)
    path = manager.save(1, {**_writers(1.0), "empty": lambda folder: None})
    assert manager.verify(path)["parts"] == ["empty", "model", "trainer"]
    (path / "empty").rmdir()
    with pytest.raises(CheckpointError, match="missing part folder empty/"):
        manager.verify(path)


def test_manifest_step_must_match_folder(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=2)
    manager.save(1, _writers(1.0))
    os.rename(tmp_path / "step_00000001", tmp_path / "step_00000009")  # copied/renamed by hand
    with pytest.raises(CheckpointError, match="records step 1 but the folder is step_00000009"):
        manager.verify(tmp_path / "step_00000009")


@pytest.mark.parametrize("keep_last", [1, 2])
def test_keep_last_prunes_older(tmp_path, keep_last):
    manager = CheckpointManager(tmp_path, keep_last=keep_last)
    for step in range(1, 5):
        manager.save(step * 10, _writers(float(step)))
    assert [p.name for p in manager.list()] == [f"step_000000{s}0" for s in range(5 - keep_last, 5)]
    assert _tmp_folders(tmp_path) == []


def test_partial_checkpoints_do_not_count_toward_keep_last(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=2)
    manager.save(1, _writers(1.0))
    partial = manager.save(2, _writers(2.0))
    (partial / "manifest.json").unlink()
    manager.save(3, _writers(3.0))
    assert [p.name for p in manager.list()] == ["step_00000001", "step_00000003"]


def test_newer_checkpoint_is_kept_with_a_warning(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=1)
    manager.save(50, _writers(5.0))
    with pytest.warns(CheckpointWarning, match="step_00000050 has a higher step"):
        saved = manager.save(20, _writers(2.0))
    assert manager.list() == [saved, tmp_path / "step_00000050"]  # the one just saved is never pruned


def test_resave_same_step_replaces_it(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=2)
    manager.save(4, _writers(1.0))
    path = manager.save(4, _writers(2.0))
    assert manager.list() == [path]
    assert _value(path) == 2.0
    manager.verify(path)
    assert _tmp_folders(tmp_path) == []


def test_swap_interrupted_between_renames_is_undone(tmp_path):
    manager = CheckpointManager(tmp_path)
    manager.save(4, _writers(1.0))
    # State after a kill between "move old step_4 aside" and "rename the new build in".
    dead = _dead_pid()
    os.rename(tmp_path / "step_00000004", tmp_path / f".tmp-replaced-step_00000004-{dead}-ab12")
    (tmp_path / f".tmp-step_00000004-{dead}-cd34").mkdir()

    manager = CheckpointManager(tmp_path)
    assert _tmp_folders(tmp_path) == []
    assert manager.latest() == tmp_path / "step_00000004" and _value(manager.latest()) == 1.0


def test_tmp_folder_of_live_process_is_left_alone(tmp_path):
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stale = tmp_path / f".tmp-step_00000001-{live.pid}-ab12"
        stale.mkdir()
        with pytest.warns(CheckpointWarning, match=f"process {live.pid} that created it is still running"):
            CheckpointManager(tmp_path)
        assert stale.exists()
    finally:
        live.kill()
        live.wait()
    CheckpointManager(tmp_path)
    assert not stale.exists()


def test_failing_writer_leaves_nothing(tmp_path):
    manager = CheckpointManager(tmp_path)
    good = manager.save(1, _writers(1.0))

    def broken(folder: Path) -> None:
        (folder / "half.bin").write_bytes(b"x" * 100)
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full") as info:
        manager.save(2, {**_writers(2.0), "zbroken": broken})
    assert any("part 'zbroken' of checkpoint step 2" in note for note in info.value.__notes__)
    assert manager.list() == [good] and manager.latest() == good
    assert _tmp_folders(tmp_path) == []


def test_no_space_while_writing_is_a_clear_error_and_keeps_the_previous_checkpoint(tmp_path):
    """ENOSPC (a full disk) or EFBIG (a file-size limit) from a writer, or safetensors' error text for one."""
    import errno

    from mindgrpo._io import out_of_space

    manager = CheckpointManager(tmp_path)
    good = manager.save(1, _writers(1.0))

    def full(folder: Path) -> None:
        (folder / "half.bin").write_bytes(b"x" * 100)
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(CheckpointError, match=rf"no space left to write checkpoint step 2 into {tmp_path} \(No "
                                              r"space left on device: disk full.*earlier checkpoints are intact"):
        manager.save(2, {**_writers(2.0), "zfull": full})
    assert manager.list() == [good] and manager.latest() == good and _tmp_folders(tmp_path) == []
    rust = RuntimeError("Error while serializing: I/O error: File too large (os error 27)")
    assert out_of_space(rust) and not out_of_space(RuntimeError("Error (os error 2)"))
    assert out_of_space(CheckpointError("cannot write")) is False


def test_bad_arguments_fail_before_writing(tmp_path):
    manager = CheckpointManager(tmp_path)
    called = []
    writer = {"model": lambda folder: called.append(folder)}
    with pytest.raises(CheckpointError, match="meta for checkpoint step 1 is not JSON-serialisable"):
        manager.save(1, writer, meta={"loss": float("nan")})
    with pytest.raises(ValueError, match="invalid checkpoint part name '../x'"):
        manager.save(1, {"../x": writer["model"]})
    with pytest.raises(ValueError, match="non-negative int"):
        manager.save(-1, writer)
    with pytest.raises(ValueError, match="keep_last"):
        CheckpointManager(tmp_path, keep_last=0)
    assert called == [] and manager.list() == [] and _tmp_folders(tmp_path) == []


def test_symlinks_are_refused(tmp_path):
    manager = CheckpointManager(tmp_path / "ckpt")
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"data")
    with pytest.raises(CheckpointError, match="symlink"):
        manager.save(1, {"model": lambda folder: (folder / "link.bin").symlink_to(outside)})
    assert manager.list() == []


_SLOW_SAVE = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from mindgrpo.train.checkpoint import CheckpointManager

    save_dir, marker = sys.argv[1], Path(sys.argv[2])

    def slow_writer(folder):
        with open(folder / "big.bin", "wb") as f:
            for _ in range(600):  # ~60 s unless killed
                f.write(b"\\0" * (1 << 20))
                f.flush()
                marker.touch()
                time.sleep(0.1)

    CheckpointManager(save_dir, keep_last=1).save(2, {"model": slow_writer})
""")


def test_sigkill_during_save_keeps_previous_checkpoint(tmp_path):
    save_dir, marker = tmp_path / "ckpt", tmp_path / "writer-started"
    manager = CheckpointManager(save_dir, keep_last=1)
    previous = manager.save(1, _writers(1.0))

    child = subprocess.Popen([sys.executable, "-c", _SLOW_SAVE, str(save_dir), str(marker)])
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert child.poll() is None, "the saving subprocess exited before its writer started"
            assert time.monotonic() < deadline, "the saving subprocess never started writing"
            time.sleep(0.05)
        time.sleep(0.3)  # a few MB into the big file
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL

    leftovers = _tmp_folders(save_dir)
    assert len(leftovers) == 1 and leftovers[0].startswith(f".tmp-step_00000002-{child.pid}-")
    assert (save_dir / leftovers[0] / "model" / "big.bin").stat().st_size > 0  # it really was mid-save
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the leftover must not even be looked at as a checkpoint
        assert manager.list() == [previous]
        assert manager.latest() == previous and _value(previous) == 1.0

    CheckpointManager(save_dir, keep_last=1)
    assert _tmp_folders(save_dir) == []
    assert manager.latest() == previous


def _draws(generator: np.random.Generator) -> list:
    return [random.random(), random.gauss(0, 1), np.random.rand(3).tolist(), float(np.random.normal()),
            generator.random(2).tolist(), generator.integers(0, 1 << 30, 2).tolist()]


@pytest.mark.parametrize("bit_generator", [np.random.PCG64, np.random.MT19937, np.random.Philox])
def test_rng_state_round_trip(tmp_path, bit_generator):
    random.seed(1)
    np.random.seed(2)
    generator = np.random.Generator(bit_generator(3))
    random.gauss(0, 1)  # leaves a cached second Gaussian in both legacy generators
    np.random.normal()
    save_json(tmp_path / "rng.json", rng_state(generator))  # through JSON, as in a checkpoint
    expected = _draws(generator)

    random.seed(99)
    np.random.seed(99)
    fresh = np.random.Generator(bit_generator(99))
    assert _draws(fresh) != expected
    set_rng_state(load_json(tmp_path / "rng.json"), fresh)
    assert _draws(fresh) == expected


def test_rng_state_mismatches_are_explained():
    with pytest.raises(CheckpointError, match="saved generator state is for PCG64.*uses MT19937"):
        set_rng_state(rng_state(np.random.default_rng(0)), np.random.Generator(np.random.MT19937(0)))
    with pytest.raises(CheckpointError, match="without a generator"):
        set_rng_state(rng_state(), np.random.default_rng(0))
    with pytest.raises(CheckpointError, match="RNG state is malformed"):
        set_rng_state({"python": {}})


def test_json_and_array_helpers_report_bad_files(tmp_path):
    with pytest.raises(CheckpointError, match="state.json.*not JSON-serialisable"):
        save_json(tmp_path / "state.json", {"loss": float("inf")})
    assert not (tmp_path / "state.json").exists() and list(tmp_path.iterdir()) == []

    (tmp_path / "bad.json").write_text('{\n  "a": 1,\n  oops\n}')
    with pytest.raises(CheckpointError, match=r"bad\.json:3: invalid JSON"):
        load_json(tmp_path / "bad.json")
    (tmp_path / "bad.safetensors").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match=r"bad\.safetensors: not a readable safetensors file"):
        load_arrays(tmp_path / "bad.safetensors")
    with pytest.raises(FileNotFoundError, match="missing.safetensors"):
        load_arrays(tmp_path / "missing.safetensors")
    with pytest.raises(TypeError, match="'w' is a list"):
        save_arrays(tmp_path / "x.safetensors", {"w": [1.0]})


def test_save_json_replaces_atomically(tmp_path):
    save_json(tmp_path / "s.json", {"a": 1})
    save_json(tmp_path / "s.json", {"a": 2})
    assert json.loads((tmp_path / "s.json").read_text()) == {"a": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]
