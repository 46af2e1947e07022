"""The project's reference fixtures (tests/fixtures/): the generators are deterministic, and the cache serves what
they make."""
from pathlib import Path

from fixtures.cache import NAMES, build, fixture_root


def _files(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_fresh_build_is_byte_identical_to_the_cached_one(tmp_path):
    """Building again (here, in this process) writes the same bytes as the cached build (another process, maybe
    another day): tokenizer, weights, pictures and every reference array."""
    cached = fixture_root()
    build(tmp_path)
    fresh, kept = _files(tmp_path), _files(cached)
    assert sorted(p.name for p in cached.iterdir()) == sorted(NAMES)
    assert sorted(fresh) == sorted(kept)
    assert [name for name in fresh if fresh[name] != kept[name]] == []
