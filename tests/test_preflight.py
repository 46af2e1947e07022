"""Every check that needs only the config, the data, the verifiers and config.json runs before any model, graph or
output file is made, and ends as the user sees it: one ``error: ...`` line naming the key, file or flag (exit 2), no
traceback, nothing in ``output_dir``.

The table runs each bad input through the command line in this process (``mindgrpo train``'s ``main``, with model
building made to fail loudly: a check that let a run through would build the models) and a part of it as real
subprocesses of ``examples/grpo/main.py`` and ``python -m mindgrpo train`` (where MindSpore's import is a few
seconds of each; the measured time of each row is printed). Valid parts come from the embedded demo, never
../shared.
"""
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_qwen import make_tiny_qwen2  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MAIN = REPO / "examples" / "grpo" / "main.py"

BASE_YAML = """\
rl_config:
  dataset_file: {prompts}
  output_dir: {run}
  mode: pynative
  max_steps: 1
  batch_size: 2
  num_generations: 4
  max_prompt_length: 64
  seq_length: 80
actor_config:
  load: {model}
  micro_batch_size: 4
ref_config:
  ref_model_batch_size: 8
generate_config:
  infer_model_batch_size: 8
  sampling_config:
    max_tokens: 8
reward_config:
  verifier_function: [accuracy_reward, hash_format_reward]
  verifier_weight: [1.0, 0.1]
"""

# id -> (command-line arguments after --config, the yaml's replaced text (old, new) or None, the error's pattern).
# {tmp}, {small} and {model} are filled in per run.
ROWS = {
    "misspelled verifier": (["--verifier_function", "acuracy_reward,hash_format_reward"], None,
                            r"verifier_function\[0\]: unknown verifier 'acuracy_reward'\. Did you mean "
                            r"'accuracy_reward'"),
    "verifier module missing": (["--verifier_function", "no_such_module:reward,hash_format_reward"], None,
                                r"verifier_function\[0\].*no_such_module"),
    "verifier weights count": (["--verifier_weight", "1.0 0.5 0.2"], None,
                               r"reward_config\.verifier_weight has 3 entries but reward_config\.verifier_function "
                               r"has 2"),
    "bad override value": (["rl_config.beta=abc"], None, r"'rl_config\.beta' must be a number, got 'abc'"),
    "unknown key": (["rl_config.betta=0.1"], None, r"unknown key 'rl_config\.betta'; did you mean 'beta'"),
    "bad yaml line": ([], ("  max_steps: 1\n", "  max_steps: [1\n"), r"c\.yaml: not valid YAML.*line \d+"),
    "model_parallel without msrun": (["actor_config.parallel_config.model_parallel=2"], None,
                                     r"not started by msrun: launch it as `msrun --worker_num=2"),
    "layout does not divide the heads": (["actor_config.parallel_config.model_parallel=3"], None,
                                         r"model_parallel = 3 does not divide the 4 attention heads"),
    "missing dataset": (["--dataset_file", "{tmp}/none.mindrecord"], None,
                        r"rl_config\.dataset_file = \S*none\.mindrecord: no such file or folder"),
    "dataset smaller than a step": (["rl_config.batch_size=64"], None,
                                    r"16 prompt\(s\), fewer than one step needs \(rl_config\.batch_size 64"),
    "missing model folder": (["--actor_checkpoint_path", "{tmp}/nomodel"], None,
                             r"actor_config\.load = \S*nomodel: no such file or folder"),
    "model folder without config.json": (["--actor_checkpoint_path", "{tmp}"], None,
                                         r"actor_config\.load = .*config\.json not found"),
    "tokenizer does not fit config.json": (["--actor_checkpoint_path", "{small}", "--tokenizer_dir", "{model}"], None,
                                           r"actor_config\.load = \S*: the model's vocab_size is 256, but the "
                                           r"tokenizer in \S* has 544 tokens"),
    "micro-batch does not divide a step": (["actor_config.micro_batch_size=12"], None,
                                           r"actor_config\.micro_batch_size = 12 does not divide"),
    "generate_checkpoint_path differs": (["--generate_checkpoint_path", "{small}"], None,
                                         r"generate_config\.load \(--generate_checkpoint_path\) = \S*small differs "
                                         r"from actor_config\.load"),
    "ref_checkpoint_path unread at beta 0": (["--ref_checkpoint_path", "{small}", "rl_config.beta=0"], None,
                                             r"ref_config\.load \(--ref_checkpoint_path\) = \S*small would never be "
                                             r"read: rl_config\.beta = 0"),
    "resume without a run to resume": (["--resume_training"], None,
                                       r"--resume_training\): nothing to resume, no run ever wrote to "
                                       r"rl_config\.output_dir"),
    "bf16 gradient buffers on CPU": (["actor_config.param_dtype=bfloat16", "actor_config.grad_reduce_dtype=bfloat16",
                                      "rl_config.device_target=CPU"], None,
                                     r"actor_config\.grad_reduce_dtype = bfloat16 on CPU: .*set "
                                     r"actor_config\.grad_reduce_dtype: float32"),
    "device_target Ascend without CANN": (["rl_config.device_target=Ascend"], None,
                                          r"rl_config\.device_target = Ascend, but MindSpore cannot load its Ascend "
                                          r"backend here"),
}
# Rows also run as the user runs them: (row, entry). Both entries share train_cli.main.
SUBPROCESS_ROWS = [("misspelled verifier", "main.py"), ("model_parallel without msrun", "main.py"),
                   ("device_target Ascend without CANN", "main.py"), ("bad yaml line", "-m mindgrpo train"),
                   ("generate_checkpoint_path differs", "-m mindgrpo train")]
# The Ascend row needs a host without a working CANN: in a subprocess the CANN environment is taken away (as on a
# badly set-up NPU host); this process keeps its own, so in-process the row runs only where Ascend cannot load.
CANN_VARIABLES = ("ASCEND_HOME_PATH", "ASCEND_OPP_PATH", "ASCEND_AICPU_PATH", "ASCEND_TOOLKIT_HOME")


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    """A Qwen2 folder with a 256-token vocabulary (smaller than the demo tokenizer's 544)."""
    return make_tiny_qwen2(tmp_path_factory.mktemp("preflight") / "small", vocab=256)


def _write_config(tmp_path, demo_plain, demo_prompts, replace=None):
    """(config path, run folder): BASE_YAML, with ``replace`` (old, new) applied, written under tmp_path."""
    run = tmp_path / "run"
    text = BASE_YAML.format(prompts=demo_prompts, run=run, model=demo_plain.model_dir)
    if replace is not None:
        assert replace[0] in text
        text = text.replace(*replace)
    config = tmp_path / "c.yaml"
    config.write_text(text, encoding="utf-8")
    return config, run


def _case(tmp_path, row, demo_plain, demo_prompts, small_model):
    """(config path, argv after it, run folder, pattern) of one row, its yaml written under tmp_path."""
    args, replace, pattern = ROWS[row]
    config, run = _write_config(tmp_path, demo_plain, demo_prompts, replace)
    fill = dict(tmp=tmp_path, small=small_model, model=demo_plain.model_dir)
    return config, [a.format(**fill) for a in args], run, pattern


def _assert_refused(row, code, stderr, pattern, run, elapsed):
    print(f"{row}: exit {code} after {elapsed:.1f} s")
    assert code == 2, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr[-3000:]
    assert re.search(pattern, stderr, re.S), stderr[-3000:]
    assert not run.exists() or not any(run.iterdir()), sorted(map(str, run.rglob("*")))


def _ascend_loads() -> bool:
    from mindspore._c_expression import MSContext

    return MSContext.get_instance().is_pkg_support_device("Ascend")


@pytest.mark.parametrize("row", list(ROWS))
def test_bad_input_is_one_error_line_before_anything_is_built(row, tmp_path, monkeypatch, capsys, demo_plain,
                                                              demo_prompts, small_model):
    if row == "device_target Ascend without CANN" and _ascend_loads():
        pytest.skip("this host loads MindSpore's Ascend backend; the subprocess row covers the check")
    from mindgrpo.apps import train_cli
    from mindgrpo.train import model_worker

    def built(*_args, **_kwargs):
        raise AssertionError(f"{row}: a model was built before the check")

    monkeypatch.setattr(model_worker, "ModelWorker", built)
    monkeypatch.chdir(tmp_path)
    config, args, run, pattern = _case(tmp_path, row, demo_plain, demo_prompts, small_model)
    start = time.perf_counter()
    code = train_cli.main(["--config", str(config), *args])
    _assert_refused(row, code, capsys.readouterr().err, pattern, run, time.perf_counter() - start)


@pytest.mark.parametrize("row,entry", SUBPROCESS_ROWS)
def test_bad_input_as_the_user_runs_it(row, entry, tmp_path, demo_plain, demo_prompts, small_model):
    config, args, run, pattern = _case(tmp_path, row, demo_plain, demo_prompts, small_model)
    program = [str(MAIN)] if entry == "main.py" else entry.split()
    env = {key: value for key, value in os.environ.items() if key not in CANN_VARIABLES}
    env["LD_LIBRARY_PATH"] = ""
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *program, "--config", str(config), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    _assert_refused(f"{row} ({entry})", done.returncode, done.stderr, pattern, run, time.perf_counter() - start)


DEMO_ROWS = {
    "bad override": ("rl_config.num_generations=many", r"'rl_config\.num_generations' must be an integer"),
    "misspelled verifier": ("reward_config.verifier_function=[accuracy_rewrad, hash_format_reward]",
                            r"accuracy_rewrad"),
}


@pytest.mark.parametrize("row", list(DEMO_ROWS))
def test_demo_refuses_bad_input_before_making_its_data(tmp_path, row):
    """Without --config (the embedded demo) a bad override or a misspelled verifier stops before the demo's model
    and data are made."""
    override, pattern = DEMO_ROWS[row]
    start = time.perf_counter()
    done = subprocess.run([sys.executable, str(MAIN), override], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "MINDGRPO_CACHE": str(tmp_path / "cache")})
    _assert_refused(f"demo {row}", done.returncode, done.stderr, pattern, tmp_path / "output",
                    time.perf_counter() - start)
    assert not (tmp_path / "cache" / "demo").exists()


@pytest.mark.parametrize("entry", ["in process", "main.py"])
def test_compile_cache_is_refused(entry, tmp_path, monkeypatch, capsys, demo_plain, demo_prompts):
    """MindSpore's compile cache (MS_COMPILER_CACHE_ENABLE=1) reloads the step graphs wrongly without an error
    (mindgrpo.train.preflight.check_compile_cache): the run must not start."""
    config, run = _write_config(tmp_path, demo_plain, demo_prompts)  # a valid config: only the variable is wrong
    pattern = r"MS_COMPILER_CACHE_ENABLE=1: MindSpore's compile cache reloads"
    start = time.perf_counter()
    if entry == "main.py":
        env = {**os.environ, "MS_COMPILER_CACHE_ENABLE": "1", "MS_COMPILER_CACHE_PATH": str(tmp_path / "cache"),
               "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        done = subprocess.run([sys.executable, str(MAIN), "--config", str(config)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)
        code, stderr = done.returncode, done.stderr
    else:
        from mindgrpo.apps import train_cli

        monkeypatch.setenv("MS_COMPILER_CACHE_ENABLE", "1")
        monkeypatch.chdir(tmp_path)
        code, stderr = train_cli.main(["--config", str(config)]), capsys.readouterr().err
    _assert_refused(f"compile cache ({entry})", code, stderr, pattern, run, time.perf_counter() - start)
