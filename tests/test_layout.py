"""The README's layout table matches the tree: every module, package and tool is named in its row, and every name
in the table exists. A newcomer finds a concept by the table; a table that drifts from the tree misleads."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CODE = re.compile(r"`([^`]+)`")


def layout_rows():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:-1] for line in section.splitlines() if line.startswith("| `")]
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
        assert f"mindgrpo/{path.name}" in named, f"README layout table has no row for mindgrpo/{path.name}"


def test_each_package_row_names_every_module_and_subpackage_it_holds():
    for where, what in layout_rows():
        for name in where:
            path = ROOT / name
            assert path.exists(), f"README layout table names {name}, which does not exist"
            if not path.is_dir() or not name.startswith("mindgrpo/"):
                continue
            listed = set(CODE.findall(what))
            for module in modules_under(path):
                assert module.name in listed, f"the README row for {name} does not name {module.relative_to(ROOT)}"
            for sub in (p for p in path.iterdir() if p.is_dir() and (p / "__init__.py").exists()):
                assert f"{sub.name}/" in what, f"the README row for {name} does not name its package {sub.name}/"
            for file_name in (n for n in listed if n.endswith(".py")):
                assert list(path.rglob(file_name)), f"the README row for {name} names {file_name}, not in {name}"


def test_tools_and_examples_rows_name_every_file():
    rows = {name: what for where, what in layout_rows() for name in where}
    for folder, pattern in (("tools/", "*.py"), ("examples/grpo/", "*"), ("examples/grpo_vl/", "*")):
        listed = set(CODE.findall(rows[folder]))
        for path in sorted((ROOT / folder).glob(pattern)):
            if path.suffix in (".py", ".ipynb"):
                assert path.name in listed, f"the README row for {folder} does not name {path.name}"
