"""The shipped example configs load, validate, and (7B) fit 8 NPUs with Qwen2.5-7B's shape."""
from pathlib import Path

import pytest

from mindgrpo.config import check_parallel_layout, load_config, validate

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "grpo"
QWEN2_5_7B = dict(num_heads=28, num_kv_heads=4, num_layers=28, vocab_size=152064, intermediate_size=18944)


@pytest.mark.parametrize("name", ["grpo_demo.yaml", "dapo_demo.yaml", "grpo_qwen2_5_7b.yaml"])
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
