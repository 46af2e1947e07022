"""Data x tensor parallelism under msrun: 4 CPU workers at ``data_parallel 2 x model_parallel 2`` train as one process.

The layout must not change the run: a GRPO step at 2 x 2 (``batch_size`` prompts per data-parallel rank) and the
same step in one process taking both ranks' prompts (``batch_size`` x 2) sample the same tokens (a prompt's
completions are drawn by its place in the global batch, not by rank), normalise the loss alike (``dapo``'s token
mean counts the tokens of every data-parallel rank) and clip the same global gradient norm (summed over the TP and
averaged over the DP groups with the real collectives; ``max_grad_norm`` is set low enough that every step clips).
With ZeRO-1 and the fused loss op; for a 2 x 2 run killed after its first checkpoint and resumed; and for its
step-1 checkpoint resumed in one process (resharded from 2 x 2 to 1 x 1). LoRA adapters on a frozen backbone, with
the plain-ops loss, train at 2 x 2 (ZeRO-1 over their moments) as in one process, and their step-1 checkpoint
resumes in one process. The 2 x 2 checkpoints load in transformers, and a rank holds its share of the model state.
(Without ZeRO-1: tests/test_optim_sharding.py at data_parallel 2, tests/test_multinode.py at model_parallel 2.)
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from conftest import msrun_group, small_run_config  # noqa: E402
from msrun_jobs import kill_when_saved, msrun  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}
BATCH = 2  # prompts per data-parallel rank
MAX_GRAD_NORM = 0.05  # below every step's norm here (asserted): clipping is active
LORA_RANK = 4

# Several runs in one process (the process groups are set up once); each writes its metrics and sampled tokens.
WORKER = """
import sys
import numpy as np
import mindgrpo
from mindgrpo.config import load_config
from mindgrpo.train.trainer import GRPOTrainer
for path in sys.argv[1:]:
    config = load_config(path)
    trainer = GRPOTrainer(config)
    tokens = []
    while trainer.step < trainer.total_steps:
        trainer.train_step()
        batch = trainer.last_rollouts
        tokens.append(np.where(batch.completion_mask > 0, batch.completion_ids, -1))
        if trainer.step % config.rl_config.save_ckpt_interval == 0:
            trainer.save_checkpoint()
    trainer.metrics.close()
    trainer.scorer.close()
    np.save(config.rl_config.output_dir + f"/tokens_rank{trainer.dist.rank}.npy", np.stack(tokens))
    worker = trainer.worker  # the bytes of this rank's weights, gradient accumulators and AdamW moments
    state = sum(p.nbytes for p in (*worker.params, *worker._accumulators, *worker.optimizer.exp_avg,
                                   *worker.optimizer.exp_avg_sq))
    np.save(config.rl_config.output_dir + f"/state_rank{trainer.dist.rank}.npy", np.array(state))
"""


def _config(root: Path, name: str, dataset: Path, model: Path, *, dp: int, mp: int, zero: bool = True,
            loss_impl: str = "fused", resume: bool = False, lora: bool = False) -> Path:
    from mindgrpo.config import dump_yaml

    cfg = small_run_config(root / name, dataset, model, max_prompt_length=64, seq_length=80, max_tokens=8,
                           verifiers=["toy_verifiers:text_length"], max_steps=2, save_ckpt_interval=1,
                           save_max_ckpt_num=2, batch_size=BATCH * (2 // dp), loss_type="dapo", loss_impl=loss_impl,
                           num_iterations=2, resume_training=resume, scale_rewards="batch")
    cfg.actor_config.lr_schedule.learning_rate = 1e-4
    cfg.actor_config.max_grad_norm = MAX_GRAD_NORM
    cfg.actor_config.micro_batch_size = 4
    cfg.ref_config.ref_model_batch_size = 8
    cfg.generate_config.infer_model_batch_size = 8
    for section in (cfg.actor_config, cfg.ref_config, cfg.generate_config):
        section.parallel_config.data_parallel = dp
        section.parallel_config.model_parallel = mp
    cfg.actor_config.parallel_config.optimizer_shard = zero
    if lora:  # rank-4 adapters on every linear; a rate at which they move 100x the tolerance below in two steps
        cfg.actor_config.lora_rank, cfg.actor_config.lora_alpha = LORA_RANK, 8.0
        cfg.actor_config.lr_schedule.learning_rate = 1e-3
    path = root / f"{name}{'_resumed' if resume else ''}.yaml"
    dump_yaml(cfg, path)
    return path


@pytest.fixture(scope="module")
def layout_runs(tmp_path_factory, demo_prompts, demo_plain):
    """Two GRPO steps (two passes each: the second sees a clipped ratio) on the same global batch of 4 prompts,
    advantages scaled by the global batch's std, ``dapo`` (the global token mean): in one process (fused loss); at
    2 x 2 with ZeRO-1 (fused); at 2 x 2 killed after its step-1 checkpoint, then resumed; and that run's step-1
    checkpoint resumed in one process ("resharded"). LoRA (the plain-ops loss) likewise: in one process, at 2 x 2
    and its step-1 checkpoint resumed in one process."""
    root = tmp_path_factory.mktemp("dp_tp")
    worker = root / "worker.py"
    worker.write_text(WORKER, encoding="utf-8")
    model = demo_plain.model_dir

    def config(name, **kw):
        return _config(root, name, demo_prompts, model, **kw)

    # one single-process run: both 2 x 2 runs train with dapo (every loss_type's reduction under data parallel is
    # checked in tests/test_algorithm.py, without msrun)
    one = subprocess.run([sys.executable, worker, config("one", dp=1, mp=1),
                          config("lora_one", dp=1, mp=1, loss_impl="plain", lora=True)],
                         env=ENV, capture_output=True, text=True, timeout=1800)
    assert one.returncode == 0, one.stderr[-3000:]

    killed = config("killed", dp=2, mp=2)
    proc = msrun([worker, killed], root / "log_killed", workers=4, wait=False)
    kill_when_saved(proc, root / "killed" / "checkpoints" / "step_00000001" / "manifest.json", str(killed),
                    timeout=1800)
    assert not (root / "killed" / "checkpoints" / "step_00000002").exists()
    msrun([worker, config("zero", dp=2, mp=2), config("killed", dp=2, mp=2, resume=True),
           config("lora", dp=2, mp=2, loss_impl="plain", lora=True)],
          root / "log_2x2", workers=4, timeout=2400)

    # the step-1 checkpoints written at 2 x 2, resumed by one process
    for run, source in (("resharded", "zero"), ("lora_resharded", "lora")):
        (root / run / "checkpoints").mkdir(parents=True)
        shutil.copytree(root / source / "checkpoints" / "step_00000001", root / run / "checkpoints" / "step_00000001")
    resharded = subprocess.run([sys.executable, worker, config("resharded", dp=1, mp=1, resume=True),
                                config("lora_resharded", dp=1, mp=1, loss_impl="plain", resume=True, lora=True)],
                               env=ENV, capture_output=True, text=True, timeout=1800)
    assert resharded.returncode == 0, resharded.stderr[-3000:]
    return root


def _weights(run: Path, step: int) -> dict:
    from safetensors.numpy import load_file

    return load_file(run / "checkpoints" / f"step_{step:08d}" / "model" / "model.safetensors")


def _worst(a: dict, b: dict) -> float:
    assert set(a) == set(b)
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


def _same_tokens(one: Path, two: Path) -> np.ndarray:
    """Assert that the 2 x 2 run ``two`` sampled the one process's completions: data-parallel rank d's rows are rows
    [d * BATCH * G, (d + 1) * BATCH * G) of the one process's, on both of its tensor-parallel ranks. Returns the one
    process's tokens."""
    single = np.load(one / "tokens_rank0.npy")
    for rank in range(4):
        part = np.load(two / f"tokens_rank{rank}.npy")
        rows = part.shape[1]
        np.testing.assert_array_equal(part, single[:, (rank // 2) * rows:(rank // 2 + 1) * rows],
                                      err_msg=f"rank {rank}")
    return single


@msrun_group
def test_2x2_samples_and_trains_as_one_process(layout_runs, demo_plain):
    """2 x 2 with ZeRO-1 and the fused loss op against one process: the same tokens, rewards, clipped global norm
    and weights."""
    from mindgrpo.train.metrics import read_metrics

    one, two = layout_runs / "one", layout_runs / "zero"
    single = _same_tokens(one, two)
    assert len({tuple(row) for row in single[0]}) > 1  # not a degenerate rollout
    metrics_one, metrics_two = read_metrics(one / "metrics.jsonl"), read_metrics(two / "metrics.jsonl")
    for a, b in zip(metrics_one, metrics_two):
        assert a["grad_norm"] > 2 * MAX_GRAD_NORM, a["grad_norm"]  # every update is clipped
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
        assert b["grpo/rewards/mean"] == pytest.approx(a["grpo/rewards/mean"], rel=1e-6)
    worst = [_worst(_weights(one, step), _weights(two, step)) for step in (1, 2)]
    print(f"2 x 2 vs one process: max |weight difference| {worst[0]:.2e} after step 1, {worst[1]:.2e} "
          f"after step 2; grad_norm {[round(m['grad_norm'], 4) for m in metrics_two]}")
    assert max(worst) <= 1e-5, worst
    from safetensors.numpy import load_file

    initial = load_file(demo_plain.model_dir / "model.safetensors")
    moved = _weights(one, 2)
    assert max(float(np.abs(moved[k] - initial[k]).max()) for k in initial) > 1e-4  # the updates moved the weights


def _adapters(run: Path, step: int) -> dict:
    from mindgrpo.models.lora import read_peft_arrays

    return read_peft_arrays(run / "checkpoints" / f"step_{step:08d}" / "model")


@msrun_group
def test_2x2_lora_samples_and_trains_as_one_process(layout_runs):
    """LoRA at 2 x 2 with ZeRO-1 over the adapters' moments, against one process: the adapters' slices (B beside
    q/k/v/gate/up split by rows, A beside o/down by columns, the other halves replicated with their gradients summed
    over the tensor-parallel pair) sample the same tokens, reach the rollout (its log-probs equal the training
    forward's), give the same clipped global norm and the same adapters, gathered into PEFT folders; the step-1
    checkpoint resumed in one process (resharded) reaches the same step 2."""
    from mindgrpo.train.metrics import read_metrics

    one, two = layout_runs / "lora_one", layout_runs / "lora"
    _same_tokens(one, two)
    metrics_one, metrics_two = read_metrics(one / "metrics.jsonl"), read_metrics(two / "metrics.jsonl")
    assert [m["step"] for m in metrics_two] == [1, 2]
    for a, b in zip(metrics_one, metrics_two):
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
        assert b["rollout/logprob_diff_max"] <= 1e-5, b
        # the logged loss terms are token means over the global batch, as one process logs them
        for key in ("actor/kl_loss", "actor/pg_loss", "actor/entropy"):
            assert b[key] == pytest.approx(a[key], rel=1e-3, abs=1e-8), key  # float32 sums in another order
    assert 0 < metrics_two[0]["actor/kl_loss"] < metrics_two[1]["actor/kl_loss"]  # from 0 (B = 0) on the first pass
    initial = _adapters(one, 1)
    worst = [_worst(_adapters(one, step), _adapters(two, step)) for step in (1, 2)]
    resharded = _worst(_adapters(two, 2), _adapters(layout_runs / "lora_resharded", 2))
    print(f"LoRA 2 x 2 vs one process: max |adapter difference| {worst[0]:.2e} after step 1, {worst[1]:.2e} after "
          f"step 2; resharded resume {resharded:.2e}; grad_norm {[round(m['grad_norm'], 4) for m in metrics_two]}")
    assert max(worst) <= 1e-5 and resharded <= 1e-5, (worst, resharded)
    final = _adapters(one, 2)
    for half in (".lora_A.", ".lora_B."):  # both halves moved 100x the tolerance between the checkpoints
        assert max(float(np.abs(final[k] - initial[k]).max()) for k in final if half in k) > 1e-3, half
    layout = json.loads((two / "checkpoints" / "step_00000002" / "optimizer" / "layout.json").read_text())
    assert (layout["tp"], layout["dp"], layout["optimizer_shard"]) == (2, 2, True)
    assert len(final) == 2 * 7 * 2  # two layers, seven linears, A and B: the PEFT folder is whole


@msrun_group
def test_2x2_killed_and_resumed_equals_uninterrupted(layout_runs):
    from mindgrpo.train.metrics import read_metrics

    killed = layout_runs / "killed"
    log = (layout_runs / "log_2x2" / "worker_0.log").read_text(errors="replace")
    assert f"resumed from {killed / 'checkpoints' / 'step_00000001'} at step 1" in log
    worst = _worst(_weights(layout_runs / "zero", 2), _weights(killed, 2))
    assert worst <= 1e-6, worst
    assert [r["step"] for r in read_metrics(killed / "metrics.jsonl")] == [1, 2]
    layout = json.loads((killed / "checkpoints" / "step_00000002" / "optimizer" / "layout.json").read_text())
    assert (layout["tp"], layout["dp"]) == (2, 2)


@msrun_group
def test_2x2_checkpoint_resumes_resharded_in_one_process(layout_runs):
    """The 2 x 2 step-1 checkpoint (TP slices, ZeRO-1 moment shards) resumed with data_parallel 1 x model_parallel 1
    reaches the weights of the 2 x 2 run's step 2."""
    worst = _worst(_weights(layout_runs / "zero", 2), _weights(layout_runs / "resharded", 2))
    print(f"resharded 2 x 2 -> 1 x 1 resume vs 2 x 2: max |weight difference| {worst:.2e}")
    assert worst <= 1e-5, worst
    log = json.loads((layout_runs / "resharded" / "checkpoints" / "step_00000002" / "optimizer" / "layout.json")
                     .read_text())
    assert (log["tp"], log["dp"]) == (1, 1)


@msrun_group
def test_2x2_export_loads_in_transformers(layout_runs):
    """The checkpoint a 2 x 2 run writes (gathered from the TP slices) is a Hugging Face folder whose logits in
    transformers equal those of the one process's."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    ids = torch.tensor([[5, 17, 300, 42, 7, 99, 500, 3]])  # within the demo model's 544-token vocabulary
    logits = {}
    for name in ("one", "zero"):
        folder = layout_runs / name / "checkpoints" / "step_00000002" / "model"
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
        with torch.no_grad():
            logits[name] = model(ids).logits.numpy()
    assert np.abs(logits["one"] - logits["zero"]).max() <= 1e-4


@msrun_group
def test_2x2_rank_holds_its_share_of_the_model_state(layout_runs, demo_plain):
    """Weights, gradient accumulators and the two AdamW moments (4 copies of the model in float32): a rank holds
    half of them at model_parallel 2 (norms are replicated: a little more), and with ZeRO-1 the data-parallel pair
    splits its moments (whole tensors to one rank or the other), so on average a rank holds (1 + 1 + 2 / 2) / 8 of
    them: 0.375, and each rank less than the 0.5 it would hold without ZeRO-1. With LoRA the trained state is the
    adapters': a rank holds its slices (the planner's count, ``lora_parameters`` at model_parallel 2, a fraction f
    of them), so on average 3 f / 4."""
    from mindgrpo.apps.plan import lora_parameters
    from mindgrpo.models.lora import TARGET_MODULES

    share = {}
    for run, single in (("zero", "one"), ("lora", "lora_one")):
        one = int(np.load(layout_runs / single / "state_rank0.npy"))
        share[run] = [int(np.load(layout_runs / run / f"state_rank{rank}.npy")) / one for rank in range(4)]
    print(f"model state per rank, as a share of one process's: {share}")
    assert 0.375 <= np.mean(share["zero"]) <= 0.41 and max(share["zero"]) < 0.5, share
    hf_config = json.loads((demo_plain.model_dir / "config.json").read_text())
    f = (lora_parameters(hf_config, LORA_RANK, TARGET_MODULES, model_parallel=2)
         / lora_parameters(hf_config, LORA_RANK, TARGET_MODULES))
    assert 0.5 < f < 1 and np.mean(share["lora"]) == pytest.approx(0.75 * f, rel=1e-9), (f, share)
