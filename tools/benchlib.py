"""Shared pieces of the benchmarks in tools/: reference paths, the `small` model, peak RSS, the matmul peak and the
memory-copy bandwidth."""
from __future__ import annotations

import json
import os
import resource
import shutil
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # measure this checkout's mindgrpo, whichever one pip has installed
SHARED = Path(os.environ.get("MINDGRPO_SHARED", REPO.parent / "shared"))
FIXTURE = SHARED / "fixtures" / "tiny-qwen2.5"
GSM8K_TRAIN = SHARED / "data" / "gsm8k" / "train.jsonl"
PEER = SHARED / "peer" / "trl_grpo_bench.py"
PAD, EOS = 4093, 4095
# The peer benchmark's `small` size (../shared/peer/trl_grpo_bench.py), with the fixture's 4,096-token vocabulary.
SMALL = dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
             intermediate_size=1408, vocab_size=4096)


def write_small_model(folder: Path, seed: int = 0) -> Path:
    """A random Qwen2 `small` as a Hugging Face folder (config.json + model.safetensors), HF-style init."""
    from safetensors.numpy import save_file

    config = json.loads((FIXTURE / "config.json").read_text()) if FIXTURE.exists() else {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
        "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
        "bos_token_id": PAD, "pad_token_id": PAD, "eos_token_id": EOS, "use_sliding_window": False}
    for key in ("layer_types", "rope_parameters", "transformers_version", "dtype"):
        config.pop(key, None)
    config.update(SMALL, rope_theta=1e6, torch_dtype="float32")
    rng = np.random.default_rng(seed)
    h, kv = SMALL["hidden_size"], SMALL["num_key_value_heads"] * SMALL["hidden_size"] // SMALL["num_attention_heads"]

    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    tensors = {"model.embed_tokens.weight": normal(SMALL["vocab_size"], h), "model.norm.weight": np.ones(h, np.float32)}
    for i in range(SMALL["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors.update({
            p + "self_attn.q_proj.weight": normal(h, h), p + "self_attn.q_proj.bias": np.zeros(h, np.float32),
            p + "self_attn.k_proj.weight": normal(kv, h), p + "self_attn.k_proj.bias": np.zeros(kv, np.float32),
            p + "self_attn.v_proj.weight": normal(kv, h), p + "self_attn.v_proj.bias": np.zeros(kv, np.float32),
            p + "self_attn.o_proj.weight": normal(h, h),
            p + "mlp.gate_proj.weight": normal(SMALL["intermediate_size"], h),
            p + "mlp.up_proj.weight": normal(SMALL["intermediate_size"], h),
            p + "mlp.down_proj.weight": normal(h, SMALL["intermediate_size"]),
            p + "input_layernorm.weight": np.ones(h, np.float32),
            p + "post_attention_layernorm.weight": np.ones(h, np.float32)})
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder


def small_model(folder: Path) -> Path:
    """`write_small_model(folder)`, written once (staged, then renamed) and reused: it is deterministic."""
    if (folder / "config.json").exists():
        return folder
    staging = folder.with_name(f".{folder.name}.partial-{os.getpid()}")
    for leftover in (staging, folder):  # a crashed writer's folder
        shutil.rmtree(leftover, ignore_errors=True)
    write_small_model(staging)
    os.replace(staging, folder)
    return folder


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
