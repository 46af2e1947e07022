"""tools/bench_grpo.py and its helpers: the FLOP count behind the MFU figure, the length-mix model copies (the
numpy Qwen2 that calibrates them, the ragged and full lengths they sample), the scaling table and plot, and one
real (slow) worker run."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

TOOLS = Path(__file__).resolve().parents[1] / "tools"
sys.path.insert(0, str(TOOLS))

import bench_grpo  # noqa: E402
import bench_scaling  # noqa: E402
import benchlib  # noqa: E402
import length_mix  # noqa: E402

EOS = 4095


def test_step_flops_counts_prompts_once_per_group_and_decode_steps_per_sampled_token():
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
    # The prefill samples the first token; the second costs one decode step over 4 keys.
    assert flops["rollout"] == prompt + head + g * (per_token + head + attn * 4)
    # Ragged lengths: only the tokens sampled count, so halving every completion roughly halves the decode work.
    ragged = bench_grpo.step_flops(hf, [3], [1] * (g // 2) + [2] * (g // 2))
    assert ragged["rollout"] == prompt + head + g // 2 * (per_token + head + attn * 4)


def test_numpy_qwen2_matches_reference_logits_with_and_without_cache(tiny_model_dir):
    reference = np.load(tiny_model_dir / "reference.npz")
    ids = reference["input_ids"][:1]  # row 0: 24 real tokens
    model = length_mix.NumpyQwen2(tiny_model_dir)
    whole = model.forward(ids, model.new_cache(1, ids.shape[1]), np.zeros(1, np.int64))
    cache = model.new_cache(1, ids.shape[1])
    pieces = [model.forward(ids[:, :10], cache, np.zeros(1, np.int64))]
    pieces += [model.forward(ids[:, t:t + 1], cache, np.array([t])) for t in range(10, ids.shape[1])]
    for hidden in (whole, np.concatenate(pieces, 1)):
        np.testing.assert_allclose(hidden @ model.lm_head.T, reference["logits"][:1], atol=1e-4)


def test_expected_length_distribution_is_the_stopping_law():
    # Constant hazard 1/2 over a limit of 3: lengths 1, 2, 3 with probabilities 1/2, 1/4, 1/4.
    probabilities = length_mix.expected_length_distribution(np.zeros((2, 3)), np.zeros((2, 3)))
    np.testing.assert_allclose(probabilities, [0.5, 0.25, 0.25])
    assert length_mix.distribution_stats(probabilities) == {"median": 1, "p90": 3, "at_limit": 0.25}


@pytest.fixture(scope="module")
def copies(tiny_model_dir, gsm8k_dir, tmp_path_factory):
    cache = tmp_path_factory.mktemp("length_mix")
    train = gsm8k_dir / "train.jsonl"
    return {mix: length_mix.model_for(tiny_model_dir, tiny_model_dir, train, mix, 64, cache, name="tiny")
            for mix in ("ragged", "full")}


def _held_out_lengths(model_dir: Path, tiny_model_dir: Path, gsm8k_dir: Path, samples: int) -> np.ndarray:
    """Ordinary sampling (EOS not masked) on 50 prompts and a seed the calibration did not use."""
    prompts = length_mix.calibration_prompts(tiny_model_dir, gsm8k_dir / "train.jsonl", 101)[1::2]
    return length_mix.sample_lengths(length_mix.NumpyQwen2(model_dir), prompts, samples, 64, [EOS], seed=12345)


def test_ragged_copy_samples_a_long_tail(copies, tiny_model_dir, gsm8k_dir):
    stats = length_mix.length_stats(_held_out_lengths(copies["ragged"], tiny_model_dir, gsm8k_dir, 4), 64)
    assert 12 <= stats["median"] <= 21, stats  # about limit / 4
    assert stats["p90"] == 64 and 0.1 <= stats["at_limit"] <= 0.3, stats  # the top decile at the limit
    manifest = json.loads((copies["ragged"] / "length_mix.json").read_text())
    assert manifest["expected_lengths"]["median"] == 16 and manifest["eos_ids"] == [EOS]


def test_full_copy_never_stops_early(copies, tiny_model_dir, gsm8k_dir):
    assert (_held_out_lengths(copies["full"], tiny_model_dir, gsm8k_dir, 2) == 64).all()


def test_copies_change_only_the_eos_row_of_an_untied_lm_head(copies, tiny_model_dir):
    from safetensors.numpy import load_file

    source = load_file(str(tiny_model_dir / "model.safetensors"))
    for model_dir in copies.values():
        config = json.loads((model_dir / "config.json").read_text())
        assert config["tie_word_embeddings"] is False
        assert json.loads((model_dir / "generation_config.json").read_text())["eos_token_id"] == EOS
        edited = load_file(str(model_dir / "model.safetensors"))
        assert set(edited) == set(source) | {"lm_head.weight"}
        for name, value in source.items():  # the EOS input embedding included
            np.testing.assert_array_equal(edited[name], value)
        rows = np.flatnonzero((edited["lm_head.weight"] != source["model.embed_tokens.weight"]).any(1))
        assert rows.tolist() == [EOS]
        assert (model_dir / "tokenizer.json").exists()


def test_copies_are_cached_and_rebuilt_when_the_recipe_changes(tiny_model_dir, gsm8k_dir, tmp_path, monkeypatch):
    def full_copy() -> Path:
        return length_mix.model_for(tiny_model_dir, tiny_model_dir, gsm8k_dir / "train.jsonl", "full", 64, tmp_path)

    weights = full_copy() / "model.safetensors"
    written = weights.stat().st_mtime_ns
    assert full_copy() / "model.safetensors" == weights and weights.stat().st_mtime_ns == written
    monkeypatch.setattr(length_mix, "RECIPE", {**length_mix.RECIPE, "full": length_mix.RECIPE["full"] + 1})
    assert json.loads((full_copy() / "length_mix.json").read_text())["recipe"] == length_mix.RECIPE["full"]
    assert weights.stat().st_mtime_ns != written and not list(tmp_path.glob(".*partial*"))


def test_scaling_table_and_plot_from_a_report(tmp_path):
    def run(framework, tokens_per_sec, median, peak=0.0):
        common = {"framework": framework, "sec_per_step": 2.0, "tokens_per_sec": tokens_per_sec,
                  "peak_rss_mib": 1000.0, "lengths": {"median": median, "p90": 64, "at_limit": 0.12}}
        if framework == "trl":
            return {**common, "gen_fraction": 0.7}
        return {**common, "share_rollout": 0.4, "share_reference": 0.1, "share_update": 0.45, "share_other": 0.05,
                "mfu_phases": {"rollout": 0.2, "reference": 0.3, "update": 0.4}, "matmul_peak_gflops": peak}

    settings = []
    for tokens in (64, 256):
        for mix in ("full", "ragged"):
            # the 64-token runs measured half the peak the 256-token ones did: their MFU is quoted against the higher
            ours, peer = run("mindgrpo", 3000.0, 17, 100.0 if tokens == 64 else 200.0), run("trl", 1000.0, 15)
            settings.append({"size": "tiny", "max_new_tokens": tokens, "length_mix": mix, "steps": 4, "warmup": 1,
                             "runs": {"mindgrpo": [ours], "trl": [peer]},
                             "comparison": {"tokens_per_sec_ratio": 3.0, "peak_rss_mib_ratio": 1.0,
                                            "target_tokens_per_sec_ratio": bench_grpo.target("tiny", tokens, mix)}})
    report = {"command": "python tools/bench_scaling.py", "machine": "test", "load_before": [0.1], "seconds": 60,
              "settings": settings, "complete": True, "matmul_peak_gflops": 100.0}
    (tmp_path / "in.json").write_text(json.dumps(report))
    out = tmp_path / "out"
    subprocess.run([sys.executable, str(TOOLS / "bench_scaling.py"), "--from-json", str(tmp_path / "in.json"),
                    "--out", str(out)], check=True, capture_output=True)
    table = (out / "scaling.md").read_text()
    assert table.count("\n| tiny |") == 4 and "**3.00x** (2x ok)" in table and "17 / 64 / 12%" in table
    assert table.count("| 10% / 15% / 20% |") == 2 and table.count("| 20% / 30% / 40% |") == 2
    assert "(200.0 GFLOP/s" in table
    assert (out / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_assets_are_made_from_the_demo_rows_without_any_shared_folder(tmp_path, monkeypatch):
    monkeypatch.delenv(benchlib.GSM8K_ENV, raising=False)
    monkeypatch.setattr(benchlib, "SHARED_GSM8K", tmp_path / "absent" / "train.jsonl")
    assets = benchlib.bench_assets(tmp_path / "cache")
    assert "demo" in assets.source and not list((tmp_path / "cache").glob(".*partial*"))
    rows = [json.loads(line) for line in assets.prompts.read_text().splitlines()]
    assert len(rows) == 2000 and rows[0]["answer"].split("#### ")[-1].isdigit()
    from mindgrpo.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(assets.tokenizer_dir)
    for size, dims in benchlib.SIZES.items():
        config = json.loads((assets.model(size) / "config.json").read_text())
        assert {k: config[k] for k in dims} == dims and config["vocab_size"] == benchlib.VOCAB
        assert config["eos_token_id"] == tokenizer.eos_token_id < benchlib.VOCAB  # the tokenizer's own ids
        assert (assets.model(size) / "tokenizer.json").exists()
    assert benchlib.bench_assets(tmp_path / "cache") == assets  # found again, not rebuilt
    monkeypatch.setenv(benchlib.GSM8K_ENV, str(tmp_path / "missing.jsonl"))
    with pytest.raises(FileNotFoundError, match="MINDGRPO_GSM8K"):
        benchlib.bench_assets(tmp_path / "cache")


def test_the_trl_peer_gets_mindgrpos_own_prompts_and_gold_numbers(tmp_path):
    from mindgrpo.data import render_prompt

    rows = [{"question": "What is 2 + 3?", "answer": "2 + 3 = 5\n#### 5"},
            {"question": "Tom has 1,200 pens.", "answer": "so\n#### 1,200"}]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = bench_grpo.peer_prompts(tmp_path / "rows.jsonl", tmp_path / "peer.jsonl")
    peer = [json.loads(line) for line in out.read_text().splitlines()]
    golds = ["5", "1,200"]
    assert peer == [{"prompt": render_prompt("gsm8k_hash", r["question"]), "gold": g} for r, g in zip(rows, golds)]
    assert peer[0]["prompt"].endswith('output the final answer after "####".<|im_end|>\n<|im_start|>assistant\n')
    trl_peer = (TOOLS / "trl_peer.py").read_text()
    assert "import mindgrpo" not in trl_peer and "apply_chat_template" not in trl_peer  # it uses the text as given


def test_the_recorded_command_keeps_no_machine_path():
    inside = str(bench_scaling.REPO / "docs" / "scaling")
    command = bench_scaling.portable_command(["--vs-trl", "/opt/venvs/trl/bin/python", "--out", inside,
                                              "--model-cache=/var/cache/x", "--steps", "5", "1"])
    assert command == ("python tools/bench_scaling.py --vs-trl '<TRL python>' --out docs/scaling "
                       "'--model-cache=<x>' --steps 5 1")


@pytest.mark.slow
def test_worker_prints_one_json_line_without_recompiling(tmp_path, monkeypatch):
    monkeypatch.delenv(benchlib.GSM8K_ENV, raising=False)
    monkeypatch.setattr(benchlib, "SHARED_GSM8K", tmp_path / "absent" / "train.jsonl")  # the demo's rows: quick
    assets = benchlib.bench_assets(tmp_path / "assets")
    out = subprocess.run([sys.executable, str(TOOLS / "bench_grpo.py"), "--worker", "tiny", "--model-dir",
                          str(assets.model("tiny")), "--work-dir", str(tmp_path), "--prompts", str(assets.prompts),
                          "--steps", "3", "--warmup", "1"], capture_output=True, text=True, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["recompiles_after_warmup"] == 0
    assert result["tokens_per_sec"] > 0 and 0 < result["mfu"] < 1
    assert abs(sum(result[f"share_{k}"] for k in ("rollout", "reference", "update", "other")) - 1) < 1e-3
    assert abs(sum(result["phase_seconds"].values()) / result["sec_per_step"] - 1) < 0.5  # mean vs median step
    eos = json.loads((assets.model("tiny") / "config.json").read_text())["eos_token_id"]
    assert result["lengths"]["count"] == 2 * 32 and result["eos_ids"] == [eos] and result["cpu"]
