"""Where a model comes from: a Hugging Face folder, a checkpoint ``step_N`` folder, a checkpoint folder or a run
folder -> its weights, tokenizer, LoRA adapter and what the run trained with (prompt template, answer extraction,
tools). ``mindgrpo eval`` and ``mindgrpo chat`` take the same MODEL argument through :func:`resolve_model`."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional, Tuple, Union

from mindgrpo.data import PROMPT_TEMPLATES, DataError
from mindgrpo.models.lora import adapter_base, is_adapter_folder
from mindgrpo.train.checkpoint import MANIFEST, CheckpointError, CheckpointManager

PathLike = Union[str, os.PathLike]
_TOKENIZER_FILES = (("tokenizer.json",), ("vocab.json", "merges.txt"))


def add_model_arguments(parser) -> None:
    """The arguments of a command that takes a model (``mindgrpo eval``, ``mindgrpo chat``): MODEL as
    :func:`resolve_model` reads it, its ``--tokenizer`` and ``--base``, and the compute ``--dtype``."""
    parser.add_argument("model", help="Hugging Face folder, LoRA adapter folder (PEFT's), mindgrpo run folder, "
                                      "checkpoints/ folder or step_N folder")
    parser.add_argument("--tokenizer", help="tokenizer folder, when MODEL has none (the base model folder)")
    parser.add_argument("--base", help="the base model folder of a LoRA adapter MODEL (default: the base its "
                                       "adapter_config.json names)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="compute dtype (float32 on CPU)")


class ModelSourceError(ValueError):
    """The model folder cannot be used; the message says which path or flag to fix."""


@dataclass(frozen=True)
class ResolvedModel:
    """Where a model's weights and tokenizer come from, and what the run trained with."""
    weights_dir: Path
    """Hugging Face folder: config.json + safetensors."""
    tokenizer_dir: Path
    template: Optional[str] = None
    """The prompt template of the run's training data, when the model comes from a run whose data is readable."""
    fallback_last_number: bool = False
    """The run's ``reward_config.fallback_last_number`` (how training extracted answers without a marker)."""
    step: Optional[int] = None
    """Checkpoint step, for a mindgrpo checkpoint."""
    note: str = ""
    """Why the template is unknown (empty when it is known or the folder is a plain Hugging Face model)."""
    adapter_dir: Optional[Path] = None
    """A LoRA adapter folder (PEFT's format) applied on ``weights_dir``, the base: a LoRA run's checkpoint."""
    tools: Tuple[str, ...] = ()
    """The run's ``rl_config.tools`` (empty: it trained without tools, or the folder is not a run's)."""


def _has_tokenizer(folder: Path) -> bool:
    return any(all((folder / name).is_file() for name in names) for names in _TOKENIZER_FILES)


def _is_hf_folder(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def _step_folders(folder: Path) -> List[Path]:
    return [p for p in folder.glob("step_*") if p.is_dir()]


def _latest_step(checkpoint_dir: Path, what: str) -> Path:
    """The newest checkpoint of `checkpoint_dir` whose files match its manifest."""
    latest = CheckpointManager(checkpoint_dir).latest() if checkpoint_dir.is_dir() else None
    if latest is None:
        raise ModelSourceError(f"{what}: no complete checkpoint in {checkpoint_dir} (no step_N folder passes its "
                              "manifest check); pass a step_N folder or a Hugging Face model folder instead")
    return latest


def _run_settings(run_dir: Path) -> Tuple[Optional[Any], str]:
    """(GRPOConfig of the run in `run_dir`, or None; why not) from the config.yaml the trainer writes there."""
    from mindgrpo.config import ConfigError, load_config

    if not (run_dir / "config.yaml").is_file():
        return None, "no run config.yaml next to the checkpoints"
    try:
        return load_config(run_dir / "config.yaml"), ""
    except ConfigError as err:
        return None, f"cannot read the run's config ({err})"


def _training_template(config: Any) -> Tuple[Optional[str], str]:
    """(prompt template recorded in the run's training MindRecord, or None; why not)."""
    dataset = config.rl_config.dataset_file
    if not dataset or not Path(dataset).is_file():
        return None, f"the run's dataset_file {dataset or '(unset)'} is not there to read its template from"
    from mindgrpo.data import PromptDataset

    try:
        template = PromptDataset(dataset).metadata.get("prompt_template")
    except DataError as err:
        return None, f"cannot read the run's dataset ({err})"
    if template not in PROMPT_TEMPLATES:
        return None, f"the run's dataset {dataset} records no known prompt template"
    return template, ""


def resolve_model(path: PathLike, tokenizer: Optional[PathLike] = None, base: Optional[PathLike] = None
                  ) -> ResolvedModel:
    """Find the weights, tokenizer and training settings behind `path`.

    `path` is one of: a Hugging Face folder (config.json + safetensors, e.g. a base model or a checkpoint's
    ``model/`` part); a checkpoint ``step_N`` folder; a checkpoint folder holding ``step_N`` folders (the newest one
    that passes its manifest check is used); a run folder (``rl_config.output_dir``: its ``config.yaml`` names the
    checkpoint folder). The tokenizer is `tokenizer` when given, else the weights folder's own (checkpoints carry
    one), else the run's ``tokenizer_dir``.

    A LoRA adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``, PEFT's format: a LoRA run's
    checkpoint ``model/``) is applied on `base`, or on the base its ``adapter_config.json`` names.
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise ModelSourceError(f"model folder {path} does not exist; pass a Hugging Face folder (config.json + "
                              "*.safetensors), a mindgrpo run folder, its checkpoints/ folder or a step_N folder")
    step_dir: Optional[Path] = None
    config: Optional[Any] = None
    verified = False  # CheckpointManager.latest() has already hashed every file
    if _is_hf_folder(path) or is_adapter_folder(path):
        if (path.parent / MANIFEST).is_file():  # the model part of a checkpoint: check the checkpoint is whole
            step_dir = path.parent
    elif (path / MANIFEST).is_file():
        step_dir = path
    elif _step_folders(path):
        step_dir, verified = _latest_step(path, str(path)), True
    elif (path / "config.yaml").is_file():
        config, why = _run_settings(path)
        if config is None:
            raise ModelSourceError(f"{path}: looks like a run folder but {why}; pass its checkpoints/step_N folder")
        step_dir, verified = _latest_step(Path(config.checkpoint_dir), str(path)), True
    else:
        raise ModelSourceError(f"{path} is neither a Hugging Face model folder (config.json + *.safetensors) nor a "
                              "mindgrpo run, checkpoint or step_N folder")
    step, note = None, ""
    if step_dir is not None:
        try:
            manifest = CheckpointManager(step_dir.parent).verify(step_dir, check_hashes=not verified)
        except CheckpointError as err:
            raise ModelSourceError(f"checkpoint {step_dir} is not usable: {err}") from err
        step = int(manifest["step"])
        path = step_dir / "model"
        if not (_is_hf_folder(path) or is_adapter_folder(path)):
            raise ModelSourceError(f"checkpoint {step_dir} has no model/ part with config.json + safetensors (or a "
                                  "LoRA adapter folder)")
        if config is None:  # the trainer's default layout: <run>/checkpoints/step_N
            config, note = _run_settings(step_dir.parent.parent)

    adapter_dir = None
    if is_adapter_folder(path):
        adapter_dir = path
        try:
            path = adapter_base(adapter_dir, base)
        except FileNotFoundError as err:
            raise ModelSourceError(str(err)) from err
    template = None
    if config is not None:
        template, note = _training_template(config)
    if tokenizer is not None:
        tokenizer_dir = Path(tokenizer).expanduser()
        if not _has_tokenizer(tokenizer_dir):
            raise ModelSourceError(f"--tokenizer {tokenizer_dir}: no tokenizer.json (or vocab.json + merges.txt) "
                                  "there; pass the base model folder")
    elif _has_tokenizer(path):
        tokenizer_dir = path
    elif config is not None and _has_tokenizer(Path(config.tokenizer_dir)):
        tokenizer_dir = Path(config.tokenizer_dir)
    else:
        raise ModelSourceError(f"{path} has no tokenizer (tokenizer.json or vocab.json + merges.txt); pass "
                              "--tokenizer with the base model folder (tokenizer=... from Python)")
    fallback = bool(config.reward_config.fallback_last_number) if config is not None else False
    tools = tuple(config.rl_config.tools) if config is not None else ()
    return ResolvedModel(path, tokenizer_dir, template, fallback, step, note, adapter_dir, tools)
