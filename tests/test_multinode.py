"""scripts/run_grpo_multinode.sh: the msrun command it builds, its argument checks, and two real msrun "nodes" on
this machine: with a probe script standing in for main.py (no training code involved), and running the GRPO job
with model_parallel 2 (TP=2), whose weights must equal those of the same job with model_parallel 1 in one process."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import msrun_group
from multinode import LAUNCHER, REPO, check_nodes, launch_nodes
from test_trainer import make_config, prompts  # noqa: F401  (the GSM8K-format prompt fixture)

CONFIG = REPO / "examples" / "grpo" / "grpo_qwen2_5_32b_2nodes.yaml"
PROBE = """
import sys
import numpy as np
import mindspore as ms
from mindspore import Tensor, ops
from mindspore.communication import get_group_size, get_rank, init

ms.set_context(device_target="CPU")
init()
total = ops.AllReduce()(Tensor(np.array([get_rank() + 1.0], np.float32))).asnumpy()[0]
assert total == get_group_size() * (get_group_size() + 1) / 2, total
print(f"PROBE rank={get_rank()} size={get_group_size()} argv={sys.argv[1:]}", flush=True)
"""


def _fake_msrun(tmp_path, body):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "msrun"
    fake.write_text("#!/usr/bin/env bash\n" + body)
    fake.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def _launch(args, env, cwd):
    return subprocess.run(["bash", str(LAUNCHER), *map(str, args)], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=60)


def test_launcher_builds_msruns_multi_node_command(tmp_path):
    record = tmp_path / "args"
    env = _fake_msrun(tmp_path, f'printf "%s\\n" "$@" > {record}\n')
    done = _launch([CONFIG, 1, "10.0.0.1", "--actor_checkpoint_path", "/m", "rl_config.seed=3"],
                   {**env, "MASTER_PORT": "9000"}, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "node 1 of 2, ranks 8..15 of 16, master 10.0.0.1:9000" in done.stdout
    assert record.read_text().splitlines() == [
        "--worker_num=16", "--local_worker_num=8", "--node_rank=1", "--master_addr=10.0.0.1", "--master_port=9000",
        "--log_dir=output/msrun_log_node1", "--join=True", "--cluster_time_out=600",
        str(REPO / "examples" / "grpo" / "main.py"), "--config", str(CONFIG), "--actor_checkpoint_path", "/m",
        "rl_config.seed=3"]
    done = _launch([CONFIG, 2, "host0", 4, 2, "--resume_training"], env, tmp_path)  # NODES 4, 2 workers each
    assert done.returncode == 0, done.stderr
    lines = record.read_text().splitlines()
    assert lines[:5] == ["--worker_num=8", "--local_worker_num=2", "--node_rank=2", "--master_addr=host0",
                         "--master_port=8118"]
    assert lines[-1] == "--resume_training"


@pytest.mark.parametrize("args,message", [
    ([CONFIG, 2, "h"], "NODE_RANK 2 is not below NODES 2"),
    ([CONFIG, "x", "h"], "NODE_RANK must be a number"),
    ([CONFIG, 0, "h", 0], "must be >= 1"),
    (["missing.yaml", 0, "h"], "config file not found"),
    ([CONFIG, 0], "usage:"),
])
def test_launcher_rejects_bad_arguments(tmp_path, args, message):
    env = _fake_msrun(tmp_path, "exit 0\n")
    done = _launch(args, env, tmp_path)
    assert done.returncode == 2 and message in done.stderr, done.stderr


@msrun_group
def test_two_msrun_nodes_on_one_host(tmp_path):
    """Two launches, node ranks 0 and 1, one worker each, same master address and port: the workers form one
    2-rank job (rank = node_rank x local workers + index) and an AllReduce spans both."""
    real = shutil.which("msrun")
    if real is None:
        pytest.skip("msrun not on PATH")
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    env = _fake_msrun(tmp_path, f"""args=()
for a in "$@"; do
  case "$a" in */examples/grpo/main.py) args+=("{probe}") ;; *) args+=("$a") ;; esac
done
exec "{real}" "${{args[@]}}"
""")
    runs = launch_nodes(CONFIG, ["rl_config.seed=3"], nodes=2, workers_per_node=1, log_root=tmp_path / "logs",
                        cwd=tmp_path, env=env, timeout=300)
    check_nodes(runs)
    for node, run in enumerate(runs):
        (log,) = run.worker_logs()
        assert f"PROBE rank={node} size=2 argv=['--config', '{CONFIG}', 'rl_config.seed=3']" in log.read_text()


@msrun_group
def test_tp2_grpo_job_as_two_msrun_nodes_equals_one_process(tmp_path, prompts, tiny_model_dir):
    """The TP=2 GRPO job (examples/grpo/main.py on the tiny fixture, 2 steps, lr 1e-4) as two msrun "nodes" of one
    worker each ends with the weights of the same job with model_parallel 1 in one process, run at the same time.
    The reward is the completion's length (toy_verifiers.text_length): every step has advantages, so each update
    follows a real gradient rather than AdamW's normalised rounding noise (a step without advantages has a KL
    gradient of ~1e-8 that differs between layouts and that AdamW's first step scales up to lr), and the weights move.
    (1e-5 and lr 1e-4 as in tests/test_data_tensor_parallel.py: AdamW's first step turns float32 reassociation differences
    of the split matmuls into weight differences proportional to lr.)"""
    if shutil.which("msrun") is None:
        pytest.skip("msrun not on PATH")
    from safetensors.numpy import load_file

    from mindgrpo.config import dump_yaml

    def config(name, model_parallel):
        cfg = make_config(tmp_path / name, prompts, tiny_model_dir, max_steps=2)
        cfg.actor_config.lr_schedule.learning_rate = 1e-4
        cfg.reward_config.verifier_function, cfg.reward_config.verifier_weight = ["toy_verifiers:text_length"], [1.0]
        for section in (cfg.actor_config, cfg.ref_config, cfg.generate_config):
            section.parallel_config.model_parallel = model_parallel
        dump_yaml(cfg, tmp_path / f"{name}.yaml")
        return tmp_path / f"{name}.yaml"

    env = {"PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}  # toy_verifiers
    with open(tmp_path / "tp1.out", "w") as out:  # started first, so it runs while the two nodes do
        tp1 = subprocess.Popen([sys.executable, str(REPO / "examples" / "grpo" / "main.py"), "--config",
                                str(config("tp1", 1))], cwd=tmp_path, env={**os.environ, **env}, stdout=out,
                               stderr=subprocess.STDOUT)
    try:
        runs = launch_nodes(config("tp2", 2), nodes=2, workers_per_node=1, log_root=tmp_path / "logs", cwd=tmp_path,
                            env=env, timeout=300)
        tp1.wait(timeout=300)
    finally:
        if tp1.poll() is None:
            tp1.kill()
            tp1.wait()
    check_nodes(runs)
    assert "[mindgrpo] done: 2 steps" in runs[0].worker_logs()[0].read_text()
    assert tp1.returncode == 0, (tmp_path / "tp1.out").read_text()[-4000:]
    two, one = (load_file(tmp_path / name / "checkpoints" / "step_00000002" / "model" / "model.safetensors")
                for name in ("tp2", "tp1"))
    assert set(two) == set(one)
    worst = max(float(np.abs(two[k] - one[k]).max()) for k in two)
    initial = load_file(tiny_model_dir / "model.safetensors")
    moved = max(float(np.abs(one[k] - initial[k]).max()) for k in initial if k in one)
    print(f"TP=2 GRPO as two msrun nodes vs TP=1 in one process: max |weight difference| {worst:.2e} "
          f"(the update moved weights by up to {moved:.2e})")
    assert worst <= 1e-5, worst
    assert moved > 5e-5, moved
