"""Prompt datasets: templates, source readers, MindRecord conversion and the trainer's prompt loader.

Flow: a source file (GSM8K jsonl, DeepScaleR json, DAPO-Math-17k parquet) -> `Record`s -> `render_prompt` ->
token ids -> a MindRecord written by `convert_dataset` (MindRLHF style: ids right-padded to a fixed length) ->
`PromptDataset`, which the trainer iterates in deterministic, data-parallel-sharded, resumable batches.
"""
from __future__ import annotations

import itertools
import json
import os
import re
import secrets
import shutil
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Optional, Sequence, Union

import numpy as np

from mindgrpo.train.checkpoint import pid_alive
from mindgrpo.rewards import normalize_number

if TYPE_CHECKING:
    from mindgrpo.data.tokenizer import Tokenizer

PathLike = Union[str, os.PathLike]

# ---------------------------------------------------------------------------------------------------------------
# Prompt templates
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PromptTemplate:
    """A prompt format: `text` with one `{question}` placeholder."""
    name: str
    text: str
    description: str

    def render(self, question: str) -> str:
        return self.text.replace("{question}", question)  # not str.format: templates may hold literal braces


PROMPT_TEMPLATES: dict[str, PromptTemplate] = {t.name: t for t in (
    PromptTemplate(
        "r1_zero",
        "<|im_start|>user\n{question}\nThink through the problem step by step inside <think> </think> tags, then "
        "give only the final answer inside <answer> </answer> tags, i.e. <think> reasoning here </think> "
        "<answer> answer here </answer>.<|im_end|>\n<|im_start|>assistant\n",
        "DeepSeek-R1-Zero style: a ChatML user turn (no system turn) asking for the reasoning inside "
        "<think> </think> and the final answer inside <answer> </answer>; pairs with tag-based format rewards."),
    PromptTemplate(
        "gsm8k_hash",
        "<|im_start|>user\n{question}\nLet's think step by step and output the final answer after \"####\"."
        "<|im_end|>\n<|im_start|>assistant\n",
        "The peer TRL benchmark's prompt (../shared/peer/trl_grpo_bench.py), byte for byte: a ChatML user turn "
        "without a system turn asking for the answer after '####', as GSM8K's own solutions write it."),
    PromptTemplate(
        "chatml",
        "<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n",
        "The question as a ChatML user turn with no added instructions, for sources whose questions already say "
        "how to answer (DAPO-Math-17k asks for 'Answer: $Answer')."),
    PromptTemplate(
        "raw",
        "{question}",
        "The question as is: for base models without a chat format, or questions that are already full prompts."),
)}


def render_prompt(template: str, question: str) -> str:
    """The prompt text for `question` under the template named `template` (a key of PROMPT_TEMPLATES)."""
    try:
        return PROMPT_TEMPLATES[template].render(question)
    except KeyError:
        raise ValueError(f"unknown prompt template {template!r}; choose one of "
                         f"{', '.join(PROMPT_TEMPLATES)}") from None


# ---------------------------------------------------------------------------------------------------------------
# Source readers
# ---------------------------------------------------------------------------------------------------------------


class DataError(ValueError):
    """An input or output file cannot be used; the message names the file (and line) and what to do."""


@dataclass(frozen=True)
class Record:
    """One usable source row. `line_no` is 1-based: a file line (jsonl) or an item/row index (json, parquet)."""
    source: str
    line_no: int
    question: str
    gold: str


@dataclass(frozen=True)
class RowError:
    """One skipped source row; `kind` is one of SKIP_REASONS."""
    source: str
    line_no: int
    kind: str
    reason: str

    def __str__(self) -> str:
        return f"{self.source}:{self.line_no}: {self.reason}"


SKIP_REASONS = ("invalid_json", "missing_field", "no_answer", "too_long")
Row = Union[Record, RowError]
_BOXED = re.compile(r"^\\boxed\{(.*)\}$", re.S)


def _text_field(obj: dict, key: str, source: str, line_no: int) -> Union[str, RowError]:
    value = obj.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)  # json answers are sometimes bare numbers
    if not isinstance(value, str) or not value.strip():
        what = "missing" if key not in obj else f"empty or not text ({type(value).__name__})"
        return RowError(source, line_no, "missing_field", f"field {key!r} is {what}")
    return value


def _math_gold(answer: str) -> str:
    """Numbers normalised like the reward does; other answers (LaTeX, expressions) kept verbatim for the verifier."""
    answer = answer.strip()
    boxed = _BOXED.match(answer)
    if boxed:
        answer = boxed.group(1).strip()
    return normalize_number(answer) or answer


def _utf8_lines(path: PathLike) -> Iterator[tuple[int, str]]:
    """(1-based line number, text) of a UTF-8 text file as editors save it: a leading byte-order mark (Windows
    Notepad) is dropped, CRLF line ends and a missing final newline are fine; non-UTF-8 bytes raise DataError."""
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, 1):
            try:
                yield line_no, raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
            except UnicodeDecodeError as err:
                raise DataError(f"{path}:{line_no}: not UTF-8 text ({err.reason} at byte {err.start}); save the "
                                "file as UTF-8") from None


def read_gsm8k(path: PathLike) -> Iterator[Row]:
    """GSM8K jsonl: one object per line with `question` and `answer` ending in `#### <number>`. Blank lines skipped.
    A UTF-8 byte-order mark and CRLF line ends (files saved on Windows) are accepted."""
    source = str(path)
    for line_no, line in _utf8_lines(path):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            yield RowError(source, line_no, "invalid_json", f"invalid JSON: {err.msg} (column {err.colno})")
            continue
        if not isinstance(obj, dict):
            yield RowError(source, line_no, "invalid_json", f"expected a JSON object, got {type(obj).__name__}")
            continue
        question, answer = (_text_field(obj, k, source, line_no) for k in ("question", "answer"))
        if isinstance(question, RowError) or isinstance(answer, RowError):
            yield question if isinstance(question, RowError) else answer
            continue
        if "####" not in answer:
            yield RowError(source, line_no, "no_answer", "answer has no '#### <number>' final answer")
            continue
        final = answer.rsplit("####", 1)[1].strip()
        gold = normalize_number(final)
        if gold is None:
            yield RowError(source, line_no, "no_answer", f"final answer after '####' is not a number: {final!r}")
            continue
        yield Record(source, line_no, question, gold)


def read_deepscaler(path: PathLike) -> Iterator[Row]:
    """DeepScaleR json: one JSON list of objects with `problem` and `answer`; line_no is the 1-based item index."""
    source = str(path)
    try:
        text = Path(path).read_bytes().decode("utf-8-sig")  # -sig: a byte-order mark from a Windows editor
    except UnicodeDecodeError as err:
        raise DataError(f"{source}: not UTF-8 text ({err.reason} at byte {err.start}); save it as UTF-8") from None
    try:
        items = json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(f"{source}:{err.lineno}: invalid JSON ({err.msg}); a deepscaler file is one JSON list "
                        "of {\"problem\", \"answer\"} objects") from err
    if not isinstance(items, list):
        raise DataError(f"{source}: expected a JSON list of {{\"problem\", \"answer\"}} objects, got "
                        f"{type(items).__name__}; is --dataset_type right?")
    for line_no, obj in enumerate(items, 1):
        if not isinstance(obj, dict):
            yield RowError(source, line_no, "invalid_json", f"item is a {type(obj).__name__}, expected an object")
            continue
        problem, answer = (_text_field(obj, k, source, line_no) for k in ("problem", "answer"))
        if isinstance(problem, RowError) or isinstance(answer, RowError):
            yield problem if isinstance(problem, RowError) else answer
            continue
        gold = _math_gold(answer)
        if not gold:
            yield RowError(source, line_no, "no_answer", f"answer {answer!r} has no content")
            continue
        yield Record(source, line_no, problem, gold)


def read_math17k(path: PathLike) -> Iterator[Row]:
    """DAPO-Math-17k parquet: the user turn of `prompt` (a list of {role, content}) and `reward_model.ground_truth`.

    line_no is the 1-based parquet row. The question is the user content verbatim (DAPO already wraps the
    problem in its instructions), so pair it with the `chatml` template.
    """
    import pyarrow.parquet as pq  # lazy: only this reader needs pyarrow

    source = str(path)
    try:
        table = pq.read_table(path)
    except Exception as err:  # pyarrow raises ArrowInvalid/OSError variants
        raise DataError(f"{source}: cannot read as parquet ({err}); is --dataset_type right?") from err
    missing = [c for c in ("prompt", "reward_model") if c not in table.column_names]
    if missing:
        raise DataError(f"{source}: parquet has no column(s) {missing} (columns: {table.column_names}); "
                        "a math17k file needs 'prompt' and 'reward_model' as in DAPO-Math-17k")
    prompts = table.column("prompt").to_pylist()
    rewards = table.column("reward_model").to_pylist()
    for line_no, (prompt, reward) in enumerate(zip(prompts, rewards), 1):
        users = [m.get("content") for m in prompt or [] if isinstance(m, dict) and m.get("role") == "user"]
        if not users or not isinstance(users[0], str) or not users[0].strip():
            yield RowError(source, line_no, "missing_field", "field 'prompt' has no user message with content")
            continue
        truth = reward.get("ground_truth") if isinstance(reward, dict) else None
        if truth is None or not str(truth).strip():
            yield RowError(source, line_no, "missing_field", "field 'reward_model.ground_truth' is missing or empty")
            continue
        yield Record(source, line_no, users[0], _math_gold(str(truth)))


READERS: dict[str, Callable[[PathLike], Iterator[Row]]] = {
    "gsm8k": read_gsm8k, "deepscaler": read_deepscaler, "math17k": read_math17k}


def read_dataset(path: PathLike, dataset_type: str) -> Iterator[Row]:
    """Records and row errors of a source file, in file order."""
    if dataset_type not in READERS:
        raise ValueError(f"unknown dataset_type {dataset_type!r}; choose one of {', '.join(READERS)}")
    if not Path(path).is_file():
        raise DataError(f"input file {path} does not exist (--file_path)")
    return READERS[dataset_type](path)


def _count_rows(path: PathLike, dataset_type: str) -> Optional[int]:
    """Cheap row count for the progress bar (None when it would mean parsing the file twice)."""
    if dataset_type == "gsm8k":
        with open(path, "rb") as f:
            return sum(1 for line in f if line.strip())
    if dataset_type == "math17k":
        import pyarrow.parquet as pq
        try:
            return pq.ParquetFile(path).metadata.num_rows
        except Exception:  # the reader reports unreadable files with a proper message
            return None
    return None


# ---------------------------------------------------------------------------------------------------------------
# MindRecord conversion
# ---------------------------------------------------------------------------------------------------------------

FORMAT_NAME = "mindgrpo-prompts"  # stored in the MindRecord schema description, checked by PromptDataset
FORMAT_VERSION = 1
_CHUNK_ROWS = 1024  # rows tokenised (in parallel) and written per MindRecord call
_PARTIAL = ".partial-"  # staging folders: .<output name>.partial-<pid>@<host>-<random>


def mindrecord_schema(max_prompt_length: int) -> dict:
    """MindRecord fields per prompt. `prompt_ids` has a fixed shape (right-padded), as MindRLHF's datasets do."""
    return {"prompt_ids": {"type": "int32", "shape": [max_prompt_length]},
            "prompt_length": {"type": "int32"},  # real tokens; the rest of prompt_ids is pad_token_id
            "gold": {"type": "string"},  # normalised final answer the reward compares against
            "question": {"type": "string"},  # raw question, for logs and completions dumps
            "line_no": {"type": "int32"}}  # 1-based source line/item, to trace a prompt back to its file


@dataclass(frozen=True)
class LengthStats:
    """Prompt length distribution in tokens."""
    min: int
    mean: float
    p50: float
    p95: float
    max: int

    @classmethod
    def of(cls, lengths: Sequence[int]) -> Optional["LengthStats"]:
        if not len(lengths):
            return None
        arr = np.asarray(lengths)
        return cls(int(arr.min()), float(arr.mean()), float(np.percentile(arr, 50)), float(np.percentile(arr, 95)),
                   int(arr.max()))


@dataclass
class ConversionSummary:
    """What `convert_dataset` did: counts, skipped rows by reason (and each one), prompt lengths."""
    input_path: str
    output_path: str
    dataset_type: str
    prompt_template: str
    max_prompt_length: int
    pad_token_id: int
    rows_read: int = 0
    rows_written: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    errors: list[RowError] = field(default_factory=list)
    prompt_length: Optional[LengthStats] = None
    seconds: float = 0.0

    @property
    def rows_skipped(self) -> int:
        return sum(self.skipped.values())

    def format(self) -> str:
        lines = [f"{self.input_path} -> {self.output_path} ({self.dataset_type}, template {self.prompt_template}, "
                 f"max_prompt_length {self.max_prompt_length}, pad {self.pad_token_id})",
                 f"rows read {self.rows_read}, written {self.rows_written}, skipped {self.rows_skipped}"
                 + "".join(f", {kind} {n}" for kind, n in sorted(self.skipped.items()))]
        s = self.prompt_length
        if s is not None:
            lines.append(f"prompt tokens: min {s.min}, mean {s.mean:.1f}, p50 {s.p50:.0f}, p95 {s.p95:.0f}, "
                         f"max {s.max}")
        lines.append(f"{self.seconds:.2f} s ({self.rows_read / max(self.seconds, 1e-9):.0f} rows/s)")
        return "\n".join(lines)


def index_path(mindrecord: PathLike) -> Path:
    """The sqlite index MindRecord keeps next to its data file."""
    return Path(f"{mindrecord}.db")


def _clean_leftovers(output: Path) -> None:
    """Remove what interrupted conversions to `output` left behind: staging folders of processes that no longer
    exist (SIGKILL, power loss) and a lone index whose data file is gone (a kill between the two renames)."""
    for staging in output.parent.glob(f".{output.name}{_PARTIAL}*"):
        pid, _, rest = staging.name[len(f".{output.name}{_PARTIAL}"):].partition("@")
        host = rest.rsplit("-", 1)[0]
        # only this host's processes can be checked: another machine's run on a shared filesystem may be alive
        if pid.isdigit() and host == socket.gethostname() and not pid_alive(int(pid)):
            shutil.rmtree(staging, ignore_errors=True)
    if index_path(output).exists() and not output.exists():
        index_path(output).unlink()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _StagedMindRecord:
    """A MindRecord written in a private folder next to the output, then moved into place.

    MindRecord stores its own base name in the file header (`shard_addresses`) and in the `.db` index
    (`SHARD_NAME`), and a renamed file cannot be opened. So the staged file already has the final base name, in a
    hidden sibling folder on the same filesystem; publishing is two `os.replace` calls (index, then data file:
    the data file appearing is the commit point) and never a rename of the base name.
    """

    def __init__(self, output: Path):
        self.output = output
        owner = f"{os.getpid()}@{socket.gethostname()}"
        self.dir = output.parent / f".{output.name}{_PARTIAL}{owner}-{secrets.token_hex(4)}"
        self.dir.mkdir()
        self.file = self.dir / output.name

    def publish(self, overwrite: bool) -> None:
        for path in (self.file, index_path(self.file)):
            _fsync(path)
        if self.output.exists():
            if not overwrite:
                raise DataError(f"{self.output} appeared while converting; pass --overwrite to replace it")
            # Drop the old data file first: a kill from here on leaves no readable pair rather than a mixed one.
            self.output.unlink()
        os.replace(index_path(self.file), index_path(self.output))
        os.replace(self.file, self.output)
        _fsync(self.output.parent)
        self.dir.rmdir()

    def discard(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def _chunks(rows: Iterable[Row], size: int) -> Iterator[list[Row]]:
    chunk: list[Row] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _encode_chunk(chunk: Sequence[Row], tokenizer: "Tokenizer", template: str, max_prompt_length: int,
                  pad: int) -> tuple[list[dict], list[RowError]]:
    """MindRecord rows for the usable records of `chunk` (one parallel tokenizer call), and the chunk's row
    errors in line order, too-long prompts included."""
    records = [r for r in chunk if isinstance(r, Record)]
    errors = [r for r in chunk if isinstance(r, RowError)]
    rows = []
    for rec, ids in zip(records, tokenizer.encode_batch([render_prompt(template, r.question) for r in records])):
        if len(ids) > max_prompt_length:
            errors.append(RowError(rec.source, rec.line_no, "too_long",
                                   f"prompt is {len(ids)} tokens, longer than max_prompt_length {max_prompt_length}"))
            continue
        padded = np.full(max_prompt_length, pad, dtype=np.int32)
        padded[:len(ids)] = ids
        rows.append({"prompt_ids": padded, "prompt_length": len(ids), "gold": rec.gold, "question": rec.question,
                     "line_no": rec.line_no})
    return rows, sorted(errors, key=lambda e: e.line_no)


def convert_dataset(input_path: PathLike, output_path: PathLike, tokenizer: "Tokenizer", *, dataset_type: str,
                    prompt_template: str, max_prompt_length: int, pad_token_id: Optional[int] = None,
                    strict: bool = False, overwrite: bool = False, progress: bool = True,
                    on_error: Optional[Callable[[RowError], None]] = None) -> ConversionSummary:
    """Convert a source dataset into a mindgrpo prompt MindRecord at `output_path` (plus its `.db` index).

    Bad rows (invalid JSON, missing field, no parsable answer, prompt longer than `max_prompt_length` tokens) are
    skipped, counted and passed to `on_error`; with `strict` the first one raises `DataError` instead. The output
    appears complete or not at all: an exception or a kill leaves neither a partial file nor a stray index at
    `output_path` (staging leftovers of killed runs are removed by the next conversion to the same path).
    Only `tokenizer.encode_batch`, `.pad_token_id` and `.vocab_size` are used.
    """
    from mindspore.mindrecord import FileWriter  # lazy: importing mindspore costs seconds
    from tqdm import tqdm

    start = time.perf_counter()
    if prompt_template not in PROMPT_TEMPLATES:
        raise ValueError(f"unknown prompt template {prompt_template!r}; choose one of {', '.join(PROMPT_TEMPLATES)}")
    if max_prompt_length < 1:
        raise ValueError(f"max_prompt_length must be >= 1, got {max_prompt_length}")
    pad = tokenizer.pad_token_id if pad_token_id is None else int(pad_token_id)
    if not 0 <= pad < tokenizer.vocab_size:
        raise ValueError(f"pad_token_id {pad} is outside the tokenizer's vocabulary [0, {tokenizer.vocab_size})")
    rows = read_dataset(input_path, dataset_type)
    output = Path(output_path).absolute()
    if output.is_dir():
        raise DataError(f"output path {output} is a folder; pass a file name such as {output / 'train.mindrecord'}")
    if set(output.name) & set("\\/:*?\"<>|`&';") or output.name != output.name.strip():
        raise DataError(f"output file name {output.name!r} is not allowed by MindRecord (no \\/:*?\"<>|`&'; or "
                        "leading/trailing spaces); choose another --output_path")
    output.parent.mkdir(parents=True, exist_ok=True)
    _clean_leftovers(output)
    if output.exists() and not overwrite:
        raise DataError(f"{output} already exists; pass --overwrite (overwrite=True) to replace it")

    summary = ConversionSummary(str(input_path), str(output), dataset_type, prompt_template, max_prompt_length, pad)
    meta = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "dataset_type": dataset_type,
            "prompt_template": prompt_template, "max_prompt_length": max_prompt_length, "pad_token_id": pad,
            "source": Path(input_path).name}
    lengths: list[int] = []
    staged = _StagedMindRecord(output)
    try:
        writer = FileWriter(str(staged.file), shard_num=1, overwrite=False)
        writer.add_schema(mindrecord_schema(max_prompt_length), json.dumps(meta))
        writer.add_index(["line_no"])  # the default indexes every string too: a needlessly large .db
        show = progress and sys.stderr.isatty()
        with tqdm(total=_count_rows(input_path, dataset_type) if show else None, unit="row", file=sys.stderr,
                  disable=not show, delay=1.0, desc=f"converting {Path(input_path).name}") as bar:
            for chunk in _chunks(rows, _CHUNK_ROWS):
                batch, errors = _encode_chunk(chunk, tokenizer, prompt_template, max_prompt_length, pad)
                lengths.extend(row["prompt_length"] for row in batch)
                for err in errors:
                    if strict:
                        raise DataError(f"{err} (strict mode: stopped at the first bad row; nothing was written)")
                    summary.errors.append(err)
                    summary.skipped[err.kind] = summary.skipped.get(err.kind, 0) + 1
                    if on_error is not None:
                        on_error(err)
                if batch:
                    writer.write_raw_data(batch)
                summary.rows_read += len(chunk)
                summary.rows_written += len(batch)
                bar.update(len(chunk))
        if summary.rows_written == 0:
            raise DataError(f"{input_path}: no usable rows ({summary.rows_read} read, all skipped); nothing written")
        writer.commit()
        _check_row_count(staged.file, summary.rows_written)
        staged.publish(overwrite)
    finally:
        staged.discard()
    summary.prompt_length = LengthStats.of(lengths)
    summary.seconds = time.perf_counter() - start
    return summary


def _check_row_count(path: Path, expected: int) -> None:
    """MindRecord's FileWriter drops rows that do not match the schema with only a log warning: count them."""
    from mindspore.mindrecord import FileReader

    reader = FileReader(str(path), num_consumer=1)
    try:
        found = reader.len()
    finally:
        reader.close()
    if found != expected:
        raise DataError(f"{path}: MindRecord holds {found} rows but {expected} were written (rows rejected by the "
                        "schema); this is a bug in mindgrpo.data, please report it")


# ---------------------------------------------------------------------------------------------------------------
# Reading converted prompts for training
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PromptRow:
    """One prompt: its unpadded token ids, gold answer and raw question."""
    prompt_ids: np.ndarray
    gold: str
    question: str
    line_no: int


@dataclass(frozen=True)
class PromptBatch:
    """A batch of prompts as stored: `input_ids` [B, max_prompt_length] right-padded, `lengths` [B] real tokens."""
    indices: np.ndarray
    input_ids: np.ndarray
    lengths: np.ndarray
    golds: list[str]
    questions: list[str]

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def prompt_ids(self) -> list[np.ndarray]:
        """Unpadded ids per prompt."""
        return [ids[:n] for ids, n in zip(self.input_ids, self.lengths)]


class PromptDataset:
    """A converted prompt MindRecord, loaded fully into memory (prompt sets are small).

    `batches()` shuffles per epoch from (seed, epoch) alone, so every data-parallel rank computes the same order
    and takes its own disjoint slice of each global batch. The read position lives in the dataset:
    `state_dict()` after receiving a batch describes the next one, so a resumed run continues exactly there.
    """

    def __init__(self, path: PathLike):
        self.path = Path(path)
        self.metadata, columns = _read_prompt_mindrecord(self.path)
        order = np.argsort(columns["line_no"], kind="stable")  # reader order is not guaranteed: file order is
        self.input_ids: np.ndarray = columns["prompt_ids"][order]
        self.lengths: np.ndarray = columns["prompt_length"][order]
        self.line_nos: np.ndarray = columns["line_no"][order]
        self.golds: list[str] = [columns["gold"][i] for i in order]
        self.questions: list[str] = [columns["question"][i] for i in order]
        self._epoch = 0
        self._position = 0
        self._expected: Optional[tuple[int, int]] = None  # (seed, global batch) a loaded state was saved with
        self._current: Optional[tuple[int, int]] = None

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> PromptRow:
        n = int(self.lengths[index])
        return PromptRow(self.input_ids[index, :n], self.golds[index], self.questions[index], int(self.line_nos[index]))

    @property
    def max_prompt_length(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def pad_token_id(self) -> Optional[int]:
        """The id the stored rows are padded with (None for files without mindgrpo metadata)."""
        return self.metadata.get("pad_token_id")

    def steps_per_epoch(self, batch_size: int, world_size: int = 1) -> int:
        """Full global batches (batch_size prompts on each of world_size ranks) per epoch; the remainder is dropped
        so every step has the same static shape on every rank."""
        return len(self) // (batch_size * world_size)

    def batches(self, batch_size: int, *, seed: int, rank: int = 0, world_size: int = 1, shuffle: bool = True,
                num_epochs: Optional[int] = None) -> Iterator[PromptBatch]:
        """This rank's batches from the current (epoch, position) on, for `num_epochs` epochs in total (None:
        forever), in the order of :meth:`_schedule`."""
        if batch_size < 1 or world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need batch_size >= 1 and 0 <= rank < world_size, got batch_size={batch_size}, "
                             f"rank={rank}, world_size={world_size}")
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        global_batch = batch_size * world_size
        steps = self.steps_per_epoch(batch_size, world_size)
        if steps == 0:
            raise DataError(f"{self.path}: {len(self)} prompts are fewer than one global batch ({batch_size} x "
                            f"{world_size} ranks); lower the batch size or add data")
        if self._expected is not None and self._expected != (seed, global_batch):
            raise ValueError(f"the loaded state was saved with seed {self._expected[0]} and global batch "
                             f"{self._expected[1]}, but batches() got seed {seed} and global batch {global_batch}; "
                             "resume with the same settings or start a fresh run")
        self._current = (seed, global_batch)
        for indices, epoch, position in self._schedule(batch_size, seed, rank, world_size, shuffle):
            if num_epochs is not None and self._epoch >= num_epochs:
                return
            self._epoch, self._position = epoch, position  # before yielding: state_dict() names the next batch
            yield PromptBatch(indices, self.input_ids[indices], self.lengths[indices],
                              [self.golds[i] for i in indices], [self.questions[i] for i in indices])

    def planned_longest_prompts(self, batch_size: int, num_batches: int, *, seed: int, rank: int = 0,
                                world_size: int = 1, shuffle: bool = True) -> np.ndarray:
        """The longest prompt of each of this rank's next ``num_batches`` batches from :meth:`batches`, without
        moving the read position (the order is a function of the seed, so the trainer can compile exactly the
        prompt widths the rest of the run will meet)."""
        schedule = self._schedule(batch_size, seed, rank, world_size, shuffle)
        return np.array([int(self.lengths[indices].max()) for indices, _, _ in itertools.islice(schedule, num_batches)],
                        np.int32)

    def _schedule(self, batch_size: int, seed: int, rank: int, world_size: int, shuffle: bool
                  ) -> Iterator[tuple[np.ndarray, int, int]]:
        """This rank's batch indices from the current (epoch, position) on, each with the (epoch, position) of the
        batch after it. Step s of an epoch gives rank r the prompts perm[s*B*W + r*B : s*B*W + (r+1)*B]; the
        permutation depends on (seed, epoch) alone."""
        steps = self.steps_per_epoch(batch_size, world_size)
        epoch, position, order_epoch, order = self._epoch, self._position, None, None
        while steps:
            if order_epoch != epoch:
                order_epoch = epoch
                order = np.random.default_rng([seed, epoch]).permutation(len(self)) if shuffle else np.arange(len(self))
            start = position * batch_size * world_size + rank * batch_size
            position += 1
            if position == steps:
                epoch, position = epoch + 1, 0
            yield order[start:start + batch_size], epoch, position

    def state_dict(self) -> dict:
        """Where the next batch starts: the same on every rank, so rank 0 can save it for all."""
        seed, global_batch = self._current or self._expected or (None, None)
        return {"epoch": self._epoch, "position": self._position, "seed": seed, "global_batch_size": global_batch,
                "num_rows": len(self)}

    def load_state_dict(self, state: dict) -> None:
        if state.get("num_rows") != len(self):
            raise ValueError(f"{self.path}: the saved data state is for {state.get('num_rows')} prompts but this "
                             f"file has {len(self)}; resume with the dataset file the run started with")
        self._epoch, self._position = int(state["epoch"]), int(state["position"])
        if state.get("seed") is not None:
            self._expected = (int(state["seed"]), int(state["global_batch_size"]))


_REQUIRED_FIELDS = ("prompt_ids", "prompt_length", "gold", "question", "line_no")


def _read_prompt_mindrecord(path: Path) -> tuple[dict, dict]:
    """(metadata, columns as numpy arrays/lists) of a prompt MindRecord, with errors that say what is wrong."""
    from mindspore.mindrecord import FileReader

    hint = "convert the source data with tools/rlhf_data.py"
    if not path.is_file():
        raise DataError(f"prompt dataset {path} does not exist; {hint}")
    if not index_path(path).is_file():
        raise DataError(f"{path}: its MindRecord index {index_path(path).name} is missing (it must stay next to "
                        f"the data file, and neither may be renamed); {hint}")
    try:
        reader = FileReader(str(path), num_consumer=1)
    except Exception as err:  # MindSpore raises RuntimeError/MRM* errors carrying a C++ trace
        first = str(err).strip().splitlines()
        raise DataError(f"{path}: not a readable MindRecord ({first[0] if first else type(err).__name__}); a "
                        f"MindRecord cannot be renamed after writing; {hint}") from err
    try:
        schema = reader.schema()
        missing = [f for f in _REQUIRED_FIELDS if f not in schema]
        if missing:
            raise DataError(f"{path}: not a mindgrpo prompt MindRecord: missing field(s) {missing} (has "
                            f"{sorted(schema)}); {hint}")
        try:  # the schema description holds conversion settings; FileReader exposes it only through its header
            metadata = json.loads(reader._header._get_meta()["desc"])  # pylint: disable=protected-access
        except (AttributeError, KeyError, TypeError, ValueError):
            metadata = {}
        if not isinstance(metadata, dict):
            metadata = {}
        if metadata.get("format", FORMAT_NAME) != FORMAT_NAME or metadata.get("version", 0) > FORMAT_VERSION:
            raise DataError(f"{path}: written as {metadata.get('format')!r} version {metadata.get('version')}, but "
                            f"this mindgrpo reads {FORMAT_NAME!r} up to version {FORMAT_VERSION}; {hint}")
        rows = list(reader.get_next())
    finally:
        reader.close()
    if not rows:
        raise DataError(f"{path}: the MindRecord holds no prompts; {hint}")
    columns = {"prompt_ids": np.stack([r["prompt_ids"] for r in rows]).astype(np.int32, copy=False),
               "prompt_length": np.array([r["prompt_length"] for r in rows], dtype=np.int32),
               "line_no": np.array([r["line_no"] for r in rows], dtype=np.int64),
               "gold": [str(r["gold"]) for r in rows], "question": [str(r["question"]) for r in rows]}
    width = columns["prompt_ids"].shape[1]
    bad = np.flatnonzero((columns["prompt_length"] < 0) | (columns["prompt_length"] > width))
    if bad.size:
        raise DataError(f"{path}: prompt_length of row with line_no {columns['line_no'][bad[0]]} is outside "
                        f"[0, {width}]; the file is corrupt, {hint}")
    return metadata, columns
