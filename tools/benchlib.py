"""Shared pieces of the benchmarks in tools/: the benchmark models, tokenizer and prompts (made locally), peak RSS,
the CPU model, the matmul peak and the memory-copy bandwidth."""
from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # measure this checkout's mindgrpo, whichever one pip has installed
PAD, EOS = 4093, 4095  # the special ids of a model written without a tokenizer (write_small_model's default)
VOCAB = 4096  # every benchmark model's vocabulary, whatever its tokenizer holds: the vocabulary product's cost
TINY = dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=352, vocab_size=VOCAB)
SMALL = dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
             intermediate_size=1408, vocab_size=VOCAB)
SIZES = {"tiny": TINY, "small": SMALL}
# GSM8K's train.jsonl ({"question", "answer"} rows) gives the benchmarks their prompts when one is found: named by
# $MINDGRPO_GSM8K, or in the shared reference folder beside the clone ($MINDGRPO_SHARED); else the embedded demo's
# GSM8K-format rows do (short one-digit problems: shorter prompts, a smaller tokenizer).
GSM8K_ENV = "MINDGRPO_GSM8K"
SHARED_GSM8K = Path(os.environ.get("MINDGRPO_SHARED", REPO.parent / "shared")) / "data" / "gsm8k" / "train.jsonl"
ASSETS_CACHE = Path(tempfile.gettempdir()) / "mindgrpo_bench_models"  # also the calibrated copies (bench_grpo)
ASSETS_RECIPE = 1  # bump when the tokenizer or the models change: cached assets of another recipe are rebuilt


def write_model(folder: Path, dims: Dict[str, int], seed: int = 0, pad: int = PAD, eos: int = EOS) -> Path:
    """A random Qwen2 of `dims` as a Hugging Face folder (config.json, generation_config.json, model.safetensors),
    tied embeddings, normal(0, 0.02) weights and zero biases as transformers initialises them."""
    from safetensors.numpy import save_file

    config = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
              "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
              "bos_token_id": pad, "pad_token_id": pad, "eos_token_id": eos, "use_sliding_window": False,
              "rope_theta": 1e6, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
              "torch_dtype": "float32", **dims}
    rng = np.random.default_rng(seed)
    h = dims["hidden_size"]
    kv = dims["num_key_value_heads"] * h // dims["num_attention_heads"]
    inter = dims["intermediate_size"]

    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    tensors = {"model.embed_tokens.weight": normal(dims["vocab_size"], h), "model.norm.weight": np.ones(h, np.float32)}
    for i in range(dims["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors.update({
            p + "self_attn.q_proj.weight": normal(h, h), p + "self_attn.q_proj.bias": np.zeros(h, np.float32),
            p + "self_attn.k_proj.weight": normal(kv, h), p + "self_attn.k_proj.bias": np.zeros(kv, np.float32),
            p + "self_attn.v_proj.weight": normal(kv, h), p + "self_attn.v_proj.bias": np.zeros(kv, np.float32),
            p + "self_attn.o_proj.weight": normal(h, h),
            p + "mlp.gate_proj.weight": normal(inter, h), p + "mlp.up_proj.weight": normal(inter, h),
            p + "mlp.down_proj.weight": normal(h, inter),
            p + "input_layernorm.weight": np.ones(h, np.float32),
            p + "post_attention_layernorm.weight": np.ones(h, np.float32)})
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    generation = {"bos_token_id": pad, "pad_token_id": pad, "eos_token_id": eos}
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=1))
    return folder


def write_model_sharded(folder: Path, dims: Dict, *, tied: bool, pad: int = PAD, eos: int = EOS, seed: int = 0,
                        dtype: str = "bfloat16") -> Path:
    """A random Qwen2 of `dims` too large to hold twice in memory (Qwen2.5-7B's 15 GB in bf16): drawn one tensor at
    a time with torch (normal(0, 0.02) matrices, zero biases, unit norms, as transformers initialises them), stored
    in `dtype` as Hugging Face's sharded layout, one shard per decoder layer plus one for the embeddings and head,
    with its `model.safetensors.index.json`."""
    import torch
    from safetensors.torch import save_file

    torch_dtype = getattr(torch, dtype)
    generator = torch.Generator().manual_seed(seed)
    h, heads = dims["hidden_size"], dims["num_attention_heads"]
    d = h // heads
    kv = dims["num_key_value_heads"] * d
    inter = dims["intermediate_size"]

    def normal(*shape: int):
        return (torch.randn(shape, generator=generator) * 0.02).to(torch_dtype)

    def zeros(n: int):
        return torch.zeros(n, dtype=torch_dtype)

    def ones(n: int):
        return torch.ones(n, dtype=torch_dtype)

    folder.mkdir(parents=True, exist_ok=True)
    layers = dims["num_hidden_layers"]
    weight_map: Dict[str, str] = {}

    def shard(index: int, tensors: Dict) -> None:
        name = f"model-{index + 1:05d}-of-{layers + 1:05d}.safetensors"
        save_file(tensors, str(folder / name), metadata={"format": "pt"})
        weight_map.update({key: name for key in tensors})

    outer = {"model.embed_tokens.weight": normal(dims["vocab_size"], h), "model.norm.weight": ones(h)}
    if not tied:
        outer["lm_head.weight"] = normal(dims["vocab_size"], h)
    shard(0, outer)
    del outer
    for i in range(layers):
        p = f"model.layers.{i}."
        shard(i + 1, {p + "self_attn.q_proj.weight": normal(heads * d, h), p + "self_attn.q_proj.bias": zeros(heads * d),
                      p + "self_attn.k_proj.weight": normal(kv, h), p + "self_attn.k_proj.bias": zeros(kv),
                      p + "self_attn.v_proj.weight": normal(kv, h), p + "self_attn.v_proj.bias": zeros(kv),
                      p + "self_attn.o_proj.weight": normal(h, heads * d),
                      p + "mlp.gate_proj.weight": normal(inter, h), p + "mlp.up_proj.weight": normal(inter, h),
                      p + "mlp.down_proj.weight": normal(h, inter),
                      p + "input_layernorm.weight": ones(h), p + "post_attention_layernorm.weight": ones(h)})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map},
                                                                    indent=1))
    config = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
              "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "tie_word_embeddings": tied,
              "bos_token_id": pad, "pad_token_id": pad, "eos_token_id": eos, "use_sliding_window": False,
              "rope_theta": 1e6, "torch_dtype": dtype, **dims}
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    generation = {"bos_token_id": pad, "pad_token_id": pad, "eos_token_id": eos}
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=1))
    return folder


def write_small_model(folder: Path, seed: int = 0) -> Path:
    """A random `small` Qwen2 (no tokenizer: pad 4093, eos 4095)."""
    return write_model(folder, SMALL, seed)


def gsm8k_source() -> Optional[Path]:
    """The GSM8K train.jsonl the benchmarks take prompts from: `$MINDGRPO_GSM8K`, else the shared data folder
    beside the clone when it exists, else None (the demo's rows)."""
    if os.environ.get(GSM8K_ENV):
        path = Path(os.environ[GSM8K_ENV])
        if not path.is_file():
            raise FileNotFoundError(f"{GSM8K_ENV}={path}: no such file (a GSM8K train.jsonl, or unset it to use "
                                    "the demo's GSM8K-format rows)")
        return path
    return SHARED_GSM8K if SHARED_GSM8K.is_file() else None


@dataclass(frozen=True)
class BenchAssets:
    """What the end-to-end benchmarks load, all made locally: the prompts (GSM8K-format rows), a tokenizer
    trained on them and a random Qwen2 per size using it."""

    root: Path
    prompts: Path  # {"question", "answer"} rows
    tokenizer_dir: Path
    source: str  # where the prompts came from, for the reports

    def model(self, size: str) -> Path:
        return self.root / size


def _prompt_rows(gsm8k: Optional[Path]) -> List[dict]:
    if gsm8k is None:
        from mindgrpo.apps.demo.problems import make_problems

        return make_problems(seed=0)[0]
    rows = [json.loads(line) for line in gsm8k.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [{"question": r["question"], "answer": r["answer"]} for r in rows]


def bench_assets(cache: Path = ASSETS_CACHE) -> BenchAssets:
    """The benchmark assets for this machine's prompt source, built once under `cache` (staged, then renamed) and
    reused. The tokenizer is the demo's recipe (Qwen2's byte-level BPE pipeline and ChatML template) trained on the
    prompt rows with up to 4,096 ids; the models keep a 4,096-token vocabulary whatever the tokenizer holds."""
    import mindgrpo  # noqa: F401  (quiet logging)
    from mindgrpo.apps.demo.tokenizer import train_tokenizer, write_tokenizer

    gsm8k = gsm8k_source()
    key = hashlib.sha256(gsm8k.read_bytes() if gsm8k else b"demo").hexdigest()[:12]
    root = Path(cache) / f"{'gsm8k' if gsm8k else 'demo'}-{key}-r{ASSETS_RECIPE}"
    source = f"GSM8K train ({gsm8k.name}, sha256 {key})" if gsm8k else "the demo's GSM8K-format rows (seed 0)"
    assets = BenchAssets(root, root / "prompts.jsonl", root / "tokenizer", source)
    if (root / "assets.json").exists():
        return assets
    rows = _prompt_rows(gsm8k)
    Path(cache).mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.partial-", dir=cache))
    try:
        (staging / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        (staging / "tokenizer").mkdir()
        ids = write_tokenizer(train_tokenizer(rows, vocab_size=VOCAB), staging / "tokenizer")
        pad, eos = ids["<|endoftext|>"], ids["<|im_end|>"]
        for size, dims in SIZES.items():
            write_model(staging / size, dims, pad=pad, eos=eos)
            for item in (staging / "tokenizer").iterdir():
                shutil.copyfile(item, staging / size / item.name)
        (staging / "assets.json").write_text(json.dumps({"recipe": ASSETS_RECIPE, "prompts": source,
                                                         "rows": len(rows), "special_ids": ids}, indent=1))
        staging.chmod(0o755)  # mkdtemp makes it private
        try:
            os.replace(staging, root)
        except OSError:  # another process finished first: its folder is the same
            if not (root / "assets.json").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return assets


def cpu_model() -> str:
    """The CPU's model name and logical CPU count, from /proc/cpuinfo ("unknown" elsewhere)."""
    try:
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), "unknown")
    except OSError:
        model = "unknown"
    return f"{model}, {os.cpu_count()} logical CPUs"


def wait_until_idle(max_busy: float, timeout_s: float, window_s: float = 5.0) -> float:
    """Wait until the CPUs are at most `max_busy` busy over `window_s` (other processes: call it before starting one
    of ours), or `timeout_s` has passed; returns the last busy fraction. Benchmarks on a shared machine use it
    because TRL's OpenMP threads slow down many times over when other processes compete for the cores."""
    deadline = time.monotonic() + timeout_s
    while True:
        total0, idle0 = cpu_ticks()
        time.sleep(window_s)
        total1, idle1 = cpu_ticks()
        busy = 1 - (idle1 - idle0) / max(total1 - total0, 1)
        if busy <= max_busy or time.monotonic() >= deadline:
            return round(busy, 3)


def cpu_ticks() -> tuple:
    """(all, idle + iowait) clock ticks of every CPU since boot, from /proc/stat."""
    with open("/proc/stat") as stat:
        ticks = [int(x) for x in stat.readline().split()[1:]]
    return sum(ticks), ticks[3] + ticks[4]


class OthersCpu:
    """Share of the machine's CPU time that other processes used while ours ran (`with OthersCpu() as o: ...`,
    then `o.share`): our children's CPU time is subtracted from the busy time /proc/stat counts."""

    def __enter__(self):
        self.ticks, self.ours = cpu_ticks(), self._children_s()
        return self

    def __exit__(self, *exc):
        total, idle = (b - a for a, b in zip(self.ticks, cpu_ticks()))
        ours = (self._children_s() - self.ours) * os.sysconf("SC_CLK_TCK")
        self.share = round(max(0.0, (total - idle - ours) / max(total, 1)), 3)
        return False

    @staticmethod
    def _children_s() -> float:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime


def peak_rss_mib() -> float:
    """Peak resident memory of this process so far (Linux reports KiB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def matmul_peak_gflops(size: int = 1024, seconds: float = 3.0) -> dict:
    """This machine's float32 matrix-multiply peak, best of repeated [size, size] products, in GFLOP/s.

    Measured with MindSpore's CPU MatMul (the kernel mindgrpo's graphs run) and with numpy's BLAS; the larger is
    the peak that model FLOP utilisation is quoted against.
    """
    import mindspore as ms
    from mindspore import ops

    a = np.random.default_rng(0).standard_normal((size, size)).astype(np.float32)
    flops = 2.0 * size ** 3
    best = {}
    for name, call in (("mindspore", lambda x=ms.Tensor(a): ops.matmul(x, x).asnumpy()),
                       ("numpy", lambda: a @ a)):
        call()
        times, end = [], time.perf_counter() + seconds / 2
        while time.perf_counter() < end:
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        best[name] = round(flops / min(times) / 1e9, 1)
    return {"peak_gflops": max(best.values()), **{f"{k}_gflops": v for k, v in best.items()}}


def copy_bandwidth(nbytes: int = 256 << 20, repeats: int = 15) -> float:
    """Bytes per second of a large numpy copy (counting the read and the write): the memory-bandwidth bound that
    memory-bound kernels (the fused loss, a decoding step) are quoted against."""
    import statistics

    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - start)
    return 2 * nbytes / statistics.median(times)
