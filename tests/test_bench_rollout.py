"""tools/bench_rollout.py's decode limits: the bytes and FLOPs a rollout's decoding steps must at least move and
compute, counted here step by step as an independent twin of its closed forms."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import bench_rollout  # noqa: E402


def test_decode_limits_count_weights_once_per_step_and_each_live_rows_cache():
    hf = {"hidden_size": 8, "num_hidden_layers": 2, "vocab_size": 11, "num_attention_heads": 4,
          "num_key_value_heads": 2, "intermediate_size": 6}
    prompts, completions = [3, 3, 5], [4, 1, 2]  # the second row ends at its first token: no decoding step
    kv = 2 * 8 // 4
    layer = 8 * 8 * 2 + 8 * kv * 2 + 8 * 6 * 3  # q, o; k, v; gate, up, down
    weights = 4 * (2 * layer + 11 * 8)
    steps, kv_bytes, flops = 0, 0, 0
    for step in range(1, max(completions)):  # decoding step `step` feeds token `step - 1`, samples token `step`
        steps += 1
        for p, c in zip(prompts, completions):
            if step < c:  # the row is still live
                keys = p + step  # its prompt and the tokens sampled so far, the fed one included
                kv_bytes += 4 * 2 * 2 * kv * keys  # K and V, two layers
                flops += 2 * (2 * layer + 11 * 8) + 4 * 2 * 8 * keys
    limits = bench_rollout.decode_limits(hf, prompts, completions)
    assert limits["steps"] == steps == 3
    assert limits["bytes"] == steps * weights + kv_bytes
    assert limits["flops"] == flops
    assert abs(limits["kv_share_of_bytes"] - kv_bytes / (steps * weights + kv_bytes)) < 1e-12
