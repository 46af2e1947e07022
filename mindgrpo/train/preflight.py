"""Every check a run needs only its config, data, verifiers, ``config.json`` and launcher for, before any model is
built, graph compiled or output file written (:func:`preflight`, the trainer's first act).

Each mismatch below used to surface minutes later (a misspelled verifier after the models were loaded, a 7B run
on a host without CANN as MindSpore's C++ trace), as a shape error deep in a compiled graph, or not at all (a
MindRecord tokenized with another vocabulary trains on garbage prompts without a single error). Every message names
the file, flag or config key to change; the command line prints it as one ``error:`` line (exit 2).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence, Tuple

import numpy as np

from mindgrpo.config import ConfigError, check_micro_batches, check_parallel_layout, validate
from mindgrpo.data import PROMPT_TEMPLATES, DataError, PromptDataset, render_prompt
from mindgrpo.data.templates import render_tool_prompt
from mindgrpo.parallel.groups import launched_by_msrun

if TYPE_CHECKING:
    from mindgrpo.config import GRPOConfig
    from mindgrpo.data.tokenizer import Tokenizer
    from mindgrpo.rewards.scorer import RewardScorer
    from mindgrpo.tools.registry import Tool

_RECHECKED_ROWS = 8  # prompts re-tokenized to recognise the tokenizer a MindRecord was made with


@dataclass
class RunInputs:
    """What the checks read, handed to the trainer so nothing is read twice."""
    tokenizer: "Tokenizer"
    dataset: PromptDataset
    scorer: "RewardScorer"
    tools: Tuple["Tool", ...] = ()


def preflight(config: "GRPOConfig", *, check_paths: bool = True) -> RunInputs:
    """Run every check that needs no model, graph or output file; raise ConfigError or DataError naming the key.

    In order: the values and input paths (:func:`validate`), the micro-batch shapes, the device, the verifiers,
    the launcher and the parallel layout against each model's config.json, then the tokenizer and data against the
    models. Builds nothing and writes nothing (reading config.json imports MindFormers: the slowest part)."""
    from mindgrpo.data.tokenizer import TokenizerError, load_tokenizer

    validate(config, check_paths=check_paths)
    tools = run_tools(config)
    scorer = check_settings(config)
    try:
        world_size = launched_world_size()
        check_launch(config, world_size)
        try:
            tokenizer = load_tokenizer(config.tokenizer_dir)
        except (OSError, TokenizerError) as err:
            raise ConfigError(f"rl_config.tokenizer_dir (--tokenizer_dir; empty: actor_config.load) = "
                              f"{config.tokenizer_dir}: {err}") from None
        dataset = PromptDataset(config.rl_config.dataset_file)
        check_run_inputs(config, tokenizer, dataset,
                         world_size=world_size // config.actor_config.parallel_config.model_parallel)
        check_dataset_tools(dataset, config.rl_config.tools, tools)
    except BaseException:
        scorer.close()  # its verifier worker processes, if it started any
        raise
    return RunInputs(tokenizer, dataset, scorer, tools)


def run_tools(config: "GRPOConfig") -> Tuple["Tool", ...]:
    """The tools of ``rl_config.tools``, resolved: a misspelled name or a user tool that does not import is a
    check, and so is the python tool's sandbox (``rl_config.tool_sandbox``): where it cannot run (the kernel refuses
    bwrap's namespaces, the remote service does not answer) the run stops here, never runs the code unisolated."""
    rl = config.rl_config
    if not rl.tools:
        return ()
    from mindgrpo.tools.registry import check_sandboxes, resolve_tools, sandbox_for

    try:
        tools = resolve_tools(rl.tools, sandbox_for(rl.tool_sandbox, rl.tool_sandbox_url))
    except ValueError as err:  # ToolSpecError
        raise ConfigError(f"rl_config.tools: {err}") from None
    try:
        check_sandboxes(tools, "rl_config.tool_sandbox")
    except ValueError as err:
        raise ConfigError(str(err)) from None
    return tools


def check_dataset_tools(dataset: PromptDataset, specs: Sequence[str], tools: Tuple["Tool", ...]) -> None:
    """The prompts must offer exactly the tools the run answers (``specs``: ``rl_config.tools``; ``tools``: them
    resolved): a model offered a tool the run does not run, or never told of one it does, learns nothing from it."""
    offered = dataset.metadata.get("tools", [])
    names = [tool.name for tool in tools]
    if list(offered) != list(specs):
        flag = f"--tools {' '.join(offered)}" if offered else "no --tools"
        raise DataError(f"rl_config.dataset_file = {dataset.path} was converted with {flag}, but rl_config.tools = "
                        f"{list(specs)}: convert it again with tools/rlhf_data.py --tools <the same tools>, or set "
                        "rl_config.tools to the tools its prompts offer")
    if offered and dataset.metadata.get("tool_signatures") != [dict(tool.signature) for tool in tools]:
        raise DataError(f"rl_config.dataset_file = {dataset.path}: its prompts describe the tools {names} otherwise "
                        "than they are now (a docstring or signature changed since conversion); convert it again "
                        "with tools/rlhf_data.py --tools")


def check_settings(config: "GRPOConfig") -> "RewardScorer":
    """The checks that read no input file: the micro-batch shapes, the device and the verifiers. The embedded demo
    runs them (with :func:`validate` without paths) before it makes its model and data, so that a misspelled
    verifier leaves nothing behind. Returns the scorer (close it if the run goes no further)."""
    check_micro_batches(config)
    check_device(config.rl_config.device_target)
    check_gradient_dtype(config)
    check_compile_cache()
    return reward_scorer(config)


COMPILE_CACHE_VARIABLES = ("MS_COMPILER_CACHE_ENABLE", "MS_DEV_FORCE_USE_COMPILE_CACHE")


def check_compile_cache() -> None:
    """MindSpore's compile cache reloads mindgrpo's step graphs into the wrong places without an error: the demo's
    second run with ``MS_COMPILER_CACHE_ENABLE=1`` sampled the same completions as the first but logged a step-1
    pg_loss of 0.277 instead of -0.0025, and its rewards drifted from step 2 (MindSpore 2.9, CPU). A run with it on
    would train on wrong gradients, so it is refused."""
    on = [name for name in COMPILE_CACHE_VARIABLES if os.environ.get(name, "").strip() not in ("", "0")]
    if on:
        raise ConfigError(f"{on[0]}={os.environ[on[0]]}: MindSpore's compile cache reloads mindgrpo's step graphs "
                          "wrongly (silently wrong losses and gradients); unset it before starting")


def launched_world_size() -> int:
    """The worker count msrun exported to this process (1 for a plain process): known before any process group."""
    return int(os.environ.get("MS_WORKER_NUM", "1")) if launched_by_msrun() else 1


def check_device(target: str) -> None:
    """``device_target: Ascend`` needs MindSpore's Ascend backend loaded, which needs CANN's libraries: MindSpore
    tries to load it at import and keeps the loader's error (a host without CANN, or without its environment
    sourced, fails here and not minutes later in ``set_device``'s C++ trace)."""
    if target != "Ascend":
        return
    from mindspore._c_expression import MSContext  # the record mindspore.device_context.ascend reads

    context = MSContext.get_instance()
    if context.is_pkg_support_device("Ascend"):
        return
    reason = next((line.strip() for line in context.load_plugin_error().splitlines() if line.strip()),
                  "no loader message")
    raise ConfigError(f"rl_config.device_target = Ascend, but MindSpore cannot load its Ascend backend here "
                      f"({reason}): install CANN and source its environment before starting (e.g. `source "
                      "/usr/local/Ascend/ascend-toolkit/set_env.sh`, which sets ASCEND_HOME_PATH and "
                      "LD_LIBRARY_PATH; `python -m mindgrpo doctor` checks the device), or set "
                      "rl_config.device_target=CPU")


def check_gradient_dtype(config: "GRPOConfig") -> None:
    """bfloat16 gradient buffers are written in place by the step graphs, and MindSpore's CPU backend has no
    bfloat16 Assign (nor Mul): they need Ascend. (bfloat16 *weights* run on CPU: the optimizer writes them from the
    host there, see mindgrpo.train.optim.)"""
    if config.actor_config.grad_reduce_dtype != "bfloat16":
        return
    target = config.rl_config.device_target
    if target == "auto":
        from mindspore._c_expression import MSContext

        target = "Ascend" if MSContext.get_instance().is_pkg_support_device("Ascend") else "CPU"
    if target != "Ascend":
        raise ConfigError(f"actor_config.grad_reduce_dtype = bfloat16 on {target}: MindSpore's {target} backend "
                          "cannot write bfloat16 gradient buffers in place; set actor_config.grad_reduce_dtype: "
                          "float32 (bfloat16 weights still train, with float32 gradients)")


def check_launch(config: "GRPOConfig", world_size: int) -> None:
    """The layout against msrun's worker count and against the actor's (and a separate reference's) config.json:
    heads, KV heads, MLP and vocabulary must split over model_parallel."""
    from mindgrpo.hf_config import ModelConfigError, qwen2_spec, read_hf_config

    parallel = config.actor_config.parallel_config
    workers = parallel.data_parallel * parallel.model_parallel * parallel.pipeline_stage
    unlaunched = None
    if workers > 1 and not launched_by_msrun():
        unlaunched = (f"actor_config.parallel_config: data_parallel x model_parallel = {workers} workers, but this "
                      f"process was not started by msrun: launch it as `msrun --worker_num={workers} "
                      f"--local_worker_num={workers} examples/grpo/main.py --config ...` (scripts/run_grpo_8p.sh), or "
                      "set data_parallel and model_parallel to 1")
        world_size = workers  # judge the shapes as msrun would run them
    models = [("actor_config.load", config.actor_config.load)]
    if config.rl_config.beta > 0 and config.ref_load != config.actor_config.load:
        models.append(("ref_config.load", config.ref_load))
    for key, folder in models:
        try:
            model = qwen2_spec(read_hf_config(folder))
        except (OSError, ModelConfigError) as err:
            raise ConfigError(f"{key} = {folder}: {err}") from None
        try:
            check_parallel_layout(parallel, world_size=world_size, device_target=config.rl_config.device_target,
                                  model=model)
        except ConfigError as err:
            raise ConfigError(f"{err} (the model of {key} = {folder})"
                              + (f"\n  - {unlaunched}" if unlaunched else "")) from None
    if unlaunched:
        raise ConfigError(unlaunched)


def reward_scorer(config: "GRPOConfig") -> "RewardScorer":
    """The run's scorer: resolving every verifier (a misspelled name, a module that does not import, a function
    with the wrong signature) is a check."""
    from mindgrpo.rewards.scorer import RewardScorer

    reward = config.reward_config
    try:
        return RewardScorer(reward.verifier_function, reward.verifier_weight,
                            gate_accuracy_on_format=reward.gate_accuracy_on_format,
                            fallback_last_number=reward.fallback_last_number, aggregation=reward.aggregation,
                            num_generations=config.rl_config.num_generations,
                            verifier_timeout=reward.verifier_timeout, verifier_parallel=reward.verifier_parallel,
                            shuffle_rewards=reward.shuffle_rewards)
    except ValueError as err:  # VerifierSpecError included; each message names reward_config.verifier_*
        raise ConfigError(f"{err} (--verifier_function / --verifier_weight)") from None


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
    from mindgrpo.hf_config import qwen2_spec, read_hf_config  # lazy: the preflight's import loads no model code

    models = [("actor_config.load", config.actor_config.load)]
    if rl.beta > 0 and config.ref_load != config.actor_config.load:  # beta = 0 never builds the reference
        models.append(("ref_config.load", config.ref_load))
    for key, model_dir in models:
        spec = qwen2_spec(read_hf_config(model_dir))
        if key == "actor_config.load":
            _check_vision_fits(config, dataset, model_dir, spec.is_vl)
        vocab = spec.vocab_size
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
    if actor.lora_rank:
        problems.append(f"actor_config.lora_rank = {actor.lora_rank}: LoRA on Qwen2.5-VL is not built yet (its "
                        "checkpoints and resume do not carry the vision tower); set lora_rank: 0")
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
    if dataset.metadata.get("tools"):
        return render_tool_prompt(template, dataset.questions[index], dataset.metadata["tool_signatures"])
    if dataset.image_files is None:
        return render_prompt(template, dataset.questions[index])
    from mindgrpo.data.images import image_token_count
    from mindgrpo.data.templates import render_vl_prompt

    merge = int(dataset.metadata["image_processor"].get("merge_size", 2))
    return render_vl_prompt(template, dataset.questions[index],
                            [image_token_count(grid, merge) for grid in dataset.image_files[index][1]])
