"""The command line: `mindgrpo COMMAND` (python -m mindgrpo), every command's --help, flags and overrides in any
order, and the MindRLHF-style scripts that wrap it (examples/grpo/main.py, tools/*.py)."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

import mindgrpo  # noqa: F401  (before MindSpore)
from mindgrpo.apps.train_cli import parse_args, run_inputs
from mindgrpo.cli import COMMANDS, main as cli_main
from mindgrpo.config import load_config

REPO = Path(__file__).resolve().parents[1]
DEMO_CONFIG = REPO / "examples" / "grpo" / "grpo_demo.yaml"

# One option each command's --help must name (besides -h).
OPTIONS = {"train": "--verifier_function", "data": "--output_path", "eval": "--max-new-tokens", "plot": "--smooth",
           "merge": "--base", "samples": "--grep", "chat": "--max-new-tokens",
           "doctor": "--master_port", "plan": "--device-memory", "fetch": "--out", "config-help": "--help"}


def test_every_command_is_tested():
    assert set(OPTIONS) == set(COMMANDS)


@pytest.mark.parametrize("command", sorted(OPTIONS))
def test_command_help_exits_0_and_names_its_options(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli_main([command, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: ") and f"mindgrpo {command}" in out and OPTIONS[command] in out


def test_no_command_lists_the_commands_and_an_unknown_one_names_the_choices():
    done = subprocess.run([sys.executable, "-m", "mindgrpo"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert all(f"\n  {command} " in done.stdout for command in COMMANDS)
    done = subprocess.run([sys.executable, "-m", "mindgrpo", "trian"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    assert f"unknown command 'trian'; choose one of {', '.join(COMMANDS)} (python -m mindgrpo --help)" in done.stderr


def test_top_level_help_says_what_each_command_reads(capsys):
    """The help once called eval "GSM8K accuracy" after it had learnt MATH500 and AIME."""
    assert cli_main(["--help"]) == 0
    out = capsys.readouterr().out
    eval_line = out.split("\n  eval ", 1)[1].split("\n  chat ", 1)[0]
    assert "GSM8K or MATH-style" in eval_line and "LoRA" in eval_line
    assert "MATH-style" in out.split("\n  data ", 1)[1].split("\n  eval ", 1)[0]


REPO_PATH = re.compile(r"(?:\.\./)*[\w.-]+(?:/[\w.-]+)+\.(?:py|md|sh|yaml|ipynb)")


def test_every_file_a_help_text_names_is_in_the_repository(capsys):
    """`mindgrpo data --help` once sent readers to ../shared/peer/trl_grpo_bench.py, and to verl's
    examples/data_preprocess/geo3k.py as if it were ours: a path a help text names is a file of this checkout."""
    texts = []
    for argv in [["--help"]] + [[command, "--help"] for command in COMMANDS]:
        try:
            cli_main(argv)
        except SystemExit:
            pass
        texts.append(capsys.readouterr().out)
    named = set(REPO_PATH.findall("\n".join(texts)))
    assert {"tools/rlhf_data.py", "examples/grpo/main.py"} <= named
    for path in sorted(named):
        assert (REPO / path).resolve().is_relative_to(REPO) and (REPO / path).is_file(), f"help names {path}"


def test_config_help_refuses_arguments(capsys):
    assert cli_main(["config-help", "rl_config.beta=0"]) == 2
    assert "config-help takes no arguments, got rl_config.beta=0" in capsys.readouterr().err


def test_flags_and_overrides_in_any_order():
    """Once `--config X a.b=1 --verifier_function f c.d=2` stopped with "unrecognized arguments"."""
    args = parse_args(["rl_config.seed=7", "--config", str(DEMO_CONFIG), "rl_config.beta=0.1", "--verifier_function",
                       "accuracy_reward", "rl_config.max_steps=3", "--resume_training", "actor_config.load=/m"])
    assert args.overrides == ["rl_config.seed=7", "rl_config.beta=0.1", "rl_config.max_steps=3", "actor_config.load=/m"]
    config = load_config(*run_inputs(args))
    rl = config.rl_config
    assert (rl.seed, rl.beta, rl.max_steps, rl.resume_training) == (7, 0.1, 3, True)
    assert config.reward_config.verifier_function == ["accuracy_reward"] and config.actor_config.load == "/m"


def test_unknown_flags_and_bare_words_are_named(capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--config", str(DEMO_CONFIG), "rl_config.beta=0.1", "--verifier_fn", "f"])
    assert exit_.value.code == 2 and "unrecognized arguments: --verifier_fn" in capsys.readouterr().err
    assert cli_main(["train", "--config", str(DEMO_CONFIG), "rl_config.beta=0.1", "beta"]) == 2
    assert "override 'beta' is not of the form key.path=value" in capsys.readouterr().err


def test_plot_and_eval_take_positionals_between_options(capsys):
    from mindgrpo.apps import eval_cli, plot_cli

    args = plot_cli.parse_args(["run1", "--smooth", "0.9", "run2", "--no-dashboard"])
    assert args.runs == ["run1", "run2"] and args.smooth == 0.9 and args.no_dashboard
    args = eval_cli.parse_args(["--limit", "4", "model", "--samples", "2", "data.jsonl"])
    assert (args.model, args.data, args.limit, args.samples) == ("model", "data.jsonl", 4, 2)


def test_the_scripts_still_run():
    """examples/grpo/main.py and tools/*.py are thin wrappers: their --help is the command's, under their own name."""
    for script, option in (("examples/grpo/main.py", "--help-config"), ("tools/rlhf_data.py", "--merges_file_path"),
                           ("tools/eval_gsm8k.py", "--max-new-tokens"), ("tools/plot_metrics.py", "--no-panels")):
        done = subprocess.run([sys.executable, str(REPO / script), "--help"], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.startswith(f"usage: {Path(script).name} ") and option in done.stdout


def test_merge_without_an_adapter_names_what_to_pass(tmp_path, tiny_model_dir, capsys):
    """Once `mindgrpo merge` on a folder without an adapter printed a raw `[Errno 2] ... adapter_config.json`."""
    (tmp_path / "empty").mkdir()
    for folder, why in ((tmp_path / "empty", "holds no LoRA adapter"), (tmp_path / "nothere", "does not exist"),
                        (tiny_model_dir, "holds a full model")):
        assert cli_main(["merge", str(folder), str(tmp_path / "merged")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and why in err and "adapter_config.json" in err and "Errno" not in err, err
    assert not (tmp_path / "merged").exists()
