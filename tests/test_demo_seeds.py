"""tools/demo_seeds.py, which makes docs/demo.md's figures: the runs it starts and the table it prints."""
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[1] / "tools"
sys.path.insert(0, str(TOOLS))

import demo_seeds  # noqa: E402


def test_each_config_runs_the_demo_its_way(tmp_path):
    flags = {"actor_checkpoint_path": "MODEL", "dataset_file": "DATA"}
    grpo = demo_seeds.command("grpo", 3, tmp_path / "run", flags)
    assert grpo[1:] == [str(demo_seeds.MAIN), "rl_config.seed=3", f"rl_config.output_dir={tmp_path / 'run'}"]
    assert demo_seeds.command("nolearn", 3, tmp_path / "run", flags)[-1] == "actor_config.lr_schedule.learning_rate=0"
    length = demo_seeds.command("length", 3, tmp_path / "run", flags)
    assert "reward_config.verifier_weight=[0.0,0.0,1.0]" in length
    assert demo_seeds.length_reward("x" * 32, "4") == 0.5
    dapo = demo_seeds.command("dapo", 3, tmp_path / "run", flags)
    assert dapo[dapo.index("--config") + 1].endswith("dapo_demo.yaml")
    assert dapo[dapo.index("--actor_checkpoint_path") + 1] == "MODEL" and "rl_config.seed=3" in dapo
    tools, notools = (demo_seeds.command(c, 3, tmp_path / "run", flags) for c in ("tools", "notools"))
    assert tools[2:4] == notools[2:4] == ["--demo", "tools"] and "MODEL" not in tools + notools
    assert "rl_config.tools=[]" in notools and "rl_config.tools=[]" not in tools


def test_summary_averages_every_10_steps_over_seeds_and_gives_each_seeds_rise():
    rising = [0.0] * 20 + [0.5] * 60 + [1.0] * 20
    flat = [0.2] * 100
    text = demo_seeds.summary({"grpo": {0: {"accuracy": rising, "seconds": 60}, 1: {"accuracy": flat, "seconds": 90}}})
    row = next(line for line in text.splitlines() if line.startswith("| grpo |")).split(" | ")
    assert row[1] == "0.100" and row[10] == "0.600" and row[11] == "0.350 |"  # 1-10, 91-100, all
    assert "seed 0: 0.000 -> 1.000 (+1.000)" in text and "seed 1: 0.200 -> 0.200 (+0.000)" in text
    assert "mean rise +0.500 (min +0.000, max +1.000); minutes per run 1.0, 1.5" in text


def test_summary_gives_each_runs_held_out_gain_over_the_warm_start():
    flat = [0.2] * 100
    runs = {"grpo": {0: {"accuracy": flat, "seconds": 60}, 1: {"accuracy": flat, "seconds": 60}}}
    text = demo_seeds.summary(runs, {"warm start": 0.3, ("grpo", 0): 0.45, ("grpo", 1): 0.35})
    assert "warm start 0.300" in text
    assert "grpo: seed 0: 0.450 (+0.150), seed 1: 0.350 (+0.050); mean +0.100 (min +0.050, max +0.150)" in text
