"""mindgrpo.data.tokenizer against transformers' AutoTokenizer on the fixture (every GSM8K text, both load paths)."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import gsm8k_path
from mindgrpo.data.tokenizer import TokenizerError, load_tokenizer

CONVERSATIONS = [
    [{"role": "user", "content": "What is 2 + 3?"}],
    [{"role": "system", "content": "You are a careful math tutor."},
     {"role": "user", "content": "Natalia sold 48 clips in April and half as many in May. How many in total?"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Count to 3, then say 'done'.\nThanks"}],
]


@pytest.fixture(scope="module")
def gsm8k_texts():
    gsm8k = gsm8k_path()
    rows = [json.loads(line) for split in ("train", "test")
            for line in (gsm8k / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 7473 + 1319
    return {"question": [r["question"] for r in rows], "answer": [r["answer"] for r in rows],
            "question+answer": [r["question"] + "\n" + r["answer"] for r in rows]}


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_model_dir):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(tiny_model_dir))


@pytest.fixture(scope="module", params=["tokenizer.json", "vocab+merges"])
def ours(request, tiny_model_dir):
    if request.param == "tokenizer.json":
        return load_tokenizer(tiny_model_dir)
    return load_tokenizer(tiny_model_dir / "vocab.json", tiny_model_dir / "merges.txt")


@pytest.fixture(scope="module")
def hf_ids(hf_tokenizer, gsm8k_texts):
    return {kind: hf_tokenizer(texts, return_attention_mask=False)["input_ids"] for kind, texts in gsm8k_texts.items()}


@pytest.fixture(scope="module")
def our_ids(ours, gsm8k_texts):
    """Every text encoded once per load path, in batches (shared by the parity and round-trip tests)."""
    return {kind: ours.encode_batch(texts) for kind, texts in gsm8k_texts.items()}


def test_ids_match_transformers_on_every_gsm8k_text(ours, our_ids, hf_ids, gsm8k_texts):
    for kind, texts in gsm8k_texts.items():
        mismatches = [i for i, (a, b) in enumerate(zip(our_ids[kind], hf_ids[kind])) if a != b]
        assert len(our_ids[kind]) == len(hf_ids[kind]) == len(texts)
        assert not mismatches, f"{kind}: {len(mismatches)} texts differ, first {texts[mismatches[0]]!r}"
    sample = gsm8k_texts["question+answer"][:50]  # encode (one text) agrees with encode_batch
    assert [ours.encode(t) for t in sample] == our_ids["question+answer"][:50]


def test_decode_round_trips_every_gsm8k_text(ours, our_ids, gsm8k_texts):
    texts = gsm8k_texts["question+answer"]
    assert ours.batch_decode(our_ids["question+answer"]) == texts
    assert ours.decode(our_ids["question+answer"][0]) == texts[0]


def test_special_tokens_and_sizes_match_transformers(ours, hf_tokenizer):
    assert ours.pad_token_id == hf_tokenizer.pad_token_id == 4093
    assert ours.eos_token_id == hf_tokenizer.eos_token_id == 4095
    assert ours.vocab_size == len(hf_tokenizer) == 4096
    chat = "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>"
    ids = ours.encode(chat)
    assert ids == hf_tokenizer(chat)["input_ids"]
    assert [4094, 4095, 4093] == [i for i in ids if i >= 4093]  # specials are single tokens, not split text
    assert ours.decode(ids, skip_special_tokens=False) == chat
    assert ours.decode(ids) == hf_tokenizer.decode(ids, skip_special_tokens=True) == "user\nhi\n"


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(ours, hf_tokenizer, add_generation_prompt):
    for messages in CONVERSATIONS:
        expected = hf_tokenizer.apply_chat_template(messages, tokenize=False,
                                                    add_generation_prompt=add_generation_prompt)
        assert ours.apply_chat_template(messages, add_generation_prompt=add_generation_prompt) == expected
    tools = [{"type": "function", "function": {"name": "calculator", "description": "Evaluates arithmetic.",
                                               "parameters": {"type": "object", "properties": {}}}}]
    assert ours.apply_chat_template(CONVERSATIONS[0], add_generation_prompt, tools=tools) == \
        hf_tokenizer.apply_chat_template(CONVERSATIONS[0], tools=tools, tokenize=False,
                                         add_generation_prompt=add_generation_prompt)


def test_builtin_chatml_matches_qwen_template_when_folder_has_none(tmp_path, tiny_model_dir, hf_tokenizer):
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(tiny_model_dir / name, tmp_path / name)
    bare = load_tokenizer(tmp_path)  # no tokenizer.json, no tokenizer_config.json: Qwen2.5 defaults
    assert (bare.pad_token_id, bare.eos_token_id, bare.vocab_size) == (4093, 4095, 4096)
    for messages in CONVERSATIONS:
        for gen in (True, False):
            assert bare.apply_chat_template(messages, add_generation_prompt=gen) == \
                hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)


def test_added_tokens_decoder_from_config_is_honoured(tmp_path, tiny_model_dir):
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(tiny_model_dir / name, tmp_path / name)
    tokens = {"4093": "<|endoftext|>", "4094": "<|im_start|>", "4095": "<|im_end|>", "4096": "<think>"}
    decoder = {i: {"content": t, "special": t != "<think>", "normalized": False, "lstrip": False, "rstrip": False,
                   "single_word": False} for i, t in tokens.items()}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"added_tokens_decoder": decoder, "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}))
    tok = load_tokenizer(tmp_path)
    assert tok.vocab_size == 4097
    assert tok.eos_token_id == 4093  # the config's eos wins over the Qwen2.5-Instruct default
    ids = tok.encode("<|im_start|>a<think>b")
    assert ids[0] == 4094 and 4096 in ids
    assert "<think>" in tok.decode(ids)  # not special: kept when special tokens are skipped

    decoder["4100"] = decoder.pop("4096")  # a gap: appending after the vocab cannot give this id
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": decoder}))
    with pytest.raises(TokenizerError, match="tokenizer_config.json"):
        load_tokenizer(tmp_path)


def test_generation_config_supplies_ids_when_tokenizer_config_has_none(tmp_path, tiny_model_dir):
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(tiny_model_dir / name, tmp_path / name)
    (tmp_path / "generation_config.json").write_text(json.dumps({"pad_token_id": 4094, "eos_token_id": [4093, 4095]}))
    tok = load_tokenizer(tmp_path)
    assert (tok.pad_token_id, tok.eos_token_id, tok.stop_token_ids) == (4094, 4093, (4093, 4095))
    assert load_tokenizer(tiny_model_dir).stop_token_ids == (4095,)


def test_missing_files_are_named(tmp_path, tiny_model_dir):
    with pytest.raises(TokenizerError) as err:
        load_tokenizer(tmp_path)
    assert str(tmp_path) in str(err.value) and "tokenizer.json" in str(err.value) and "merges.txt" in str(err.value)
    with pytest.raises(TokenizerError, match="does not exist"):
        load_tokenizer(tmp_path / "nope")
    with pytest.raises(TokenizerError, match="merges_file"):
        load_tokenizer(tiny_model_dir / "vocab.json")
    with pytest.raises(TokenizerError, match="missing .*merges.txt"):
        load_tokenizer(tiny_model_dir / "vocab.json", tmp_path / "merges.txt")
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="tokenizer.json"):
        load_tokenizer(tmp_path)


def test_save_pretrained_round_trips_through_transformers(tmp_path, tiny_model_dir, hf_tokenizer, gsm8k_texts):
    from transformers import AutoTokenizer

    src = load_tokenizer(tiny_model_dir / "vocab.json", tiny_model_dir / "merges.txt")
    out = tmp_path / "export"
    written = src.save_pretrained(out)
    assert {p.name for p in written} == {"vocab.json", "merges.txt", "tokenizer_config.json", "tokenizer.json"}
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in written)  # no temporary files left
    reloaded = AutoTokenizer.from_pretrained(str(out))
    sample = gsm8k_texts["question+answer"][:300]
    assert reloaded(sample)["input_ids"] == hf_tokenizer(sample)["input_ids"]
    assert reloaded.apply_chat_template(CONVERSATIONS[1], tokenize=False, add_generation_prompt=True) == \
        src.apply_chat_template(CONVERSATIONS[1])
    assert (reloaded.pad_token_id, reloaded.eos_token_id) == (4093, 4095)
    again = load_tokenizer(out)
    assert again.encode_batch(sample) == src.encode_batch(sample)


def test_import_does_not_pull_in_transformers():
    code = "import sys, mindgrpo.data.tokenizer; sys.exit('transformers' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parent).returncode == 0
