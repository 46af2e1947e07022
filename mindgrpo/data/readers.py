"""Source readers: GSM8K jsonl, DeepScaleR json, DAPO-Math-17k and geo3k parquet files as `Record`s and `RowError`s.

Each reader yields one item per source row, in file order: a usable `Record` (question and gold answer) or a
`RowError` saying why the row is skipped. Errors that make the whole file unusable raise `DataError`.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional, Union

from mindgrpo.rewards.answers import normalize_number

PathLike = Union[str, os.PathLike]


class DataError(ValueError):
    """An input or output file cannot be used; the message names the file (and line) and what to do."""


@dataclass(frozen=True)
class Record:
    """One usable source row. `line_no` is 1-based: a file line (jsonl) or an item/row index (json, parquet)."""
    source: str
    line_no: int
    question: str
    gold: str
    images: tuple[bytes, ...] = ()  # encoded image files, in the order of the question's `<image>` tags


@dataclass(frozen=True)
class RowError:
    """One skipped source row; `kind` is one of SKIP_REASONS."""
    source: str
    line_no: int
    kind: str
    reason: str

    def __str__(self) -> str:
        return f"{self.source}:{self.line_no}: {self.reason}"


SKIP_REASONS = ("invalid_json", "missing_field", "no_answer", "too_long", "bad_image")
IMAGE_TAG = "<image>"  # where an image goes in a multimodal question (geo3k, verl and LLaMA-Factory datasets)
Row = Union[Record, RowError]
_BOXED = re.compile(r"^\\boxed\{(.*)\}$", re.S)


def _text_fields(obj: object, keys: tuple[str, ...], source: str, line_no: int) -> Union[tuple[str, ...], RowError]:
    """The text values of `keys` in one JSON row, or the RowError of a row that is not an object or of its first
    field that is missing, empty or not text. Bare JSON numbers count as text: answers are sometimes written so."""
    if not isinstance(obj, dict):
        return RowError(source, line_no, "invalid_json", f"expected a JSON object, got {type(obj).__name__}")
    values = []
    for key in keys:
        value = obj.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str) or not value.strip():
            what = "missing" if key not in obj else f"empty or not text ({type(value).__name__})"
            return RowError(source, line_no, "missing_field", f"field {key!r} is {what}")
        values.append(value)
    return tuple(values)


def _math_row(obj: object) -> bool:
    """A MATH-style row (MATH500, AIME): a problem and its final answer, no GSM8K question."""
    return isinstance(obj, dict) and "problem" in obj and "answer" in obj and "question" not in obj


def _gsm8k_row(obj: object) -> bool:
    """A GSM8K row: a question (no problem) and a worked answer ending in ``#### <number>``."""
    if not isinstance(obj, dict) or "problem" in obj or not isinstance(obj.get("question"), str):
        return False
    answer = obj.get("answer")
    return isinstance(answer, str) and "####" in answer and normalize_number(
        answer.rsplit("####", 1)[1].strip()) is not None


def detect_dataset_type(path: PathLike) -> str:
    """The reader a problems file needs, from its form: ``math17k`` for a parquet file with DAPO-Math-17k's
    ``prompt`` and ``reward_model``, ``math`` for another parquet file or a jsonl whose first row holds a problem and
    an answer, ``deepscaler`` for one JSON list, else ``gsm8k`` (whose reader then names what a row lacks)."""
    if str(path).endswith(".parquet"):
        import pyarrow.parquet as pq  # lazy: only the parquet readers need pyarrow

        try:
            names = set(pq.read_schema(path).names)
        except Exception:  # unreadable: the math reader says so, naming the file
            return "math"
        return "math17k" if {"prompt", "reward_model"} <= names else "math"
    for _, line in _utf8_lines(path):
        if not line.strip():
            continue
        if line.lstrip().startswith("["):
            return "deepscaler"
        try:
            return "math" if _math_row(json.loads(line)) else "gsm8k"
        except json.JSONDecodeError:
            return "gsm8k"
    return "gsm8k"


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
        if _math_row(obj):
            raise DataError(f"{source}:{line_no}: a MATH-style row (problem and answer), not GSM8K's question and "
                            "'#### N' answer: read the file as math (--dataset-type math)")
        fields = _text_fields(obj, ("question", "answer"), source, line_no)
        if isinstance(fields, RowError):
            yield fields
            continue
        question, answer = fields
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
        yield _math_record(obj, ("problem", "answer"), source, line_no)


def _math_record(obj: object, keys: tuple[str, str], source: str, line_no: int) -> Row:
    """The Record of one JSON row holding a problem and its final answer under `keys` (the answer as `_math_gold`
    keeps it), or the RowError of a row that has none."""
    fields = _text_fields(obj, keys, source, line_no)
    if isinstance(fields, RowError):
        return fields
    problem, answer = fields
    gold = _math_gold(answer)
    if not gold:
        return RowError(source, line_no, "no_answer", f"answer {answer!r} has no content")
    return Record(source, line_no, problem, gold)


def read_math(path: PathLike) -> Iterator[Row]:
    """MATH-style problems (MATH500, AIME and the like): `problem` and `answer` per row, as a jsonl file (one object a
    line, blank lines skipped) or a parquet file (`.parquet`). The answer is the final one (`\\frac{1}{2}`, `204`, a
    `\\boxed{}` is unwrapped), compared by the reward as maths (math-verify); `question` is taken where there is no
    `problem`. line_no is the file line, or the 1-based parquet row."""
    source = str(path)
    if str(path).endswith(".parquet"):
        problems, answers = _parquet_columns(path, (("problem", "question"), "answer"),
                                             "a math file needs problem (or question) and answer")
        objects = ((line_no, {"problem": q, "answer": a}) for line_no, (q, a) in enumerate(zip(problems, answers), 1))
    else:
        def parsed():
            for line_no, line in _utf8_lines(path):
                if not line.strip():
                    continue
                try:
                    yield line_no, json.loads(line)
                except json.JSONDecodeError as err:
                    yield line_no, RowError(source, line_no, "invalid_json",
                                            f"invalid JSON: {err.msg} (column {err.colno})")
        objects = parsed()
    for line_no, obj in objects:
        if isinstance(obj, RowError):
            yield obj
            continue
        if _gsm8k_row(obj):
            raise DataError(f"{source}:{line_no}: a GSM8K row (question, and an answer ending in '#### N'): read as "
                            "math, its whole solution would be the gold answer; read the file as gsm8k "
                            "(--dataset-type gsm8k)")
        key = "problem" if isinstance(obj, dict) and "problem" in obj else "question"
        yield _math_record(obj, (key, "answer"), source, line_no)


def _parquet_columns(path: PathLike, columns: tuple[Union[str, tuple[str, ...]], ...], hint: str) -> list[list]:
    """The named columns of a parquet file as Python lists; DataError when the file or a column is missing. An entry
    may be a tuple of alternative names: the first one the file has is read."""
    import pyarrow.parquet as pq  # lazy: only the parquet readers need pyarrow

    try:
        table = pq.read_table(path)
    except Exception as err:  # pyarrow raises ArrowInvalid/OSError variants
        raise DataError(f"{path}: cannot read as parquet ({err}); is --dataset_type right?") from err
    chosen = [next((n for n in ((c,) if isinstance(c, str) else c) if n in table.column_names), None)
              for c in columns]
    missing = [c for c, name in zip(columns, chosen) if name is None]
    if missing:
        raise DataError(f"{path}: parquet has no column(s) {missing} (columns: {table.column_names}); {hint}")
    return [table.column(name).to_pylist() for name in chosen]


def read_math17k(path: PathLike) -> Iterator[Row]:
    """DAPO-Math-17k parquet: the user turn of `prompt` (a list of {role, content}) and `reward_model.ground_truth`.

    line_no is the 1-based parquet row. The question is the user content verbatim (DAPO already wraps the
    problem in its instructions), so pair it with the `chatml` template.
    """
    source = str(path)
    prompts, rewards = _parquet_columns(path, ("prompt", "reward_model"),
                                        "a math17k file needs 'prompt' and 'reward_model' as in DAPO-Math-17k")
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


def _image_bytes(images: object, source: str, line_no: int) -> Union[tuple[bytes, ...], RowError]:
    """The encoded files of a row's `images` list ({bytes, path} structs, as Hugging Face datasets stores images),
    each checked to decode; or the RowError of the first one that does not."""
    from mindgrpo.data.images import ImageError, decode_image  # lazy: Pillow only for image datasets

    if images is None:
        return ()
    if not isinstance(images, list):
        return RowError(source, line_no, "bad_image", f"field 'images' is a {type(images).__name__}, not a list")
    found = []
    for k, image in enumerate(images, 1):
        data = image.get("bytes") if isinstance(image, dict) else image
        if not isinstance(data, (bytes, bytearray)) or not data:
            path = image.get("path") if isinstance(image, dict) else None
            return RowError(source, line_no, "bad_image", f"image {k} has no bytes"
                            + (f" (only a path, {path!r}: embed the files in the parquet)" if path else ""))
        try:
            decode_image(data)
        except ImageError as err:
            return RowError(source, line_no, "bad_image", f"image {k}: {err}")
        found.append(bytes(data))
    return tuple(found)


def read_geo3k(path: PathLike) -> Iterator[Row]:
    """Geometry3K parquet as on the Hugging Face hub (hiyouga/geometry3k): `images` (a list of {bytes, path}),
    `problem` with one `<image>` tag per image, and `answer` (a number or LaTeX, kept for LaTeX-aware grading).

    line_no is the 1-based parquet row. The question keeps its `<image>` tags: conversion puts each image there.
    """
    source = str(path)
    columns = _parquet_columns(path, ("images", "problem", "answer"),
                               "a geo3k file needs 'images', 'problem' and 'answer' as in hiyouga/geometry3k")
    for line_no, (images, problem, answer) in enumerate(zip(*columns), 1):
        fields = _text_fields({"problem": problem, "answer": answer}, ("problem", "answer"), source, line_no)
        if isinstance(fields, RowError):
            yield fields
            continue
        problem, answer = fields
        found = _image_bytes(images, source, line_no)
        if isinstance(found, RowError):
            yield found
            continue
        tags = problem.count(IMAGE_TAG)
        if tags != len(found):
            yield RowError(source, line_no, "bad_image", f"problem has {tags} {IMAGE_TAG} tag(s) but the row has "
                           f"{len(found)} image(s); put one {IMAGE_TAG} where each image belongs")
            continue
        gold = _math_gold(answer)
        if not gold:
            yield RowError(source, line_no, "no_answer", f"answer {answer!r} has no content")
            continue
        yield Record(source, line_no, problem, gold, found)


READERS: dict[str, Callable[[PathLike], Iterator[Row]]] = {
    "gsm8k": read_gsm8k, "deepscaler": read_deepscaler, "math17k": read_math17k, "geo3k": read_geo3k,
    "math": read_math}
IMAGE_DATASETS = frozenset({"geo3k"})  # sources whose records carry images (their MindRecords store them)


def read_dataset(path: PathLike, dataset_type: str) -> Iterator[Row]:
    """Records and row errors of a source file, in file order."""
    if dataset_type not in READERS:
        raise ValueError(f"unknown dataset_type {dataset_type!r}; choose one of {', '.join(READERS)}")
    if not Path(path).is_file():
        raise DataError(f"input file {path} does not exist (--file_path)")
    return READERS[dataset_type](path)


def count_rows(path: PathLike, dataset_type: str) -> Optional[int]:
    """Cheap row count for the progress bar (None when it would mean parsing the file twice)."""
    if dataset_type == "gsm8k" or (dataset_type == "math" and not str(path).endswith(".parquet")):
        with open(path, "rb") as f:
            return sum(1 for line in f if line.strip())
    if dataset_type in ("math17k", "geo3k") or (dataset_type == "math" and str(path).endswith(".parquet")):
        import pyarrow.parquet as pq
        try:
            return pq.ParquetFile(path).metadata.num_rows
        except Exception:  # the reader reports unreadable files with a proper message
            return None
    return None
