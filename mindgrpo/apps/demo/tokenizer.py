"""The demo's tokenizer: a Qwen2-format byte-level BPE trained on the demo rows.

Qwen2's NFC normaliser, split regex and byte-level pipeline (digits one per token); `<|endoftext|>`, `<|im_start|>`,
`<|im_end|>` appended after training. The corpus is the rows rendered in every prompt template, so each template
word is one token. Written as tokenizer.json, vocab.json + merges.txt and a tokenizer_config.json with Qwen2.5's
ChatML template; transformers' AutoTokenizer loads it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Sequence

from mindgrpo.stamped import write_json

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # Qwen2.5's order: pad/bos, chat start, eos
VOCAB_SIZE = 640  # upper bound, special tokens included; the demo corpus needs ~545 for every word to be one token

_SYSTEM_TURN = "system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n"  # chat default


# The text templates the demo's tokenizer learns its words from: a fixed list, not every template mindgrpo has, so a
# template added later (geo3k's) does not change the demo's vocabulary, and with it every cached demo (RECIPE_VERSION).
CORPUS_TEMPLATES = ("r1_zero", "gsm8k_hash", "chatml", "raw")


def _without_specials(text: str) -> str:
    for special in SPECIAL_TOKENS:  # special tokens are added after training: keep them out of the merges
        text = text.replace(special, "\n")
    return text


def _tokenizer_corpus(rows: Sequence[dict], extra: Sequence[str] = ()) -> List[str]:
    """Every text the demo puts through the tokenizer: rows in each text prompt template and the chat template's
    default system turn, so prompts tokenize into whole words rather than bytes, then the `extra` texts."""
    from mindgrpo.data import PROMPT_TEMPLATES

    texts = []
    for row in rows:
        for template in (PROMPT_TEMPLATES[name] for name in CORPUS_TEMPLATES):
            texts.append(_without_specials(template.render(row["question"])) + row["answer"])
    return texts + [_SYSTEM_TURN] * (len(rows) // 4) + [_without_specials(text) for text in extra]


def train_tokenizer(rows: Sequence[dict], vocab_size: int = VOCAB_SIZE, extra: Sequence[str] = ()):
    """A `tokenizers.Tokenizer` with Qwen2's pipeline, trained on the demo corpus and the `extra` texts
    (deterministic)."""
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
    tok.train_from_iterator(_tokenizer_corpus(rows, extra), trainer)
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
    write_json(out / "tokenizer_config.json", config)
    return ids
