"""Every named choice a config key accepts, in one place (as verl's ``core_algos`` registries).

The config validates against these tuples and the modules that implement a choice dispatch on the same names, so a
new variant is added here and where it is computed, never copied by hand into the config. This module imports
nothing: it sits below every package (the config, the kernels, the models, the rollout engines, the rewards and
the tools all read it), so any of them can name a choice without loading another's code or MindSpore.
"""
from __future__ import annotations

from typing import Mapping, Tuple

# The policy loss (algorithm/loss.py; TRL 1.16's names): the four clipped-surrogate reductions over tokens and
# completions, and two other surrogates, CISPO (clipped, detached IS weight x log-prob) and SAPO (a sigmoid-gated
# soft clip), which TRL reduces as dapo and grpo respectively (LOSS_REDUCTIONS).
CLIPPED_LOSS_TYPES: Tuple[str, ...] = ("grpo", "bnpo", "dr_grpo", "dapo")
LOSS_TYPES: Tuple[str, ...] = CLIPPED_LOSS_TYPES + ("cispo", "sapo")
LOSS_REDUCTIONS: Mapping[str, str] = {"cispo": "dapo", "sapo": "grpo"}
# Correction of the rollout engine's log-prob drift (algorithm/loss.py; TRL's vllm_importance_sampling_mode, plus
# "none" for its vllm_importance_sampling_correction=False): a per-token or per-sequence importance weight
# exp(old - sampling), truncated at the cap or zeroed above it.
ROLLOUT_CORRECTIONS: Tuple[str, ...] = ("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
# Where the importance ratio is taken (algorithm/loss.py; TRL's importance_sampling_level): one per token, or one
# length-normalised ratio per sequence (GSPO).
IMPORTANCE_SAMPLING_LEVELS: Tuple[str, ...] = ("token", "sequence")
# How the per-token loss runs: one fused custom op, or the plain MindSpore-ops twin it is tested against.
LOSS_IMPLS: Tuple[str, ...] = ("fused", "plain")
# Per-token KL estimators (algorithm/kl.py). The fused kernels take the index into this tuple.
KL_ESTIMATORS: Tuple[str, ...] = ("k1", "k2", "k3")
# verl's names for the same estimators.
KL_ALIASES: Mapping[str, str] = {"kl": "k1", "mse": "k2", "low_var_kl": "k3"}
# What a group's centred rewards are divided by (algorithm/advantages.py).
SCALE_REWARDS: Tuple[str, ...] = ("group", "batch", "none")
# How several verifiers' scores become one reward (rewards/scorer.py).
REWARD_AGGREGATIONS: Tuple[str, ...] = ("sum_then_normalize", "normalize_then_sum")
# Rollout engines (rollout/backends/) and the native engine's decode step (fused kernels or plain ops).
ROLLOUT_BACKENDS: Tuple[str, ...] = ("native", "mindformers", "vllm")
DECODE_IMPLS: Tuple[str, ...] = ("fused", "plain")
# How the vocabulary head and its log-softmax run in the training-side passes (ops/head_logprobs.py): one chunked
# kernel that never holds [tokens, vocab], or the plain ops (logits, then log_softmax) it is tested against.
HEAD_IMPLS: Tuple[str, ...] = ("fused", "plain")
# Learning-rate schedules (train/optim.py), with MindRLHF's names as aliases.
LR_SCHEDULES: Tuple[str, ...] = ("constant", "cosine", "linear")
LR_SCHEDULE_ALIASES: Mapping[str, str] = {"CosineWithWarmUpLR": "cosine", "cosine_with_warmup": "cosine",
                                          "ConstantWarmUpLR": "constant"}
OPTIMIZERS: Tuple[str, ...] = ("AdamW",)
# Matmul dtypes of the actor and reference models (bfloat16 and float16 are Ascend's: CPU has no bf16 MatMul).
COMPUTE_DTYPES: Tuple[str, ...] = ("float32", "bfloat16", "float16")
# The actor's working weights (bfloat16: fp32 master weights and moments live only in the optimizer, train/optim.py)
# and the dtype its gradients are accumulated and reduced in.
PARAM_DTYPES: Tuple[str, ...] = ("float32", "bfloat16")
GRAD_REDUCE_DTYPES: Tuple[str, ...] = ("float32", "bfloat16")
# MindSpore's execution modes (compiled or eager) and the devices a run may ask for ("auto": what MindSpore finds).
EXECUTION_MODES: Tuple[str, ...] = ("graph", "pynative")
DEVICE_TARGETS: Tuple[str, ...] = ("auto", "CPU", "Ascend")

# Where the python tool runs model-written code (tools/registry.py SANDBOXES): kernel namespaces through bubblewrap,
# a SandboxFusion service, or a plain child process that isolates nothing from code written to escape.
TOOL_SANDBOXES: Tuple[str, ...] = ("bwrap", "process", "remote")

# The linears LoRA may adapt (models/lora.py), by Hugging Face module name: every linear of a Qwen2 decoder layer.
LORA_TARGET_MODULES: Tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def canonical(key: str, value: str, choices: Tuple[str, ...], aliases: Mapping[str, str] | None = None) -> str:
    """``value`` under its canonical name; a ValueError naming ``key`` and the choices when it is none of them."""
    name = (aliases or {}).get(value, value)
    if name not in choices:
        also = f" (or {', '.join(aliases)})" if aliases else ""
        raise ValueError(f"{key} = {value!r}: choose one of {', '.join(choices)}{also}")
    return name


def canonical_kl_estimator(name: str) -> str:
    """Map a KL estimator name (``k1``/``kl``, ``k2``/``mse``, ``k3``/``low_var_kl``) to its canonical form."""
    return canonical("kl_estimator", name, KL_ESTIMATORS, KL_ALIASES)
