"""Shared pytest fixtures: the generated reference folders, the GSM8K data and MindSpore execution modes."""
import gc
import os
from pathlib import Path

import numpy as np
import pytest

import mindgrpo  # noqa: F401  (configures MindSpore/MindFormers logging before anything imports them)

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("MINDGRPO_SHARED", REPO.parent / "shared"))
# The real GSM8K files (train.jsonl, test.jsonl): $MINDGRPO_GSM8K, else ../shared/data/gsm8k on a machine that has it.
GSM8K = Path(os.environ.get("MINDGRPO_GSM8K", SHARED / "data" / "gsm8k"))


# The path fixtures are session-scoped so module- and session-scoped fixtures (built models, trained runs) can use
# them directly.
def generated_fixture(name: str) -> Path:
    """A folder the project's generators make (tests/fixtures/cache.py): built on first use, then cached."""
    from fixtures.cache import NAMES, fixture_root

    assert name in NAMES, name
    return fixture_root() / name


def gsm8k_path() -> Path:
    """The real GSM8K folder, or skip the test cleanly: the only data a test may lack (set MINDGRPO_GSM8K)."""
    if not (GSM8K / "train.jsonl").is_file():
        pytest.skip(f"GSM8K data not found: {GSM8K} (set MINDGRPO_GSM8K to a folder with train.jsonl, test.jsonl)")
    return GSM8K


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """The committed reference files: TRL's own losses and gradients (tools/make_trl_loss_reference.py)."""
    return REPO / "tests" / "fixtures"


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    return generated_fixture("tiny-qwen2.5")


@pytest.fixture(scope="session")
def tiny_untied_model_dir() -> Path:
    return generated_fixture("tiny-qwen2.5-untied")


@pytest.fixture(scope="session")
def vl_dir() -> Path:
    return generated_fixture("tiny-qwen2.5-vl")


@pytest.fixture(scope="session")
def vl_reference(vl_dir) -> dict:
    """Every array of the Qwen2.5-VL fixture's reference.npz (transformers' inputs and outputs)."""
    data = np.load(vl_dir / "reference.npz")
    return {key: data[key] for key in data.files}


@pytest.fixture(scope="session")
def gsm8k_dir() -> Path:
    return gsm8k_path()


def _kept_mode():
    """Restore MindSpore's execution mode after a test (or a module) that changed it: a trainer built in GRAPH mode
    sets it for the whole process, and under xdist any test may run next (one that differentiates a Python lambda,
    for one, cannot run in GRAPH mode)."""
    import mindspore as ms

    previous = ms.get_context("mode")
    yield
    ms.set_context(mode=previous)


# A module's own module-scoped fixtures (a trainer built once for its tests) keep their mode for the module's tests;
# the module-wide restore, instantiated before them, undoes it when the module is done.
module_keeps_the_mode = pytest.fixture(autouse=True, scope="module")(_kept_mode)
test_keeps_the_mode = pytest.fixture(autouse=True)(_kept_mode)


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
    from mindgrpo.apps import demo

    return demo.make_demo(tmp_path_factory.mktemp("demo_plain") / "demo", warm_start_steps=0)


def convert_demo_rows(folder: Path, demo, count: int, **options) -> Path:
    """The demo's first ``count`` training rows as a MindRecord in ``folder`` (``options``: convert_dataset's, with
    ``tools`` named as in rl_config.tools)."""
    from mindgrpo.data import convert_dataset
    from mindgrpo.data.tokenizer import load_tokenizer
    from mindgrpo.tools import offered_signatures

    rows = demo.train_jsonl.read_text(encoding="utf-8").splitlines(keepends=True)[:count]
    (folder / "train.jsonl").write_text("".join(rows), encoding="utf-8")
    out = folder / "train.mindrecord"
    convert_dataset(folder / "train.jsonl", out, load_tokenizer(demo.model_dir), dataset_type="gsm8k",
                    prompt_template="gsm8k_hash", progress=False,
                    **{**options, "tools": offered_signatures(options.get("tools", []))})
    return out


@pytest.fixture(scope="session")
def demo_prompts(tmp_path_factory, demo_plain):
    """16 demo prompts as a MindRecord (one prompt width: the step graphs compile once)."""
    return convert_demo_rows(tmp_path_factory.mktemp("demo_prompts"), demo_plain, 16, max_prompt_length=64)


def small_run_config(out: Path, dataset: Path, model: Path, *, max_prompt_length: int, seq_length: int,
                     max_tokens: int, verifiers, **rl):
    """A GRPO config small enough for a test: 2 prompts x 4 completions per step, checkpoints every 2 steps, a
    learning rate large enough that weights visibly move in a few steps; ``rl`` sets any other rl_config key."""
    from mindgrpo.config import GRPOConfig

    cfg = GRPOConfig()
    cfg.rl_config.dataset_file = str(dataset)
    cfg.rl_config.output_dir = str(out)
    cfg.rl_config.batch_size = 2
    cfg.rl_config.num_generations = 4
    cfg.rl_config.max_prompt_length = max_prompt_length
    cfg.rl_config.seq_length = seq_length
    cfg.rl_config.beta = 0.04
    cfg.rl_config.save_ckpt_interval = 2
    cfg.rl_config.save_max_ckpt_num = 2
    cfg.actor_config.load = str(model)
    cfg.actor_config.micro_batch_size = 4
    cfg.actor_config.lr_schedule.learning_rate = 1e-3
    cfg.ref_config.ref_model_batch_size = 8
    cfg.generate_config.infer_model_batch_size = 8
    cfg.generate_config.sampling_config.max_tokens = max_tokens
    cfg.reward_config.verifier_function = list(verifiers)
    cfg.reward_config.verifier_weight = [1.0] * len(verifiers)
    for key, value in rl.items():
        setattr(cfg.rl_config, key, value)
    return cfg


# ---- the suite on two workers (pytest-xdist: `python -m pytest -n 2`, the README's command) ----------------------
# `--dist loadgroup` (pyproject's addopts) sends each xdist_group to one worker as a whole, in collection order
# (`--no-loadscope-reorder`).

# Tests that start msrun (a scheduler and 2 workers: already both cores) run one after another on one worker: two at
# once would put 4 training processes on 2 cores and stretch the collectives' timeouts the fault tests measure.
msrun_group = pytest.mark.xdist_group("msrun")

# The longest work units start first, so that no worker is left running one of them alone at the end. Measured
# under `-n 2` on 2 cores (42.5 min in all, before the demo test became one seed): the msrun group 1533 s, the demo
# learning over five seeds 870 s, tests/test_faults.py's group 390 s, the 7B-depth test 358 s; the next units are
# under about 200 s. The tool demo's learning test (its warm start, then 2 runs) took 317 s beside the other worker
# (at eb8d267, 60 steps a run; 40 since).
LONGEST_FIRST = ("msrun", "tests/test_faults.py",
                 "tests/test_demo_tools.py::test_tool_demo_beats_the_same_budget_without_tools",
                 "tests/test_depth.py::test_qwen2_5_7b_depth_and_vocabulary_train_checkpoint_and_resume",
                 "tests/test_demo_learns.py::test_demo_learns_on_problems_it_never_saw")


def _group(item):
    marker = item.get_closest_marker("xdist_group")
    return marker.args[0] if marker is not None else None


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups into the node ids
def pytest_collection_modifyitems(config, items):
    """A module-, class- or session-scoped fixture defined in a test module is built once per worker that runs one of
    its tests: keep that module's tests on one worker (its own group) so an expensive one (a trained run, compiled
    engines) is built once, as in a serial run. On an xdist worker, the LONGEST_FIRST units move to the front."""
    for item in items:
        if _group(item) is not None or not hasattr(item, "_fixtureinfo"):
            continue
        module_id = item.nodeid.split("::", 1)[0]
        shared = any(defs and defs[-1].scope != "function" and defs[-1].baseid == module_id
                     for defs in item._fixtureinfo.name2fixturedefs.values())
        if shared:
            item.add_marker(pytest.mark.xdist_group(module_id))
    if hasattr(config, "workerinput"):  # a serial run keeps the file order
        rank = {unit: i for i, unit in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(_group(item) or item.nodeid, len(rank)))


# MindSpore runs a full gc.collect() before compiling each graph. In a test worker that has imported torch,
# transformers and MindFormers and holds built models, that traverses some 10^6 objects: about 0.2 s per compile, some
# hundreds of compiles in the suite. Freezing what each module starts with moves it out of the collector's sight
# (garbage cycles among it are collected first; reference counting still frees the rest as usual).
@pytest.fixture(autouse=True, scope="module")
def _long_lived_objects_frozen():
    gc.collect()
    gc.freeze()
    yield
