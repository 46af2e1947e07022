"""The fault matrix of docs/reliability.md: each fault a test, on the embedded demo's model without its warm start (a
random 2-layer Qwen2 and its tokenizer, made locally in a second), so none of this needs ../shared.

Runs are tiny (2 prompts x 4 completions of 8 tokens per step) and compile in seconds; the dense toy verifier
`text_length` gives every step advantages, so the weights move on every step and a resume that redoes or skips
anything shows in the final weights.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, msrun_group, small_run_config
from msrun_jobs import free_port
from mindgrpo.config import GRPOConfig, dump_yaml
from mindgrpo.train.metrics import read_metrics

TESTS = Path(__file__).resolve().parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}


def convert_rows(demo, out: Path, rows: int) -> Path:
    from mindgrpo.data import convert_dataset
    from mindgrpo.data.tokenizer import load_tokenizer

    src = out.with_suffix(".jsonl")
    src.write_text("".join(demo.train_jsonl.read_text(encoding="utf-8").splitlines(keepends=True)[:rows]),
                   encoding="utf-8")
    convert_dataset(src, out, load_tokenizer(demo.model_dir), dataset_type="gsm8k", prompt_template="gsm8k_hash",
                    max_prompt_length=64, progress=False)
    return out


@pytest.fixture(scope="module")
def prompts(tmp_path_factory, demo_plain):
    """24 demo prompts (31..47 tokens: one prompt width, so each run compiles its step graphs once)."""
    return convert_rows(demo_plain, tmp_path_factory.mktemp("prompts") / "train.mindrecord", 24)


def make_config(out: Path, dataset: Path, model: Path, **rl) -> GRPOConfig:
    """A small run on the demo's short prompts, rewarded by completion length (see conftest.small_run_config)."""
    return small_run_config(out, dataset, model, **{"max_prompt_length": 64, "seq_length": 80, **rl},
                            max_tokens=8, verifiers=["toy_verifiers:text_length"])


def write_yaml(path: Path, cfg: GRPOConfig) -> Path:
    dump_yaml(cfg, path)
    return path


def run_main(config_yaml: Path, *extra: str, kill_at: str = "") -> subprocess.CompletedProcess:
    """examples/grpo/main.py through tests/kill_at.py: SIGKILLed at the first file event matching `kill_at`."""
    env = {**ENV, "MINDGRPO_KILL_AT": kill_at}
    return subprocess.run([sys.executable, str(TESTS / "kill_at.py"), "--config", str(config_yaml), *extra],
                          env=env, capture_output=True, text=True, timeout=900)


def steps(run: Path) -> list:
    return sorted(int(p.name.split("_")[1]) for p in (run / "checkpoints").glob("step_*"))


def checkpoint_weights(run: Path, step: int = 0) -> dict:
    from safetensors.numpy import load_file

    folder = run / "checkpoints" / (f"step_{step:08d}" if step else sorted(p.name for p in
                                                                          (run / "checkpoints").glob("step_*"))[-1])
    return load_file(folder / "model" / "model.safetensors")


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_allclose(b[name], a[name], atol=1e-6, rtol=0, err_msg=name)


# ---- SIGKILL anywhere, then --resume_training -----------------------------------------------------------------

# One run of 6 steps (checkpoints every 2, two kept), killed again and again, each time resumed with
# --resume_training. Each kill point, in order, with what the next resume must start from.
KILLS = [
    # inside the first checkpoint's model writer: the export's own commit rename in the build folder
    (r"^re(name|place) \S*\.tmp-step_00000002-", []),
    # the files of step 4 are written and being hashed for the manifest
    (r"^hash \S*\.tmp-step_00000004-", [2]),
    # the manifest is written; the commit rename of step 6 has not happened
    (r"^rename \S*\.tmp-step_00000006-\S* \S*step_00000006$", [2, 4]),
    # between steps: step 5 is computed but its metrics line is not written (the resume redoes it)
    (r"^append .*metrics\.jsonl \{'step': 5,", [2, 4]),
    # step 6 is committed; pruning step 2 is cut short mid-delete
    (r"^rmtree \S*\.tmp-discard-step_00000002-", [4, 6]),
]


def test_sigkill_at_many_points_then_resume_equals_an_uninterrupted_run(tmp_path, prompts, demo_plain):
    """Five SIGKILLs at different points of one run (mid-checkpoint-write among them), each followed by
    --resume_training: the run continues from the newest complete checkpoint each time, its metrics hold every
    step once, no build folder is left, and the final weights equal those of the same run uninterrupted. Without a
    reference model (beta 0), as each of the seven processes would build and compile it again: a resume with the
    KL term is test_resume_at_an_epoch_boundary_runs_every_epoch_in_the_same_order's."""
    model = demo_plain.model_dir
    straight = write_yaml(tmp_path / "straight.yaml", make_config(tmp_path / "straight", prompts, model, max_steps=6,
                                                                  beta=0.0))
    done = run_main(straight)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    run = tmp_path / "killed"
    killed = write_yaml(tmp_path / "killed.yaml", make_config(run, prompts, model, max_steps=6, beta=0.0))
    for i, (point, left) in enumerate(KILLS):
        done = run_main(killed, *(["--resume_training"] if i else []), kill_at=point)
        assert done.returncode == -signal.SIGKILL, (point, done.stdout[-3000:] + done.stderr[-3000:])
        assert "[kill_at] SIGKILL before" in done.stdout
        assert steps(run) == left, point
    done = run_main(killed, "--resume_training")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "resumed from" in done.stdout and "step_00000006" in done.stdout

    assert_same_weights(checkpoint_weights(tmp_path / "straight"), checkpoint_weights(run))
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1, 2, 3, 4, 5, 6]
    completions = [json.loads(line)["step"] for line in (run / "completions.jsonl").read_text().splitlines()]
    assert completions == [s for s in range(1, 7) for _ in range(2 * 4)]
    assert steps(run) == [4, 6] and not list((run / "checkpoints").glob(".tmp-*"))  # build folders cleaned up


# ---- epochs ---------------------------------------------------------------------------------------------------

def _prompts_by_step(run: Path) -> list:
    rows = [json.loads(line) for line in (run / "completions.jsonl").read_text(encoding="utf-8").splitlines()]
    return [(r["step"], r["prompt"]) for r in rows]


def test_resume_at_an_epoch_boundary_runs_every_epoch_in_the_same_order(tmp_path, demo_plain):
    """verl#7401: a resume at an epoch boundary skipped the next epoch and exited 0. Two epochs of 4 steps,
    stopped right after the checkpoint at the boundary (step 4) and resumed: the same 8 steps, the same prompts in
    the same order and the same final weights as the run that was not interrupted."""
    from mindgrpo.train.trainer import GRPOTrainer

    data = convert_rows(demo_plain, tmp_path / "eight.mindrecord", 8)

    def config(out):
        return make_config(tmp_path / out, data, demo_plain.model_dir, epochs=2, max_steps=0, save_ckpt_interval=4)

    straight = GRPOTrainer(config("straight"))
    assert straight.total_steps == 8
    straight.train()

    first = GRPOTrainer(config("stopped"))
    for _ in range(4):
        first.train_step()
    first.save_checkpoint()
    first.metrics.close()
    assert first.dataset.state_dict()["epoch"] == 1 and first.dataset.state_dict()["position"] == 0

    cfg = config("stopped")
    cfg.rl_config.resume_training = True
    resumed = GRPOTrainer(cfg)
    assert (resumed.step, resumed.total_steps) == (4, 8)
    resumed.train()
    assert resumed.step == 8

    a, b = _prompts_by_step(tmp_path / "straight"), _prompts_by_step(tmp_path / "stopped")
    assert b == a and [s for s, _ in a] == [s for s in range(1, 9) for _ in range(2 * 4)]
    epoch_prompts = [{p for s, p in a if lo <= s <= lo + 3} for lo in (1, 5)]
    assert len(epoch_prompts[0]) == 8 and epoch_prompts[0] == epoch_prompts[1]  # each epoch: every prompt once
    assert [r["step"] for r in read_metrics(tmp_path / "stopped")] == list(range(1, 9))
    assert_same_weights(checkpoint_weights(tmp_path / "straight", 8), checkpoint_weights(tmp_path / "stopped", 8))


# ---- torn or corrupted checkpoints ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def four_step_run(tmp_path_factory, prompts, demo_plain):
    """A finished 4-step run with checkpoints at steps 2 and 4."""
    from mindgrpo.train.trainer import GRPOTrainer

    out = tmp_path_factory.mktemp("four") / "run"
    GRPOTrainer(make_config(out, prompts, demo_plain.model_dir, max_steps=4)).train()
    assert steps(out) == [2, 4]
    return out


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage,reason", [(_truncate, "size mismatch"), (_flip_a_byte, "sha256 mismatch")])
def test_resume_skips_a_torn_or_corrupted_checkpoint_for_the_previous_one(tmp_path, four_step_run, prompts,
                                                                          demo_plain, damage, reason):
    from mindgrpo.train.checkpoint import CheckpointWarning
    from mindgrpo.models import state_dict_hf
    from mindgrpo.train.trainer import GRPOTrainer

    run = tmp_path / "run"
    shutil.copytree(four_step_run / "checkpoints", run / "checkpoints")
    damage(run / "checkpoints" / "step_00000004" / "model" / "model.safetensors")
    cfg = make_config(run, prompts, demo_plain.model_dir, max_steps=4, resume_training=True)
    with pytest.warns(CheckpointWarning, match=rf"skipping checkpoint: .*step_00000004: {reason} for "
                                               r"model/model.safetensors"):
        trainer = GRPOTrainer(cfg)
    assert trainer.step == 2
    assert_same_weights(checkpoint_weights(four_step_run, 2), state_dict_hf(trainer.worker.actor))


# ---- two runs, one folder -------------------------------------------------------------------------------------

def test_a_second_run_on_the_same_output_folder_is_refused(tmp_path, prompts, demo_plain, capsys, monkeypatch):
    """The first run holds <output_dir>/.mindgrpo.lock; a second one stops before loading anything, naming the
    holder. Once the holder is gone (SIGKILL: its lock file is left behind), the next run takes the folder over."""
    import runpy

    import mindgrpo.train.model_worker
    from mindgrpo.train.run_lock import LOCK_NAME, RunLockError
    from mindgrpo.train.trainer import GRPOTrainer

    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        from mindgrpo.train.run_lock import lock_output_dir
        lock_output_dir({str(out)!r})
        print("locked", flush=True)
        import time; time.sleep(600)""")], stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        assert holder.stdout.readline().strip() == "locked"
        cfg = make_config(out, prompts, demo_plain.model_dir, max_steps=1)
        built = []
        monkeypatch.setattr(mindgrpo.train.model_worker, "ModelWorker", lambda *a, **k: built.append(1))
        with pytest.raises(RunLockError, match=rf"output_dir = {out} is in use by process {holder.pid} on "):
            GRPOTrainer(cfg)
        assert not built  # refused before the model was built
        main = runpy.run_path(str(REPO / "examples" / "grpo" / "main.py"))["main"]
        assert main(["--config", str(write_yaml(tmp_path / "c.yaml", cfg))]) == 2
        assert f"in use by process {holder.pid}" in capsys.readouterr().err
    finally:
        holder.kill()
        holder.wait()
    monkeypatch.undo()
    assert (out / LOCK_NAME).read_text().split()[0] == str(holder.pid)  # stale: its process is dead
    GRPOTrainer(cfg)
    assert (out / LOCK_NAME).read_text().split()[0] == str(os.getpid())


# ---- non-finite updates ---------------------------------------------------------------------------------------

def test_non_finite_updates_are_skipped_counted_and_stop_the_run(tmp_path, prompts, demo_plain):
    """A reward whose advantages overflow the gradients to inf: each such update is skipped and counted in
    grpo/skipped_updates, the weights stay those of the last good update (finite), and the third bad step in a
    row (rl_config.max_skipped_updates = 2) stops the run with a clear error; the newest checkpoint is good."""
    import toy_verifiers
    from mindgrpo.train.checkpoint import CheckpointManager
    from mindgrpo.models import state_dict_hf
    from mindgrpo.train.trainer import GRPOTrainer, TrainingError

    out = tmp_path / "run"
    cfg = make_config(out, prompts, demo_plain.model_dir, max_steps=12, max_skipped_updates=2, scale_rewards="none")
    cfg.reward_config.verifier_function = ["toy_verifiers:poisonable"]
    trainer = GRPOTrainer(cfg)
    for _ in range(2):
        trainer.train_step()
    good = state_dict_hf(trainer.worker.actor)
    toy_verifiers.POISON["on"] = True
    try:
        with pytest.raises(TrainingError, match=r"step 5: 3 steps in a row had a non-finite loss or gradient"):
            trainer.train()
    finally:
        toy_verifiers.POISON["on"] = False
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["grpo/skipped_updates"] > 0 for r in rows] == [False, False, True, True]
    now = state_dict_hf(trainer.worker.actor)
    assert all(np.isfinite(now[k]).all() for k in now)
    assert_same_weights(good, now)
    newest = CheckpointManager(out / "checkpoints").latest()
    assert newest.name == "step_00000004"  # saved during the bad streak: the weights of the last good update
    assert_same_weights(good, checkpoint_weights(out, 4))


# ---- disk full ------------------------------------------------------------------------------------------------

DISK_FULL = """
import json, resource, signal, sys
import mindgrpo
from mindgrpo.config import load_config
from mindgrpo.train.trainer import GRPOTrainer

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit then fail with EFBIG, as on a full disk
trainer = GRPOTrainer(load_config(sys.argv[1]))
for _ in range(2):
    trainer.train_step()
trainer.save_checkpoint()
trainer.train_step()
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, hard))  # metrics fit, the 0.5 MB weights do not
try:
    trainer.save_checkpoint()
except Exception as err:
    print(json.dumps({"checkpoint": f"{type(err).__name__}: {err}"}), flush=True)
size = (trainer.output_dir / "metrics.jsonl").stat().st_size
resource.setrlimit(resource.RLIMIT_FSIZE, (size + 100, hard))  # the next metrics line does not fit
try:
    trainer.train_step()
except Exception as err:
    print(json.dumps({"metrics": f"{type(err).__name__}: {err}"}), flush=True)
"""


def test_disk_full_while_writing_a_checkpoint_or_metrics(tmp_path, prompts, demo_plain):
    """RLIMIT_FSIZE (a file-size limit, SIGXFSZ ignored) makes writes fail with EFBIG as on a full disk: the
    checkpoint save fails with an error naming the disk and the folder, leaves no build folder, and the previous
    checkpoint still verifies; a metrics line that does not fit is rolled back, so metrics.jsonl stays valid JSON
    line by line."""
    from mindgrpo.train.checkpoint import CheckpointManager

    out = tmp_path / "run"
    cfg_path = write_yaml(tmp_path / "c.yaml", make_config(out, prompts, demo_plain.model_dir, max_steps=10))
    script = tmp_path / "disk_full.py"
    script.write_text(DISK_FULL)
    done = subprocess.run([sys.executable, str(script), str(cfg_path)], env=ENV, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    errors = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            errors.update(json.loads(line))
    assert set(errors) == {"checkpoint", "metrics"}, done.stdout[-3000:]
    assert errors["checkpoint"].startswith("CheckpointError: no space left to write ")
    assert str(out / "checkpoints") in errors["checkpoint"]
    assert "metrics.jsonl" in errors["metrics"] and "no space" in errors["metrics"]
    assert steps(out) == [2]
    CheckpointManager(out / "checkpoints").verify(out / "checkpoints" / "step_00000002")
    assert not list((out / "checkpoints").glob(".tmp-*"))
    lines = (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3]


# ---- bad data and models: stopped before anything is built ----------------------------------------------------

def _copy_model(demo, dest: Path) -> Path:
    shutil.copytree(demo.model_dir, dest)
    return dest


@pytest.fixture
def no_model_build(monkeypatch):
    """Fail the test if the trainer gets as far as building the models (loading weights, compiling)."""
    import mindgrpo.train.model_worker

    def refuse(*args, **kwargs):
        raise AssertionError("the trainer built the models before refusing its inputs")
    monkeypatch.setattr(mindgrpo.train.model_worker, "ModelWorker", refuse)


def test_mindrecord_made_with_another_tokenizer_is_refused(tmp_path, prompts, demo_plain, no_model_build):
    """Same size, two token ids swapped: the prompts would silently mean other words."""
    from mindgrpo.data import DataError
    from mindgrpo.train.trainer import GRPOTrainer

    other = _copy_model(demo_plain, tmp_path / "other")
    spec = json.loads((other / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = spec["model"]["vocab"]
    vocab["Tom"], vocab["Ġhas"] = vocab["Ġhas"], vocab["Tom"]
    (other / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    cfg = make_config(tmp_path / "run", prompts, demo_plain.model_dir, tokenizer_dir=str(other))
    with pytest.raises(DataError, match=rf"dataset_file = {prompts} was tokenized with another tokenizer than the "
                                        rf"run's \({other}\).*--tokenizer_dir {other}"):
        GRPOTrainer(cfg)


def test_prompts_longer_than_max_prompt_length_are_refused(tmp_path, prompts, demo_plain, no_model_build):
    from mindgrpo.data import DataError
    from mindgrpo.train.trainer import GRPOTrainer

    cfg = make_config(tmp_path / "run", prompts, demo_plain.model_dir, max_prompt_length=40)
    with pytest.raises(DataError, match=r"converted with --max_prompt_length 64 and holds a prompt of 47 tokens, "
                                        r"longer than rl_config.max_prompt_length = 40"):
        GRPOTrainer(cfg)


def test_model_whose_vocabulary_does_not_fit_the_tokenizer_is_refused(tmp_path, prompts, demo_plain,
                                                                      no_model_build):
    from mindgrpo.data import DataError
    from mindgrpo.train.trainer import GRPOTrainer

    small = _copy_model(demo_plain, tmp_path / "small")
    config = json.loads((small / "config.json").read_text(encoding="utf-8"))
    config["vocab_size"] = 256
    (small / "config.json").write_text(json.dumps(config), encoding="utf-8")
    cfg = make_config(tmp_path / "run", prompts, small, tokenizer_dir=str(demo_plain.model_dir))
    with pytest.raises(DataError, match=rf"actor_config.load = {small}: the model's vocab_size is 256, but the "
                                        r"tokenizer in .* has 544 tokens"):
        GRPOTrainer(cfg)


def test_vision_language_layouts_that_cannot_run_are_refused_before_training(tmp_path, prompts, demo_plain,
                                                                              no_model_build):
    """A Qwen2.5-VL actor (in the nested config spelling transformers 4.57 saves, no top-level vocab_size) trains on
    the native engine with the shared-prompt forward on one tensor-parallel rank: every other choice is refused up
    front, each by its key; training the vision tower is refused by the config check."""
    from mindgrpo.config import ConfigError
    from mindgrpo.data import PromptDataset
    from mindgrpo.data.tokenizer import load_tokenizer
    from mindgrpo.train.preflight import check_run_inputs
    from mindgrpo.train.trainer import GRPOTrainer

    vl = _copy_model(demo_plain, tmp_path / "vl")
    text = json.loads((vl / "config.json").read_text(encoding="utf-8"))
    head_half = text["hidden_size"] // text["num_attention_heads"] // 2
    text["rope_scaling"] = {"type": "mrope", "mrope_section": [head_half - 2 * (head_half // 3)] + [head_half // 3] * 2}
    (vl / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl", "text_config": text}), encoding="utf-8")
    cfg = make_config(tmp_path / "run", prompts, vl, tokenizer_dir=str(demo_plain.model_dir))
    cfg.rl_config.share_prompt = False
    cfg.generate_config.backend = "mindformers"
    with pytest.raises(ConfigError, match=rf"actor_config.load = {vl} is a Qwen2.5-VL model:") as err:
        GRPOTrainer(cfg)
    assert "generate_config.backend = mindformers" in str(err.value)
    assert "rl_config.share_prompt = false" in str(err.value)
    cfg = make_config(tmp_path / "run1", prompts, vl, tokenizer_dir=str(demo_plain.model_dir))
    cfg.actor_config.parallel_config.model_parallel = 2  # the check the trainer runs before any process group
    with pytest.raises(ConfigError, match=r"actor_config.parallel_config.model_parallel = 2: tensor parallelism "
                                          r"does not yet run the vision tower"):
        check_run_inputs(cfg, load_tokenizer(demo_plain.model_dir), PromptDataset(prompts))
    cfg = make_config(tmp_path / "run1", prompts, vl, tokenizer_dir=str(demo_plain.model_dir))
    cfg.actor_config.lora_rank = 4
    with pytest.raises(ConfigError, match=r"actor_config.lora_rank = 4: LoRA on Qwen2.5-VL is not built yet"):
        check_run_inputs(cfg, load_tokenizer(demo_plain.model_dir), PromptDataset(prompts))
    cfg = make_config(tmp_path / "run2", prompts, vl, tokenizer_dir=str(demo_plain.model_dir))
    cfg.actor_config.freeze_vision_tower = False
    with pytest.raises(ConfigError, match=r"actor_config.freeze_vision_tower = false: training the Qwen2.5-VL "
                                          r"vision tower is not supported yet"):
        GRPOTrainer(cfg)


def test_empty_or_too_small_dataset_is_refused(tmp_path, demo_plain, no_model_build, capsys):
    from mindgrpo.data import DataError
    from mindgrpo.train.trainer import GRPOTrainer

    one = convert_rows(demo_plain, tmp_path / "one.mindrecord", 1)
    cfg = make_config(tmp_path / "run", one, demo_plain.model_dir)
    with pytest.raises(DataError, match=rf"dataset_file = {one}: 1 prompt\(s\), fewer than one step needs "
                                        r"\(rl_config.batch_size 2 x 1 data-parallel rank\(s\)\)"):
        GRPOTrainer(cfg)
    import runpy

    main = runpy.run_path(str(REPO / "examples" / "grpo" / "main.py"))["main"]
    assert main(["--config", str(write_yaml(tmp_path / "c.yaml", cfg))]) == 2  # a message, not a traceback
    assert "error: rl_config.dataset_file" in capsys.readouterr().err
    (tmp_path / "empty.jsonl").write_text("\n\n", encoding="utf-8")
    tool = runpy.run_path(str(REPO / "tools" / "rlhf_data.py"))["main"]
    assert tool(["--tokenizer_dir", str(demo_plain.model_dir), "--file_path", str(tmp_path / "empty.jsonl"),
                 "--output_path", str(tmp_path / "empty.mindrecord"), "--dataset_type", "gsm8k"]) == 1
    assert "empty.jsonl: no usable rows" in capsys.readouterr().err
    assert not (tmp_path / "empty.mindrecord").exists()


# ---- data parallel under msrun --------------------------------------------------------------------------------

def _data_parallel(cfg: GRPOConfig, ranks: int) -> GRPOConfig:
    for group in (cfg.actor_config, cfg.ref_config, cfg.generate_config):
        if hasattr(group, "parallel_config"):
            group.parallel_config.data_parallel = ranks
    return cfg


@msrun_group
def test_msrun_two_ranks_train_in_lockstep(tmp_path, prompts, demo_plain):
    """2-worker msrun data parallel on CPU: both ranks end with identical weights that moved from the start, and
    rank 0 logs every step once. Without ZeRO-1, so each rank applies the averaged gradient itself and identical
    weights prove the gradient all-reduce (under ZeRO-1 the owner's broadcast keeps ranks identical even without it;
    ZeRO-1 equals the unsharded update in tests/test_optim_sharding.py). With dynamic sampling, on a verifier that
    leaves the groups of even answers flat, so the ranks need different numbers of rounds: both run as many and
    read the same number of prompt batches (their saved data positions are equal)."""
    cfg = _data_parallel(make_config(tmp_path / "dp", prompts, demo_plain.model_dir, max_steps=3, loss_type="dapo",
                                     dynamic_sampling=True, max_generation_batches=3), 2)
    cfg.reward_config.verifier_function = ["toy_verifiers:flat_when_gold_even"]
    cfg.actor_config.parallel_config.optimizer_shard = False
    cfg_path = write_yaml(tmp_path / "dp.yaml", cfg)
    script = tmp_path / "dump_ranks.py"
    script.write_text(textwrap.dedent(f"""
        import numpy as np
        import mindgrpo
        from mindgrpo.config import load_config
        from mindgrpo.models import state_dict_hf
        from mindgrpo.train.trainer import GRPOTrainer
        trainer = GRPOTrainer(load_config({str(cfg_path)!r}))
        trainer.train()
        np.savez({str(tmp_path)!r} + f"/rank{{trainer.dist.rank}}.npz", **state_dict_hf(trainer.worker.actor),
                 data_position=np.array([trainer.dataset.state_dict()[k] for k in ("epoch", "position")]))
        """))
    cmd = ["msrun", "--worker_num=2", "--local_worker_num=2", "--master_addr=127.0.0.1",
           f"--master_port={free_port()}", f"--log_dir={tmp_path / 'msrun_log'}", "--join=True", str(script)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=ENV)
    logs = "".join(p.read_text(errors="replace")[-2000:] for p in (tmp_path / "msrun_log").glob("*.log"))
    assert done.returncode == 0, logs
    r0, r1 = np.load(tmp_path / "rank0.npz"), np.load(tmp_path / "rank1.npz")
    for name in r0.files:
        np.testing.assert_array_equal(r0[name], r1[name], err_msg=name)
    from safetensors.numpy import load_file

    initial = load_file(demo_plain.model_dir / "model.safetensors")
    assert max(np.abs(r0[k] - initial[k]).max() for k in initial) > 1e-4  # they trained, in lockstep
    rows = read_metrics(tmp_path / "dp")
    assert [r["step"] for r in rows] == [1, 2, 3]
    position = r0["data_position"]
    assert position[0] * 6 + position[1] == sum(r["grpo/generation_batches"] for r in rows)  # 24 prompts: 6 batches


WORKER = """
import os, runpy, subprocess, sys
# msrun starts this wrapper; main.py runs in a child, so the wrapper can record how that child ended.
if sys.argv[1] == "wrap":
    done = subprocess.run([sys.executable, __file__, "train", *sys.argv[2:]])
    if os.environ.get("MS_ROLE") == "MS_WORKER":  # msrun runs the script as the scheduler too
        open(os.path.join(sys.argv[2], f"exit_{os.environ['MS_NODE_ID']}"), "w").write(str(done.returncode))
    sys.exit(done.returncode)
if os.environ.get("MS_ROLE") == "MS_WORKER":
    open(os.path.join(sys.argv[2], f"pid_rank{os.environ['RANK_ID']}"), "w").write(str(os.getpid()))
sys.argv = [MAIN, *sys.argv[3:]]
runpy.run_path(MAIN, run_name="__main__")
"""


@msrun_group
def test_msrun_worker_killed_the_other_exits_within_two_minutes_then_the_run_resumes(tmp_path, prompts, demo_plain):
    """SIGKILL rank 1 of a 2-worker run started as the README starts it (msrun without --join, main.py): rank 0
    does not hang in its next collective. About 30 s later MindSpore's scheduler declares rank 1 timed out and
    rank 0 ends, by SIGTERM or with a failed collective ("Launch kernel failed, name:Default/AllReduce", "The
    state of the cluster is error"; all seen here), well within 2 minutes and never with exit code 0. Either way
    its own log names the lost rank and its pid (mindgrpo/train/peers.py), as does the scheduler's by node id. Then
    ``--resume_training`` under msrun continues from the last checkpoint: every step is logged once."""
    from mindgrpo._io import pid_alive
    from mindgrpo.train.checkpoint import CheckpointManager

    cfg = _data_parallel(make_config(tmp_path / "dp", prompts, demo_plain.model_dir, max_steps=100000,
                                     save_ckpt_interval=2), 2)
    cfg_path = write_yaml(tmp_path / "dp.yaml", cfg)
    script = tmp_path / "worker.py"
    script.write_text(WORKER.replace("MAIN", repr(str(REPO / "examples" / "grpo" / "main.py"))))
    logs = tmp_path / "msrun_log"
    subprocess.run(["msrun", "--worker_num=2", "--local_worker_num=2", "--master_addr=127.0.0.1",
                    f"--master_port={free_port()}", f"--log_dir={logs}", str(script), "wrap", str(tmp_path),
                    "--config", str(cfg_path)],
                   env=ENV, check=True, timeout=120)  # returns at once: workers run detached
    metrics, deadline = tmp_path / "dp" / "metrics.jsonl", time.time() + 900
    while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 3):
        assert time.time() < deadline, "".join(p.read_text(errors="replace")[-2000:] for p in logs.glob("*.log"))
        time.sleep(0.5)
    rank0, rank1 = (int((tmp_path / f"pid_rank{r}").read_text()) for r in (0, 1))
    os.kill(rank1, signal.SIGKILL)
    killed = time.time()
    while pid_alive(rank0) and time.time() - killed < 120:
        time.sleep(0.5)
    survived = pid_alive(rank0)
    if survived:
        os.kill(rank0, signal.SIGKILL)
    assert not survived, "rank 0 still running 2 minutes after rank 1 was killed"
    print(f"rank 0 exited {time.time() - killed:.0f} s after rank 1 was killed")
    deadline = time.time() + 60
    while len(list(tmp_path.glob("exit_*"))) < 2 and time.time() < deadline:
        time.sleep(0.5)
    codes = sorted(int(p.read_text()) for p in tmp_path.glob("exit_*"))
    assert len(codes) == 2 and -signal.SIGKILL in codes and all(code != 0 for code in codes), codes
    # The scheduler declares the timeout on its own clock, about when rank 0 gives up: under load its log line can
    # land a little after rank 0 has exited, so it is awaited rather than read once.
    deadline = time.time() + 60
    while "The node: 1 is timed out" not in (logs / "scheduler.log").read_text(errors="replace") \
            and time.time() < deadline:
        time.sleep(0.5)
    assert "The node: 1 is timed out" in (logs / "scheduler.log").read_text(errors="replace")
    rank0_log = (logs / "worker_0.log").read_text(errors="replace")
    assert f"rank 1 (pid {rank1} on " in rank0_log and "--resume_training" in rank0_log, rank0_log[-3000:]

    # The run resumes from its newest checkpoint, under msrun as the README starts it, and ends cleanly.
    last = CheckpointManager(tmp_path / "dp" / "checkpoints").latest()
    saved = int(last.name.split("_")[-1])
    end = saved + 2
    logs = tmp_path / "msrun_resume_log"
    done = subprocess.run(["msrun", "--worker_num=2", "--local_worker_num=2", "--master_addr=127.0.0.1",
                           f"--master_port={free_port()}", f"--log_dir={logs}", "--join=True",
                           str(REPO / "examples" / "grpo" / "main.py"), "--config", str(cfg_path),
                           "--resume_training", f"rl_config.max_steps={end}"],
                          env=ENV, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, "".join(p.read_text(errors="replace")[-2000:] for p in logs.glob("*.log"))
    assert [r["step"] for r in read_metrics(tmp_path / "dp")] == list(range(1, end + 1))
