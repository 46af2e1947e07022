"""The layout table (docs/layout.md) matches the tree: every module, package, tool and documentation page is named in
its row, and every name in the table exists. A newcomer finds a concept by the table; a table that drifts from the
tree misleads."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CODE = re.compile(r"`([^`]+)`")
LAYOUT = ROOT / "docs" / "layout.md"


def layout_rows():
    text = LAYOUT.read_text(encoding="utf-8")
    rows = [line.split("|")[1:-1] for line in text.splitlines() if line.startswith("| `")]
    return [(CODE.findall(where), " ".join(what)) for where, *what in rows]


def modules_under(folder: Path):
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts and not p.name.startswith("__"))


def test_every_top_level_module_and_package_has_a_row():
    named = {name.rstrip("/") for where, _ in layout_rows() for name in where}
    for path in sorted((ROOT / "mindgrpo").iterdir()):
        if path.name.startswith("__") and path.name != "__main__.py" or path.suffix not in (".py", ""):
            continue
        if path.is_dir() and not (path / "__init__.py").exists():
            continue
        assert f"mindgrpo/{path.name}" in named, f"docs/layout.md has no row for mindgrpo/{path.name}"


def test_each_package_row_names_every_module_and_subpackage_it_holds():
    for where, what in layout_rows():
        for name in where:
            path = ROOT / name
            assert path.exists(), f"docs/layout.md names {name}, which does not exist"
            if not path.is_dir() or not name.startswith("mindgrpo/"):
                continue
            listed = set(CODE.findall(what))
            for module in modules_under(path):
                assert module.name in listed, f"the docs/layout.md row for {name} does not name {module.relative_to(ROOT)}"
            for sub in (p for p in path.iterdir() if p.is_dir() and (p / "__init__.py").exists()):
                assert f"{sub.name}/" in what, f"the docs/layout.md row for {name} does not name its package {sub.name}/"
            for file_name in (n for n in listed if n.endswith(".py")):
                assert list(path.rglob(file_name)), f"the docs/layout.md row for {name} names {file_name}, not in {name}"


def test_tools_and_examples_rows_name_every_file():
    rows = {name: what for where, what in layout_rows() for name in where}
    for folder, pattern in (("tools/", "*.py"), ("examples/grpo/", "*"), ("examples/grpo_vl/", "*"), ("docs/", "*")):
        listed = set(CODE.findall(rows[folder]))
        for path in sorted((ROOT / folder).glob(pattern)):
            if path.suffix in (".py", ".ipynb", ".md") or path.is_dir():
                name = f"{path.name}/" if path.is_dir() else path.name
                assert name in listed, f"the docs/layout.md row for {folder} does not name {name}"
