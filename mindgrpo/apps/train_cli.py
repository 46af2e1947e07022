"""Train a Qwen2.5 policy with GRPO: ``mindgrpo train``, also run as ``examples/grpo/main.py`` (MindRLHF's entry).

    python examples/grpo/main.py                                  # embedded demo: no downloads, a few minutes on CPU
    python examples/grpo_vl/main.py [rl_config.seed=1 ...]        # the embedded Qwen2.5-VL demo (--demo vl)
    python examples/grpo/main.py --config grpo_config.yaml [--dataset_file ...] [rl_config.beta=0.0 ...]
    msrun --worker_num=2 --local_worker_num=2 --master_addr=127.0.0.1 --master_port=8118 \\
        examples/grpo/main.py --config grpo_config.yaml             # data parallel (CPU) / semi-auto (Ascend)

``mindgrpo train`` (or ``python -m mindgrpo train``) takes the same arguments. Flags are MindRLHF's; any config key
can be overridden as ``group.key=value``, before, between or after the flags. ``--help-config`` lists every key.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import mindgrpo
from mindgrpo.config import CLI_FLAGS, ConfigError, GRPOConfig, describe, load_config, validate
from mindgrpo.data import DataError

# The embedded demos' configs ship with the source checkout, beside examples/grpo*/main.py.
DEMO_CONFIG = Path(mindgrpo.__file__).resolve().parents[1] / "examples" / "grpo" / "grpo_demo.yaml"
VL_DEMO_CONFIG = Path(mindgrpo.__file__).resolve().parents[1] / "examples" / "grpo_vl" / "grpo_vl_demo.yaml"
TOOL_DEMO_CONFIG = DEMO_CONFIG.with_name("tool_demo.yaml")


@dataclass(frozen=True)
class Demo:
    """An embedded demo: its config, the output folder it runs in by default, how its model and data are made
    (``prepare(config)`` returns the flags that point the config at them), and whether its graphs are compiled
    before the first step (``GRPOTrainer.precompile``)."""
    config: Path
    run_dir: str
    prepare: Callable[[GRPOConfig], Dict[str, str]]
    precompile: bool = False


def _convert_demo_data(model_dir: Path, rows: Path, template: str, config: GRPOConfig) -> Path:
    """The demo's GSM8K-format `rows` in the prompt template `template`, as ``mindgrpo data`` converts them for
    `config` (its prompt length and tools), in the run's folder."""
    from mindgrpo.apps.data_cli import main as convert

    dataset = Path(config.rl_config.output_dir) / "data" / "train.mindrecord"
    if not dataset.exists():
        args = ["--tokenizer_dir", str(model_dir), "--file_path", str(rows), "--output_path", str(dataset),
                "--dataset_type", "gsm8k", "--prompt_template", template, "--max_prompt_length",
                str(config.rl_config.max_prompt_length), "--no_progress"]
        if config.rl_config.tools:
            args += ["--tools", *config.rl_config.tools]
        print("[demo] converting the demo data: mindgrpo data", " ".join(args), flush=True)
        if convert(args) != 0:
            raise DataError(f"converting the demo data {rows} failed: see the error above")
    return dataset


def prepare_demo(config: GRPOConfig) -> Dict[str, str]:
    """Make the demo model and data (cached) and convert the data as ``mindgrpo data`` does."""
    from mindgrpo.apps.demo import default_demo_dir, make_demo

    assets = make_demo(default_demo_dir())
    return {"actor_checkpoint_path": str(assets.model_dir),
            "dataset_file": str(_convert_demo_data(assets.model_dir, assets.train_jsonl, "gsm8k_hash", config))}


def prepare_tool_demo(config: GRPOConfig) -> Dict[str, str]:
    """Make the tool demo's model and problems (cached) and convert the problems with the config's tools (with
    ``rl_config.tools=[]``, the same model answers the prompts without the tool block)."""
    from mindgrpo.apps.demo_tools import PROMPT_TEMPLATE, default_tool_demo_dir, make_tool_demo

    demo = make_tool_demo(default_tool_demo_dir())
    print(f"[demo] tool demo in {demo.root}: {demo.facts}", flush=True)
    return {"actor_checkpoint_path": str(demo.model_dir),
            "dataset_file": str(_convert_demo_data(demo.model_dir, demo.train_jsonl, PROMPT_TEMPLATE, config))}


def prepare_vl_demo(config: GRPOConfig) -> Dict[str, str]:
    """Make the Qwen2.5-VL demo's model, pictures and warm start in ``<output_dir>/demo`` (about a minute; a later
    run into the same folder, a resume among them, finds it there)."""
    from mindgrpo.apps.demo_vl import make_vl_demo

    demo = make_vl_demo(Path(config.rl_config.output_dir) / "demo")
    print(f"[demo] VL demo in {demo.root}: {demo.facts}", flush=True)
    return {"actor_checkpoint_path": str(demo.model_dir), "dataset_file": str(demo.dataset_file)}


DEMOS = {"text": Demo(DEMO_CONFIG, "output/demo", prepare_demo),
         "tools": Demo(TOOL_DEMO_CONFIG, "output/demo_tools", prepare_tool_demo),
         "vl": Demo(VL_DEMO_CONFIG, "output/demo_vl", prepare_vl_demo, precompile=True)}


def demo_flags(demo: str, output_dir: Path, overrides: Sequence[str] = ()) -> Dict[str, str]:
    """The flags of demo `demo` run into `output_dir` with `overrides`: its model (made or cached) and its data
    (converted into `output_dir`), for scripts that run or measure the demos."""
    config = load_config(DEMOS[demo].config, [f"rl_config.output_dir={Path(output_dir).resolve()}", *overrides])
    return DEMOS[demo].prepare(config)


def build_parser(prog: Optional[str] = "mindgrpo train", demo: str = "text") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="grpo_config.yaml; omit to run the embedded demo")
    parser.add_argument("--demo", choices=sorted(DEMOS), default=demo,
                        help=f"the embedded demo run without --config (default {demo}): text (one-digit arithmetic), "
                             "tools (3-digit products with the calculator tool) or vl (Qwen2.5-VL counting squares)")
    for flag, key in CLI_FLAGS.items():
        if flag == "resume_training":
            parser.add_argument("--resume_training", action="store_true", default=None, help=f"sets {key}")
        else:
            parser.add_argument(f"--{flag}", help=f"sets {key}")
    parser.add_argument("--help-config", action="store_true", help="print every config key with its documentation")
    parser.add_argument("overrides", nargs="*", metavar="group.key=value", help="config overrides")
    return parser


def parse_args(argv: Optional[Sequence[str]] = None, prog: Optional[str] = "mindgrpo train",
               demo: str = "text") -> argparse.Namespace:
    """Flags and overrides in any order: intermixed parsing gathers every ``group.key=value`` wherever it stands
    (an unknown flag is still refused by name, and :func:`load_config` names an override without ``=``)."""
    return build_parser(prog, demo).parse_intermixed_args(argv)


def run_inputs(args: argparse.Namespace) -> Tuple[Path, List[str], dict]:
    """The ``load_config`` arguments of a command line: (config path, overrides, MindRLHF flags). Without
    ``--config`` this is the embedded demo ``--demo``, whose model and data are made first (in its output folder,
    or cached)."""
    flags = {flag: getattr(args, flag) for flag in CLI_FLAGS}
    overrides = list(args.overrides)
    if args.config is not None:
        return Path(args.config), overrides, flags
    demo = DEMOS[args.demo]
    if not demo.config.is_file():
        raise ConfigError(f"no --config given, and the embedded demo's config {demo.config} is missing (it comes "
                          "with the source checkout): pass --config grpo_config.yaml")
    overrides = [f"rl_config.output_dir={Path(demo.run_dir).resolve()}", *overrides]
    # Keys, values, device and verifiers first: a bad override or a misspelled verifier must not wait for the demo's
    # model and data to be made (or leave them behind).
    from mindgrpo.train.preflight import check_settings

    config = load_config(demo.config, overrides, flags)
    validate(config, check_paths=False)
    check_settings(config).close()
    for flag, value in demo.prepare(config).items():
        flags[flag] = flags[flag] or value
    return demo.config, overrides, flags


def sampled_accuracy(metrics_file: Path) -> Optional[str]:
    """The demos' summary: the mean sampled accuracy of the first and the last third of the steps."""
    from mindgrpo.train.metrics import read_metrics

    accuracy = [r["grpo/rewards/accuracy_reward"] for r in read_metrics(metrics_file)
                if "grpo/rewards/accuracy_reward" in r]
    if not accuracy:
        return None
    window = max(1, len(accuracy) // 3)
    first, last = sum(accuracy[:window]) / window, sum(accuracy[-window:]) / window
    return f"Accuracy of sampled answers: first {window} steps {first:.3f}, last {window} steps {last:.3f}"


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = "mindgrpo train", demo: str = "text") -> int:
    args = parse_args(argv, prog, demo)
    if args.help_config:
        print("\n".join(describe()))
        return 0
    try:
        config = load_config(*run_inputs(args))
        from mindgrpo.train.trainer import GRPOTrainer

        trainer = GRPOTrainer(config)
    except (ConfigError, DataError) as err:  # bad config or data: the message says what to change
        print(f"error: {err}", file=sys.stderr)
        return 2
    from mindgrpo.train.trainer import PeerLostError

    try:
        if args.config is None and DEMOS[args.demo].precompile:
            trainer.precompile()
        trainer.train()
    except PeerLostError as err:
        # The collectives are broken, and MindSpore's teardown then may crash (a SIGSEGV was seen here after this
        # message): say why and leave at once, with a status that tells a launcher the run failed.
        print(f"error: {err}", file=sys.stderr, flush=True)
        os._exit(1)
    if trainer.dist.is_main:
        out = Path(config.rl_config.output_dir)
        summary = sampled_accuracy(out / "metrics.jsonl") if args.config is None else None
        if summary:
            print(summary, flush=True)
        print(f"[mindgrpo] done: {trainer.step} steps. Metrics: {out / 'metrics.jsonl'} (TensorBoard: "
              f"tensorboard --logdir {out / 'tensorboard'}); completions: {out / 'completions.jsonl'}; "
              f"checkpoints: {config.checkpoint_dir}", flush=True)
    return 0
