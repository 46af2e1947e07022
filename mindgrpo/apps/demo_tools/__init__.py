r"""The embedded tool demo: the text demo's tiny Qwen2.5 learning to use the ``calculator`` tool, made locally.

`make_tool_demo(out_dir)` builds what `mindgrpo train --demo tools` (``examples/grpo/tool_demo.yaml``) trains,
without downloading anything, from the text demo's pieces (:mod:`mindgrpo.apps.demo`: tokenizer recipe, model,
warm-start settings):

- `task`: products of a three-digit and a two-digit number ("What is 347 * 82?"), in GSM8K format: arithmetic the
  tiny model cannot do in its head, and can with the calculator.
- the tokenizer is trained on the prompts with and without the tool block (Qwen2.5's system turn listing the
  calculator) and on both answer formats, so a prompt is whole words (about 230 tokens with the tool block).
- `warm_start`: a short supervised fine-tuning on both formats (the call and `#### N` after the tool's response;
  the worked product without tools), stopped while the model still often miscopies a number.

The GRPO runs with and without the tool start from this one model: ``rl_config.tools=[]`` converts the prompts
without the tool block (`prepare_tool_demo` in :mod:`mindgrpo.apps.train_cli`).
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Union

from mindgrpo.stamped import STAMP, stamped_build, write_json, write_jsonl
from mindgrpo.apps.demo.model import init_weights, model_config
from mindgrpo.apps.demo.tokenizer import train_tokenizer, write_tokenizer
from mindgrpo.apps.demo_tools.task import corpus, make_problems
from mindgrpo.apps.demo_tools.warm_start import encode, warm_start

TOOLS = ["calculator"]
PROMPT_TEMPLATE = "chatml"
DEFAULT_WARM_START_STEPS = 600  # an upper bound: the warm start stops at warm_start.TARGET_MATCH


STAMP_FORMAT = "mindgrpo-tool-demo"
RECIPE_VERSION = 2  # 2: the warm start computes the tool rows' system turn once


@dataclass(frozen=True)
class ToolDemo:
    """Paths of a built tool demo folder and what building it measured."""
    root: Path
    model_dir: Path       # the Hugging Face folder GRPO starts from (warm-started)
    train_jsonl: Path     # GSM8K-format rows, converted with or without --tools calculator
    test_jsonl: Path
    facts: Dict[str, object] = field(default_factory=dict)

    @classmethod
    def at(cls, root: Path, facts: Dict[str, object]) -> "ToolDemo":
        return cls(root, root / "model", root / "train.jsonl", root / "test.jsonl", facts)


def default_tool_demo_dir() -> Path:
    """Where `mindgrpo train --demo tools` keeps the demo: mindgrpo's per-user cache, beside the text demo."""
    from mindgrpo._env import cache_dir

    return Path(cache_dir()) / "demo_tools"


def make_tool_demo(out_dir: Union[str, Path], *, seed: int = 0,
                   warm_start_steps: int = DEFAULT_WARM_START_STEPS) -> ToolDemo:
    """Build the demo in `out_dir`, or return the one already there (its `demo.json` stamp, written last, names
    the same recipe). Built in a temporary sibling folder renamed into place, one builder at a time, so an
    interrupted build leaves nothing half-written and data-parallel ranks wait for the first one."""
    root = Path(out_dir).expanduser().resolve()
    recipe = {"version": RECIPE_VERSION, "seed": int(seed), "warm_start_steps": int(warm_start_steps)}
    facts = stamped_build(root, STAMP_FORMAT, recipe, lambda tmp: _build(tmp, seed, warm_start_steps),
                          what="mindgrpo tool demo", required=["model/config.json", "train.jsonl", "test.jsonl"])
    return ToolDemo.at(root, facts)


def _build(root: Path, seed: int, warm_start_steps: int) -> Dict[str, object]:
    """Every file of the demo in `root`; returns the facts for the stamp."""
    from safetensors.numpy import save_file

    from mindgrpo.data import render_prompt
    from mindgrpo.data.templates import render_tool_prompt
    from mindgrpo.data.tokenizer import load_tokenizer
    from mindgrpo.tools import resolve_tools
    from mindgrpo.data.tool_format import system_turn

    init_dir, model_dir = root / "init", root / "model"
    init_dir.mkdir()
    train, test = make_problems(seed)
    write_jsonl(root / "train.jsonl", train)
    write_jsonl(root / "test.jsonl", test)
    signatures = [tool.signature for tool in resolve_tools(TOOLS)]
    tool_prompts = [render_tool_prompt(PROMPT_TEMPLATE, row["question"], signatures) for row in train]
    plain_prompts = [render_prompt(PROMPT_TEMPLATE, row["question"]) for row in train]
    system = system_turn(signatures)
    if any(tool != system + plain for tool, plain in zip(tool_prompts, plain_prompts)):
        # the warm start trains on the system turn and each prompt apart: together they must be the rollout's prompt
        raise RuntimeError("a tool prompt is not the system turn followed by the prompt without tools")
    # the tool block once per 8 rows weighs its words as the rows' own: each becomes one token
    tok = train_tokenizer(train, extra=corpus(train) + tool_prompts[::8])
    ids = write_tokenizer(tok, init_dir)
    config = model_config(tok.get_vocab_size(), ids)
    write_json(init_dir / "config.json", config)
    write_json(init_dir / "generation_config.json", {
        "bos_token_id": config["bos_token_id"], "eos_token_id": [config["eos_token_id"], config["pad_token_id"]],
        "pad_token_id": config["pad_token_id"]})
    weights = init_weights(config, seed)
    save_file(weights, str(init_dir / "model.safetensors"), metadata={"format": "pt"})
    facts: Dict[str, object] = {"vocab_size": config["vocab_size"], "num_train": len(train), "num_test": len(test)}
    if warm_start_steps:
        arrays = encode(load_tokenizer(init_dir), system, plain_prompts, train, BUFFER_LENGTHS)
        facts.update(warm_start(init_dir, model_dir, arrays, max_steps=warm_start_steps, seed=seed))
        shutil.rmtree(init_dir)
    else:
        init_dir.rename(model_dir)
    return facts


# after the system turn (199 tokens), the longest prompt with its transcript (81 tokens); the longest prompt (22)
# with its answer (18)
BUFFER_LENGTHS = (88, 48)  # checked by warm_start.encode
