"""`python -m mindgrpo doctor`: passes on this machine, and each failure names the problem and the fix."""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import mindgrpo  # noqa: F401  (before mindspore)
from mindgrpo.apps import doctor
from mindgrpo.cli import main as cli_main

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def by_name(checks, name):
    found = [c for c in checks if c.name == name]
    assert found, f"no {name!r} check in {[c.name for c in checks]}"
    return found[0]


@pytest.fixture
def good_config(tmp_path):
    """A config whose every input exists: a model folder with config.json + safetensors, a MindRecord + index."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2", "num_attention_heads": 14,  # 0.5B's shape
                                                   "num_key_value_heads": 2, "num_hidden_layers": 24,
                                                   "hidden_size": 896, "intermediate_size": 4864,
                                                   "vocab_size": 151936}))
    (model / "model.safetensors").write_bytes(b"\0" * 16)
    (model / "tokenizer.json").write_text("{}")
    (tmp_path / "train.mindrecord").write_bytes(b"\0")
    (tmp_path / "train.mindrecord.db").write_bytes(b"\0")
    cfg = {"rl_config": {"dataset_file": "train.mindrecord", "output_dir": "out", "batch_size": 2,
                         "num_generations": 4},
           "actor_config": {"load": "model", "micro_batch_size": 4},
           "ref_config": {"ref_model_batch_size": 8}}
    path = tmp_path / "grpo.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_in_process_passes_on_this_machine(capsys):
    import mindspore as ms

    mode = ms.get_context("mode")
    assert cli_main(["doctor", "--master_port", str(free_port())]) == 0
    out = capsys.readouterr().out
    for line in ("ok    python ", "ok    mindspore ", "ok    tested pair ", "ok    numpy ", "ok    device ",
                 "ok    fused loss op ", "ok    decode kernels ", "ok    master port ", "ok    cache folder ",
                 "ok    output folder "):
        assert line in out, out
    assert "supported <2.11,>=2.7.1" in out and "matches plain ops" in out and " 0 FAIL" in out
    assert ms.get_context("mode") == mode  # the op check ran in PyNative and put the caller's mode back


def test_subprocess_on_this_machine(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    port = str(free_port())
    done = subprocess.run([sys.executable, "-m", "mindgrpo", "doctor", "--master_port", port], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("mindgrpo doctor: mindgrpo ")
    assert any(line.startswith("ok    device") and "CPU" in line for line in lines), done.stdout
    assert any(line.startswith("info  ascend-only") and "vllm" in line for line in lines), done.stdout
    assert lines[-1].endswith(" 0 FAIL") and "WARNING" not in done.stderr
    assert list(tmp_path.iterdir()) == []  # the writability probe left nothing behind


def test_json_output(capsys):
    assert cli_main(["doctor", "--json", "--master_port", str(free_port())]) == 0
    report = json.loads(capsys.readouterr().out)  # nothing but the JSON on stdout
    assert report["ok"] is True and report["summary"].endswith(" 0 FAIL")
    assert {c["status"] for c in report["checks"]} <= {"ok", "info", "warn"}
    assert {"python", "mindspore", "device", "fused loss op", "msrun", "master port"} <= {
        c["name"] for c in report["checks"]}


def test_decode_kernels_check_fails_without_a_compiler_and_names_the_switch(tmp_path, monkeypatch):
    monkeypatch.setenv("MINDGRPO_CACHE", str(tmp_path))  # nothing compiled yet
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    check = doctor.check_decode_kernels("CPU")
    assert check.status == "FAIL" and "not found" in check.detail and "decode_impl=plain" in check.fix
    assert doctor.check_decode_kernels("CPU", decode_impl="plain").status == "info"
    assert "CPU only" in doctor.check_decode_kernels("Ascend").detail


def test_head_kernel_check_runs_it_and_fails_without_a_compiler_naming_the_switch(tmp_path, monkeypatch):
    assert doctor.check_head_kernel("CPU").status == "ok"
    monkeypatch.setenv("MINDGRPO_CACHE", str(tmp_path))  # nothing compiled yet
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    check = doctor.check_head_kernel("CPU")
    assert check.status == "FAIL" and "not found" in check.detail and "head_impl=plain" in check.fix
    assert doctor.check_head_kernel("CPU", head_impl="plain").status == "info"
    assert "CPU only" in doctor.check_head_kernel("Ascend").detail


def test_busy_port_fails_with_a_free_suggestion(capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        check = doctor.check_port(port, "test")
        assert check.status == "FAIL" and f"{port}" in check.detail and "in use" in check.detail
        suggested = int(check.fix.split("--master_port ")[1].split()[0])
        assert suggested != port and doctor.port_free(suggested)
        assert cli_main(["doctor", "--master_port", str(port)]) == 1
    out = capsys.readouterr().out
    assert f"FAIL  master port" in out and "fix: use --master_port" in out
    assert doctor.port_free(port)  # released with the socket


def test_good_config_passes(good_config):
    checks = doctor.run_checks(str(good_config), master_port=free_port())
    failed = [c for c in checks if c.status == "FAIL"]
    assert not failed, failed
    for name in ("config", "rl_config.dataset_file", "actor_config.load", "tokenizer",
                 "batch sizes", "layout actor_config", "rl_config.output_dir", "checkpoint folder",
                 "rollout backend"):
        assert by_name(checks, name).status == "ok", name
    assert "heads/layers not checked" not in by_name(checks, "layout actor_config").detail


def test_missing_paths_fail_naming_key_path_and_fix(good_config, tmp_path):
    checks = doctor.run_checks(str(good_config), ["rl_config.dataset_file=gone.mindrecord",
                                                  f"actor_config.load={tmp_path / 'no_model'}"],
                               master_port=free_port())
    data = by_name(checks, "rl_config.dataset_file")
    assert data.status == "FAIL" and str(Path.cwd() / "gone.mindrecord") in data.detail
    assert data.fix.startswith("python tools/rlhf_data.py ") and "--output_path" in data.fix
    model = by_name(checks, "actor_config.load")
    assert model.status == "FAIL" and str(tmp_path / "no_model") in model.detail and "--local-dir" in model.fix
    (tmp_path / "train.mindrecord.db").unlink()
    index = by_name(doctor.run_checks(str(good_config), master_port=free_port()), "rl_config.dataset_file")
    assert index.status == "FAIL" and "train.mindrecord.db" in index.detail


def test_bad_layouts_and_batches_fail(good_config):
    port = free_port()
    checks = doctor.run_checks(str(good_config), ["actor_config.parallel_config.data_parallel=3"], master_port=port,
                               workers=2)
    layout = by_name(checks, "layout actor_config")
    assert layout.status == "FAIL" and "= 3, but 2 worker(s)" in layout.detail and "= 2" in layout.fix
    # 4-way model parallel does not divide the 14 heads of the model's config.json (checked as on Ascend).
    checks = doctor.run_checks(str(good_config), ["actor_config.parallel_config.model_parallel=4",
                                                  "actor_config.parallel_config.data_parallel=2",
                                                  "rl_config.device_target=Ascend"], master_port=port, workers=8)
    assert "does not divide the 14 attention heads" in by_name(checks, "layout actor_config").detail
    assert by_name(checks, "device target").status == "FAIL"
    checks = doctor.run_checks(str(good_config), ["actor_config.micro_batch_size=3"], master_port=port)
    batches = by_name(checks, "batch sizes")
    assert batches.status == "FAIL" and "micro_batch_size = 3 does not divide" in batches.detail
    assert batches.fix == "actor_config.micro_batch_size=2"


def test_config_problems_are_reported_and_later_checks_still_run(good_config, tmp_path):
    checks = doctor.run_checks(str(good_config), ["rl_config.beta=-1", "generate_config.backend=vllm"],
                               master_port=free_port())
    assert any(c.name == "config value" and "rl_config.beta" in c.detail for c in checks)
    backend = by_name(checks, "rollout backend")
    assert backend.status == "FAIL" and "native" in backend.fix
    assert by_name(checks, "rl_config.dataset_file").status == "ok"
    missing = by_name(doctor.run_checks(str(tmp_path / "nope.yaml"), master_port=free_port()), "config")
    assert missing.status == "FAIL" and "nope.yaml" in missing.detail and "--config" in missing.fix
    blocked = tmp_path / "a_file"
    blocked.write_text("")
    out = by_name(doctor.run_checks(str(good_config), [f"rl_config.output_dir={blocked / 'run'}"],
                                    master_port=free_port()), "rl_config.output_dir")
    assert out.status == "FAIL" and "cannot write" in out.detail


def test_version_mismatch_fails_with_pip_command(monkeypatch):
    monkeypatch.setattr(doctor, "requirements", lambda: (">=3.10", ["mindspore==0.1", "numpy<2", "no-such-pkg-xyz"],
                                                         "test"))
    checks = list(doctor.check_versions())
    ms_check = by_name(checks, "mindspore")
    assert ms_check.status == "FAIL" and ms_check.fix == 'pip install "mindspore==0.1"'
    assert by_name(checks, "numpy").status == "ok"
    others = by_name(checks, "other requirements")
    assert others.status == "FAIL" and "no-such-pkg-xyz missing" in others.detail


def test_requirements_come_from_setup_py():
    python_requires, install, source = doctor.requirements()
    assert source.endswith("setup.py") and python_requires == ">=3.10,<3.12"
    assert {"mindspore>=2.7.1,<2.11", "numpy<2"} <= set(install)


def test_command_dispatch(capsys):
    from importlib.metadata import entry_points

    scripts = {e.name: e.value for e in entry_points(group="console_scripts")}
    assert scripts.get("mindgrpo") == "mindgrpo.cli:main"  # `mindgrpo doctor` runs this main
    assert cli_main(["config-help"]) == 0 and "rl_config.dataset_file" in capsys.readouterr().out
    assert cli_main(["nonsense"]) == 2 and "unknown command 'nonsense'" in capsys.readouterr().err
    assert cli_main([]) == 2


@pytest.mark.parametrize("overrides, uses_kernel", [
    ({}, True),
    ({"importance_sampling_level": "sequence"}, False),  # GSPO: the plain ops, whatever loss_impl says
    ({"loss_type": "cispo"}, False),
    ({"loss_impl": "plain"}, False),
])
def test_a_broken_fused_op_fails_only_runs_that_call_it(monkeypatch, overrides, uses_kernel):
    from mindgrpo.config import GRPOConfig
    import mindgrpo.ops as ops_package

    config = GRPOConfig()
    for key, value in overrides.items():
        setattr(config.rl_config, key, value)
    runs_fused = config.rl_config.runs_fused
    assert runs_fused is uses_kernel

    def broken(*args, **kwargs):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(ops_package, "fused_token_loss", broken)
    check = doctor.check_fused_op("CPU", runs_fused)
    assert check.status == ("FAIL" if uses_kernel else "warn")
    assert "kernel exploded" in check.detail


def test_the_installed_pair_is_checked_against_the_tested_table(tmp_path):
    """`mindgrpo doctor` reports the MindSpore + MindFormers pair in use against tools/compat.py's table."""
    import importlib.metadata
    import json

    from mindgrpo.apps.doctor import COMPAT_TABLE, check_tested_pair

    ms, mf = importlib.metadata.version("mindspore"), importlib.metadata.version("mindformers")
    table = tmp_path / "compat.json"

    def verdict(rows):
        table.write_text(json.dumps({"date": "2026-11-29", "machine": "x86_64", "pairs": rows}))
        return check_tested_pair(table)

    ok = verdict([{"mindspore": ms, "mindformers": mf, "passed": True}])
    assert ok.status == "ok" and f"MindSpore {ms} + MindFormers {mf}: passed" in ok.detail
    failed = verdict([{"mindspore": ms, "mindformers": mf, "passed": False}])
    assert failed.status == "warn" and "failed tools/compat.py" in failed.detail
    other = verdict([{"mindspore": "0.0.1", "mindformers": mf, "passed": True}])
    assert other.status == "warn" and "not among the tested pairs (0.0.1+" in other.detail
    assert f"--pairs {ms}:{mf}" in other.fix
    table.write_text("{not json")
    assert check_tested_pair(table).status == "warn"
    assert check_tested_pair(COMPAT_TABLE).status == "ok"  # the shipped table has the pair CI installs
