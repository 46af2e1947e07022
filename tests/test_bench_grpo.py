"""tools/bench_grpo.py: the FLOP count behind its MFU figure, and one real (slow) worker run."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[1] / "tools"
sys.path.insert(0, str(TOOLS))

import bench_grpo  # noqa: E402


def test_step_flops_counts_prompts_once_per_group():
    hf = {"hidden_size": 4, "num_hidden_layers": 1, "vocab_size": 10, "num_attention_heads": 2,
          "num_key_value_heads": 1, "intermediate_size": 8}
    g = bench_grpo.GENERATIONS
    flops = bench_grpo.step_flops(hf, [3], [2] * g)
    per_token = 2 * (2 * 16 + 2 * 4 * 2 + 3 * 4 * 8)  # q, o (h x h); k, v (h x kv); gate, up, down
    head, attn = 2 * 4 * 10, 4 * 4
    prompt = per_token * 3 + attn * 6  # 3 prompt tokens, 6 causal (query, key) pairs
    completion = per_token * 2 + head * 2 + attn * (2 * 3 + 3)  # each completion: 2 tokens over 3 prompt keys
    assert flops["reference"] == prompt + g * completion
    assert flops["update"] == 3 * flops["reference"]
    assert flops["rollout"] == prompt + head + g * completion


@pytest.mark.slow
def test_worker_prints_one_json_line_without_recompiling(tiny_model_dir, gsm8k_dir, tmp_path):
    out = subprocess.run([sys.executable, str(TOOLS / "bench_grpo.py"), "--worker", "tiny", "--model-dir",
                          str(tiny_model_dir), "--work-dir", str(tmp_path), "--steps", "3", "--warmup", "1"],
                         capture_output=True, text=True, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["recompiles_after_warmup"] == 0
    assert result["tokens_per_sec"] > 0 and 0 < result["mfu"] < 1
    assert abs(sum(result[f"share_{k}"] for k in ("rollout", "reference", "update", "other")) - 1) < 1e-3
