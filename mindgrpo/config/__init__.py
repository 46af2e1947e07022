"""Typed GRPO configuration, loaded from a MindRLHF-style ``grpo_config.yaml``: the leaf every other package reads.

=================================  ===============================================================================
module                             what it holds
=================================  ===============================================================================
:mod:`~mindgrpo.config.schema`     the dataclasses of the yaml's key groups, their defaults and documentation
                                   (``python -m mindgrpo config-help``)
:mod:`~mindgrpo.config.load`       yaml + MindRLHF's flags + ``group.key=value`` overrides -> a config
:mod:`~mindgrpo.config.validate`   every check, with the problems listed together
:mod:`~mindgrpo.config.derived`    the values that follow from a config (completions per rank, prompt widths, ...)
=================================  ===============================================================================

It imports neither MindSpore nor another mindgrpo package, except the import-free registry of named choices
(:mod:`mindgrpo.choices`).
"""
from mindgrpo.config.derived import Derived
from mindgrpo.config.load import CLI_FLAGS, ConfigWarning, dump_yaml, load_config
from mindgrpo.config.schema import (PROMPT_LENGTH_BUCKET, ActorConfig, ConfigError, GenerateConfig, GRPOConfig,
                                    LRScheduleConfig, OptimizerConfig, ParallelConfig, RefConfig, RewardConfig,
                                    RLConfig, SamplingConfig, describe, get_key, path_keys)
from mindgrpo.config.validate import check_micro_batches, check_parallel_layout, micro_batch_problems, validate

__all__ = [
    "ActorConfig", "CLI_FLAGS", "ConfigError", "ConfigWarning", "Derived", "GenerateConfig", "GRPOConfig",
    "LRScheduleConfig", "OptimizerConfig", "PROMPT_LENGTH_BUCKET", "ParallelConfig", "RLConfig", "RefConfig",
    "RewardConfig", "SamplingConfig", "check_micro_batches", "check_parallel_layout", "describe", "dump_yaml",
    "get_key", "load_config", "micro_batch_problems", "path_keys", "validate",
]
