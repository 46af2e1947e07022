"""Tools a rollout may call: the built-in ``calculator`` and ``python``, and user tools given as ``module:function``.

A tool is a top-level Python function (worker processes import it by name) and its JSON signature, the
``{"type": "function", "function": {...}}`` object the prompt's system turn lists (:mod:`mindgrpo.tools.format`).
A user tool's signature comes from :func:`tool_signature` when it is decorated with it, else from its type hints
and Google-style docstring, read by transformers' ``get_json_schema`` (what TRL and transformers' chat templates
use), so a tool written for them works here unchanged.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Sequence, Tuple

from mindgrpo._spec import import_spec
from mindgrpo.tools.calculator import calculator
from mindgrpo.tools.sandbox import run_python

SIGNATURE_MARK = "__mindgrpo_tool_signature__"


class ToolSpecError(ValueError):
    """A tool named in the config cannot be used (unknown, not importable, or without a signature)."""


@dataclass(frozen=True)
class Tool:
    name: str
    function: Callable[..., Any]
    signature: Mapping[str, Any]
    """``{"type": "function", "function": {"name", "description", "parameters"}}``"""

    def check_arguments(self, arguments: Mapping[str, Any]) -> str:
        """Why ``function(**arguments)`` cannot be called ("" when it can): said to the model, not raised."""
        try:
            inspect.signature(self.function).bind(**arguments)
        except TypeError as err:
            params = ", ".join(self.signature["function"]["parameters"].get("properties", {}))
            return f"{self.name} takes ({params}): {err}"
        return ""


def python(code: str) -> str:
    """Run Python code in a sandbox and return what it prints (and the value of a last bare expression).

    Args:
        code: the Python source to run; there is no network and only a scratch folder to write in
    """
    return run_python(code).text()


def tool_signature(description: str, parameters: Mapping[str, Any]):
    """Decorate a user tool with its signature explicitly (``parameters`` is a JSON schema object), instead of
    deriving it from the docstring."""
    def decorate(function):
        signature = {"type": "function", "function": {"name": function.__name__, "description": description,
                                                      "parameters": dict(parameters)}}
        setattr(function, SIGNATURE_MARK, signature)
        return function
    return decorate


def _docstring_signature(function: Callable, spec: str) -> Dict[str, Any]:
    from transformers.utils import get_json_schema  # noqa: PLC0415  (transformers is heavy; only user tools need it)

    try:
        return get_json_schema(function)
    except Exception as err:  # transformers raises its own DocstringParsingException / TypeHintParsingException
        raise ToolSpecError(f"tool {spec!r}: no JSON signature from its docstring ({err}); give every argument a "
                            "type hint and an 'Args:' line, or decorate it with mindgrpo.tools.tool_signature"
                            ) from None


def _builtin(function: Callable) -> Tool:
    return Tool(function.__name__, function, _docstring_signature(function, function.__name__))


BUILTIN_TOOLS: Dict[str, Callable[[], Tool]] = {"calculator": lambda: _builtin(calculator),
                                                "python": lambda: _builtin(python)}


def resolve_tool(spec: str) -> Tool:
    """The tool a name (built-in) or a ``package.module:function`` spec stands for."""
    if ":" not in spec:
        if spec not in BUILTIN_TOOLS:
            raise ToolSpecError(f"unknown tool {spec!r}: the built-in tools are {', '.join(BUILTIN_TOOLS)}; give a "
                                "tool of your own as 'package.module:function'")
        return BUILTIN_TOOLS[spec]()
    function = import_spec(spec, "tool", ToolSpecError)
    if not inspect.isfunction(function):
        raise ToolSpecError(f"tool {spec!r} is a {type(function).__name__}, not a function: worker processes import "
                            "tools by name, so a tool must be a top-level function")
    signature = getattr(function, SIGNATURE_MARK, None) or _docstring_signature(function, spec)
    return Tool(signature["function"]["name"], function, signature)


def resolve_tools(specs: Sequence[str]) -> Tuple[Tool, ...]:
    """The tools of ``rl_config.tools``, each name once."""
    tools = tuple(resolve_tool(spec) for spec in specs)
    names = [tool.name for tool in tools]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ToolSpecError(f"tools {repeated} are given twice in rl_config.tools: a model calls a tool by name")
    return tools
