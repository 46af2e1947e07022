"""Shared pytest fixtures: the `../shared` reference folder and MindSpore execution modes."""
import os
from pathlib import Path

import pytest

import mindgrpo  # noqa: F401  (configures MindSpore/MindFormers logging before anything imports them)

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("MINDGRPO_SHARED", REPO.parent / "shared"))


# The path fixtures are session-scoped so module- and session-scoped fixtures (built models, trained runs) can use
# them directly.
def shared_path(*parts: str) -> Path:
    """Path under ../shared, or skip the test cleanly when that folder (or file) is absent."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"reference data not found: {path}")
    return path


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return shared_path("fixtures")


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    return shared_path("fixtures", "tiny-qwen2.5")


@pytest.fixture(scope="session")
def tiny_untied_model_dir() -> Path:
    return shared_path("fixtures", "tiny-qwen2.5-untied")


@pytest.fixture(scope="session")
def gsm8k_dir() -> Path:
    return shared_path("data", "gsm8k")


@pytest.fixture(params=["pynative", "graph"])
def ms_mode(request):
    """Run the test once in PyNative and once in GRAPH mode (the mindone way)."""
    import mindspore as ms

    previous = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE if request.param == "pynative" else ms.GRAPH_MODE)
    yield request.param
    ms.set_context(mode=previous)


@pytest.fixture(scope="session")
def demo_plain(tmp_path_factory):
    """The embedded demo without its warm start (a random tiny Qwen2 model, tokenizer and GSM8K-format rows, made
    locally in about a second): for tests of the trainer's guarantees that must not depend on ../shared."""
    from mindgrpo import demo

    return demo.make_demo(tmp_path_factory.mktemp("demo_plain") / "demo", warm_start_steps=0)
