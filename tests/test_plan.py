"""`python -m mindgrpo plan`: per-rank memory of each layout, the recommended one, and the doctor's memory check."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import mindgrpo  # noqa: F401  (before mindspore)
from mindgrpo.apps import doctor
from mindgrpo.config import load_config
from mindgrpo.apps.plan import (HEADROOM, PlanError, activation_bytes, format_plan, kv_cache_bytes, layout_bytes,
                           local_parameters, local_sizes, main, model_state_bytes, parse_bytes, plan_layouts)

REPO = Path(__file__).resolve().parents[1]
CONFIG_7B = REPO / "examples" / "grpo" / "grpo_qwen2_5_7b.yaml"
GiB = 2**30
# Qwen2.5-7B's config.json (the shape keys as Hugging Face ships them)
QWEN2_5_7B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
              "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
              "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False, "rms_norm_eps": 1e-6,
              "rope_theta": 1000000.0, "max_position_embeddings": 131072, "hidden_act": "silu",
              "use_sliding_window": False, "bos_token_id": 151643, "eos_token_id": 151643}


@pytest.fixture
def model_7b(tmp_path):
    folder = tmp_path / "Qwen2.5-7B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN2_5_7B))
    return folder


def config_7b(model, *overrides):
    return load_config(CONFIG_7B, [f"actor_config.load={model}", *overrides])


def plan_7b(model, *overrides):
    return plan_layouts(config_7b(model, *overrides), 8, 64 * GiB, QWEN2_5_7B)


def by_mp(plan, mp):
    return next(lay for lay in plan["layouts"] if lay["model_parallel"] == mp)


def test_parse_bytes_units():
    assert parse_bytes("64GB") == parse_bytes("64GiB") == parse_bytes("65536MB") == parse_bytes("64 gib") \
        == parse_bytes(str(64 * GiB)) == parse_bytes("0.0625TB") == 64 * GiB
    assert parse_bytes("512k") == 512 * 1024 and parse_bytes("1.5G") == 3 * GiB // 2
    for bad in ("64XB", "", "GB", "-1GB", "0", "64 GB of HBM", "64iB"):
        with pytest.raises(PlanError, match="device memory"):
            parse_bytes(bad)


def test_parameters_follow_the_tensor_parallel_split():
    assert local_parameters(QWEN2_5_7B, 1) == 7_615_616_512  # Qwen2.5-7B's published parameter count
    norms = (2 * 28 + 1) * 3584  # replicated on every rank; everything else is split evenly at tp=2
    assert local_parameters(QWEN2_5_7B, 2) == (7_615_616_512 - norms) // 2 + norms
    # Fewer KV heads than ranks: each rank holds one of the 2 KV heads (half of k/v), not a quarter.
    small = dict(QWEN2_5_7B, hidden_size=256, num_attention_heads=8, num_key_value_heads=2, intermediate_size=512,
                 vocab_size=1024, num_hidden_layers=2)
    d, layers = 32, 2
    kv = layers * 2 * (2 * d * 256 + 2 * d)  # k and v, weights and biases
    split = 2 * 1024 * 256 + layers * (2 * 256 * 256 + 256 + 3 * 256 * 512)  # embed, lm_head, q(+bias), o, MLP
    norms = (2 * layers + 1) * 256
    assert local_parameters(small, 1) == split + kv + norms
    assert local_parameters(small, 4) == split // 4 + kv // 2 + norms


def test_7b_on_8_devices_recommends_tensor_parallel_and_explains_data_parallel(model_7b):
    plan = plan_7b(model_7b, "generate_config.backend=native")
    rec = plan["recommended"]
    assert rec is not None and rec["fits"] and rec["model_parallel"] >= 2
    assert rec["bytes"]["total"] <= HEADROOM * 64 * GiB
    assert rec["data_parallel"] * rec["model_parallel"] == 8 and rec in plan["layouts"]
    dp_only = by_mp(plan, 1)
    assert not dp_only["fits"] and dp_only["bytes"]["total"] > 64 * GiB
    # every rank holds all 7.6 B parameters: float32 weights and gradients, 1/8 of the moments (ZeRO-1)
    assert dp_only["bytes"]["weights"] == dp_only["bytes"]["gradients"] == 4 * 7_615_616_512
    assert "training state alone" in dp_only["why_not"]
    assert [s["model_parallel"] for s in plan["skipped"]] == [8]  # 28 heads do not split 8 ways
    assert "28 attention heads" in plan["skipped"][0]["why"]
    text = format_plan(plan)
    assert "121.8 GB" in text  # 16 bytes x 7.6 B parameters, unsharded
    assert re.search(r"dp 8 x mp 1: needs [\d.]+ GiB per rank, over the 57.6 GiB budget: the training state alone",
                     text), text
    assert f"recommended: data_parallel {rec['data_parallel']}, model_parallel {rec['model_parallel']}" in text


def test_bf16_weights_count_two_bytes_and_the_masters_go_with_the_moments(model_7b):
    """actor_config.param_dtype bfloat16: the weights are 2 bytes a parameter, the gradients stay float32 (the default
    grad_reduce_dtype), and the optimizer state is 12 bytes (moments and fp32 master) of the parameters a ZeRO-1 rank
    owns: what mindgrpo.train.optim.AdamW allocates."""
    fp32, bf16 = (by_mp(plan_7b(model_7b, "generate_config.backend=native", f"actor_config.param_dtype={dtype}"), 2)
                  for dtype in ("float32", "bfloat16"))
    assert bf16["bytes"]["weights"] * 2 == fp32["bytes"]["weights"]
    assert bf16["bytes"]["gradients"] == fp32["bytes"]["gradients"]
    assert bf16["bytes"]["optimizer"] * 8 == fp32["bytes"]["optimizer"] * 12
    assert bf16["bytes"]["total"] < fp32["bytes"]["total"]


# Qwen2.5-32B's config.json shape keys
QWEN2_5_32B = dict(QWEN2_5_7B, hidden_size=5120, intermediate_size=27648, num_hidden_layers=64, num_attention_heads=40,
                   num_key_value_heads=8)
CONFIG_32B = REPO / "examples" / "grpo" / "grpo_qwen2_5_32b_2nodes.yaml"
BF16_STATE = ("actor_config.param_dtype=bfloat16", "actor_config.grad_reduce_dtype=bfloat16")


def test_bf16_state_fits_7b_at_tensor_parallel_2_and_32b_on_32_devices(model_7b, tmp_path):
    """docs/parallelism.md's figures: with bf16 weights and bf16 gradient buffers (Ascend), Qwen2.5-7B on 8 x 64 GB at
    4 x 2 and Qwen2.5-32B on 32 x 64 GB at 4 x 8; with float32 gradients (the default) the update's two
    gradient-sized temporaries keep both out, as they keep every float32 layout of 32B out."""
    plan = plan_7b(model_7b, "generate_config.backend=native", *BF16_STATE)
    assert (plan["recommended"]["data_parallel"], plan["recommended"]["model_parallel"]) == (4, 2)
    assert not by_mp(plan_7b(model_7b, "generate_config.backend=native", BF16_STATE[0]), 2)["fits"]
    folder = tmp_path / "Qwen2.5-32B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN2_5_32B))

    def plan_32b(*overrides):
        return plan_layouts(load_config(CONFIG_32B, [f"actor_config.load={folder}", *overrides]), 32, 64 * GiB,
                            QWEN2_5_32B)

    assert plan_32b()["recommended"] is None and plan_32b(BF16_STATE[0])["recommended"] is None
    fitting = plan_32b(*BF16_STATE)["recommended"]
    assert (fitting["data_parallel"], fitting["model_parallel"]) == (4, 8)


def test_vllm_pool_beside_the_training_state_and_the_advice_that_fixes_it(model_7b):
    plan = plan_7b(model_7b, "generate_config.backend=vllm", "generate_config.gpu_memory_utilization=0.8")
    assert plan["recommended"] is None
    assert all(lay["bytes"]["kv_cache"] == int(0.8 * 64 * GiB) for lay in plan["layouts"])
    advice = " ".join(plan["advice"])
    share = float(re.search(r"<= (0\.\d+) with data_parallel 2, model_parallel 4", advice).group(1))
    fixed = plan_7b(model_7b, "generate_config.backend=vllm", f"generate_config.gpu_memory_utilization={share}")
    assert fixed["recommended"] is not None and fixed["recommended"]["model_parallel"] == 4
    over = plan_7b(model_7b, "generate_config.backend=vllm", f"generate_config.gpu_memory_utilization={share + 0.02}")
    assert not by_mp(over, 4)["fits"]


def test_zero1_halves_the_optimizer_at_dp2():
    sharded = model_state_bytes(QWEN2_5_7B, model_parallel=2, data_parallel=2)
    whole = model_state_bytes(QWEN2_5_7B, model_parallel=2, data_parallel=2, optimizer_shard=False)
    assert whole["optimizer"] == 8 * local_parameters(QWEN2_5_7B, 2)
    # ZeRO-1 hands out whole parameters: the busier rank keeps half, give or take less than one parameter
    largest = 8 * max(local_sizes(QWEN2_5_7B, 2))
    assert whole["optimizer"] / 2 <= sharded["optimizer"] < whole["optimizer"] / 2 + largest
    assert sharded["optimizer"] / whole["optimizer"] == pytest.approx(0.5, abs=0.01)
    assert sharded["weights"] == whole["weights"] and sharded["gradients"] == whole["gradients"]
    assert sharded["reference"] == 0
    with_ref = model_state_bytes(QWEN2_5_7B, model_parallel=2, reference_dtype="bfloat16")
    assert with_ref["reference"] == 2 * local_parameters(QWEN2_5_7B, 2)
    assert with_ref["total"] == sum(v for k, v in with_ref.items() if k != "total")


def test_optimizer_shard_setting_reaches_the_layout(model_7b):
    config = config_7b(model_7b, "generate_config.backend=native")
    sharded = layout_bytes(config, QWEN2_5_7B, data_parallel=2, model_parallel=4)
    config.actor_config.parallel_config.optimizer_shard = False
    whole = layout_bytes(config, QWEN2_5_7B, data_parallel=2, model_parallel=4)
    assert whole["optimizer"] / sharded["optimizer"] == pytest.approx(2, rel=0.02)
    assert whole["total"] - sharded["total"] == whole["optimizer"] - sharded["optimizer"]


def test_recompute_lowers_activations_and_the_total_uses_the_setting(model_7b):
    shape = dict(model_parallel=2, micro_batch_size=8, num_generations=8, prompt_len=256, completion_len=512,
                 compute_dtype="bfloat16")
    full, rec = (activation_bytes(QWEN2_5_7B, recompute=r, **shape) for r in (False, True))
    assert rec < full / 3
    assert activation_bytes(QWEN2_5_7B, share_prompt=True, **shape) < activation_bytes(
        QWEN2_5_7B, share_prompt=False, **shape)  # the prompt once per group instead of once per completion
    on = layout_bytes(config_7b(model_7b, "actor_config.recompute=true"), QWEN2_5_7B, data_parallel=4,
                      model_parallel=2)
    off = layout_bytes(config_7b(model_7b, "actor_config.recompute=false"), QWEN2_5_7B, data_parallel=4,
                       model_parallel=2)
    assert on["activations"] == off["activations"] and on["activations_recompute"] == off["activations_recompute"]
    # the peak's transient is the larger of the activations and the update step's gradient copies
    assert off["total"] - on["total"] == off["activations"] - max(on["activations_recompute"], on["update"]) > 0
    assert on["update"] == 2 * on["gradients"]


def test_kv_cache_is_per_rank_kv_heads():
    # 2 (K, V) x 28 layers x 16 rows x 1 local KV head x (512 + 1024) positions x 128 x 2 bytes
    assert kv_cache_bytes(QWEN2_5_7B, model_parallel=4, batch=16, prompt_len=512, max_tokens=1024,
                          compute_dtype="bfloat16") == 2 * 28 * 16 * 1 * 1536 * 128 * 2
    # tp=8 > 4 KV heads: still one (replicated) KV head per rank; max_tokens rounds up to a multiple of 32
    assert kv_cache_bytes(QWEN2_5_7B, model_parallel=8, batch=1, prompt_len=10, max_tokens=1) == \
        2 * 28 * 1 * 1 * (10 + 32) * 128 * 4


def test_cli_json(model_7b):
    out = subprocess.run([sys.executable, "-m", "mindgrpo", "plan", "--config", str(CONFIG_7B), "--workers", "8",
                          "--device-memory", "64GB", "--model", str(model_7b), "--json",
                          "generate_config.backend=native", "actor_config.recompute=true"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["device_memory"] == 64 * GiB and plan["model"]["parameters"] == 7_615_616_512
    parts = {"weights", "gradients", "optimizer", "activations", "activations_recompute", "update", "kv_cache",
             "reference", "runtime", "total"}
    for lay in plan["layouts"]:
        assert {"data_parallel", "model_parallel", "pipeline_stage", "fits", "bytes"} <= set(lay)
        assert set(lay["bytes"]) == parts and lay["pipeline_stage"] == 1
        assert lay["data_parallel"] * lay["model_parallel"] == 8
        b = lay["bytes"]
        resident = b["weights"] + b["gradients"] + b["optimizer"] + b["kv_cache"] + b["reference"] + b["runtime"]
        # ascend (the default): HCCL's 2 x 200 MB per communication group: the world, plus TP and DP groups
        groups = 1 + (1 < lay["model_parallel"] < 8) + (1 < lay["data_parallel"] < 8)
        assert b["runtime"] == groups * 2 * 200 * 2**20
        assert b["total"] == resident + max(b["activations_recompute"], b["update"])  # recompute: true
    assert plan["recommended"] in plan["layouts"] and plan["recommended"]["fits"]


def test_cli_errors(model_7b, capsys):
    bad = subprocess.run([sys.executable, "-m", "mindgrpo", "plan", "--config", str(CONFIG_7B), "--workers", "8",
                          "--device-memory", "64XB", "--model", str(model_7b)], capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode == 2 and "'64XB' is not a size" in bad.stderr and "64GiB" in bad.stderr, bad.stderr
    with pytest.raises(SystemExit) as exit_info:  # the 7B recipe leaves actor_config.load empty
        main(["--config", str(CONFIG_7B), "--workers", "8", "--device-memory", "64GB"])
    assert exit_info.value.code == 2 and "pass --model" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--config", str(CONFIG_7B), "--workers", "8", "--device-memory", "64GB", "--model",
              str(model_7b / "missing")])
    assert "does not exist" in capsys.readouterr().err


def test_doctor_explains_a_layout_that_cannot_fit(model_7b):
    config = config_7b(model_7b, "generate_config.backend=native", "actor_config.parallel_config.data_parallel=8",
                       "actor_config.parallel_config.model_parallel=1")
    check = doctor.check_memory(config, 8, 64 * GiB)
    assert check.status == "FAIL" and "dp 8 x mp 1" in check.detail and "training state alone" in check.detail
    recommended = plan_layouts(config, 8, 64 * GiB, QWEN2_5_7B)["recommended"]
    assert f"model_parallel={recommended['model_parallel']}" in check.fix
    config = config_7b(model_7b, "generate_config.backend=native", "actor_config.parallel_config.data_parallel=2",
                       "actor_config.parallel_config.model_parallel=4")
    assert doctor.check_memory(config, 8, 64 * GiB).status == "ok"
    assert doctor.build_parser().parse_args(["--device-memory", "65536MB"]).device_memory == 64 * GiB
    with pytest.raises(SystemExit):
        doctor.build_parser().parse_args(["--device-memory", "lots"])


def test_fused_cpu_kv_store_is_transient_and_the_plain_cache_resident(model_7b):
    """The fused CPU decode kernels give their KV store back after each rollout chunk, so on cpu it is alive only
    while the training transient is not: the total counts the larger of the two. The plain decode graph's cache,
    and every cache on Ascend, stays resident beside the training state."""
    def parts(device, impl):
        return layout_bytes(config_7b(model_7b, f"generate_config.decode_impl={impl}", "actor_config.recompute=true",
                                      "generate_config.backend=native"),
                            QWEN2_5_7B, data_parallel=4, model_parallel=2, device=device)

    fused, plain = parts("cpu", "fused"), parts("cpu", "plain")
    assert fused["kv_cache"] == plain["kv_cache"] > 0
    resident = sum(plain[k] for k in ("weights", "gradients", "optimizer", "reference", "runtime"))
    transient = plain["activations_recompute"] + plain["update"]  # cpu: the sum of the two
    assert plain["total"] == resident + plain["kv_cache"] + transient
    assert fused["total"] == resident + max(plain["kv_cache"], transient) < plain["total"]
    ascend = parts("ascend", "fused")  # the fused kernels are CPU kernels: on Ascend the cache stays resident
    assert ascend["total"] - ascend["kv_cache"] == sum(
        ascend[k] for k in ("weights", "gradients", "optimizer", "reference", "runtime")) + max(
        ascend["activations_recompute"], ascend["update"])


def test_cpu_update_keeps_one_parameter_copy_without_data_parallelism(model_7b):
    """On cpu ReduceAndClip clips the accumulators in place on the host (step_graphs.ReduceAndClip.clips_in_graph):
    one process counts only the AdamW graph's copy (measured on the real 0.5B, CPU_APPLY_COPIES); data parallelism
    adds its AllReduce's two, as every Ascend layout has."""
    def update(device, dp, mp):
        return layout_bytes(config_7b(model_7b, "generate_config.backend=native"), QWEN2_5_7B, data_parallel=dp,
                            model_parallel=mp, device=device)

    one = update("cpu", 1, 8)
    assert one["update"] == one["gradients"] > 0
    assert update("cpu", 2, 4)["update"] == 3 * update("cpu", 2, 4)["gradients"]
    assert update("ascend", 1, 8)["update"] == 2 * one["gradients"]


def test_lora_counts_a_frozen_backbone_and_float32_adapters_and_7b_fits_one_device(model_7b):
    """actor_config.lora_rank: the backbone in its dtype with no gradients, optimizer state or reference copy; the
    adapters (rank x (in + out) per adapted weight, counted here independently from Qwen2.5-7B's shapes) take 4
    bytes each of weights and gradients and 8 of moments. Qwen2.5-7B with a bf16 backbone and rank 16 then fits
    one 64 GB device, which full-parameter training at any dtype does not."""
    from mindgrpo.apps.plan import lora_parameters

    h, i, layers, q, kv = 3584, 18944, 28, 3584, 512
    per_layer = (h + q) + (h + kv) * 2 + (q + h) + 3 * (h + i)  # q, k, v, o, gate, up, down: in + out
    assert lora_parameters(QWEN2_5_7B, 16, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                            "down_proj")) == 16 * per_layer * layers
    assert lora_parameters(QWEN2_5_7B, 8, ("q_proj", "v_proj")) == 8 * ((h + q) + (h + kv)) * layers
    adapters = 16 * per_layer * layers
    single = ("actor_config.parallel_config.data_parallel=1", "actor_config.parallel_config.model_parallel=1",
              "ref_config.parallel_config.data_parallel=1", "ref_config.parallel_config.model_parallel=1",
              "generate_config.backend=native", "actor_config.param_dtype=bfloat16")
    lora = plan_layouts(config_7b(model_7b, *single, "actor_config.lora_rank=16"), 1, 64 * GiB, QWEN2_5_7B)
    full = plan_layouts(config_7b(model_7b, *single), 1, 64 * GiB, QWEN2_5_7B)
    parts = lora["layouts"][0]["bytes"]
    assert parts["weights"] == 2 * local_parameters(QWEN2_5_7B) + 4 * adapters
    assert (parts["gradients"], parts["optimizer"], parts["reference"]) == (4 * adapters, 8 * adapters, 0)
    assert lora["recommended"] is not None and full["recommended"] is None
    assert "frozen backbone (LoRA rank 16)" in format_plan(lora)


def test_lora_adapters_split_with_tensor_parallelism_and_32b_fits_8_devices(tmp_path):
    """Under tensor parallelism a rank holds its slices of the adapters (B beside q/k/v/gate/up split by rows, A
    beside o/down by columns, the other halves whole) and ZeRO-1 shares their moments out; Qwen2.5-32B with a bf16
    backbone and rank-16 adapters on every linear then fits 8 x 64 GB (the 32B recipe's other settings), which it
    cannot at model_parallel 1: its backbone alone is 61 GiB."""
    from mindgrpo.apps.plan import lora_parameters, lora_sizes

    targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    h, i, layers, q, kv, r = 5120, 27648, 64, 5120, 1024, 16
    # counted by hand at model_parallel 8: the split half is 1/8, the replicated half whole
    column = r * (h + q // 8) + 2 * r * (h + kv // 8) + 2 * r * (h + i // 8)  # q, k, v, gate, up
    row = r * (q // 8 + h) + r * (i // 8 + h)  # o, down
    assert lora_parameters(QWEN2_5_32B, r, targets, model_parallel=8) == (column + row) * layers
    folder = tmp_path / "Qwen2.5-32B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN2_5_32B))
    config = load_config(CONFIG_32B, [f"actor_config.load={folder}", "actor_config.lora_rank=16",
                                      "actor_config.param_dtype=bfloat16"])
    plan = plan_layouts(config, 8, 64 * GiB, QWEN2_5_32B)
    assert not by_mp(plan, 1)["fits"] and by_mp(plan, 2)["fits"] and by_mp(plan, 8)["fits"]
    assert plan["recommended"]["model_parallel"] == 2
    parts = by_mp(plan, 2)["bytes"]  # data_parallel 4: ZeRO-1 over the adapters' moments
    sizes = lora_sizes(QWEN2_5_32B, r, targets, 2)
    assert parts["gradients"] == 4 * sum(sizes)
    assert 8 * sum(sizes) / 4 <= parts["optimizer"] < 8 * sum(sizes) / 4 + 8 * max(sizes)


def test_cpu_recompute_counts_what_each_layer_keeps_there():
    """On CPU a recomputed layer still keeps two float32 score tensors and its RoPE rows (measured on the real
    0.5B's user path, see CPU_RECOMPUTE_SCORE_COPIES): the planner adds exactly that, per layer, to the recompute
    figure and nothing to the figure without recompute."""
    shape = dict(micro_batch_size=16, num_generations=8, prompt_len=128, completion_len=256)
    qwen05 = dict(QWEN2_5_7B, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, vocab_size=151936)
    n = 2 * 128 + 16 * 256  # two prompts once, then each completion (shared prompt)
    scores = 14 * (2 * 128 * 128 + 16 * 256 * (128 + 256))
    per_layer = 4 * 2 * scores + 2 * 4 * n * 64 * (14 + 2)
    assert (activation_bytes(qwen05, recompute=True, recompute_keeps=True, **shape)
            - activation_bytes(qwen05, recompute=True, **shape)) == 24 * per_layer
    assert (activation_bytes(qwen05, recompute=False, recompute_keeps=True, **shape)
            == activation_bytes(qwen05, recompute=False, **shape))
    assert 200 * 2**20 < per_layer < 215 * 2**20  # the 213 MiB a layer measured
