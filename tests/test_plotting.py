"""tools/plot_metrics.py and mindgrpo.apps.plotting: PNGs from a real trainer run, overlays, gaps, bad lines,
smoothing."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mindgrpo  # noqa: F401  (before mindspore)
from mindgrpo.train.metrics import MetricsLogger
from mindgrpo.apps.plotting import MetricsFileError, load_run, load_runs, parse_smooth, plot_runs, smooth_values

pytest.importorskip("matplotlib")
REPO = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple:
    """(width, height) from the IHDR chunk, after checking the signature."""
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR", path
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def pixels(path: Path) -> np.ndarray:
    from matplotlib.image import imread

    return imread(path)


@pytest.fixture(scope="module")
def trainer_run(tmp_path_factory):
    """Three real GRPO steps on the untrained demo model: the metrics.jsonl the trainer really writes (its numbers
    are dull, the model is random; beta = 0 skips building the reference model, the KL is still logged as 0)."""
    from mindgrpo.config import GRPOConfig
    from mindgrpo.data import convert_dataset
    from mindgrpo.apps.demo import make_demo
    from mindgrpo.data.tokenizer import load_tokenizer
    from mindgrpo.train.trainer import GRPOTrainer

    root = tmp_path_factory.mktemp("plot_run")
    assets = make_demo(root / "demo", warm_start_steps=0)
    dataset = root / "train.mindrecord"
    convert_dataset(assets.train_jsonl, dataset, load_tokenizer(assets.model_dir), dataset_type="gsm8k",
                    prompt_template="gsm8k_hash", max_prompt_length=64, progress=False)
    cfg = GRPOConfig()
    rl = cfg.rl_config
    rl.dataset_file, rl.output_dir = str(dataset), str(root / "run")
    rl.max_steps, rl.batch_size, rl.num_generations, rl.beta = 3, 4, 4, 0.0
    rl.max_prompt_length, rl.seq_length, rl.save_ckpt_interval = 64, 80, 0
    cfg.actor_config.load = str(assets.model_dir)
    cfg.actor_config.micro_batch_size = cfg.ref_config.ref_model_batch_size = 16
    cfg.generate_config.infer_model_batch_size = 16
    cfg.generate_config.sampling_config.max_tokens = 8
    cfg.reward_config.verifier_function = ["accuracy_reward", "hash_format_reward"]
    cfg.reward_config.verifier_weight = [1.0, 0.1]
    GRPOTrainer(cfg).train()
    return root / "run"


def write_run(folder: Path, steps: int, *, drop=(), scale: float = 1.0, nan_at=None, extra=None) -> Path:
    """A synthetic run written by the real MetricsLogger, without the keys in `drop`, with those of `extra`."""
    with MetricsLogger(folder, tensorboard=False, console=False) as logger:
        for step in range(1, steps + 1):
            m = {"grpo/rewards/mean": scale * step / steps, "grpo/rewards/min": 0.0, "grpo/rewards/max": scale,
                 "grpo/rewards/accuracy_reward": step / steps / 2, "actor/pg_loss": 0.01 * (-1) ** step,
                 "actor/kl_loss": 0.001 * step, "actor/entropy": 1.0 / step, "response_length/mean": 10.0 + step,
                 "response_length/min": 5.0, "response_length/max": 20.0, "grad_norm": 0.5,
                 "e2e_tps": 1000.0 * step, "timing/all": 2.0, "timing/rollout": 1.0, "timing/update": 0.5}
            if step == nan_at:
                m["actor/pg_loss"] = math.nan
            m.update(extra or {})
            logger.log(step, {k: v for k, v in m.items() if k not in drop})
    return folder


def test_real_trainer_run_gives_every_panel(trainer_run, tmp_path):
    written = plot_runs([trainer_run], tmp_path / "plots")
    names = {p.name for p in written}
    expected = {"dashboard.png", "reward.png", "reward_accuracy_reward.png", "reward_hash_format_reward.png",
                "pg_loss.png", "kl.png", "entropy.png", "response_length.png", "grad_norm.png", "e2e_tps.png",
                "timing.png"}
    assert names == expected
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == sorted(expected)  # no temporary files left
    for path in written:
        width, height = png_size(path)
        assert width >= 600 and height >= 400, (path, width, height)
        image = pixels(path)
        assert image[..., :3].std() > 0.05, f"{path} looks blank"  # something was drawn, not a flat canvas
    # The dashboard is a 3-column grid: wider than one panel, with 11 panels in 4 rows.
    assert png_size(tmp_path / "plots" / "dashboard.png")[0] > 2 * png_size(tmp_path / "plots" / "reward.png")[0]
    run = load_run(trainer_run)
    assert list(run.steps) == [1, 2, 3] and run.label == "run"
    assert {"timing/rollout", "timing/reference_model", "timing/update"} <= set(run.values)


def test_cli_overlays_runs_with_labels_and_smoothing(trainer_run, tmp_path):
    other = write_run(tmp_path / "synthetic", 12)
    out = tmp_path / "cmp"
    done = subprocess.run([sys.executable, str(REPO / "tools" / "plot_metrics.py"), str(trainer_run), str(other),
                           "--labels", "real,fake", "--smooth", "0.8", "--out", str(out), "--only", "reward,kl"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert [Path(p).name for p in done.stdout.split()] == ["dashboard.png", "reward.png", "kl.png"]
    for name in ("dashboard.png", "reward.png", "kl.png"):
        png_size(out / name)


def test_overlay_draws_one_colour_per_run(tmp_path):
    """Two runs in one panel: the image holds both tab10 colours (blue and orange), a single run only blue."""
    a, b = write_run(tmp_path / "a", 20), write_run(tmp_path / "b", 30, scale=2.0)
    both = plot_runs([a, b], tmp_path / "two", dashboard=False, only=["reward"])[0]
    one = plot_runs([a], tmp_path / "one", dashboard=False, only=["reward"])[0]

    def has_colour(path, rgb):
        image = pixels(path)[..., :3]
        return bool((np.abs(image - np.array(rgb)).max(axis=-1) < 0.03).sum() > 50)

    blue, orange = (0.122, 0.467, 0.706), (1.0, 0.498, 0.055)
    assert has_colour(both, blue) and has_colour(both, orange)
    assert has_colour(one, blue) and not has_colour(one, orange)


def test_missing_metrics_are_skipped(tmp_path):
    full = write_run(tmp_path / "full", 5)
    partial = write_run(tmp_path / "partial", 5, drop=("actor/kl_loss", "timing/all", "timing/rollout",
                                                       "timing/update", "e2e_tps"))
    names = {p.name for p in plot_runs([partial], tmp_path / "alone")}
    assert "kl.png" not in names and "timing.png" not in names and "e2e_tps.png" not in names
    assert {"dashboard.png", "reward.png", "pg_loss.png"} <= names
    # Overlaid with a run that has them, the panels are back (drawn from the full run only).
    both = plot_runs([full, partial], tmp_path / "both", per_panel=False)
    assert [p.name for p in both] == ["dashboard.png"] and png_size(both[0])
    with pytest.raises(ValueError, match="kl"):
        plot_runs([partial], tmp_path / "x", only=["kl"])


def test_non_finite_values_are_gaps_not_errors(tmp_path):
    run = write_run(tmp_path / "nan", 6, nan_at=3)
    assert math.isnan(load_run(run).values["actor/pg_loss"][2]) and load_run(run).non_finite["actor/pg_loss"] == 1
    assert plot_runs([run], tmp_path / "plots", dashboard=False, only=["pg_loss"])


def test_bad_line_names_file_and_line(tmp_path):
    run = write_run(tmp_path / "bad", 4)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    lines[1] = lines[1][:25]  # a torn record in the middle
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(MetricsFileError, match=r"bad/metrics\.jsonl:2: not valid JSON"):
        plot_runs([run], tmp_path / "plots")
    assert not (tmp_path / "plots").exists() or not list((tmp_path / "plots").iterdir())
    lines[1] = json.dumps({"step": 2, "actor/pg_loss": "oops"})
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(MetricsFileError, match=r"metrics\.jsonl:2: metric 'actor/pg_loss' is 'oops'"):
        load_run(run)
    done = subprocess.run([sys.executable, str(REPO / "tools" / "plot_metrics.py"), str(run)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 2 and "metrics.jsonl:2:" in done.stderr and "Traceback" not in done.stderr


def test_unfinished_last_line_is_skipped_with_a_warning(tmp_path):
    run = write_run(tmp_path / "live", 4)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "grpo/rewa')  # the trainer is writing step 5 right now
    with pytest.warns(UserWarning, match=r"metrics\.jsonl:5: skipping the unfinished last line"):
        assert list(load_run(run).steps) == [1, 2, 3, 4]


def test_labels_default_to_distinct_folder_names(tmp_path):
    a = write_run(tmp_path / "x" / "demo", 2)
    b = write_run(tmp_path / "y" / "demo", 2)
    c = write_run(tmp_path / "gen4", 2)
    assert [r.label for r in load_runs([a, b, c])] == ["x/demo", "y/demo", "gen4"]
    assert [r.label for r in load_runs([a / "metrics.jsonl", c], labels=["A", "C"])] == ["A", "C"]
    with pytest.raises(ValueError, match="one label per run"):
        load_runs([a, b], labels=["only one"])
    with pytest.raises(FileNotFoundError, match="no metrics file"):
        load_runs([tmp_path / "nowhere"])


def test_smoothing():
    values = np.array([0.0, 10.0, np.nan, 10.0, 10.0])
    ema = smooth_values(values, 0.5)
    # Debiased EMA: the first value is itself, NaN stays a gap and is skipped by the average.
    assert ema[0] == 0.0 and math.isnan(ema[2])
    assert ema[1] == pytest.approx((0.5 * 0 * 0.5 + 0.5 * 10) / (1 - 0.25))
    window = smooth_values(values, 2)
    np.testing.assert_allclose(window, [0.0, 5.0, np.nan, 10.0, 10.0])
    np.testing.assert_array_equal(smooth_values(values, None), values)
    assert parse_smooth("0.9") == 0.9 and parse_smooth("10") == 10
    for bad in ("1.5", "-3", "abc"):
        with pytest.raises(ValueError):
            parse_smooth(bad)
    with pytest.raises(ValueError):
        smooth_values(values, True)


def test_matplotlib_is_optional_and_loaded_lazily(tmp_path, monkeypatch):
    code = "import sys, mindgrpo.apps.plotting; print('matplotlib' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.stdout.strip() == "False", done.stdout + done.stderr
    run = write_run(tmp_path / "run", 3)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    with pytest.raises(ImportError, match=r'pip install "mindgrpo\[plot\]"'):
        plot_runs([run], tmp_path / "plots")


def test_old_and_new_weight_sync_names_make_one_phase(tmp_path):
    """A run of MindRLHF's names (timing/resharding_to_infer) and one of the new names, which also writes the old
    as an alias, both read as timing/weight_sync: one bar, not two."""
    old = tmp_path / "old"
    old.mkdir()
    (old / "metrics.jsonl").write_text("".join(json.dumps({"step": step, "timing/all": 2.0, "timing/rollout": 1.0,
                                                           "timing/resharding_to_infer": 0.25}) + "\n"
                                               for step in (1, 2)), encoding="utf-8")
    new = write_run(tmp_path / "new", 2, extra={"timing/weight_sync": 0.5})
    for folder, seconds in ((old, 0.25), (new, 0.5)):
        run = load_run(folder)
        assert "timing/resharding_to_infer" not in run.values
        np.testing.assert_array_equal(run.values["timing/weight_sync"], [seconds, seconds])
    assert "timing.png" in {p.name for p in plot_runs([old, new], tmp_path / "plots", only=["timing"])}
