"""The documentation: the pages under docs/ build as a site with `mkdocs build --strict` (a broken link, a missing
page, an anchor that does not exist or a page left out of the navigation fails it), the README's own links reach a
file and a heading, and the README stays a page a newcomer reads in minutes, its two commands the ones `.ci/run`
and a fresh machine run."""
import re
import subprocess
import sys
from pathlib import Path

from markdown.extensions.toc import slugify

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.+)$", re.M)


def test_docs_build_strict(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "WARNING" not in done.stderr, done.stderr
    assert (tmp_path / "site" / "index.html").is_file()


def readme_links():
    return [link for link in LINK.findall(README.read_text(encoding="utf-8")) if "://" not in link]


def test_readme_links_reach_a_file_and_a_heading():
    links = readme_links()
    assert any(link.startswith("docs/") for link in links)
    for link in links:
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.is_file(), f"README links to {path}, which does not exist"
        if anchor:
            headings = HEADING.findall(target.read_text(encoding="utf-8"))
            assert anchor in {slugify(h, "-") for h in headings}, f"README links to {link}: no such heading"


def test_readme_is_short_and_its_commands_are_the_ones_run():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250, "the README is the three-minute page: move details into docs/"
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    assert "pip install -e . && python examples/grpo/main.py\n" in blocks
    test_command = 'pip install -e ".[test]" && python -m pytest -n 2'
    assert f"{test_command}\n" in blocks
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()
    assert ci[-1] == test_command, ".ci/run runs the README's test command verbatim"
