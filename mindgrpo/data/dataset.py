"""The trainer's prompt loader: a converted prompt MindRecord as deterministic, data-parallel-sharded, resumable
batches of prompts. A MindRecord with images (geo3k) keeps each prompt's image files in memory, encoded, and a batch
carries them preprocessed as the model folder's image processor does (:mod:`mindgrpo.data.images`), with the
settings the conversion recorded, so the image token counts of the stored prompts match."""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

from mindgrpo.data.mindrecord import FORMAT_NAME, FORMAT_VERSION, IMAGE_FIELDS, index_path, stored_images
from mindgrpo.data.readers import DataError, PathLike


@dataclass(frozen=True)
class PromptRow:
    """One prompt: its unpadded token ids, gold answer and raw question."""
    prompt_ids: np.ndarray
    gold: str
    question: str
    line_no: int


@dataclass(frozen=True)
class PromptImagePixels:
    """One prompt's images preprocessed for Qwen2.5-VL's vision tower (what `Qwen2VLImageProcessor` returns)."""
    pixel_values: np.ndarray    # float32 [patches, C * T * patch * patch], the prompt's images concatenated
    image_grid_thw: np.ndarray  # int64 [images, 3]


@dataclass(frozen=True)
class PromptBatch:
    """A batch of prompts as stored: `input_ids` [B, max_prompt_length] right-padded, `lengths` [B] real tokens.
    `images`: for a MindRecord with images, one entry per prompt (None for a prompt without images); None for a
    text MindRecord."""
    indices: np.ndarray
    input_ids: np.ndarray
    lengths: np.ndarray
    golds: list[str]
    questions: list[str]
    images: Optional[list[Optional[PromptImagePixels]]] = None

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
        # encoded image files and their stored grids per prompt (None: a text MindRecord)
        self.image_files: Optional[list[tuple[list[bytes], np.ndarray]]] = (
            [columns["images"][i] for i in order] if "images" in columns else None)
        self._image_config = None
        if self.image_files is not None:
            from mindgrpo.data.images import ImageProcessorConfig

            stored = self.metadata.get("image_processor")
            if not isinstance(stored, dict):
                raise DataError(f"{self.path}: the MindRecord holds images but not the image processor settings they "
                                "were converted with; convert it again with tools/rlhf_data.py")
            self._image_config = ImageProcessorConfig(**{k: tuple(v) if isinstance(v, list) else v
                                                         for k, v in stored.items()})
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
    def has_images(self) -> bool:
        """Whether the prompts carry images (a geo3k MindRecord)."""
        return self.image_files is not None

    def image_patch_counts(self) -> list[int]:
        """The vision-tower patches of each prompt with images (from the stored grids, nothing decoded)."""
        return [int(np.prod(grids, axis=1).sum()) for files, grids in self.image_files or () if files]

    def prompt_images(self, index: int) -> Optional[PromptImagePixels]:
        """Prompt ``index``'s images decoded and preprocessed (None: it has none). Its grids must be those the
        conversion stored: they fixed how many <|image_pad|> tokens the prompt holds."""
        if self.image_files is None or not self.image_files[index][0]:
            return None
        from mindgrpo.data.images import decode_image, preprocess_images

        files, grids = self.image_files[index]
        pixels, grid = preprocess_images([decode_image(data) for data in files], self._image_config)
        if not np.array_equal(grid, grids):
            raise DataError(f"{self.path}: the images of source row {int(self.line_nos[index])} preprocess to grids "
                            f"{grid.tolist()} but the MindRecord stored {grids.tolist()}; convert it again")
        return PromptImagePixels(pixels.astype(np.float32, copy=False), grid)

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
            images = None if self.image_files is None else [self.prompt_images(int(i)) for i in indices]
            yield PromptBatch(indices, self.input_ids[indices], self.lengths[indices],
                              [self.golds[i] for i in indices], [self.questions[i] for i in indices], images)

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
    if all(name in schema for name in IMAGE_FIELDS):
        columns["images"] = [stored_images(r) for r in rows]
    width = columns["prompt_ids"].shape[1]
    bad = np.flatnonzero((columns["prompt_length"] < 0) | (columns["prompt_length"] > width))
    if bad.size:
        raise DataError(f"{path}: prompt_length of row with line_no {columns['line_no'][bad[0]]} is outside "
                        f"[0, {width}]; the file is corrupt, {hint}")
    return metadata, columns
