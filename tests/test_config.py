"""Config loading: yaml groups, relative paths, unknown keys, flags, overrides, validation."""
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from mindgrpo.config import (ConfigError, Derived, GRPOConfig, ParallelConfig, check_micro_batches,
                             check_parallel_layout, describe, load_config, micro_batch_problems, validate)
from mindgrpo.hf_config import qwen2_spec


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_are_valid_without_paths():
    validate(GRPOConfig(), check_paths=False)


def test_groups_types_and_relative_paths(tmp_path):
    cfg_file = write(tmp_path / "cfg" / "grpo.yaml", """
rl_config:
  dataset_file: data/train.mindrecord
  beta: 0.0
  num_generations: 4
actor_config:
  load: ../models/tiny
  lr_schedule:
    learning_rate: 1e-6      # PyYAML reads this as a string; it must still become a float
    type: CosineWithWarmUpLR
  parallel_config:
    data_parallel: 2
reward_config:
  verifier_function: [accuracy_reward]
  verifier_weight: [2]
""")
    cfg = load_config(cfg_file)
    assert cfg.rl_config.dataset_file == str(tmp_path / "cfg" / "data" / "train.mindrecord")
    assert cfg.actor_config.load == str(tmp_path / "models" / "tiny")
    assert cfg.actor_config.lr_schedule.learning_rate == pytest.approx(1e-6)
    assert isinstance(cfg.reward_config.verifier_weight[0], float)
    assert cfg.actor_config.parallel_config.data_parallel == 2
    assert cfg.tokenizer_dir == cfg.actor_config.load and cfg.ref_load == cfg.actor_config.load
    validate(cfg, check_paths=False)
    assert cfg.actor_config.lr_schedule.type == "cosine"


def test_unknown_key_names_file_line_and_suggests(tmp_path):
    cfg_file = write(tmp_path / "g.yaml", "rl_config:\n  beta: 0.1\n  num_generation: 4\n")
    with pytest.raises(ConfigError) as err:
        load_config(cfg_file)
    msg = str(err.value)
    assert f"{cfg_file}:3" in msg and "rl_config.num_generation" in msg and "did you mean 'num_generations'" in msg


def test_renamed_key_still_works_with_a_warning_naming_the_new_key(tmp_path):
    from mindgrpo.config import ConfigWarning

    cfg_file = write(tmp_path / "g.yaml", "rl_config:\n  beta: 0.1\n  max_skipped_steps: 5\n")
    with pytest.warns(ConfigWarning, match=rf"{cfg_file}:3.*'rl_config.max_skipped_steps' is now called "
                                           r"'rl_config.max_skipped_updates'"):
        cfg = load_config(cfg_file)
    assert cfg.rl_config.max_skipped_updates == 5
    with pytest.warns(ConfigWarning, match="max_skipped_updates"):
        assert load_config(overrides=["rl_config.max_skipped_steps=1"]).rl_config.max_skipped_updates == 1


def test_unknown_group_and_bad_type(tmp_path):
    with pytest.raises(ConfigError, match="did you mean 'actor_config'"):
        load_config(write(tmp_path / "a.yaml", "actr_config:\n  load: x\n"))
    with pytest.raises(ConfigError, match=r"a\.yaml:2.*rl_config\.batch_size' must be an integer"):
        load_config(write(tmp_path / "a.yaml", "rl_config:\n  batch_size: four\n"))
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(write(tmp_path / "a.yaml", "actor_config:\n  optimizer: adam\n"))


def test_flags_and_overrides_resolve_against_cwd(tmp_path, monkeypatch):
    cfg_file = write(tmp_path / "conf" / "g.yaml", "rl_config:\n  dataset_file: d.mindrecord\n")
    monkeypatch.chdir(tmp_path)
    cfg = load_config(cfg_file, overrides=["rl_config.beta=0.5", "generate_config.sampling_config.top_k=5"],
                      flags={"actor_checkpoint_path": "m", "verifier_function": "accuracy_reward,format_reward",
                             "verifier_weight": "1.0 0.5", "resume_training": True, "tokenizer_dir": None})
    assert cfg.rl_config.dataset_file == str(tmp_path / "conf" / "d.mindrecord")
    assert cfg.actor_config.load == str(tmp_path / "m")
    assert cfg.rl_config.beta == 0.5 and cfg.generate_config.sampling_config.top_k == 5
    assert cfg.reward_config.verifier_function == ["accuracy_reward", "format_reward"]
    assert cfg.reward_config.verifier_weight == [1.0, 0.5]
    assert cfg.rl_config.resume_training is True
    with pytest.raises(ConfigError, match="did you mean 'beta'"):
        load_config(cfg_file, overrides=["rl_config.betta=1"])
    with pytest.raises(ConfigError, match="key.path=value"):
        load_config(cfg_file, overrides=["rl_config.beta"])


def test_validate_lists_every_problem(tmp_path):
    cfg = load_config(write(tmp_path / "g.yaml", """
rl_config:
  loss_type: ppo
  dataset_file: missing.mindrecord
  max_prompt_length: 1000
  seq_length: 1024
reward_config:
  verifier_weight: [1.0]
"""))
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    msg = str(err.value)
    assert "rl_config.loss_type = 'ppo'" in msg
    assert "missing.mindrecord: no such file" in msg and "tools/rlhf_data.py" in msg
    assert "actor_config.load is not set" in msg
    assert "exceeds rl_config.seq_length" in msg
    assert "one weight per verifier" in msg


REPO = Path(__file__).resolve().parents[1]
NO_EFFECT = [  # overrides -> the one warning they raise
    (["generate_config.gpu_memory_utilization=0.5"],
     r"^generate_config.gpu_memory_utilization = 0.5 has no effect: it is the vllm backend's, and "
     r"generate_config.backend is native; remove it"),
    (["rl_config.max_tool_turns=8"], r"^rl_config.max_tool_turns = 8 has no effect: rl_config.tools is empty"),
    (["rl_config.tool_sandbox=process"], r"^rl_config.tool_sandbox = 'process' has no effect: rl_config.tools is empty"),
    (["rl_config.tool_sandbox=remote"], r"^rl_config.tool_sandbox = 'remote' has no effect: rl_config.tools is empty"),
    (["rl_config.tool_sandbox_url=http://sandbox:8080/run_code"],  # with tool_sandbox bwrap: no tools, no refusal
     r"^rl_config.tool_sandbox_url = 'http://sandbox:8080/run_code' has no effect: rl_config.tools is empty"),
    (["rl_config.epochs=3", "rl_config.max_steps=10"],
     r"^rl_config.epochs = 3 has no effect: rl_config.max_steps = 10 sets the run's length; remove epochs"),
    (["actor_config.lora_alpha=32"], r"^actor_config.lora_alpha = 32.0 has no effect: actor_config.lora_rank is 0"),
]


@pytest.mark.parametrize("overrides, warning", NO_EFFECT)
def test_a_setting_with_no_effect_is_warned_about_by_name(overrides, warning):
    """vllm-only keys on the native backend, tool settings without tools, epochs beside max_steps and LoRA keys
    without LoRA once passed without a word. Each is one ConfigWarning naming the key and the fix; the run goes on
    (a recipe may keep such a key for when it switches the setting back)."""
    from mindgrpo.config import ConfigWarning

    with pytest.warns(ConfigWarning) as caught:
        validate(load_config(None, overrides), check_paths=False)
    assert len(caught) == 1
    assert re.match(warning, str(caught[0].message)), str(caught[0].message)


def test_the_same_settings_where_they_act_and_the_shipped_recipes_raise_no_warning():
    acting = [["rl_config.tools=[calculator]", "rl_config.max_tool_turns=8"], ["rl_config.epochs=3"],
              ["actor_config.lora_rank=8", "actor_config.lora_alpha=32"]]
    recipes = sorted((REPO / "examples").rglob("*.yaml"))
    assert len(recipes) >= 8
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for overrides in acting:
            validate(load_config(None, overrides), check_paths=False)
        for recipe in recipes:
            validate(load_config(recipe), check_paths=False)


def test_a_warning_is_one_line_on_the_console():
    """Python's format puts a location in mindgrpo's source and that source line before the message."""
    code = ("import mindgrpo; from mindgrpo.config import load_config, validate; "
            "validate(load_config(None, ['rl_config.epochs=3', 'rl_config.max_steps=10']), check_paths=False); "
            "validate(load_config(None, ['rl_config.epochs=3', 'rl_config.max_steps=10']), check_paths=False)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stderr.startswith("warning: rl_config.epochs = 3 has no effect")
    assert done.stderr.count("\n") == 1, done.stderr  # once, however often the config is validated


def test_the_lora_help_says_what_validate_accepts():
    """The LoRA key's help once said it needs model_parallel 1, while tensor-parallel LoRA trains
    (tests/test_data_tensor_parallel.py): what the help names as needed is what validate refuses without."""
    help_line = next(line for line in describe() if line.startswith("actor_config.lora_rank "))
    assert "model_parallel 1" not in help_line and "any model_parallel" in help_line and "native" in help_line
    validate(load_config(None, ["actor_config.lora_rank=16", "actor_config.parallel_config.model_parallel=2"]),
             check_paths=False)
    with pytest.raises(ConfigError, match="only the native engine decodes with the adapters"):
        validate(load_config(None, ["actor_config.lora_rank=16", "generate_config.backend=vllm"]), check_paths=False)


def test_every_field_is_documented():
    lines = describe()
    assert len(lines) > 60
    undocumented = [line for line in lines if line.endswith(": ")]
    assert not undocumented, undocumented
    # rl_config's keys, under a heading per concept group, in the order the groups are read
    from mindgrpo.config import RLConfig
    headings = [line.split(":")[0] for line in lines if line.startswith("# ")]
    assert headings == [f"# rl_config.{group.__name__}" for group in RLConfig.groups()]


def model_shape(heads, kv_heads, layers, vocab_size=152064, intermediate_size=18944):
    """A Qwen2 shape (head_dim 128), Qwen2.5-7B's vocabulary and MLP unless given."""
    return qwen2_spec({"model_type": "qwen2", "num_attention_heads": heads, "num_key_value_heads": kv_heads,
                       "num_hidden_layers": layers, "hidden_size": 128 * heads, "vocab_size": vocab_size,
                       "intermediate_size": intermediate_size})


@pytest.mark.parametrize("layout, world, device, needle", [
    (dict(data_parallel=2, model_parallel=2), 8, "Ascend", "= 4, but 8 worker"),
    (dict(data_parallel=1, model_parallel=3), 3, "Ascend", "does not divide the 28 attention heads"),
    (dict(data_parallel=2, pipeline_stage=2), 4, "Ascend", "pipeline parallelism is not implemented"),
    (dict(data_parallel=1, model_parallel=3), 3, "CPU", "multiple of them"),
])
def test_parallel_layout_errors(layout, world, device, needle):
    with pytest.raises(ConfigError, match=needle):
        check_parallel_layout(ParallelConfig(**layout), world_size=world, model=model_shape(28, 4, 28),
                              device_target=device)


def test_parallel_layout_ok():
    check_parallel_layout(ParallelConfig(data_parallel=2, model_parallel=4), world_size=8,
                          model=model_shape(28, 4, 28), device_target="Ascend")
    check_parallel_layout(ParallelConfig(data_parallel=2), world_size=2, model=model_shape(4, 2, 4),
                          device_target="CPU")
    # tensor parallel on CPU too (explicit collectives), with KV heads replicated when fewer than the ranks
    check_parallel_layout(ParallelConfig(model_parallel=4), world_size=4,
                          model=model_shape(4, 2, 4, vocab_size=256, intermediate_size=96), device_target="CPU")
    # without the model's shape (no readable config.json) only the worker count is checked
    check_parallel_layout(ParallelConfig(model_parallel=3), world_size=3, model=None, device_target="CPU")


def test_aliases_take_their_canonical_names():
    cfg = load_config(overrides=["rl_config.kl_estimator=low_var_kl", "actor_config.lr_schedule.type=ConstantWarmUpLR"])
    validate(cfg, check_paths=False)
    assert (cfg.rl_config.kl_estimator, cfg.actor_config.lr_schedule.type) == ("k3", "constant")
    cfg.rl_config.kl_estimator = "k4"
    with pytest.raises(ConfigError, match=r"rl_config.kl_estimator = 'k4': choose one of k1, k2, k3 \(or kl, mse"):
        validate(cfg, check_paths=False)


def test_derived_values():
    cfg = GRPOConfig()
    rl = cfg.rl_config
    rl.batch_size, rl.num_generations, rl.max_prompt_length, rl.prompt_bucket = 3, 4, 150, 64
    cfg.actor_config.micro_batch_size = 4
    cfg.actor_config.max_tokens_per_micro_batch = 1100
    cfg.generate_config.sampling_config.max_tokens = 256
    derived = Derived(cfg)
    assert (derived.completions_per_rank, derived.grad_accum_steps, derived.packed_rows) == (12, 3, 4)
    assert derived.prompt_widths == (64, 128, 150)
    assert [derived.prompt_width(n) for n in (1, 64, 65, 150)] == [64, 64, 128, 150]
    rl.epochs = 2
    assert derived.total_steps(steps_per_epoch=5) == 10
    rl.max_steps = 3
    assert derived.total_steps(steps_per_epoch=5) == 3


def test_micro_batches_must_divide_the_completions_of_a_rank():
    cfg = GRPOConfig()  # 4 prompts x 8 completions
    check_micro_batches(cfg)
    cfg.ref_config.ref_model_batch_size = 24
    assert list(micro_batch_problems(cfg)) == ["ref_config.ref_model_batch_size"]
    with pytest.raises(ConfigError, match="ref_model_batch_size = 24 does not divide .* = 32"):
        check_micro_batches(cfg)


def test_config_is_a_leaf():
    """Importing the config loads neither MindSpore nor another mindgrpo package (but the leaf naming every choice,
    mindgrpo.choices, and mindgrpo's private start-up helpers, mindgrpo._*)."""
    code = ("import sys, mindgrpo.config; print(sorted(m for m in sys.modules if m.startswith(('mindspore', "
            "'mindformers', 'mindgrpo.')) and not m.startswith(('mindgrpo.config', 'mindgrpo._'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["['mindgrpo.choices']"]


def test_lora_keys_are_checked_and_what_lora_cannot_run_with_is_refused():
    from mindgrpo.config import GRPOConfig

    cfg = GRPOConfig()
    cfg.actor_config.load = "m"
    cfg.actor_config.lora_rank = 8
    cfg.actor_config.lora_alpha = 0
    cfg.actor_config.lora_target_modules = ["q_proj", "qkv"]
    cfg.generate_config.backend = "mindformers"
    cfg.ref_config.load = "other"
    with pytest.raises(ConfigError) as err:
        validate(cfg, check_paths=False)
    msg = str(err.value)
    assert "actor_config.lora_alpha = 0: must be positive" in msg
    assert "lora_target_modules = ['q_proj', 'qkv']" in msg
    assert "only the native engine decodes with the adapters" in msg
    assert "leave ref_config.load empty" in msg
    cfg = GRPOConfig()
    cfg.actor_config.load = "m"
    cfg.actor_config.lora_rank = 8
    for section in (cfg.actor_config, cfg.ref_config, cfg.generate_config):  # tensor-parallel adapters run
        section.parallel_config.model_parallel = 2
    validate(cfg, check_paths=False)
    assert Derived(cfg).reference_dtype is None  # the backbone is the reference: no reference model
    cfg.actor_config.lora_rank = -1
    with pytest.raises(ConfigError, match="lora_rank = -1"):
        validate(cfg, check_paths=False)


def test_rollout_gap_limit_is_on_where_rollout_and_training_compute_the_same_math():
    from mindgrpo.config import GRPOConfig

    cfg = GRPOConfig()
    assert Derived(cfg).max_rollout_logprob_gap == 1e-3
    cfg.actor_config.compute_dtype = "bfloat16"
    assert Derived(cfg).max_rollout_logprob_gap == 0.0
    cfg.actor_config.compute_dtype = "float32"
    cfg.generate_config.backend = "vllm"
    assert Derived(cfg).max_rollout_logprob_gap == 0.0
    cfg.rl_config.max_rollout_logprob_gap = 0.5
    assert Derived(cfg).max_rollout_logprob_gap == 0.5
    for key, value in (("top_p", 0.95), ("top_k", 50), ("repetition_penalty", 1.05), ("min_tokens", 2)):
        cfg = GRPOConfig()  # the engine's log-probs are then those of the filtered distribution
        setattr(cfg.generate_config.sampling_config, key, value)
        assert Derived(cfg).max_rollout_logprob_gap == 0.0, key
