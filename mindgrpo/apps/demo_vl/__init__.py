r"""The embedded Qwen2.5-VL demo: a tiny Qwen2.5-VL, its tokenizer and a picture-counting task, made locally.

`make_vl_demo(out_dir)` builds what `python examples/grpo_vl/main.py` trains, without downloading anything, reusing
the text demo's pieces (:mod:`mindgrpo.apps.demo`: tokenizer recipe, weight initialisation, warm-start settings):

- `task`: 84 x 84 pictures with 1-4 coloured squares on a 3 x 3 grid; "How many squares are in the picture?",
  answered in `\boxed{}`, as geo3k parquet rows, converted by the geo3k converter.
- `model`: the text demo's tiny Qwen2.5 made a Qwen2.5-VL (M-RoPE, vision tokens, a 2-block vision tower).
- `warm_start`: a short supervised fine-tuning of the language model (the tower frozen) to about half the answers
  right, so GRPO starts with reward signal and room to improve.

`demo_config` is the GRPO run on it (`examples/grpo_vl/grpo_vl_demo.yaml`): the trainer, verifier (`accuracy_reward`
on the `\boxed{}` answer) and checkpoints are the library's, the tower frozen as in the geo3k recipe.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Union

from mindgrpo.stamped import stamped_build
from mindgrpo.apps.demo_vl.model import write_model
from mindgrpo.apps.demo_vl.task import NUM_TRAIN, QUESTION, make_rows, write_parquet
from mindgrpo.apps.demo_vl.warm_start import warm_start

PROMPT_TEMPLATE = "chatml"
MAX_PROMPT_LENGTH = 96
DEFAULT_WARM_START_STEPS = 300  # an upper bound: the warm start stops at warm_start.TARGET_MATCH
STAMP_FORMAT, RECIPE_VERSION = "mindgrpo-vl-demo", 1
DATASET_FILE = "data/train.mindrecord"  # the training prompts with their pictures, under the demo folder


@dataclass(frozen=True)
class VLDemo:
    """Paths of a built VL demo folder and what building it measured."""
    root: Path
    model_dir: Path       # the Hugging Face Qwen2.5-VL folder GRPO starts from (warm-started)
    dataset_file: Path    # the training prompts, a geo3k-format MindRecord with the pictures
    facts: Dict[str, object] = field(default_factory=dict)


def make_vl_demo(out_dir: Union[str, Path], *, seed: int = 0,
                 warm_start_steps: int = DEFAULT_WARM_START_STEPS) -> VLDemo:
    """Build the demo in `out_dir` (about a minute on 2 cores), or return the one already there: its `demo.json`
    stamp, written last, names the same recipe and every file is intact. Built in a temporary sibling folder
    renamed into place, one builder at a time, so an interrupted build leaves nothing half-written, data-parallel
    ranks wait for the first one, and a folder that is not a VL demo is refused, not overwritten."""
    root = Path(out_dir).expanduser().resolve()
    recipe = {"version": RECIPE_VERSION, "seed": int(seed), "warm_start_steps": int(warm_start_steps)}
    facts = stamped_build(root, STAMP_FORMAT, recipe, lambda tmp: _build(tmp, seed, warm_start_steps),
                          what="mindgrpo VL demo", required=["model/config.json", DATASET_FILE])
    return VLDemo(root, root / "model", root / DATASET_FILE, facts)


def _build(root: Path, seed: int, warm_start_steps: int) -> Dict[str, object]:
    """Every file of the demo in `root`: model, pictures and prompts, warm start; returns the facts for the stamp."""
    from mindgrpo.data import convert_dataset
    from mindgrpo.data.images import ImageProcessorConfig
    from mindgrpo.data.tokenizer import load_tokenizer

    init_dir, model_dir = root / "init", root / "model"
    init_dir.mkdir()
    rows = make_rows(NUM_TRAIN, seed)
    corpus = [{"question": QUESTION, "answer": f"\\boxed{{{n}}}"} for n in range(10)]
    facts = write_model(init_dir, corpus, seed)
    dataset_file = root / DATASET_FILE
    dataset_file.parent.mkdir()
    summary = convert_dataset(write_parquet(root / "data" / "train.parquet", rows), dataset_file,
                              load_tokenizer(init_dir), dataset_type="geo3k", prompt_template=PROMPT_TEMPLATE,
                              max_prompt_length=MAX_PROMPT_LENGTH, progress=False,
                              image_config=ImageProcessorConfig.from_pretrained(init_dir))
    facts["num_train"] = summary.rows_written
    if warm_start_steps:
        facts.update(warm_start(init_dir, model_dir, dataset_file, max_steps=warm_start_steps, seed=seed))
        shutil.rmtree(init_dir)
    else:
        init_dir.rename(model_dir)
    return facts


# The demo's GRPO run, beside examples/grpo_vl/main.py in the source checkout.
DEMO_CONFIG = Path(__file__).resolve().parents[3] / "examples" / "grpo_vl" / "grpo_vl_demo.yaml"


def demo_config(demo: VLDemo, output_dir: Union[str, Path], *, steps: int, seed: int = 0):
    """The GRPO run on the demo (``examples/grpo_vl/grpo_vl_demo.yaml``: 8 pictures x 8 samples per step, GRAPH
    mode) for `steps` steps into `output_dir`."""
    from mindgrpo.config import load_config

    return load_config(DEMO_CONFIG, [f"rl_config.output_dir={Path(output_dir).resolve()}",
                                     f"rl_config.max_steps={steps}", f"rl_config.seed={seed}"],
                       {"actor_checkpoint_path": str(demo.model_dir), "dataset_file": str(demo.dataset_file)})
