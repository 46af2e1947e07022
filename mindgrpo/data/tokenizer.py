"""Qwen2/Qwen2.5 tokenizer on the `tokenizers` library, without importing transformers.

`load_tokenizer` accepts a Hugging Face model folder (``tokenizer.json``, else ``vocab.json`` + ``merges.txt``) or
MindRLHF-style ``--vocab_path`` / ``--merges_file_path`` files. For vocab + merges we rebuild the exact pipeline
transformers' ``Qwen2Converter`` builds, so ids match ``AutoTokenizer`` on every text. Chat templates are rendered
through jinja2 in the same sandboxed environment transformers uses, so prompts match ``apply_chat_template``.
"""
from __future__ import annotations

import json
import os
import shutil
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as _BackendTokenizer

from mindgrpo._io import atomic_open, atomic_write

PathLike = Union[str, os.PathLike]

# Qwen2's pre-tokenizer regex (transformers' Qwen2Converter); digits split one per token.
QWEN2_SPLIT_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                     r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
# Qwen2.5's special tokens in id order, appended after the BPE vocab when no config lists them.
QWEN25_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
QWEN25_PAD_TOKEN = "<|endoftext|>"
QWEN25_EOS_TOKEN = "<|im_end|>"

# Qwen2.5-Instruct's ChatML template without the tool-calling branches: used only when the folder has no
# `chat_template`. Like Qwen2.5 it adds the default system turn when the conversation has none.
QWEN25_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (message['role'] == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Files next to the model files that save_pretrained copies along (settings, not vocabulary).
_SIDE_FILES = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "chat_template.jinja")


class TokenizerError(ValueError):
    """A tokenizer folder or file is missing or inconsistent; the message names the path and the fix."""


def _read_json(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except json.JSONDecodeError as err:
        raise TokenizerError(f"{path}:{err.lineno}: invalid JSON ({err.msg}); restore the file from the model "
                             "repository") from err
    if not isinstance(value, dict):
        raise TokenizerError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def _token_text(value: Any) -> Optional[str]:
    """Special-token entries are strings, or {"content": ...} dicts in older tokenizer_config files."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _build_bpe_pipeline(vocab_file: Path, merges_file: Path) -> _BackendTokenizer:
    """The tokenizer transformers' Qwen2Converter builds from vocab.json + merges.txt."""
    vocab, merges = models.BPE.read_file(str(vocab_file), str(merges_file))
    backend = _BackendTokenizer(models.BPE(
        vocab=vocab, merges=merges, dropout=None, unk_token=None, continuing_subword_prefix="",
        end_of_word_suffix="", fuse_unk=False, byte_fallback=False))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    return backend


def _add_special_tokens(backend: _BackendTokenizer, config: dict, config_path: Path) -> None:
    """Register added tokens at the ids tokenizer_config.json declares (else Qwen2.5's three after the vocab)."""
    declared = config.get("added_tokens_decoder")
    if declared:
        entries = sorted(((int(idx), spec) for idx, spec in declared.items()), key=lambda item: item[0])
    else:
        base = backend.get_vocab_size(with_added_tokens=False)
        entries = [(base + i, {"content": tok, "special": True}) for i, tok in enumerate(QWEN25_SPECIAL_TOKENS)]
    for token_id, spec in entries:
        token = AddedToken(spec["content"], single_word=spec.get("single_word", False),
                           lstrip=spec.get("lstrip", False), rstrip=spec.get("rstrip", False),
                           normalized=spec.get("normalized", False), special=spec.get("special", True))
        if token.special:
            backend.add_special_tokens([token])
        else:
            backend.add_tokens([token])
        got = backend.token_to_id(spec["content"])
        if got != token_id:
            raise TokenizerError(
                f"{config_path}: added_tokens_decoder gives {spec['content']!r} id {token_id}, but appending it "
                f"after the {backend.get_vocab_size(with_added_tokens=False)}-entry vocab.json gives id {got}; "
                "the vocab.json and tokenizer_config.json come from different tokenizers")


class Tokenizer:
    """Qwen2.5 tokenizer: encode/decode, ChatML prompts, and the special ids the trainer needs."""

    def __init__(self, backend: _BackendTokenizer, *, config: Optional[dict] = None,
                 generation_config: Optional[dict] = None, source_files: Sequence[tuple[str, Path]] = ()):
        self._backend = backend
        self._config = dict(config or {})
        self._generation_config = dict(generation_config or {})
        self._source_files = tuple(source_files)  # (canonical file name, path it was loaded from)
        self.chat_template: str = self._config.get("chat_template") or QWEN25_CHAT_TEMPLATE
        self.pad_token: str = _token_text(self._config.get("pad_token")) or self._token_for(
            self._generation_config.get("pad_token_id"), QWEN25_PAD_TOKEN)
        self.eos_token: str = _token_text(self._config.get("eos_token")) or self._token_for(
            self._generation_config.get("eos_token_id"), QWEN25_EOS_TOKEN)
        self.bos_token: Optional[str] = _token_text(self._config.get("bos_token"))
        for name in ("pad_token", "eos_token"):
            if self._backend.token_to_id(getattr(self, name)) is None:
                raise TokenizerError(f"{name} {getattr(self, name)!r} is not in the vocabulary "
                                     f"(files: {', '.join(str(src) for _, src in self._source_files)})")

    def _token_for(self, token_id: Any, default: str) -> str:
        if isinstance(token_id, list):  # generation_config may list several stop ids: the first is the primary
            token_id = token_id[0] if token_id else None
        if isinstance(token_id, int):
            token = self._backend.id_to_token(token_id)
            if token is not None:
                return token
        return default

    # ---- ids ----------------------------------------------------------------------------------------------------
    @property
    def pad_token_id(self) -> int:
        return self._backend.token_to_id(self.pad_token)

    @property
    def eos_token_id(self) -> int:
        return self._backend.token_to_id(self.eos_token)

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """Ids that end a generation: eos plus generation_config's extra eos ids (Qwen2.5 also stops on pad)."""
        extra = self._generation_config.get("eos_token_id")
        ids = [self.eos_token_id] + (extra if isinstance(extra, list) else [extra])
        return tuple(dict.fromkeys(i for i in ids if isinstance(i, int)))

    @property
    def vocab_size(self) -> int:
        """Number of token ids, added (special) tokens included."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    @property
    def backend(self) -> _BackendTokenizer:
        """The underlying `tokenizers.Tokenizer`, for callers that need offsets or raw batch calls."""
        return self._backend

    # ---- text <-> ids -------------------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return self._backend.encode(text).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Encode many texts in parallel (Rust threads); same ids as calling `encode` on each."""
        batch = getattr(self._backend, "encode_batch_fast", self._backend.encode_batch)  # no offsets: faster
        return [enc.ids for enc in batch(list(texts))]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return self._backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def batch_decode(self, sequences: Iterable[Iterable[int]], skip_special_tokens: bool = True) -> list[str]:
        return self._backend.decode_batch([[int(i) for i in ids] for ids in sequences],
                                          skip_special_tokens=skip_special_tokens)

    # ---- chat ---------------------------------------------------------------------------------------------------
    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                            **kwargs: Any) -> str:
        """Render a conversation exactly as transformers' `apply_chat_template(..., tokenize=False)` does."""
        special = {"bos_token": self.bos_token, "eos_token": self.eos_token, "pad_token": self.pad_token}
        context = {"tools": None, "documents": None, **{k: v for k, v in special.items() if v is not None},
                   **kwargs}  # as in transformers, explicit kwargs win over the special tokens
        return compile_chat_template(self.chat_template).render(
            messages=list(messages), add_generation_prompt=add_generation_prompt, **context)

    # ---- export -------------------------------------------------------------------------------------------------
    def save_pretrained(self, out_dir: PathLike) -> list[Path]:
        """Write a tokenizer folder transformers can load: the source files copied, tokenizer.json and a
        tokenizer_config.json written when the source had none. Each file is written atomically."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        written = [_atomic_copy(src, out / name) for name, src in self._source_files]
        names = {p.name for p in written}
        if "tokenizer.json" not in names:
            atomic_write(out / "tokenizer.json", self._backend.to_str(pretty=True))
            written.append(out / "tokenizer.json")
        if "tokenizer_config.json" not in names:
            config = {"tokenizer_class": "Qwen2Tokenizer", "bos_token": self.bos_token, "eos_token": self.eos_token,
                      "pad_token": self.pad_token, "unk_token": None, "clean_up_tokenization_spaces": False,
                      "chat_template": self.chat_template}
            atomic_write(out / "tokenizer_config.json", json.dumps(config, indent=2) + "\n")
            written.append(out / "tokenizer_config.json")
        return written

    def __repr__(self) -> str:
        return (f"Tokenizer(vocab_size={self.vocab_size}, pad={self.pad_token!r}:{self.pad_token_id}, "
                f"eos={self.eos_token!r}:{self.eos_token_id})")


def _atomic_copy(src: Path, dest: Path) -> Path:
    with open(src, "rb") as f, atomic_open(dest, "wb") as out:
        shutil.copyfileobj(f, out)
    return dest


@lru_cache(maxsize=8)
def compile_chat_template(template: str):
    """transformers' `_compile_jinja_template`: same sandbox, options, filters and globals."""
    import jinja2  # lazy: only chat rendering needs it
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(Extension):
        """`{% generation %}...{% endgeneration %}` marks assistant spans for masks; rendering keeps the body."""
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

        def _render(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # transformers overrides jinja's tojson, which would HTML-escape characters
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


def load_tokenizer(path: PathLike, merges_file: Optional[PathLike] = None) -> Tokenizer:
    """Load a Qwen2/Qwen2.5 tokenizer.

    `path` is a model folder (``tokenizer.json`` preferred, else ``vocab.json`` + ``merges.txt``), or a
    ``vocab.json`` file together with `merges_file` (MindRLHF's ``--vocab_path`` / ``--merges_file_path``).
    ``tokenizer_config.json`` and ``generation_config.json`` next to the files supply the chat template,
    pad/eos tokens and, for vocab + merges, the added tokens; a ``chat_template.jinja`` (transformers' own file
    since 4.47) gives the chat template instead.
    """
    path = Path(path)
    if path.is_dir():
        folder = path
        if (folder / "tokenizer.json").is_file() and merges_file is None:
            vocab_file = merges = None
        else:
            vocab_file, merges = folder / "vocab.json", Path(merges_file) if merges_file else folder / "merges.txt"
    elif path.is_file():
        folder = path.parent
        if merges_file is None:
            if path.name == "tokenizer.json":
                vocab_file = merges = None
            else:
                raise TokenizerError(f"{path} is a file: pass merges_file (--merges_file_path) with a vocab.json, "
                                     "or pass the model folder")
        else:
            vocab_file, merges = path, Path(merges_file)
    else:
        raise TokenizerError(f"tokenizer path {path} does not exist: pass a model folder containing tokenizer.json "
                             "(or vocab.json + merges.txt), or a vocab.json file with merges_file")

    config_path = folder / "tokenizer_config.json"
    config = _read_json(config_path) if config_path.is_file() else {}
    template_path = folder / "chat_template.jinja"  # where transformers >= 4.47 saves it; it wins, as there
    if template_path.is_file():
        config["chat_template"] = template_path.read_text(encoding="utf-8")
    gen_path = folder / "generation_config.json"
    generation_config = _read_json(gen_path) if gen_path.is_file() else {}

    if vocab_file is None:
        json_path = path if path.is_file() else folder / "tokenizer.json"
        try:
            backend = _BackendTokenizer.from_file(str(json_path))
        except Exception as err:  # tokenizers raises a bare Exception with the serde message
            raise TokenizerError(f"{json_path}: cannot load tokenizer.json ({err})") from err
        sources = [("tokenizer.json", json_path)]
    else:
        missing = [str(p) for p in (vocab_file, merges) if not p.is_file()]
        if missing:
            raise TokenizerError(f"no tokenizer in {folder}: looked for tokenizer.json, or vocab.json + merges.txt; "
                                 f"missing {', '.join(missing)}")
        try:
            backend = _build_bpe_pipeline(vocab_file, merges)
        except Exception as err:
            raise TokenizerError(f"cannot read BPE files {vocab_file} and {merges}: {err}") from err
        _add_special_tokens(backend, config, config_path)
        sources = [("vocab.json", vocab_file), ("merges.txt", merges)]
    # The other files come along for export; the model files themselves are never mixed across load paths.
    sources += [(name, folder / name) for name in _SIDE_FILES if (folder / name).is_file()]
    return Tokenizer(backend, config=config, generation_config=generation_config, source_files=sources)
