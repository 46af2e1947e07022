"""MindRecord conversion: a source dataset -> a mindgrpo prompt MindRecord (MindRLHF style) that `PromptDataset` reads.

`convert_dataset` reads rows with `readers`, renders them with a prompt template, tokenises them in chunks, and
writes token ids right-padded to a fixed length, with the conversion settings in the schema description. The file
and its `.db` index are staged in a hidden folder and published by renames, so the output appears complete or not
at all. Datasets with images (`readers.IMAGE_DATASETS`) render prompts through Qwen2.5-VL's chat template with one
`<|image_pad|>` per merged patch, and store each row's encoded image files beside its ids (`IMAGE_FIELDS`).
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence

import numpy as np

from mindgrpo._io import fsync, pid_alive
from mindgrpo.data.readers import (IMAGE_DATASETS, DataError, PathLike, Record, Row, RowError, count_rows,
                                   read_dataset)
from mindgrpo.data.templates import PROMPT_TEMPLATES, render_prompt, render_tool_prompt, render_vl_prompt

if TYPE_CHECKING:
    from mindgrpo.data.images import ImageProcessorConfig
    from mindgrpo.data.tokenizer import Tokenizer

FORMAT_NAME = "mindgrpo-prompts"  # stored in the MindRecord schema description, checked by PromptDataset
FORMAT_VERSION = 1
_CHUNK_ROWS = 1024  # rows tokenised (in parallel) and written per MindRecord call
_PARTIAL = ".partial-"  # staging folders: .<output name>.partial-<pid>@<host>-<random>


# MindRecord has one bytes field per row, so a row's image files are stored back to back with their lengths.
IMAGE_FIELDS = {"images": {"type": "bytes"},  # the encoded files (PNG, JPEG, ...) concatenated
                "image_byte_lengths": {"type": "int64", "shape": [-1]},  # one per image: splits `images`
                "image_grid_thw": {"type": "int32", "shape": [-1]}}  # (t, h, w) per image, flattened


def mindrecord_schema(max_prompt_length: int, with_images: bool = False) -> dict:
    """MindRecord fields per prompt. `prompt_ids` has a fixed shape (right-padded), as MindRLHF's datasets do."""
    schema = {"prompt_ids": {"type": "int32", "shape": [max_prompt_length]},
              "prompt_length": {"type": "int32"},  # real tokens; the rest of prompt_ids is pad_token_id
              "gold": {"type": "string"},  # normalised final answer the reward compares against
              "question": {"type": "string"},  # raw question, for logs and completions dumps
              "line_no": {"type": "int32"}}  # 1-based source line/item, to trace a prompt back to its file
    return {**schema, **IMAGE_FIELDS} if with_images else schema


def stored_images(row: dict) -> tuple[list[bytes], np.ndarray]:
    """A stored row's image files and their `image_grid_thw` [num_images, 3], as `convert_dataset` wrote them."""
    blob, lengths = bytes(row["images"]), np.asarray(row["image_byte_lengths"], np.int64)
    ends = np.cumsum(lengths)
    if len(blob) != int(lengths.sum()):
        raise DataError(f"stored images hold {len(blob)} bytes but their lengths add up to {int(lengths.sum())}: "
                        "the MindRecord is damaged; convert the dataset again")
    return ([blob[end - n:end] for n, end in zip(lengths.tolist(), ends.tolist())],
            np.asarray(row["image_grid_thw"], np.int64).reshape(-1, 3))


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
            fsync(path)
        if self.output.exists():
            if not overwrite:
                raise DataError(f"{self.output} appeared while converting; pass --overwrite to replace it")
            # Drop the old data file first: a kill from here on leaves no readable pair rather than a mixed one.
            self.output.unlink()
        os.replace(index_path(self.file), index_path(self.output))
        os.replace(self.file, self.output)
        fsync(self.output.parent)
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


def _vl_prompt(rec: Record, template: str, image_config: "ImageProcessorConfig") -> tuple[str, list[tuple]]:
    """The Qwen2.5-VL prompt of a record with images and each image's (t, h, w) grid; ValueError when it cannot
    be built (an image the processor refuses, a question spelling `<|image_pad|>`)."""
    from mindgrpo.data.images import decode_image, image_grid_thw, image_token_count

    grids = []
    for data in rec.images:
        image = decode_image(data)
        grids.append(image_grid_thw(image.height, image.width, image_config))
    tokens = [image_token_count(grid, image_config.merge_size) for grid in grids]
    return render_vl_prompt(template, rec.question, tokens), grids


def _encode_chunk(chunk: Sequence[Row], tokenizer: "Tokenizer", template: str, max_prompt_length: int, pad: int,
                  image_config: Optional["ImageProcessorConfig"] = None, signatures: Sequence[dict] = ()
                  ) -> tuple[list[dict], list[RowError]]:
    """MindRecord rows for the usable records of `chunk` (one parallel tokenizer call), and the chunk's row
    errors in line order, too-long prompts included. With `image_config` (an image dataset) every prompt goes
    through Qwen2.5-VL's chat template and the rows carry their images."""
    errors = [r for r in chunk if isinstance(r, RowError)]
    records, texts, grids = [], [], []
    for rec in (r for r in chunk if isinstance(r, Record)):
        if signatures:
            text, rec_grids = render_tool_prompt(template, rec.question, signatures), []
        elif image_config is None:
            text, rec_grids = render_prompt(template, rec.question), []
        else:
            try:
                text, rec_grids = _vl_prompt(rec, template, image_config)
            except ValueError as err:  # ImageError included
                errors.append(RowError(rec.source, rec.line_no, "bad_image", str(err)))
                continue
        records.append(rec)
        texts.append(text)
        grids.append(rec_grids)
    rows = []
    for k, (rec, ids) in enumerate(zip(records, tokenizer.encode_batch(texts))):
        if len(ids) > max_prompt_length:
            errors.append(RowError(rec.source, rec.line_no, "too_long",
                                   f"prompt is {len(ids)} tokens, longer than max_prompt_length {max_prompt_length}"))
            continue
        padded = np.full(max_prompt_length, pad, dtype=np.int32)
        padded[:len(ids)] = ids
        row = {"prompt_ids": padded, "prompt_length": len(ids), "gold": rec.gold, "question": rec.question,
               "line_no": rec.line_no}
        if image_config is not None:
            row.update(images=b"".join(rec.images),
                       image_byte_lengths=np.asarray([len(b) for b in rec.images], np.int64),
                       image_grid_thw=np.asarray(grids[k], np.int32).reshape(-1))
        rows.append(row)
    return rows, sorted(errors, key=lambda e: e.line_no)


def convert_dataset(input_path: PathLike, output_path: PathLike, tokenizer: "Tokenizer", *, dataset_type: str,
                    prompt_template: str, max_prompt_length: int, pad_token_id: Optional[int] = None,
                    strict: bool = False, overwrite: bool = False, progress: bool = True,
                    on_error: Optional[Callable[[RowError], None]] = None,
                    image_config: Optional["ImageProcessorConfig"] = None,
                    tools: Mapping[str, Mapping[str, Any]] = {}) -> ConversionSummary:
    """Convert a source dataset into a mindgrpo prompt MindRecord at `output_path` (plus its `.db` index).

    Bad rows (invalid JSON, missing field, no parsable answer, prompt longer than `max_prompt_length` tokens) are
    skipped, counted and passed to `on_error`; with `strict` the first one raises `DataError` instead. The output
    appears complete or not at all: an exception or a kill leaves neither a partial file nor a stray index at
    `output_path` (staging leftovers of killed runs are removed by the next conversion to the same path).
    Only `tokenizer.encode_batch`, `.pad_token_id` and `.vocab_size` are used. Datasets with images need
    `image_config` (the model folder's `preprocessor_config.json`): it fixes how many `<|image_pad|>` tokens each
    image takes, and is stored in the metadata so training preprocesses the images the same way. Rows whose image
    cannot be used are skipped as `bad_image`. With `tools` (each name as in ``rl_config.tools`` -> the JSON
    signature of the tool it resolves to: :func:`mindgrpo.tools.offered_signatures`) every prompt starts with
    Qwen2.5's system turn offering them; the names and signatures are stored in the metadata, and training checks
    them against its own ``rl_config.tools``.
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
    with_images = dataset_type in IMAGE_DATASETS
    if with_images and image_config is None:
        raise ValueError(f"dataset_type {dataset_type!r} has images: pass image_config (ImageProcessorConfig."
                         "from_pretrained(model folder), the folder's preprocessor_config.json)")
    if with_images:
        render_vl_prompt(prompt_template, "", [])  # a template that is not one ChatML user turn fails here, once
    signatures = [dict(signature) for signature in tools.values()]
    if tools:
        if with_images:
            raise ValueError(f"dataset_type {dataset_type!r} has images: tools with image prompts are not built yet")
        render_tool_prompt(prompt_template, "", signatures)  # a template that cannot offer tools fails here, once
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
    if with_images:  # what the stored grids and pad counts depend on; training must preprocess the same way
        meta["image_processor"] = asdict(image_config)
    if tools:  # what the prompts offer: training must run the same tools
        meta.update(tools=list(tools), tool_signatures=signatures)
    lengths: list[int] = []
    staged = _StagedMindRecord(output)
    try:
        writer = FileWriter(str(staged.file), shard_num=1, overwrite=False)
        writer.add_schema(mindrecord_schema(max_prompt_length, with_images), json.dumps(meta))
        writer.add_index(["line_no"])  # the default indexes every string too: a needlessly large .db
        show = progress and sys.stderr.isatty()
        with tqdm(total=count_rows(input_path, dataset_type) if show else None, unit="row", file=sys.stderr,
                  disable=not show, delay=1.0, desc=f"converting {Path(input_path).name}") as bar:
            for chunk in _chunks(rows, _CHUNK_ROWS):
                batch, errors = _encode_chunk(chunk, tokenizer, prompt_template, max_prompt_length, pad,
                                              image_config if with_images else None, signatures)
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
