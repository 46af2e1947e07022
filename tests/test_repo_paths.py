"""No committed file holds a path of one machine (a home folder, /root, /tmp, a workspace): the repository, its docs
and the figures they quote work from any clone. Examples use placeholders (`/path/to/Qwen2.5-7B`, `trlenv/`)."""
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:work|tmp|root|home|Users)/")


def committed_files():
    """Tracked files of the checkout (every file under it, hidden and build folders aside, when git is absent)."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True)
    if listed.returncode == 0 and listed.stdout:
        return [ROOT / name for name in listed.stdout.decode().split("\0") if name]
    skip = {"build", "dist", "output", "__pycache__"}
    return [p for p in ROOT.rglob("*") if p.is_file()
            and not any(part.startswith(".") or part in skip or part.endswith(".egg-info")
                        for part in p.relative_to(ROOT).parts)]


def machine_paths(path: Path):
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):  # binary (a PNG, an npz): no text to read paths from
        return []
    return [f"{path.relative_to(ROOT)}:{n}: {line.strip()[:140]}"
            for n, line in enumerate(text.splitlines(), 1) if MACHINE_PATH.search(line)]


def test_the_pattern_finds_machine_paths_and_spares_placeholders():
    machine = [f"python -m venv /{top}/trlenv" for top in ("work", "tmp", "root", "home", "Users")]  # built, so this
    assert all(MACHINE_PATH.search(s) for s in machine)  # file does not hold them itself
    spared = ("/path/to/Qwen2.5-7B", "~/.cache/mindgrpo", "trlenv/bin/python", f"a/{'tmp'}/b", "output/demo/", "/data/x")
    assert not [s for s in spared if MACHINE_PATH.search(s)]


def test_no_committed_file_holds_a_machine_path():
    files = committed_files()
    assert any(p.name == "README.md" for p in files)
    hits = [hit for path in files if path.is_file() for hit in machine_paths(path)]
    assert not hits, ("committed files hold paths of one machine (use a path relative to the clone or a "
                      "placeholder such as /path/to/...):\n" + "\n".join(hits))
