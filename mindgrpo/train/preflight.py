"""Checks that the run's data, tokenizer and model belong together, before any model is built or graph compiled.

Each mismatch below used to surface minutes later as a shape error deep in a compiled graph, or not at all (a
MindRecord tokenized with another vocabulary trains on garbage prompts without a single error). Every message names
the file and the config key to change.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from mindgrpo.data import PROMPT_TEMPLATES, DataError, PromptDataset, render_prompt

if TYPE_CHECKING:
    from mindgrpo.config import GRPOConfig
    from mindgrpo.data.tokenizer import Tokenizer

_RECHECKED_ROWS = 8  # prompts re-tokenized to recognise the tokenizer a MindRecord was made with


def check_run_inputs(config: "GRPOConfig", tokenizer: "Tokenizer", dataset: PromptDataset, *,
                     world_size: int = 1) -> None:
    """Raise DataError if the dataset cannot fill a step, was tokenized differently, holds prompts longer than
    rl_config.max_prompt_length, or if the tokenizer's ids do not fit the actor's (or reference's) vocabulary."""
    rl = config.rl_config
    hint = "convert it again with tools/rlhf_data.py"
    if dataset.steps_per_epoch(rl.batch_size, world_size) == 0:
        raise DataError(f"rl_config.dataset_file = {dataset.path}: {len(dataset)} prompt(s), fewer than one step "
                        f"needs (rl_config.batch_size {rl.batch_size} x {world_size} data-parallel rank(s)); add "
                        "data or lower rl_config.batch_size")
    longest = int(dataset.lengths.max())
    if longest > rl.max_prompt_length:
        built = dataset.metadata.get("max_prompt_length", dataset.max_prompt_length)
        raise DataError(f"rl_config.dataset_file = {dataset.path} was converted with --max_prompt_length {built} "
                        f"and holds a prompt of {longest} tokens, longer than rl_config.max_prompt_length = "
                        f"{rl.max_prompt_length}: raise rl_config.max_prompt_length to {longest} (and seq_length to "
                        f"match), or {hint} --max_prompt_length {rl.max_prompt_length}")
    _check_same_tokenizer(dataset, tokenizer, config.tokenizer_dir, hint)
    from mindgrpo.models.hf_config import (VL_MODEL_TYPES, language_model_config,  # lazy: no MindFormers imports
                                           read_hf_config)

    models = [("actor_config.load", config.actor_config.load)]
    if rl.beta > 0 and config.ref_load != config.actor_config.load:  # beta = 0 never builds the reference
        models.append(("ref_config.load", config.ref_load))
    for key, model_dir in models:
        hf = read_hf_config(model_dir)
        if key == "actor_config.load":
            _check_vision_fits(config, dataset, model_dir, hf.get("model_type") in VL_MODEL_TYPES)
        vocab = int(language_model_config(hf)["vocab_size"])  # Qwen2.5-VL may nest it in text_config
        highest = max(tokenizer.vocab_size - 1, int(dataset.input_ids.max()))
        if highest >= vocab:
            raise DataError(f"{key} = {model_dir}: the model's vocab_size is {vocab}, but the tokenizer in "
                            f"{config.tokenizer_dir} has {tokenizer.vocab_size} tokens (and the data token ids up "
                            f"to {int(dataset.input_ids.max())}): the model and tokenizer are from different "
                            "models; point rl_config.tokenizer_dir (or actor_config.load) at matching folders")


def _check_vision_fits(config: "GRPOConfig", dataset: PromptDataset, model_dir: str, is_vl: bool) -> None:
    """Image prompts need a Qwen2.5-VL actor, and a Qwen2.5-VL actor the paths that take M-RoPE and image
    features: the native rollout engine and the shared-prompt or packed forwards, on one tensor-parallel rank."""
    if dataset.has_images and not is_vl:
        raise DataError(f"rl_config.dataset_file = {dataset.path} holds images but actor_config.load = {model_dir} "
                        "is a text model: train a Qwen2.5-VL folder on it, or convert a text dataset")
    if not is_vl:
        return
    from mindgrpo.config import ConfigError

    rl, actor = config.rl_config, config.actor_config
    problems = []
    if actor.parallel_config.model_parallel > 1:
        problems.append(f"actor_config.parallel_config.model_parallel = {actor.parallel_config.model_parallel}: "
                        "tensor parallelism does not yet run the vision tower and M-RoPE; use 1 (data parallel "
                        "only)")
    if config.generate_config.backend != "native":
        problems.append(f"generate_config.backend = {config.generate_config.backend}: only the native rollout "
                        "engine takes image prompts; use native")
    if not rl.share_prompt and not actor.max_tokens_per_micro_batch:
        problems.append("rl_config.share_prompt = false: Qwen2.5-VL trains with the shared-prompt (or packed) "
                        "forward, which reads each prompt's image features once; set it to true")
    if rl.beta > 0 and config.ref_load != actor.load:
        problems.append(f"ref_config.load = {config.ref_load}: the reference shares the actor's frozen vision "
                        "tower, so it must be the actor's folder (leave ref_config.load empty)")
    if problems:
        raise ConfigError(f"actor_config.load = {model_dir} is a Qwen2.5-VL model:\n  - " + "\n  - ".join(problems))


def _check_same_tokenizer(dataset: PromptDataset, tokenizer: "Tokenizer", tokenizer_dir: str, hint: str) -> None:
    """Re-tokenize the first prompts with the template the file records: other ids mean another tokenizer."""
    template = dataset.metadata.get("prompt_template")
    if template not in PROMPT_TEMPLATES:
        return  # a MindRecord made elsewhere: nothing to compare against
    rows = range(min(_RECHECKED_ROWS, len(dataset)))
    expected = tokenizer.encode_batch([_rendered(dataset, template, i) for i in rows])
    for i, ids in zip(rows, expected):
        stored = dataset[i].prompt_ids
        if len(ids) != len(stored) or not np.array_equal(np.asarray(ids), stored):
            raise DataError(f"rl_config.dataset_file = {dataset.path} was tokenized with another tokenizer than "
                            f"the run's ({tokenizer_dir}): the prompt of source line {dataset[i].line_no} "
                            f"re-tokenizes to {len(ids)} different ids. {hint.capitalize()} --tokenizer_dir "
                            f"{tokenizer_dir}, or set rl_config.tokenizer_dir to the tokenizer it was made with")


def _rendered(dataset: PromptDataset, template: str, index: int) -> str:
    """Prompt ``index`` as the conversion rendered it (with images: through Qwen2.5-VL's chat template, one
    <|image_pad|> per merged patch of each stored grid)."""
    if dataset.image_files is None:
        return render_prompt(template, dataset.questions[index])
    from mindgrpo.data.images import image_token_count
    from mindgrpo.data.templates import render_vl_prompt

    merge = int(dataset.metadata["image_processor"].get("merge_size", 2))
    return render_vl_prompt(template, dataset.questions[index],
                            [image_token_count(grid, merge) for grid in dataset.image_files[index][1]])
