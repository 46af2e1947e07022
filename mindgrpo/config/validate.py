"""Every check of a GRPO config, before any work starts: one ConfigError that lists all the problems.

:func:`validate` checks the values and how they agree (and that every input path exists); it also puts the aliases
of a choice under their canonical names. Two checks need what only a run knows and are called by the trainer and
the doctor: :func:`check_micro_batches` (the update's static shapes) and :func:`check_parallel_layout` (the worker
count and the model's shape). The named choices come from :mod:`mindgrpo.choices`.
"""
from __future__ import annotations

import importlib.util
import os
import urllib.parse
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Tuple

from mindgrpo.choices import (COMPUTE_DTYPES, DECODE_IMPLS, DEVICE_TARGETS, EXECUTION_MODES,
                             GRAD_REDUCE_DTYPES, HEAD_IMPLS, IMPORTANCE_SAMPLING_LEVELS, KL_ALIASES,
                             KL_ESTIMATORS, LORA_TARGET_MODULES, LOSS_IMPLS, LOSS_TYPES,
                             LR_SCHEDULE_ALIASES, LR_SCHEDULES, OPTIMIZERS, PARAM_DTYPES,
                             REWARD_AGGREGATIONS, ROLLOUT_BACKENDS, ROLLOUT_CORRECTIONS, SCALE_REWARDS,
                             TOOL_SANDBOXES, canonical)
from mindgrpo.config.derived import Derived
from mindgrpo.config.load import ConfigWarning
from mindgrpo.config.schema import (ActorConfig, ConfigError, GenerateConfig, GRPOConfig, ParallelConfig, RLConfig,
                                    get_key, path_keys)

if TYPE_CHECKING:
    from mindgrpo.hf_config import Qwen2Spec

# Each key with a named choice: (its choices, the aliases validate renames to them).
CHOICES: Dict[str, Tuple[Tuple[str, ...], Optional[Mapping[str, str]]]] = {
    "rl_config.mode": (EXECUTION_MODES, None),
    "rl_config.device_target": (DEVICE_TARGETS, None),
    "rl_config.kl_estimator": (KL_ESTIMATORS, KL_ALIASES),
    "rl_config.loss_type": (LOSS_TYPES, None),
    "rl_config.importance_sampling_level": (IMPORTANCE_SAMPLING_LEVELS, None),
    "rl_config.rollout_correction": (ROLLOUT_CORRECTIONS, None),
    "rl_config.scale_rewards": (SCALE_REWARDS, None),
    "rl_config.loss_impl": (LOSS_IMPLS, None),
    "actor_config.compute_dtype": (COMPUTE_DTYPES, None),
    "actor_config.param_dtype": (PARAM_DTYPES, None),
    "actor_config.grad_reduce_dtype": (GRAD_REDUCE_DTYPES, None),
    "ref_config.compute_dtype": (COMPUTE_DTYPES, None),
    "actor_config.optimizer.type": (OPTIMIZERS, None),
    "actor_config.lr_schedule.type": (LR_SCHEDULES, LR_SCHEDULE_ALIASES),
    "generate_config.backend": (ROLLOUT_BACKENDS, None),
    "generate_config.decode_impl": (DECODE_IMPLS, None),
    "actor_config.head_impl": (HEAD_IMPLS, None),
    "reward_config.aggregation": (REWARD_AGGREGATIONS, None),
    "rl_config.tool_sandbox": (TOOL_SANDBOXES, None),
}


def validate(config: GRPOConfig, *, check_paths: bool = True) -> GRPOConfig:
    """Check values and (optionally) that every input path exists; raise one ConfigError listing all problems."""
    problems = (_choice_problems(config) + _range_problems(config) + _length_problems(config)
                + _shared_prompt_problems(config) + _packing_problems(config) + _layout_problems(config)
                + _reward_problems(config) + _generation_problems(config)
                + _vision_problems(config) + _model_source_problems(config) + _lora_problems(config)
                + _tool_problems(config))
    if config.generate_config.backend == "vllm":
        problems += _vllm_layout_problems(config)
    if check_paths:
        problems += _path_problems(config)
    if problems:
        where = f" in {config.config_path}" if config.config_path else ""
        raise ConfigError(f"invalid configuration{where}:\n  - " + "\n  - ".join(problems))
    for line in no_effect_settings(config):
        warnings.warn(line, ConfigWarning, stacklevel=1)  # one place: each line shows once however often validated
    return config


VLLM_KEYS = ("gpu_memory_utilization", "block_size", "max_model_len")
TOOL_KEYS = ("max_tool_turns", "max_tool_response_tokens", "tool_timeout", "tool_parallel", "tool_sandbox",
             "tool_sandbox_url")
LORA_KEYS = ("lora_alpha", "lora_target_modules")


def no_effect_settings(config: GRPOConfig) -> List[str]:
    """The keys set away from their defaults that the rest of the config leaves nothing to do, one line each naming
    the key, why, and what to change. :func:`validate` warns with them (a :class:`ConfigWarning`) rather than
    refusing: a recipe may keep such a key for when it switches the setting back (the tool demo's control run is
    ``rl_config.tools=[]``)."""
    rl, generate, actor = config.rl_config, config.generate_config, config.actor_config

    def changed(section, default, names):
        return [(name, getattr(section, name)) for name in names if getattr(section, name) != getattr(default, name)]

    lines = [f"generate_config.{name} = {value!r} has no effect: it is the vllm backend's, and "
             f"generate_config.backend is {generate.backend}; remove it (or set backend: vllm)"
             for name, value in changed(generate, GenerateConfig(), VLLM_KEYS) if generate.backend != "vllm"]
    lines += [f"rl_config.{name} = {value!r} has no effect: rl_config.tools is empty; remove it (or offer a tool)"
              for name, value in changed(rl, RLConfig(), TOOL_KEYS) if not rl.tools]
    if rl.max_steps > 0 and rl.epochs != RLConfig().epochs:
        lines.append(f"rl_config.epochs = {rl.epochs} has no effect: rl_config.max_steps = {rl.max_steps} sets the "
                     f"run's length; remove epochs (or set max_steps: 0 to run {rl.epochs} epochs)")
    lines += [f"actor_config.{name} = {value!r} has no effect: actor_config.lora_rank is 0 (LoRA off); remove it "
              "(or set lora_rank)" for name, value in changed(actor, ActorConfig(), LORA_KEYS) if actor.lora_rank == 0]
    return lines


def _model_source_problems(config: GRPOConfig) -> List[str]:
    """A reference or rollout folder the run would never read is refused, not ignored: a run pointed at another
    model must not train on the actor's weights without a word."""
    actor = config.actor_config.load
    problems: List[str] = []
    generate = config.generate_config.load
    if generate and not _same_folder(generate, actor):
        problems.append(f"generate_config.load (--generate_checkpoint_path) = {generate} differs from "
                        f"actor_config.load = {actor}: the rollout engine always generates with the actor's current "
                        "weights (native decodes over the actor's own Parameters; mindformers and vllm copy them in "
                        "before the first rollout), so this folder would never be used; leave it empty or set it to "
                        "the actor's folder")
    ref = config.ref_config.load
    if ref and config.rl_config.beta == 0 and not _same_folder(ref, actor):
        problems.append(f"ref_config.load (--ref_checkpoint_path) = {ref} would never be read: rl_config.beta = 0 "
                        "builds no reference model; set rl_config.beta > 0 for a KL penalty to it, or leave "
                        "ref_config.load empty")
    return problems


def _same_folder(a: str, b: str) -> bool:
    return bool(b) and os.path.realpath(a) == os.path.realpath(b)


def _vision_problems(config: GRPOConfig) -> List[str]:
    """Training the vision tower needs its gradient path (features per completion, tower in the optimizer)."""
    if config.actor_config.freeze_vision_tower:
        return []
    return ["actor_config.freeze_vision_tower = false: training the Qwen2.5-VL vision tower is not supported yet; "
            "set it to true (the tower stays frozen, as in verl's and MindSpeed-MM's geo3k recipes)"]


def _choice_problems(config: GRPOConfig) -> List[str]:
    """Each choice under its canonical name (an alias is renamed in place), or a problem naming the choices."""
    problems: List[str] = []
    for key, (choices, aliases) in CHOICES.items():
        parent, _, name = key.rpartition(".")
        try:
            setattr(get_key(config, parent), name, canonical(key, get_key(config, key), choices, aliases))
        except ValueError as err:
            problems.append(str(err))
    return problems


def _range_problems(config: GRPOConfig) -> List[str]:
    rl, sampling = config.rl_config, config.generate_config.sampling_config
    sched = config.actor_config.lr_schedule
    positive = {
        "rl_config.batch_size": rl.batch_size, "rl_config.num_generations": rl.num_generations,
        "rl_config.num_iterations": rl.num_iterations, "rl_config.max_prompt_length": rl.max_prompt_length,
        "rl_config.seq_length": rl.seq_length, "generate_config.sampling_config.max_tokens": sampling.max_tokens,
        "rl_config.prompt_bucket": rl.prompt_bucket,
        "actor_config.micro_batch_size": config.actor_config.micro_batch_size,
        "ref_config.ref_model_batch_size": config.ref_config.ref_model_batch_size,
        "generate_config.infer_model_batch_size": config.generate_config.infer_model_batch_size,
        "rl_config.save_max_ckpt_num": rl.save_max_ckpt_num, "rl_config.epochs": rl.epochs,
    }
    problems = [f"{k} = {v}: must be at least 1" for k, v in positive.items() if v < 1]
    nonneg = {"rl_config.max_steps": rl.max_steps,
              "rl_config.save_ckpt_interval": rl.save_ckpt_interval,
              "actor_config.lr_schedule.learning_rate": sched.learning_rate,
              "actor_config.lr_schedule.warmup_steps": sched.warmup_steps,
              "actor_config.optimizer.max_grad_norm": config.actor_config.optimizer.max_grad_norm,
              "generate_config.sampling_config.min_tokens": sampling.min_tokens}
    problems += [f"{k} = {v}: must not be negative" for k, v in nonneg.items() if v < 0]
    problems += rl.range_problems("rl_config.")
    actor = config.actor_config
    if actor.param_dtype == "float32" and actor.grad_reduce_dtype != "float32":
        problems.append(f"actor_config.grad_reduce_dtype = {actor.grad_reduce_dtype!r} with param_dtype 'float32': "
                        "float32 weights get float32 gradients; set grad_reduce_dtype: float32")
    if rl.entropy_coef > 0 and actor.parallel_config.model_parallel > 1:
        problems.append(f"rl_config.entropy_coef = {rl.entropy_coef} with actor_config.parallel_config."
                        "model_parallel > 1: the vocabulary-parallel entropy has no gradient; set entropy_coef: 0")
    if sampling.temperature <= 0:
        problems.append(f"generate_config.sampling_config.temperature = {sampling.temperature}: must be > 0 "
                        "(use top_k: 1 for greedy decoding)")
    if not 0 < sampling.top_p <= 1:
        problems.append(f"generate_config.sampling_config.top_p = {sampling.top_p}: must be in (0, 1]")
    return problems


def _length_problems(config: GRPOConfig) -> List[str]:
    rl, sampling = config.rl_config, config.generate_config.sampling_config
    problems: List[str] = []
    if sampling.min_tokens > sampling.max_tokens:
        problems.append(f"generate_config.sampling_config.min_tokens = {sampling.min_tokens} exceeds "
                        f"max_tokens = {sampling.max_tokens}")
    if rl.max_prompt_length + sampling.max_tokens > rl.seq_length:
        problems.append(f"rl_config.max_prompt_length ({rl.max_prompt_length}) + "
                        f"generate_config.sampling_config.max_tokens ({sampling.max_tokens}) exceeds "
                        f"rl_config.seq_length ({rl.seq_length}): raise seq_length or shorten one of them")
    # DAPO's overlong buffer is the last tokens before max_tokens: it must leave room for unpunished lengths.
    if not 0 <= rl.overlong_buffer_length < sampling.max_tokens:
        problems.append(f"rl_config.overlong_buffer_length = {rl.overlong_buffer_length}: must be in [0, "
                        f"generate_config.sampling_config.max_tokens = {sampling.max_tokens}) (0: no overlong "
                        "penalty)")
    if not rl.overlong_penalty_factor >= 0:
        problems.append(f"rl_config.overlong_penalty_factor = {rl.overlong_penalty_factor}: must not be negative")
    return problems


def _micro_batch_sizes(config: GRPOConfig) -> Dict[str, int]:
    return {"actor_config.micro_batch_size": config.actor_config.micro_batch_size,
            "ref_config.ref_model_batch_size": config.ref_config.ref_model_batch_size}


def _generation_problems(config: GRPOConfig) -> List[str]:
    """Dynamic sampling's round limit, and steps_per_generation: a checkpoint saved in the middle of a generation
    could not resume it exactly (its rollouts are not saved), so saves fall between generations."""
    rl = config.rl_config
    problems: List[str] = []
    if rl.max_generation_batches < 1:
        problems.append(f"rl_config.max_generation_batches = {rl.max_generation_batches}: must be at least 1 (the "
                        "rounds of generation one step may take under dynamic_sampling)")
    if rl.steps_per_generation < 1:
        problems.append(f"rl_config.steps_per_generation = {rl.steps_per_generation}: must be at least 1")
        return problems
    for key, value in (("save_ckpt_interval", rl.save_ckpt_interval), ("max_steps", rl.max_steps)):
        if value % rl.steps_per_generation:
            problems.append(f"rl_config.{key} = {value}: must be a multiple of rl_config.steps_per_generation = "
                            f"{rl.steps_per_generation} (checkpoints are saved between generations only)")
    return problems


def _tool_problems(config: GRPOConfig) -> List[str]:
    """Multi-turn tool rollouts run in the native engine."""
    rl = config.rl_config
    problems = [f"rl_config.{key} = {getattr(rl, key)}: must be at least 1"
                for key in ("max_tool_turns", "max_tool_response_tokens", "tool_parallel") if getattr(rl, key) < 1]
    if not rl.tool_timeout > 0:
        problems.append(f"rl_config.tool_timeout = {rl.tool_timeout}: must be a positive number of seconds")
    if not rl.tools:  # the sandbox settings then have no effect: no_effect_settings warns about them
        return problems
    url_problem = sandbox_url_problem(rl.tool_sandbox_url)
    if rl.tool_sandbox == "remote" and url_problem:
        problems.append(f"rl_config.tool_sandbox_url = {rl.tool_sandbox_url!r}: tool_sandbox remote {url_problem}")
    elif rl.tool_sandbox != "remote" and rl.tool_sandbox_url:
        problems.append(f"rl_config.tool_sandbox_url is set but rl_config.tool_sandbox = {rl.tool_sandbox}: set "
                        "tool_sandbox: remote to send the code there, or leave the URL empty")
    if config.generate_config.backend != "native":
        problems.append(f"rl_config.tools = {rl.tools} needs generate_config.backend: native (the engine that "
                        f"pauses a row for its tool calls); it is {config.generate_config.backend}")
    return problems


def sandbox_url_problem(url: str) -> str:
    """Why ``url`` cannot be the remote sandbox's service ("" when it can): it must be an http(s) URL with a host.
    The one reading of the URL, for ``rl_config.tool_sandbox_url`` here and for
    :class:`~mindgrpo.tools.remote.RemoteSandbox` (``mindgrpo eval --tool-sandbox-url``)."""
    try:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme in ("http", "https") and parts.hostname:
            return ""
    except ValueError:  # e.g. an unclosed [IPv6 address
        pass
    return "needs the service's http(s) /run_code URL, e.g. http://sandbox:8080/run_code"


def _shared_prompt_problems(config: GRPOConfig) -> List[str]:
    num_generations = config.rl_config.num_generations
    if not config.rl_config.share_prompt:
        return []
    return [f"{key} = {size} is not a multiple of rl_config.num_generations = {num_generations}: "
            "rl_config.share_prompt needs whole groups per micro-batch (change the size, or set "
            "rl_config.share_prompt: false)"
            for key, size in _micro_batch_sizes(config).items() if size % num_generations]


def _packing_problems(config: GRPOConfig) -> List[str]:
    budget, key = config.actor_config.max_tokens_per_micro_batch, "actor_config.max_tokens_per_micro_batch"
    limit = config.generate_config.sampling_config.max_tokens
    if budget == 0:
        return []
    if budget < 0:
        return [f"{key} = {budget}: must not be negative (0: padded micro-batches)"]
    if budget < limit:
        return [f"{key} = {budget} is below generate_config.sampling_config.max_tokens = {limit}: a completion at "
                f"the limit must fit one micro-batch; raise it (or 0 for padded micro-batches)"]
    if not config.rl_config.share_prompt:
        return [f"{key} = {budget} packs completions for the shared-prompt forward; set rl_config.share_prompt: "
                "true (or the key to 0)"]
    return []


def _layout_problems(config: GRPOConfig) -> List[str]:
    """The layouts of actor, reference and rollout engine must agree (the model's shape is checked later, by
    check_parallel_layout, once config.json is read)."""
    actor = config.actor_config.parallel_config
    problems: List[str] = []
    tensor_parallel = actor.model_parallel > 1
    sections = [("ref_config", config.ref_config.parallel_config)]
    backend = config.generate_config.backend
    if backend != "vllm":  # vllm reshards to its own model_parallel (checked with the backend's settings)
        sections.append(("generate_config", config.generate_config.parallel_config))
    for name, layout in sections:
        if (layout.data_parallel, layout.model_parallel, layout.pipeline_stage) == (1, 1, 1):
            continue  # left at the default: the actor's layout is used
        for key in ("data_parallel", "model_parallel", "pipeline_stage"):
            if getattr(layout, key) != getattr(actor, key):
                problems.append(f"{name}.parallel_config.{key} = {getattr(layout, key)} differs from "
                                f"actor_config.parallel_config.{key} = {getattr(actor, key)}: the "
                                f"{'reference model' if name == 'ref_config' else backend + ' rollout engine'} "
                                "runs on the actor's ranks with the actor's slices; use the same value")
    if tensor_parallel and backend == "mindformers":
        problems.append("generate_config.backend: mindformers cannot run on tensor-parallel slices (MindFormers' "
                        "generate() runs a whole model); use generate_config.backend: native")
    if backend == "mindformers" and importlib.util.find_spec("mindformers") is None:
        problems.append("generate_config.backend: mindformers needs MindFormers, which is not installed: pip install "
                        '"mindgrpo[mindformers]" (on MindSpore 2.10: pip install --no-deps mindformers==1.9.0), or '
                        "use generate_config.backend: native")
    return problems


def _lora_problems(config: GRPOConfig) -> List[str]:
    """LoRA's keys, and what it does not run with yet."""
    actor = config.actor_config
    if actor.lora_rank < 0:
        return [f"actor_config.lora_rank = {actor.lora_rank}: must be 0 (off) or a positive rank"]
    if actor.lora_rank == 0:
        return []
    problems: List[str] = []
    if actor.lora_alpha <= 0:
        problems.append(f"actor_config.lora_alpha = {actor.lora_alpha}: must be positive")
    unknown = [m for m in actor.lora_target_modules if m not in LORA_TARGET_MODULES]
    if unknown or not actor.lora_target_modules:
        problems.append(f"actor_config.lora_target_modules = {list(actor.lora_target_modules)}: name one or more "
                        f"of {', '.join(LORA_TARGET_MODULES)}")
    if config.generate_config.backend != "native":
        problems.append(f"actor_config.lora_rank = {actor.lora_rank} with generate_config.backend = "
                        f"{config.generate_config.backend}: only the native engine decodes with the adapters; set "
                        "generate_config.backend: native")
    if config.ref_config.load and not _same_folder(config.ref_config.load, actor.load):
        problems.append(f"ref_config.load = {config.ref_config.load} with actor_config.lora_rank = "
                        f"{actor.lora_rank}: the LoRA reference is the actor's backbone with the adapters off; "
                        "leave ref_config.load empty")
    return problems


def _reward_problems(config: GRPOConfig) -> List[str]:
    rewards, problems = config.reward_config, []
    if len(rewards.verifier_weight) != len(rewards.verifier_function):
        problems.append(f"reward_config.verifier_weight has {len(rewards.verifier_weight)} entries but "
                        f"reward_config.verifier_function has {len(rewards.verifier_function)}: give one weight "
                        "per verifier")
    if not rewards.verifier_function:
        problems.append("reward_config.verifier_function is empty: name at least one verifier")
    if not 0 <= rewards.verifier_timeout < float("inf"):  # also refuses NaN
        problems.append(f"reward_config.verifier_timeout = {rewards.verifier_timeout}: must be a finite number of "
                        "seconds >= 0 (0: no limit)")
    if rewards.verifier_parallel < 0:
        problems.append(f"reward_config.verifier_parallel = {rewards.verifier_parallel}: must not be negative "
                        "(0: verifiers run in the trainer's process)")
    if rewards.aggregation == "normalize_then_sum":
        scale_rewards = config.rl_config.scale_rewards
        if scale_rewards != "batch":
            problems.append(f"reward_config.aggregation = normalize_then_sum normalises each verifier within its "
                            f"group, then the sum over the batch (TRL, GDPO), but rl_config.scale_rewards = "
                            f"{scale_rewards!r}: set rl_config.scale_rewards: batch")
        if rewards.gate_accuracy_on_format:
            problems.append("reward_config.aggregation = normalize_then_sum normalises each verifier on its own, "
                            "and reward_config.gate_accuracy_on_format multiplies accuracy by format: choose one")
    return problems


def _vllm_layout_problems(config: GRPOConfig) -> List[str]:
    """vLLM's tensor_parallel_size is generate_config.parallel_config.model_parallel; the weight sync reshards the
    actor into it (mindgrpo.parallel.resharding), which needs it to split the heads, KV heads, MLP and vocabulary
    as mindgrpo.parallel.layout.TPLayout does. Needs the actor's config.json: without a readable one there is
    nothing to check here (the path checks report a missing folder)."""
    key = "generate_config.parallel_config.model_parallel"
    tp = config.generate_config.parallel_config.model_parallel
    if tp < 1:
        return [f"{key} = {tp}: must be at least 1"]
    if not config.actor_config.load:
        return []
    # Imported on use: importing the config reads nothing of a model.
    from mindgrpo.hf_config import ModelConfigError, read_hf_config  # noqa: PLC0415
    from mindgrpo.parallel.layout import LayoutError, TPLayout  # noqa: PLC0415

    try:
        hf_config = read_hf_config(config.actor_config.load)
    except (OSError, ModelConfigError):
        return []
    try:
        TPLayout.for_hf_config(hf_config, tp, 0)
    except LayoutError as err:
        return [f"{key} = {tp} is vLLM's tensor_parallel_size for generate_config.backend vllm, and it cannot split "
                f"the model in {config.actor_config.load}: {err}. Choose a divisor of the attention heads that also "
                "divides (or is a multiple of) the key/value heads and divides the MLP size and vocabulary"]
    return []


def _path_problems(config: GRPOConfig) -> List[str]:
    problems: List[str] = []
    hints = {
        "rl_config.dataset_file": "convert your data first: python tools/rlhf_data.py --help",
        "actor_config.load": "point it at a Hugging Face Qwen2.5 folder with config.json and *.safetensors",
    }
    required = {"rl_config.dataset_file", "actor_config.load"}
    for key in path_keys("input"):
        value = get_key(config, key)
        if not value:
            if key in required:
                problems.append(f"{key} is not set: {hints[key]}")
            continue
        if not os.path.exists(value):
            problems.append(f"{key} = {value}: no such file or folder" + (f"; {hints[key]}" if key in hints else ""))
    for key in path_keys("output"):
        value = get_key(config, key)
        if value and not _writable(value):
            problems.append(f"{key} = {value}: cannot create or write this folder")
    return problems + _resume_problems(config)


def _resume_problems(config: GRPOConfig) -> List[str]:
    """A run killed before its first checkpoint resumes from step 0 (its folder holds at least its lock file); a
    folder no run ever wrote to means a mistyped path, which would silently start over."""
    rl = config.rl_config
    if not rl.resume_training or any(_holds_files(folder) for folder in (config.checkpoint_dir, rl.output_dir)):
        return []
    return [f"rl_config.resume_training (--resume_training): nothing to resume, no run ever wrote to "
            f"rl_config.output_dir = {rl.output_dir} or the checkpoint folder {config.checkpoint_dir} (both absent "
            "or empty); drop --resume_training to start a new run, or point rl_config.output_dir (or "
            "--save_checkpoint_dir) at the run to continue"]


def _holds_files(folder: str) -> bool:
    path = Path(folder)
    return path.is_dir() and any(path.iterdir())


def _writable(path: str) -> bool:
    probe = Path(path)
    while not probe.exists():
        if probe.parent == probe:
            return False
        probe = probe.parent
    return probe.is_dir() and os.access(probe, os.W_OK | os.X_OK)


# ----------------------------------------------------------------------------------------------------------------
# Checks the trainer and the doctor run with what only a run knows

def micro_batch_problems(config: GRPOConfig) -> Dict[str, str]:
    """The update's static-shape rule: each micro-batch size (key -> problem) that does not divide a rank's
    completions per step, so every micro-batch has the same shape (GRAPH mode compiles one graph per width). Not
    part of :func:`validate`: the policy and the planner take any size; the trainer applies it before building
    anything, the doctor with the nearest size that works."""
    completions = Derived(config).completions_per_rank
    return {key: f"{key} = {size} does not divide rl_config.batch_size x num_generations = {completions}: every "
                 "micro-batch must have the same static shape"
            for key, size in _micro_batch_sizes(config).items() if completions % size}


def check_micro_batches(config: GRPOConfig) -> None:
    """Raise ConfigError if a micro-batch size breaks :func:`micro_batch_problems`' rule."""
    problems = micro_batch_problems(config)
    if problems:
        raise ConfigError("invalid micro-batch sizes:\n  - " + "\n  - ".join(problems.values()))


def check_parallel_layout(parallel: ParallelConfig, *, world_size: int, device_target: str,
                          model: Optional[Qwen2Spec], key: str = "actor_config.parallel_config") -> None:
    """Check a parallel layout against the worker count and the shape of ``model`` (the same on CPU and Ascend:
    tensor parallelism is explicit collectives, see mindgrpo.parallel.layers): model_parallel must split its heads,
    KV heads, MLP and vocabulary as :class:`~mindgrpo.parallel.layout.TPLayout` cuts them. ``model`` None (no
    readable config.json) checks the worker count only. Raises ConfigError naming the number that is wrong.
    """
    dp, mp, pp = parallel.data_parallel, parallel.model_parallel, parallel.pipeline_stage
    problems = [f"{key}.{name} = {value}: must be at least 1"
                for name, value in (("data_parallel", dp), ("model_parallel", mp), ("pipeline_stage", pp))
                if value < 1]
    if not problems:
        if dp * mp * pp != world_size:
            problems.append(f"{key}: data_parallel ({dp}) x model_parallel ({mp}) x pipeline_stage ({pp}) = "
                            f"{dp * mp * pp}, but {world_size} worker(s) are running: make the product equal the "
                            "msrun --worker_num")
        if pp > 1:
            problems.append(f"{key}.pipeline_stage = {pp}: pipeline parallelism is not implemented; use "
                            "model_parallel (tensor parallel) x data_parallel (see `python -m mindgrpo plan`)")
        if model is not None:
            # The layout the model, the planner and the doctor build (pure numpy), imported on use as above.
            from mindgrpo.parallel.layout import TPLayout  # noqa: PLC0415

            problems += [f"{key}.{p}" for p in TPLayout.of(model, mp).problems()]
    if problems:
        raise ConfigError("invalid parallel layout:\n  - " + "\n  - ".join(problems))
