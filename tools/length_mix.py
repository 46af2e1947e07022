"""Benchmark models with a chosen completion-length mix, the same weights for mindgrpo and TRL.

    full     every completion runs to the limit (EOS suppressed)
    ragged   long-tailed lengths: median about a quarter of the limit, the top 10 % at the limit

Each is an untied copy of a source model (the tiny fixture, or `small`) that differs from it only in the EOS row of
`lm_head` (`tie_word_embeddings: false`, an explicit `lm_head.weight`): the input embedding of EOS, which every
ChatML prompt contains, is unchanged. Both frameworks load the copy and sample as they normally do (temperature 1,
no top-k/top-p). EOS is <|im_end|> (4095) for both: mindgrpo stops on the tokenizer's eos token, TRL on the
tokenizer's eos plus `generation_config.eos_token_id`, which the copy sets to the same single id; pad
(<|endoftext|>) stops neither.

The edit. The final hidden states h_t (after the last RMSNorm) of these random Qwen2s share a strong common
direction d, their mean: on the tiny fixture h_t.d = 7.7 +- 1.0, with a persistent per-row part (the prompt, the
first tokens) and a downward drift with position. An EOS row alpha * u makes the EOS logit alpha * h_t.u and
changes nothing else.
    ragged   u = d, and the alpha whose expected median length is limit / 4. The per-row spread of h_t.d makes
             the rows' stopping rates differ, which gives the long tail (12-15 % at the limit, where equal rates
             would give 6 %).
    full     u = the max-margin direction (the largest smallest projection over the calibration states, a linear
             program; about twice the mean direction's relative margin late in long completions, where h_t.d
             drifts towards 0), and alpha = -FULL_MARGIN / that smallest projection. One copy per limit, fitted
             on trajectories of that length: a copy fitted on 64 tokens stops 3 % of 1,024-token rows early.

The calibration is exact and deterministic. Trajectories sampled with EOS masked out (a fixed seed, 64 GSM8K train
prompts evenly spread over the file, the benchmark's prompt template) are distributed as the edited model's
trajectories given that they have not stopped, because the edit changes no other logit. So for any alpha the
length distribution is the mean over those rows of the stopping law with hazard
sigmoid(alpha * h_t.d - logsumexp(other logits at t)), and alpha is found by bisection without sampling again.
The trajectories come from `NumpyQwen2`, a plain numpy Qwen2 with a KV cache (checked against the fixture's
reference logits in tests/test_bench_grpo.py); the full and ragged copies of one limit share them. Copies are
cached per (source, mix, limit) under a folder of your choice (`model_for`); a cached copy is reused when its
manifest matches the recipe and the source.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

RECIPE = {"full": 2, "ragged": 1}  # bump when a calibration changes: cached copies of another recipe are rebuilt
CALIBRATION_PROMPTS, CALIBRATION_SAMPLES, CALIBRATION_SEED = 64, 1, 0  # distinct prompts: their spread matters most
FULL_MARGIN = 20.0  # `full`: EOS logit at most -20 at every calibration state (probability below 1e-12)
MARGIN_STATES = 16384  # `full`: states the max-margin direction is fitted on (every k-th step of every row)
MEDIAN_FRACTION = 0.25  # `ragged`: median length / limit
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")


class NumpyQwen2:
    """Qwen2 forward with a KV cache in plain numpy (float32), for sampling calibration trajectories."""

    def __init__(self, folder: Path):
        from safetensors.numpy import load_file

        cfg = json.loads((Path(folder) / "config.json").read_text())
        self.w = load_file(str(Path(folder) / "model.safetensors"))
        self.hidden, self.heads = cfg["hidden_size"], cfg["num_attention_heads"]
        self.kv_heads = cfg.get("num_key_value_heads") or self.heads
        self.head_dim, self.layers = self.hidden // self.heads, cfg["num_hidden_layers"]
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        theta = cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)
        self.inv_freq = 1.0 / theta ** (np.arange(0, self.head_dim, 2, dtype=np.float64) / self.head_dim)
        self.embed = self.w["model.embed_tokens.weight"]
        self.lm_head = self.w.get("lm_head.weight", self.embed)

    def new_cache(self, rows: int, length: int) -> List[Tuple[np.ndarray, np.ndarray]]:
        shape = (rows, self.kv_heads, length, self.head_dim)
        return [(np.zeros(shape, np.float32), np.zeros(shape, np.float32)) for _ in range(self.layers)]

    def _norm(self, x: np.ndarray, name: str) -> np.ndarray:
        return (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * self.w[name]).astype(np.float32)

    def _linear(self, x: np.ndarray, name: str, bias: bool = False) -> np.ndarray:
        y = x @ self.w[name + ".weight"].T
        return y + self.w[name + ".bias"] if bias else y

    def _rope(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:  # x [R, n, heads, d], positions [R, n]
        angle = positions[..., None].astype(np.float64) * self.inv_freq
        cos, sin = (f(angle).astype(np.float32)[:, :, None, :] for f in (np.cos, np.sin))
        half = self.head_dim // 2
        x1, x2 = x[..., :half], x[..., half:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    def forward(self, ids: np.ndarray, cache, cached: np.ndarray) -> np.ndarray:
        """Final hidden states [R, n, hidden] of tokens `ids` [R, n] that follow `cached` [R] cached tokens."""
        rows, n = ids.shape
        positions = cached[:, None] + np.arange(n)
        group = self.heads // self.kv_heads
        keys = int(positions.max()) + 1
        visible = np.arange(keys)[None, None, :] <= positions[:, :, None]  # [R, n, keys]
        x = self.embed[ids]
        for i in range(self.layers):
            p = f"model.layers.{i}."
            xn = self._norm(x, p + "input_layernorm.weight")
            q = self._rope(self._linear(xn, p + "self_attn.q_proj", True).reshape(rows, n, self.heads, -1), positions)
            k = self._rope(self._linear(xn, p + "self_attn.k_proj", True).reshape(rows, n, self.kv_heads, -1),
                           positions)
            v = self._linear(xn, p + "self_attn.v_proj", True).reshape(rows, n, self.kv_heads, -1)
            k_cache, v_cache = cache[i]
            k_cache[np.arange(rows)[:, None], :, positions] = k
            v_cache[np.arange(rows)[:, None], :, positions] = v
            q = q.transpose(0, 2, 1, 3).reshape(rows, self.kv_heads, group * n, self.head_dim)
            scores = (q @ k_cache[:, :, :keys].transpose(0, 1, 3, 2)).reshape(rows, self.kv_heads, group, n, keys)
            scores = np.where(visible[:, None, None], scores / np.sqrt(self.head_dim), -np.inf)
            weights = np.exp(scores - scores.max(-1, keepdims=True))
            weights /= weights.sum(-1, keepdims=True)
            out = weights.reshape(rows, self.kv_heads, group * n, keys) @ v_cache[:, :, :keys]
            out = out.reshape(rows, self.kv_heads, group, n, -1).transpose(0, 3, 1, 2, 4).reshape(rows, n, -1)
            x = x + self._linear(out, p + "self_attn.o_proj")
            xn = self._norm(x, p + "post_attention_layernorm.weight")
            gate = self._linear(xn, p + "mlp.gate_proj")
            x = x + self._linear(gate / (1 + np.exp(-gate)) * self._linear(xn, p + "mlp.up_proj"), p + "mlp.down_proj")
        return self._norm(x, "model.norm.weight")

    def prefill(self, prompts: Sequence[Sequence[int]], samples: int, limit: int):
        """KV cache and last hidden state of `samples` rows per prompt (prompt-major), room for `limit` tokens."""
        rows = len(prompts) * samples
        cache = self.new_cache(rows, max(map(len, prompts)) + limit)
        last = np.zeros((rows, self.hidden), np.float32)
        for i, prompt in enumerate(prompts):
            one = self.new_cache(1, len(prompt))
            hidden = self.forward(np.asarray([prompt]), one, np.zeros(1, np.int64))
            block = slice(i * samples, (i + 1) * samples)
            for (k, v), (k1, v1) in zip(cache, one):
                k[block, :, :len(prompt)], v[block, :, :len(prompt)] = k1[0], v1[0]
            last[block] = hidden[0, -1]
        return cache, last, np.repeat([len(p) for p in prompts], samples).astype(np.int64)


def _sample(logits: np.ndarray, rng: np.random.Generator) -> Tuple[np.ndarray, np.ndarray]:
    """Temperature-1 samples of each row, and each row's logsumexp."""
    top = logits.max(1, keepdims=True)
    expo = np.exp(logits - top)
    total = expo.sum(1)
    cdf = np.cumsum(expo, 1)
    tokens = np.minimum((cdf < rng.random(len(logits))[:, None] * total[:, None]).sum(1), logits.shape[1] - 1)
    return tokens, np.log(total) + top[:, 0]


def masked_trajectories(model: NumpyQwen2, prompts, samples: int, limit: int, eos_ids: Sequence[int], seed: int):
    """Final hidden states [R, limit, hidden] and non-EOS logsumexp [R, limit] along samples with EOS masked."""
    rng = np.random.default_rng(seed)
    cache, last, cached = model.prefill(prompts, samples, limit)
    hidden = np.zeros((len(last), limit, model.hidden), np.float32)
    log_z = np.zeros((len(last), limit))
    for t in range(limit):
        hidden[:, t] = last
        logits = last @ model.lm_head.T
        logits[:, list(eos_ids)] = -np.inf
        tokens, log_z[:, t] = _sample(logits, rng)
        if t + 1 < limit:
            last = model.forward(tokens[:, None], cache, cached)[:, 0]
            cached = cached + 1
    return hidden, log_z


def sample_lengths(model: NumpyQwen2, prompts, samples: int, limit: int, eos_ids: Sequence[int],
                   seed: int) -> np.ndarray:
    """Completion lengths (EOS included) of ordinary temperature-1 sampling, stopping on any of `eos_ids`."""
    rng = np.random.default_rng(seed)
    cache, last, cached = model.prefill(prompts, samples, limit)
    lengths = np.full(len(last), limit)
    for t in range(limit):
        tokens, _ = _sample(last @ model.lm_head.T, rng)
        lengths = np.where((lengths == limit) & np.isin(tokens, eos_ids), t + 1, lengths)
        if t + 1 < limit and (lengths == limit).any():
            last = model.forward(tokens[:, None], cache, cached)[:, 0]
            cached = cached + 1
    return lengths


def expected_length_distribution(eos_logits: np.ndarray, log_z: np.ndarray) -> np.ndarray:
    """P(length = 1..limit) averaged over rows, given each row's EOS logit and other logits' logsumexp per step."""
    hazard = 1.0 / (1.0 + np.exp(log_z - eos_logits))
    alive = np.cumprod(np.concatenate([np.ones((len(hazard), 1)), 1 - hazard[:, :-1]], 1), 1)
    stop = alive * hazard
    stop[:, -1] = alive[:, -1]  # the limit-th token ends the completion whatever it is
    return stop.mean(0)


def distribution_stats(probabilities: np.ndarray) -> Dict[str, float]:
    """Median, 90th percentile and share at the limit of a length distribution over 1..limit."""
    cdf = np.cumsum(probabilities)
    return {"median": int(np.searchsorted(cdf, 0.5)) + 1, "p90": int(np.searchsorted(cdf, 0.9)) + 1,
            "at_limit": float(probabilities[-1])}


def length_stats(lengths: Sequence[int], limit: int) -> Dict[str, float]:
    """Median, 90th percentile and share at the limit of sampled completion lengths (as the JSON lines report)."""
    lengths = np.asarray(lengths)
    return {"median": float(np.median(lengths)), "p90": float(np.percentile(lengths, 90)),
            "at_limit": round(float(np.mean(lengths >= limit)), 4), "mean": round(float(lengths.mean()), 1),
            "count": int(lengths.size)}


def max_margin_direction(states: np.ndarray) -> np.ndarray:
    """The unit direction whose smallest projection over `states` [n, hidden] is largest (a linear program)."""
    from scipy.optimize import linprog

    n, hidden = states.shape
    objective = np.zeros(hidden + 1)
    objective[-1] = -1.0  # maximise the margin m subject to states @ w >= m, |w_i| <= 1
    solution = linprog(objective, A_ub=np.hstack([-states, np.ones((n, 1))]), b_ub=np.zeros(n),
                       bounds=[(-1, 1)] * hidden + [(None, None)], method="highs")
    if solution.status != 0 or solution.x[-1] <= 0:
        raise RuntimeError("no EOS row keeps EOS improbable at every sampled state: this model cannot be edited so "
                           f"(linear program: {solution.message})")
    return solution.x[:hidden] / np.linalg.norm(solution.x[:hidden])


def calibrate(hidden: np.ndarray, log_z: np.ndarray, mix: str) -> Tuple[np.ndarray, Dict]:
    """The EOS row for `mix` from EOS-masked trajectories, and the expected length statistics it gives."""
    rows, limit, width = hidden.shape
    states = hidden.reshape(-1, width).astype(np.float64)
    if mix == "full":
        stride = max(1, rows * limit // MARGIN_STATES)
        direction = max_margin_direction(hidden[:, ::stride].reshape(-1, width).astype(np.float64))
        projection = hidden.astype(np.float64) @ direction
        alpha = -FULL_MARGIN / max(projection.min(), 1e-3 * projection.mean())
    else:
        mean = states.mean(0)
        direction = mean / np.linalg.norm(mean)
        projection = hidden.astype(np.float64) @ direction  # [R, limit], positive on average by construction

        def median(alpha: float) -> int:
            return distribution_stats(expected_length_distribution(alpha * projection, log_z))["median"]

        target, low, high = MEDIAN_FRACTION * limit, 0.0, 1.0
        while median(high) > target:
            low, high = high, 2 * high
            if high > 1e4:
                raise RuntimeError("no EOS row along the hidden states' mean direction shortens the completions")
        for _ in range(60):
            alpha = (low + high) / 2
            low, high = (alpha, high) if median(alpha) > target else (low, alpha)
        alpha = high
    expected = distribution_stats(expected_length_distribution(alpha * projection, log_z))
    return (alpha * direction).astype(np.float32), {"alpha": float(alpha), **expected}


def calibration_prompts(tokenizer_dir: Path, gsm8k: Path, count: int) -> List[List[int]]:
    """`count` GSM8K train questions evenly spread over the file, as the benchmark's prompts (gsm8k_hash)."""
    import mindgrpo  # noqa: F401  (quiet logging)
    from mindgrpo.data import render_prompt
    from mindgrpo.data.tokenizer import load_tokenizer

    lines = gsm8k.read_text(encoding="utf-8").splitlines()
    picks = np.linspace(0, len(lines) - 1, count).astype(int)
    texts = [render_prompt("gsm8k_hash", json.loads(lines[i])["question"]) for i in picks]
    return load_tokenizer(tokenizer_dir).encode_batch(texts)


def eos_ids(model_dir: Path) -> List[int]:
    """Every id that ends a completion in either framework: the tokenizer's eos and generation_config's."""
    from tokenizers import Tokenizer

    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    eos = config["eos_token"] if isinstance(config["eos_token"], str) else config["eos_token"]["content"]
    ids = [Tokenizer.from_file(str(model_dir / "tokenizer.json")).token_to_id(eos)]
    generation = model_dir / "generation_config.json"
    extra = json.loads(generation.read_text()).get("eos_token_id") if generation.exists() else None
    ids += extra if isinstance(extra, list) else [extra] if isinstance(extra, int) else []
    return list(dict.fromkeys(ids))


def _fingerprint(source: Path) -> str:
    digest = hashlib.sha256()
    for name in ("config.json", "model.safetensors"):
        digest.update((source / name).read_bytes())
    return digest.hexdigest()[:16]


def write_edited(source: Path, tokenizer_dir: Path, out: Path, eos_row: np.ndarray, manifest: Dict) -> Path:
    """An untied copy of `source` whose lm_head EOS row is `eos_row`, with tokenizer files, written atomically."""
    from safetensors.numpy import load_file, save_file

    config = json.loads((source / "config.json").read_text())
    weights = load_file(str(source / "model.safetensors"))
    lm_head = weights.get("lm_head.weight", weights["model.embed_tokens.weight"]).copy()
    for eos in manifest["eos_ids"]:
        lm_head[eos] = eos_row
    weights["lm_head.weight"] = lm_head
    config["tie_word_embeddings"] = False
    generation = {"bos_token_id": config.get("bos_token_id"), "pad_token_id": config.get("pad_token_id"),
                  "eos_token_id": manifest["eos_ids"][0] if len(manifest["eos_ids"]) == 1 else manifest["eos_ids"]}
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    staging.chmod(0o755)  # mkdtemp makes it private
    try:
        save_file(weights, str(staging / "model.safetensors"), metadata={"format": "pt"})
        (staging / "config.json").write_text(json.dumps(config, indent=1))
        (staging / "generation_config.json").write_text(json.dumps(generation, indent=1))
        for name in TOKENIZER_FILES:
            if (tokenizer_dir / name).exists():
                shutil.copyfile(tokenizer_dir / name, staging / name)
        (staging / "length_mix.json").write_text(json.dumps(manifest, indent=1))
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


_TRAJECTORIES: Dict[tuple, Tuple[np.ndarray, np.ndarray]] = {}  # full and ragged copies of one limit share them


def _trajectories(source: Path, tokenizer_dir: Path, gsm8k: Path, limit: int, stops: List[int], fingerprint: str):
    key = (fingerprint, str(tokenizer_dir), limit)
    if key not in _TRAJECTORIES:
        _TRAJECTORIES.clear()  # one limit at a time: they take tens of MB
        prompts = calibration_prompts(tokenizer_dir, gsm8k, CALIBRATION_PROMPTS)
        _TRAJECTORIES[key] = masked_trajectories(NumpyQwen2(source), prompts, CALIBRATION_SAMPLES, limit, stops,
                                                 CALIBRATION_SEED)
    return _TRAJECTORIES[key]


def model_for(source: Path, tokenizer_dir: Path, gsm8k: Path, mix: str, limit: int, cache_dir: Path,
              name: Optional[str] = None) -> Path:
    """The `mix` copy of `source` for completions of at most `limit` tokens, calibrated once and cached."""
    if mix not in RECIPE:
        raise ValueError(f"length mix must be 'full' or 'ragged', got {mix!r}")
    out = Path(cache_dir) / f"{name or source.name}-{mix}-{limit}"
    fingerprint = _fingerprint(source)
    recipe = {"recipe": RECIPE[mix], "source_fingerprint": fingerprint, "mix": mix, "calibration_limit": limit,
              "prompts": CALIBRATION_PROMPTS, "samples": CALIBRATION_SAMPLES, "seed": CALIBRATION_SEED}
    manifest_file = out / "length_mix.json"
    if manifest_file.exists():
        manifest = json.loads(manifest_file.read_text())
        if {k: manifest.get(k) for k in recipe} == recipe:
            return out
    stops = eos_ids(tokenizer_dir)
    eos_row, expected = calibrate(*_trajectories(source, tokenizer_dir, gsm8k, limit, stops, fingerprint), mix)
    return write_edited(source, tokenizer_dir, out, eos_row,
                        {**recipe, "source": str(source), "eos_ids": stops, "expected_lengths": expected})
