"""Loading a GRPO config: a MindRLHF-style yaml, MindRLHF's command-line flags, then ``group.key=value`` overrides.

Rules that differ from the seeds on purpose:
- relative paths in the yaml resolve against the yaml's own folder (paths given on the command line resolve
  against the current directory), so a config folder can be moved or shared as a whole;
- unknown keys are errors that name the key, the file and line, and suggest the closest known key;
- a renamed key still works, with a warning naming where it was written and its new name.
Values are only coerced to their field's type here; :func:`mindgrpo.config.validate.validate` checks them.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
import typing
import warnings
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

import yaml

from mindgrpo.config.schema import ConfigError, GRPOConfig

# MindRLHF's command-line flags and where they land.
CLI_FLAGS: Dict[str, str] = {
    "dataset_file": "rl_config.dataset_file",
    "tokenizer_dir": "rl_config.tokenizer_dir",
    "actor_checkpoint_path": "actor_config.load",
    "ref_checkpoint_path": "ref_config.load",
    "generate_checkpoint_path": "generate_config.load",
    "verifier_function": "reward_config.verifier_function",
    "verifier_weight": "reward_config.verifier_weight",
    "save_checkpoint_dir": "rl_config.save_checkpoint_dir",
    "resume_training": "rl_config.resume_training",
}


class _Source:
    """Where values came from, for error messages and path resolution."""

    def __init__(self, file: Optional[Path], lines: Mapping[str, int]):
        self.file, self.lines = file, lines

    def where(self, key: str) -> str:
        if self.file is None:
            return "command line"
        line = self.lines.get(key)
        return f"{self.file}:{line}" if line else str(self.file)


def load_config(path: str | os.PathLike | None = None, overrides: Sequence[str] = (),
                flags: Optional[Mapping[str, Any]] = None) -> GRPOConfig:
    """Load a yaml config, then apply MindRLHF-style ``flags`` and ``key.path=value`` ``overrides``.

    Relative paths in the yaml resolve against the yaml's folder; relative paths in flags and overrides resolve
    against the current directory. Unknown keys raise :class:`ConfigError` with a suggestion.
    """
    config = GRPOConfig()
    if path is not None:
        yaml_path = Path(path).expanduser().resolve()
        if not yaml_path.is_file():
            raise ConfigError(f"config file not found: {yaml_path}")
        text = yaml_path.read_text(encoding="utf-8")
        try:
            node = yaml.compose(text)
            data = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ConfigError(f"{yaml_path}: not valid YAML: {err}") from None
        source = _Source(yaml_path, _key_lines(node))
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(f"{yaml_path}: the top level must be a mapping of key groups "
                              f"(rl_config, actor_config, ...), got {type(data).__name__}")
        _merge(config, data, "", source, base_dir=yaml_path.parent)
        config.config_path = str(yaml_path)
    cli = _Source(None, {})
    for name, value in (flags or {}).items():
        if value is None:
            continue
        if name not in CLI_FLAGS:
            raise ConfigError(f"unknown flag --{name}{_suggest(name, CLI_FLAGS)}")
        set_key(config, CLI_FLAGS[name], value, cli, base_dir=Path.cwd())
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} is not of the form key.path=value (e.g. rl_config.beta=0.0)")
        set_key(config, key.strip(), yaml.safe_load(raw) if raw.strip() else "", cli, base_dir=Path.cwd())
    return config


def _key_lines(node: Any, prefix: str = "") -> Dict[str, int]:
    """Map dotted key paths to 1-based yaml line numbers."""
    lines: Dict[str, int] = {}
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = f"{prefix}{key_node.value}"
            lines[key] = key_node.start_mark.line + 1
            lines.update(_key_lines(value_node, key + "."))
    return lines


def _merge(obj: Any, data: Mapping[str, Any], prefix: str, source: _Source, base_dir: Path) -> None:
    for key, value in data.items():
        set_key(obj, f"{prefix}{key}", value, source, base_dir, root_prefix=prefix)


RENAMED_KEYS = {"rl_config.max_skipped_steps": "rl_config.max_skipped_updates"}
"""Old key -> new key. An old key still works, with a warning naming where it was written and the new name."""


class ConfigWarning(UserWarning):
    """A config that works but should be changed (a renamed key)."""


def set_key(config: Any, dotted: str, value: Any, source: _Source, base_dir: Path, root_prefix: str = "") -> None:
    """Set ``dotted`` (relative to ``config``) to ``value``, checking the key and coercing the type."""
    if dotted in RENAMED_KEYS:
        warnings.warn(f"{source.where(dotted)}: '{dotted}' is now called '{RENAMED_KEYS[dotted]}'; "
                      "the old name still works but will be removed", ConfigWarning, stacklevel=2)
        dotted = RENAMED_KEYS[dotted]
    parts = dotted[len(root_prefix):].split(".") if root_prefix else dotted.split(".")
    obj = config
    for depth, name in enumerate(parts):
        known = {f.name: f for f in dataclasses.fields(obj) if not f.metadata.get("internal")}
        full = root_prefix + ".".join(parts[: depth + 1])
        if name not in known:
            raise ConfigError(f"{source.where(full)}: unknown key '{full}'{_suggest(name, known)}")
        f = known[name]
        hint = typing.get_type_hints(type(obj))[name]
        if depth < len(parts) - 1:
            if not dataclasses.is_dataclass(hint):
                raise ConfigError(f"{source.where(full)}: '{full}' is a value, not a group")
            obj = getattr(obj, name)
            continue
        if dataclasses.is_dataclass(hint):
            if not isinstance(value, dict):
                raise ConfigError(f"{source.where(full)}: '{full}' must be a mapping of its keys, "
                                  f"got {type(value).__name__}")
            _merge(getattr(obj, name), value, full + ".", source, base_dir)
            return
        coerced = _coerce(value, hint, full, source)
        if f.metadata.get("path") and coerced:
            coerced = str((base_dir / Path(coerced).expanduser()).resolve()) if not os.path.isabs(
                os.path.expanduser(coerced)) else os.path.normpath(os.path.expanduser(coerced))
        setattr(obj, name, coerced)


def _suggest(name: str, known: Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    if close:
        return f"; did you mean '{close[0]}'?"
    return f"; known keys: {', '.join(sorted(known))}"


def _coerce(value: Any, hint: Any, key: str, source: _Source) -> Any:
    def fail(expected: str) -> ConfigError:
        return ConfigError(f"{source.where(key)}: '{key}' must be {expected}, got {value!r}")

    if typing.get_origin(hint) in (list, List):
        inner = typing.get_args(hint)[0]
        if isinstance(value, str):  # "a,b" or "1.0 0.5" from the command line
            value = [v for v in value.replace(",", " ").split() if v]
        if not isinstance(value, (list, tuple)):
            raise fail("a list")
        return [_coerce(v, inner, key, source) for v in value]
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no", "on", "off"):
            return value.lower() in ("true", "1", "yes", "on")
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise fail("true or false")
    if hint is int:
        if isinstance(value, bool):
            raise fail("an integer")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                raise fail("an integer") from None
            if number.is_integer():
                return int(number)
        raise fail("an integer")
    if hint is float:
        if isinstance(value, bool):
            raise fail("a number")
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):  # PyYAML reads 1e-6 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                raise fail("a number") from None
        raise fail("a number")
    if hint is str:
        if value is None:
            return ""
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise fail("a string")
    raise ConfigError(f"{source.where(key)}: '{key}' has an unsupported type {hint!r}")


def dump_yaml(config: GRPOConfig, path: str | os.PathLike) -> None:
    """Write the resolved config (absolute paths) atomically, e.g. next to a run's metrics."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(yaml.safe_dump(config.to_dict(), sort_keys=False), encoding="utf-8")
    os.replace(tmp, path)
