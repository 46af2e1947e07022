"""The shipped example configs load, validate, and (7B) fit 8 NPUs with Qwen2.5-7B's shape."""
from pathlib import Path

import pytest

from mindgrpo.config import check_parallel_layout, load_config, validate
from mindgrpo.hf_config import qwen2_spec

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "grpo"
QWEN2_5_7B = dict(model=qwen2_spec({"model_type": "qwen2", "num_attention_heads": 28, "num_key_value_heads": 4,
                                    "num_hidden_layers": 28, "hidden_size": 3584, "vocab_size": 152064,
                                    "intermediate_size": 18944}))


@pytest.mark.parametrize("name", ["grpo_demo.yaml", "dapo_demo.yaml", "grpo_qwen2_5_7b.yaml",
                                  "grpo_qwen2_5_7b_tools.yaml"])
def test_example_configs_validate(name):
    config = validate(load_config(EXAMPLES / name), check_paths=False)
    assert config.rl_config.output_dir.startswith(str(EXAMPLES.parents[1]))  # resolved against the yaml folder
    group = config.rl_config.batch_size * config.rl_config.num_generations
    assert group % config.actor_config.micro_batch_size == 0
    assert group % config.ref_config.ref_model_batch_size == 0 or config.rl_config.beta == 0


def test_7b_layout_fits_eight_npus():
    config = load_config(EXAMPLES / "grpo_qwen2_5_7b.yaml")
    for key in ("actor_config", "ref_config", "generate_config"):
        check_parallel_layout(getattr(config, key).parallel_config, world_size=8, device_target="Ascend",
                              key=f"{key}.parallel_config", **QWEN2_5_7B)
    assert config.actor_config.parallel_config.model_parallel == 4 and config.rl_config.share_prompt
    assert config.generate_config.backend == "native" and config.actor_config.compute_dtype == "bfloat16"


def test_qwen2_5_7b_tools_recipe_is_retool_style_and_fits_eight_npus():
    """The tool recipe (ReTool-style python tool on DAPO-Math-17k): valid, the 7B layout on 8 NPUs, the python tool
    with room for several turns in the budget, DAPO's loss without KL, and the tools' resolution in preflight."""
    from mindgrpo.config import check_micro_batches
    from mindgrpo.train.preflight import run_tools

    config = validate(load_config(EXAMPLES / "grpo_qwen2_5_7b_tools.yaml"), check_paths=False)
    check_micro_batches(config)
    for key in ("actor_config", "ref_config", "generate_config"):
        check_parallel_layout(getattr(config, key).parallel_config, world_size=8, device_target="Ascend",
                              key=f"{key}.parallel_config", **QWEN2_5_7B)
    rl, sampling = config.rl_config, config.generate_config.sampling_config
    assert [tool.name for tool in run_tools(config)] == ["python"] and config.generate_config.backend == "native"
    assert rl.max_tool_turns * rl.max_tool_response_tokens <= sampling.max_tokens
    assert rl.max_prompt_length + sampling.max_tokens <= rl.seq_length
    assert (rl.loss_type, rl.beta, rl.epsilon_high) == ("dapo", 0.0, 0.28)


def test_qwen2_5_vl_7b_geo3k_recipe_validates_and_fits_eight_npus():
    """The geo3k recipe: valid, a data-parallel layout Qwen2.5-VL-7B's language model (Qwen2.5-7B's shape) fits on
    8 NPUs, and the choices a Qwen2.5-VL actor needs (the trainer's preflight refuses others): native engine,
    shared-prompt forward, one tensor-parallel rank, frozen vision tower; verl's seed values where mindgrpo has them."""
    from mindgrpo.config import check_micro_batches

    path = EXAMPLES.parent / "grpo_vl" / "grpo_qwen2_5_vl_7b_geo3k.yaml"
    config = validate(load_config(path), check_paths=False)
    check_micro_batches(config)
    for key in ("actor_config", "ref_config", "generate_config"):
        check_parallel_layout(getattr(config, key).parallel_config, world_size=8, device_target="Ascend",
                              key=f"{key}.parallel_config", **QWEN2_5_7B)
    rl, actor = config.rl_config, config.actor_config
    assert actor.parallel_config.model_parallel == 1 and actor.parallel_config.data_parallel == 8
    assert config.generate_config.backend == "native" and rl.share_prompt and actor.freeze_vision_tower
    assert config.reward_config.verifier_function == ["geo3k_reward"]
    # verl examples/grpo_trainer/run_qwen2_5_vl-7b.sh
    sampling = config.generate_config.sampling_config
    assert (rl.num_generations, rl.max_prompt_length, sampling.max_tokens) == (5, 1024, 2048)
    assert (actor.lr_schedule.learning_rate, rl.beta, rl.kl_estimator) == (1e-6, 0.01, "k3")
    assert rl.batch_size * 8 == 128 and actor.micro_batch_size == 10 and rl.epochs == 15
