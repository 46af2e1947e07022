"""The embedded demo: a tiny Qwen2.5-architecture model, its tokenizer and a GSM8K-format task, made locally.

`make_demo(out_dir)` builds everything the README's first command needs, without downloading anything
(`python -m mindgrpo.apps.demo [OUT_DIR]` does the same from the shell):

- **Task**: one-digit addition and subtraction word problems ("Tom has 3 apples and buys 4 more. How many apples
  does Tom have now?") in GSM8K format: `answer` is `"3 + 4 = 7\n#### 7"`. 2,000 train and 200 test rows, no
  question in both.
- **Tokenizer**: a Qwen2-format byte-level BPE (Qwen2's NFC normaliser, split regex and byte-level pipeline, digits
  one per token; `<|endoftext|>`, `<|im_start|>`, `<|im_end|>` appended) trained on the demo rows rendered in every
  prompt template, so each template word is one token. Written as tokenizer.json, vocab.json + merges.txt and a
  tokenizer_config.json with Qwen2.5's ChatML template; transformers' AutoTokenizer loads it.
- **Model**: Qwen2 (hidden 64, 2 layers, 4 heads, 2 KV heads, tied embeddings, ~128k parameters) initialised as
  Hugging Face does, then a short supervised **warm start** in MindSpore on `gsm8k_hash` prompts -> answers. A random
  model never writes `#### N`, so GRPO's reward would be all zeros; the warm start stops once the model gets about a
  fifth of its training answers exactly right (about 30-45% greedy test accuracy, less when sampling), which leaves
  GRPO a reward signal and room to improve.

The folder is stamped with `demo.json` (recipe version, seed, file hashes, measured facts), written last. Everything
is built in a temporary sibling folder that is renamed into place, so an interrupted call leaves nothing
half-written, and a second call returns the stamped folder at once. Same seed, same files (on the same machine).
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import random
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

RECIPE_VERSION = 1
STAMP = "demo.json"
STAMP_FORMAT = "mindgrpo-demo"
MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
               "tokenizer_config.json", "vocab.json", "merges.txt")
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # Qwen2.5's order: pad/bos, chat start, eos
VOCAB_SIZE = 640  # upper bound, special tokens included; the demo corpus needs ~545 for every word to be one token
MAX_OPERAND = 9
NUM_TRAIN, NUM_TEST = 2000, 200
DEFAULT_WARM_START_STEPS = 400  # an upper bound: the warm start stops at TARGET_MATCH

PathLike = Union[str, os.PathLike]


@dataclass(frozen=True)
class DemoAssets:
    """Paths of a finished demo folder, and what `make_demo` measured while making it."""

    root: Path
    model_dir: Path  # Hugging Face folder: config, weights, tokenizer
    train_jsonl: Path
    test_jsonl: Path
    facts: Dict[str, object] = field(default_factory=dict)  # e.g. test_greedy_accuracy, parameters, vocab_size


# ---------------------------------------------------------------------------------------------------------------
# Task
# ---------------------------------------------------------------------------------------------------------------
_NAMES = ("Tom", "Anna", "Ben", "Mia", "Sam", "Lily", "Max", "Emma", "Leo", "Zoe", "Jack", "Nina")
_THINGS = (("apple", "apples"), ("pen", "pens"), ("book", "books"), ("marble", "marbles"), ("coin", "coins"),
           ("card", "cards"), ("shell", "shells"), ("cookie", "cookies"), ("ball", "balls"), ("flower", "flowers"))
# {n}: name, {a}/{b}: operands, {A}/{B}: "<a> <thing(s)>" with the right number, {T}: plural thing.
_ADD = (
    "What is {a} plus {b}?",
    "What is {a} + {b}?",
    "What is the sum of {a} and {b}?",
    "{n} has {A} and buys {b} more. How many {T} does {n} have now?",
    "{n} has {A}. A friend gives {n} {B}. How many {T} does {n} have?",
    "There are {A} in a box. {n} puts in {b} more. How many {T} are in the box?",
    "{n} found {A} and then {B}. How many {T} did {n} find in all?",
)
_SUB = (
    "What is {a} minus {b}?",
    "What is {a} - {b}?",
    "What is {b} less than {a}?",
    "{n} has {A} and gives {b} away. How many {T} does {n} have left?",
    "{n} had {A} and lost {B}. How many {T} does {n} have now?",
    "There are {A} in a box. {n} takes out {b}. How many {T} are left in the box?",
    "{n} made {A} and sold {B}. How many {T} does {n} still have?",
)


def _question(template: str, name: str, thing: Tuple[str, str], a: int, b: int) -> str:
    def count(k: int) -> str:
        return f"{k} {thing[0] if k == 1 else thing[1]}"

    return template.format(n=name, a=a, b=b, A=count(a), B=count(b), T=thing[1])


def make_problems(seed: int = 0, num_train: int = NUM_TRAIN, num_test: int = NUM_TEST) -> Tuple[List[dict], List[dict]]:
    """(train, test) rows `{"question", "answer"}`: one-digit sums and non-negative differences, GSM8K style.

    Half the rows add `a + b` (a, b in 1..MAX_OPERAND), half subtract `a - b` (1 <= b <= a <= MAX_OPERAND). Every
    question is unique, so the splits share none; they do share operand pairs (there are only 126): the model has
    to learn to read the question, and the facts.
    """
    rng = random.Random(seed)
    rows: List[dict] = []
    seen = set()
    while len(rows) < num_train + num_test:
        subtract = len(rows) % 2 == 1
        a = rng.randint(1, MAX_OPERAND)
        b = rng.randint(1, a) if subtract else rng.randint(1, MAX_OPERAND)
        template = rng.choice(_SUB if subtract else _ADD)
        question = _question(template, rng.choice(_NAMES), rng.choice(_THINGS), a, b)
        if question in seen:
            continue
        seen.add(question)
        result = a - b if subtract else a + b
        rows.append({"question": question, "answer": f"{a} {'-' if subtract else '+'} {b} = {result}\n#### {result}"})
    rng.shuffle(rows)
    return rows[:num_train], rows[num_train:]


# ---------------------------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------------------------
_SYSTEM_TURN = "system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n"  # chat default


def _tokenizer_corpus(rows: Sequence[dict]) -> List[str]:
    """Every text the demo puts through the tokenizer: rows in each prompt template and the chat template's default
    system turn, so prompts tokenize into whole words rather than bytes."""
    from mindgrpo.data import PROMPT_TEMPLATES

    texts = []
    for row in rows:
        for template in PROMPT_TEMPLATES.values():
            prompt = template.render(row["question"])
            for special in SPECIAL_TOKENS:  # special tokens are added after training: keep them out of the merges
                prompt = prompt.replace(special, "\n")
            texts.append(prompt + row["answer"])
    return texts + [_SYSTEM_TURN] * (len(rows) // 4)


def train_tokenizer(rows: Sequence[dict], vocab_size: int = VOCAB_SIZE):
    """A `tokenizers.Tokenizer` with Qwen2's pipeline, trained on the demo corpus (deterministic)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers import trainers

    from mindgrpo.data.tokenizer import QWEN2_SPLIT_REGEX

    tok = Tokenizer(models.BPE(unk_token=None, continuing_subword_prefix="", end_of_word_suffix="",
                               fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(SPECIAL_TOKENS), special_tokens=[],
                                  show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_tokenizer_corpus(rows), trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return tok


def write_tokenizer(tok, out: Path) -> Dict[str, int]:
    """tokenizer.json, vocab.json + merges.txt and tokenizer_config.json as Qwen2.5 ships them; returns the ids
    of the special tokens."""
    from mindgrpo.data.tokenizer import QWEN25_CHAT_TEMPLATE

    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    (out / "tokenizer.json").write_text(tok.to_str(pretty=True) + "\n", encoding="utf-8")
    tok.model.save(str(out))  # vocab.json + merges.txt: the "slow" files, special tokens left out as in Qwen2.5
    config = {
        "add_bos_token": False, "add_prefix_space": False,
        "added_tokens_decoder": {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                          "single_word": False, "special": True} for t, i in ids.items()},
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None, "chat_template": QWEN25_CHAT_TEMPLATE, "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>", "errors": "replace", "model_max_length": 512, "pad_token": "<|endoftext|>",
        "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer", "unk_token": None,
    }
    _write_json(out / "tokenizer_config.json", config)
    return ids


# ---------------------------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------------------------
def model_config(vocab_size: int, special_ids: Dict[str, int]) -> dict:
    """config.json of the tiny Qwen2.5 (transformers 4.x spelling, as real Qwen2.5 checkpoints have it)."""
    pad, eos = special_ids["<|endoftext|>"], special_ids["<|im_end|>"]
    return {
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": pad, "eos_token_id": eos,
        "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 176,
        "max_position_embeddings": 512, "max_window_layers": 2, "model_type": "qwen2", "num_attention_heads": 4,
        "num_hidden_layers": 2, "num_key_value_heads": 2, "pad_token_id": pad, "rms_norm_eps": 1e-06,
        "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": None, "tie_word_embeddings": True,
        "torch_dtype": "float32", "use_cache": True, "use_sliding_window": False, "vocab_size": vocab_size,
    }


def init_weights(config: dict, seed: int) -> Dict[str, np.ndarray]:
    """Hugging Face names and initialisation: matrices and embeddings N(0, initializer_range), the pad embedding
    row zero, biases zero, RMSNorm scales one. Tied embeddings: no lm_head.weight."""
    rng = np.random.default_rng(seed)
    hidden, inter, std = config["hidden_size"], config["intermediate_size"], config["initializer_range"]
    kv = config["num_key_value_heads"] * hidden // config["num_attention_heads"]

    def normal(*shape: int) -> np.ndarray:
        return rng.normal(0.0, std, size=shape).astype(np.float32)

    weights = {"model.embed_tokens.weight": normal(config["vocab_size"], hidden)}
    weights["model.embed_tokens.weight"][config["pad_token_id"]] = 0.0  # nn.Embedding(padding_idx=pad)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for proj, rows in (("q", hidden), ("k", kv), ("v", kv)):
            weights[f"{p}self_attn.{proj}_proj.weight"] = normal(rows, hidden)
            weights[f"{p}self_attn.{proj}_proj.bias"] = np.zeros(rows, np.float32)
        weights[f"{p}self_attn.o_proj.weight"] = normal(hidden, hidden)
        weights[f"{p}mlp.gate_proj.weight"] = normal(inter, hidden)
        weights[f"{p}mlp.up_proj.weight"] = normal(inter, hidden)
        weights[f"{p}mlp.down_proj.weight"] = normal(hidden, inter)
        weights[f"{p}input_layernorm.weight"] = np.ones(hidden, np.float32)
        weights[f"{p}post_attention_layernorm.weight"] = np.ones(hidden, np.float32)
    weights["model.norm.weight"] = np.ones(hidden, np.float32)
    if not config["tie_word_embeddings"]:
        weights["lm_head.weight"] = normal(config["vocab_size"], hidden)
    return weights


# ---------------------------------------------------------------------------------------------------------------
# Files, stamp and cache
# ---------------------------------------------------------------------------------------------------------------
def _write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def _write_jsonl(path: Path, rows: Sequence[dict]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _asset_paths(root: Path) -> Tuple[Path, Path, Path]:
    return root / "model", root / "train.jsonl", root / "test.jsonl"


def _read_stamp(root: Path) -> Optional[dict]:
    try:
        stamp = json.loads((root / STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return stamp if isinstance(stamp, dict) and stamp.get("format") == STAMP_FORMAT else None


def _cached(root: Path, recipe: dict) -> Optional[DemoAssets]:
    """The finished assets in `root` when its stamp matches `recipe` and every file still has its recorded hash."""
    stamp = _read_stamp(root)
    if stamp is None or stamp.get("recipe") != recipe:
        return None
    files = stamp.get("files") or {}
    for rel, digest in files.items():
        path = root / rel
        if not path.is_file() or _sha256(path) != digest:
            return None
    model_dir, train, test = _asset_paths(root)
    expected = {f"model/{name}" for name in MODEL_FILES} | {"train.jsonl", "test.jsonl"}
    if not expected <= set(files):
        return None
    return DemoAssets(root, model_dir, train, test, dict(stamp.get("facts") or {}))


def _publish(tmp: Path, root: Path) -> None:
    """Move the finished `tmp` folder to `root`, replacing a stale demo folder there."""
    if root.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{root.name}.old-", dir=root.parent))
        os.replace(root, old / root.name)
        try:
            os.replace(tmp, root)
        finally:
            shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, root)


def default_demo_dir() -> Path:
    """Where the README's command keeps the demo: mindgrpo's per-user cache (see `mindgrpo._env.cache_dir`)."""
    from mindgrpo._env import cache_dir

    return Path(cache_dir()) / "demo"


@contextlib.contextmanager
def _build_lock(root: Path):
    """One builder per folder at a time: data-parallel ranks that all call `make_demo` wait for the first one and
    then find its stamp. The lock file lives in mindgrpo's cache, not next to the user's folder."""
    from mindgrpo._env import cache_dir

    locks = Path(cache_dir()) / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"demo-{hashlib.sha256(str(root).encode()).hexdigest()[:16]}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def make_demo(out_dir: PathLike, *, seed: int = 0, warm_start_steps: int = DEFAULT_WARM_START_STEPS,
              force: bool = False) -> DemoAssets:
    """Build (or reuse) the demo in `out_dir`: `model/` (Hugging Face folder), `train.jsonl`, `test.jsonl` and the
    `demo.json` stamp. Returns the existing assets at once when `out_dir` holds a complete demo (every file hash
    checked) of the same recipe version, seed and `warm_start_steps`, unless `force`.

    `warm_start_steps` caps the supervised warm start, which stops earlier once the model answers TARGET_MATCH of
    its training batches exactly; 0 keeps the randomly initialised model. `out_dir` must be absent, empty or an
    earlier demo folder: anything else is refused rather than overwritten.
    """
    if warm_start_steps < 0:
        raise ValueError(f"warm_start_steps={warm_start_steps} must be >= 0 (0 skips the warm start)")
    root = Path(out_dir).expanduser().resolve()
    recipe = {"version": RECIPE_VERSION, "seed": int(seed), "warm_start_steps": int(warm_start_steps)}
    with _build_lock(root):
        cached = None if force else _cached(root, recipe)
        if cached is not None:
            return cached
        if root.exists() and (not root.is_dir() or (any(root.iterdir()) and _read_stamp(root) is None)):
            raise FileExistsError(f"{root} exists and is not a mindgrpo demo folder (no {STAMP}); pass an empty or "
                                  "new folder to make_demo, or delete this one")
        root.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.tmp-", dir=root.parent))
        try:
            tmp.chmod(0o755)  # mkdtemp makes it private; the published folder is an ordinary one
            facts = _build(tmp, seed, warm_start_steps)
            files = {p.relative_to(tmp).as_posix(): _sha256(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
            _write_json(tmp / STAMP, {"format": STAMP_FORMAT, "recipe": recipe, "files": files, "facts": facts})
            _publish(tmp, root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return DemoAssets(root, *_asset_paths(root), facts)


def _build(root: Path, seed: int, warm_start_steps: int) -> Dict[str, object]:
    """Write every asset into `root`; returns the facts for the stamp."""
    from safetensors.numpy import save_file

    model_dir, train_path, test_path = _asset_paths(root)
    init_dir = root / "init" if warm_start_steps else model_dir
    init_dir.mkdir()
    train, test = make_problems(seed)
    _write_jsonl(train_path, train)
    _write_jsonl(test_path, test)
    tok = train_tokenizer(train)
    ids = write_tokenizer(tok, init_dir)
    config = model_config(tok.get_vocab_size(), ids)
    _write_json(init_dir / "config.json", config)
    _write_json(init_dir / "generation_config.json", {  # Qwen2.5-Instruct stops on <|im_end|> and <|endoftext|>
        "bos_token_id": config["bos_token_id"], "eos_token_id": [config["eos_token_id"], config["pad_token_id"]],
        "pad_token_id": config["pad_token_id"]})
    weights = init_weights(config, seed)
    save_file(weights, str(init_dir / "model.safetensors"), metadata={"format": "pt"})  # what transformers expects
    facts: Dict[str, object] = {"vocab_size": config["vocab_size"],
                                "parameters": int(sum(v.size for v in weights.values())),
                                "num_train": len(train), "num_test": len(test)}
    if warm_start_steps:
        facts.update(warm_start(init_dir, model_dir, train, test, max_steps=warm_start_steps, seed=seed))
        shutil.rmtree(init_dir)
    return facts


# ---------------------------------------------------------------------------------------------------------------
# Warm start (supervised) and accuracy
# ---------------------------------------------------------------------------------------------------------------
SEQ_LENGTH = 64  # longest gsm8k_hash prompt (48 tokens) + MAX_NEW_TOKENS, checked by _encode
MAX_NEW_TOKENS = 14  # the longest answer ("9 + 9 = 18\n#### 18") is 13 tokens + <|im_end|>
_WINDOW = 16  # positions scored per row from the last prompt token: covers every answer + <|im_end|>
BATCH_SIZE = 32
LEARNING_RATE = 4e-3  # after WARMUP_STEPS of linear warmup, constant
WARMUP_STEPS = 20
ADAM_BETA2 = 0.99
TARGET_MATCH = 0.22  # exact-match rate over the last MATCH_WINDOW training batches at which the warm start stops
MATCH_WINDOW = 10


def _encode(tok, rows: Sequence[dict], with_answers: bool) -> Tuple[np.ndarray, ...]:
    """Right-padded int32 ids and attention mask [N, SEQ_LENGTH], float32 answer-token mask [N, SEQ_LENGTH], and
    the int32 start of each row's scored window (the last prompt position) [N]."""
    from mindgrpo.data import render_prompt

    ids = np.full((len(rows), SEQ_LENGTH), tok.pad_token_id, np.int32)
    attention = np.zeros_like(ids)
    answer_mask = np.zeros(ids.shape, np.float32)
    first = np.zeros(len(rows), np.int32)
    for i, row in enumerate(rows):
        prompt = tok.encode(render_prompt("gsm8k_hash", row["question"]))
        answer = tok.encode(row["answer"]) + [tok.eos_token_id] if with_answers else []
        if len(prompt) + max(len(answer), MAX_NEW_TOKENS) > SEQ_LENGTH:
            raise ValueError(f"demo row {i} is {len(prompt)} + {len(answer)} tokens, more than SEQ_LENGTH "
                             f"{SEQ_LENGTH} allows; the demo task changed without updating SEQ_LENGTH")
        ids[i, :len(prompt) + len(answer)] = prompt + answer
        attention[i, :len(prompt) + len(answer)] = 1
        answer_mask[i, len(prompt):len(prompt) + len(answer)] = 1.0
        first[i] = len(prompt) - 1
    return ids, attention, answer_mask, first


def _window_functions(model):
    """Graph-mode helpers for `model`: `window(first)`, the [B, _WINDOW] positions from each row's `first` on
    (shifted left where they would run past the buffer), and `window_logits(ids, attention, first)`, the float32
    logits [B, _WINDOW, V] there: only these positions are projected to the vocabulary."""
    from mindspore import ops

    offsets = ops.arange(_WINDOW).reshape(1, -1)

    def window(first):
        return ops.minimum(first, SEQ_LENGTH - 1 - _WINDOW).reshape(-1, 1) + offsets

    def window_logits(ids, attention, first):
        hidden = model(ids, attention)
        where = ops.broadcast_to(window(first).expand_dims(-1), (-1, -1, hidden.shape[-1]))
        return model.logits(ops.gather_elements(hidden, 1, where))

    return window, window_logits


def warm_start(init_dir: Path, out_dir: Path, train: Sequence[dict], test: Sequence[dict], *, max_steps: int,
               seed: int) -> Dict[str, object]:
    """Supervised fine-tuning of the model in `init_dir` on `train` (loss on answer tokens only, AdamW, GRAPH-mode
    step), exported to `out_dir`. Returns the steps and time taken, and greedy and sampled accuracy on `test`.

    Each step also counts the batch rows whose every answer token is already the model's top choice (measured by
    the step's own forward, before its update: this is when greedy decoding writes the gold answer). Training stops
    once that exact match, averaged over the last MATCH_WINDOW batches, reaches TARGET_MATCH, or after `max_steps`.
    Stopping on a measurement rather than after a fixed step count lands in the band GRPO needs (some reward
    signal, room to improve) whatever the data order or the machine's floating-point rounding; measuring inside the
    training step keeps it free (switching to another compiled graph every few steps would halve the step rate).
    """
    import mindspore as ms
    from mindspore import Tensor, ops

    from mindgrpo.config import LRScheduleConfig, OptimizerConfig
    from mindgrpo.models import build_model, export_hf, read_hf_config
    from mindgrpo.train.optim import AdamW, clip_by_global_norm, learning_rate_at
    from mindgrpo.data.tokenizer import load_tokenizer

    start_time = time.perf_counter()
    tok = load_tokenizer(init_dir)
    model = build_model(init_dir, role="actor", seq_length=SEQ_LENGTH)
    config = OptimizerConfig(weight_decay=0.0, beta2=ADAM_BETA2, max_grad_norm=1.0)
    optimizer = AdamW(model.trainable_params(), config)
    schedule = LRScheduleConfig(learning_rate=LEARNING_RATE, warmup_steps=WARMUP_STEPS)
    window, window_logits = _window_functions(model)

    def answer_loss(ids, attention, answer_mask, first):
        logits = window_logits(ids, attention, first)
        targets = ops.gather_elements(ids, 1, window(first) + 1)
        mask = ops.gather_elements(answer_mask, 1, window(first) + 1)
        token_logprobs = ops.gather_elements(ops.log_softmax(logits, -1), 2, targets.expand_dims(-1)).squeeze(-1)
        misses = ops.cast(ops.not_equal(logits.argmax(-1), targets), ms.float32) * mask
        exact_rows = ops.cast(misses.sum(-1) == 0, ms.float32).sum()
        return -(token_logprobs * mask).sum() / mask.sum(), exact_rows

    grad_fn = ms.value_and_grad(answer_loss, None, optimizer.params, has_aux=True)

    @ms.jit
    def train_step(ids, attention, answer_mask, first, lr, bias_correction1, bias_correction2):
        (loss, exact_rows), grads = grad_fn(ids, attention, answer_mask, first)
        grads, _ = clip_by_global_norm(grads, config.max_grad_norm)
        optimizer(grads, lr, bias_correction1, bias_correction2)
        return loss, exact_rows

    batches = _encode(tok, train, with_answers=True)
    rng = np.random.default_rng(seed)
    order = np.zeros(0, np.int64)
    matches: List[float] = []
    for step in range(1, max_steps + 1):
        if len(order) < BATCH_SIZE:  # epochs in a fresh random order
            order = np.concatenate([order, rng.permutation(len(train))])
        batch, order = order[:BATCH_SIZE], order[BATCH_SIZE:]
        lr = learning_rate_at(schedule, step - 1, max_steps)
        loss, exact_rows = train_step(*(Tensor(array[batch]) for array in batches), *optimizer.hyper_tensors(lr))
        matches.append(float(exact_rows.asnumpy()) / BATCH_SIZE)
        if len(matches) >= MATCH_WINDOW and np.mean(matches[-MATCH_WINDOW:]) >= TARGET_MATCH:
            break
    seconds = time.perf_counter() - start_time
    export_hf(model, out_dir, hf_config=read_hf_config(init_dir), tokenizer_dir=init_dir)
    scorer = _Scorer(model, tok)
    return {"warm_start_steps_run": step, "warm_start_loss": round(float(loss.asnumpy()), 4),
            "warm_start_seconds": round(seconds, 1),
            "train_exact_match": round(float(np.mean(matches[-MATCH_WINDOW:])), 4),
            "test_greedy_accuracy": scorer.accuracy(test), "test_sampled_accuracy": scorer.accuracy(test, seed)}


def answer_accuracy(model, tok, rows: Sequence[dict], decodings: Sequence[Optional[int]] = (None,)) -> List[float]:
    """Per decoding, the fraction of `rows` whose completion of the gsm8k_hash prompt earns `accuracy_reward` 1.
    A decoding is None for greedy, or an int seed for sampling at temperature 1."""
    scorer = _Scorer(model, tok)
    return [scorer.accuracy(rows, seed) for seed in decodings]


class _Scorer:
    """Greedy or sampled generation by a plain loop of full forwards on a fixed [N, SEQ_LENGTH] right-padded
    buffer (no KV cache: the model is tiny, and one compiled graph serves every step)."""

    def __init__(self, model, tok):
        import mindspore as ms

        self.window_logits, self.tok = ms.jit(_window_functions(model)[1]), tok

    def completions(self, rows: Sequence[dict], seed: Optional[int] = None) -> List[str]:
        """Completions of the gsm8k_hash prompts, up to MAX_NEW_TOKENS, stopping at the tokenizer's stop tokens."""
        from mindspore import Tensor

        rng = None if seed is None else np.random.default_rng(seed)
        ids, attention, _, first = _encode(self.tok, rows, with_answers=False)
        lengths = first.astype(np.int64) + 1
        live = np.ones(len(rows), bool)
        completions: List[List[int]] = [[] for _ in rows]
        stops = set(self.tok.stop_token_ids)
        for _ in range(MAX_NEW_TOKENS):
            window = self.window_logits(Tensor(ids), Tensor(attention), Tensor((lengths - 1).astype(np.int32)))
            shift = lengths - 1 - np.minimum(lengths - 1, SEQ_LENGTH - 1 - _WINDOW)  # where the last token sits
            logits = window.asnumpy()[np.arange(len(rows)), shift].astype(np.float64)
            if rng is None:
                tokens = logits.argmax(-1)
            else:  # inverse-CDF sampling at temperature 1: one uniform draw per row
                probs = np.exp(logits - logits.max(-1, keepdims=True))
                cumulative = np.cumsum(probs / probs.sum(-1, keepdims=True), -1)
                tokens = (cumulative < rng.random((len(rows), 1))).sum(-1).clip(max=logits.shape[-1] - 1)
            for i in np.flatnonzero(live):
                if int(tokens[i]) in stops:
                    live[i] = False
                else:
                    completions[i].append(int(tokens[i]))
                    ids[i, lengths[i]], attention[i, lengths[i]] = tokens[i], 1
                    lengths[i] += 1
            if not live.any():
                break
        return self.tok.batch_decode(completions)

    def accuracy(self, rows: Sequence[dict], seed: Optional[int] = None) -> float:
        """Mean `accuracy_reward` of `completions(rows, seed)` against the rows' `#### N` answers."""
        from mindgrpo.rewards import accuracy_reward

        golds = [row["answer"].rsplit("####", 1)[1].strip() for row in rows]
        return float(np.mean([accuracy_reward(text, gold) for text, gold in zip(self.completions(rows, seed), golds)]))


def main(argv: Optional[Sequence[str]] = None) -> None:
    """`python -m mindgrpo.apps.demo [OUT_DIR]`: build (or find) the demo and print where it is and what it scored."""
    parser = argparse.ArgumentParser(prog="python -m mindgrpo.apps.demo", description=main.__doc__)
    parser.add_argument("out_dir", nargs="?", default=None, help=f"default: {default_demo_dir()}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warm-start-steps", type=int, default=DEFAULT_WARM_START_STEPS)
    parser.add_argument("--force", action="store_true", help="rebuild even when a matching demo exists")
    args = parser.parse_args(argv)
    assets = make_demo(args.out_dir or default_demo_dir(), seed=args.seed, warm_start_steps=args.warm_start_steps,
                       force=args.force)
    print(json.dumps({"model_dir": str(assets.model_dir), "train_jsonl": str(assets.train_jsonl),
                      "test_jsonl": str(assets.test_jsonl), "facts": assets.facts}, indent=2))


if __name__ == "__main__":
    main()
