"""Tools a rollout may call: the built-in ``calculator`` and ``python``, and user tools given as ``module:function``;
and the python tool's sandboxes by name (``rl_config.tool_sandbox``).

A tool is a top-level Python function (worker processes import it by name) and its JSON signature, the
``{"type": "function", "function": {...}}`` object the prompt's system turn lists (:mod:`mindgrpo.data.tool_format`).
A user tool's signature comes from :func:`tool_signature` when it is decorated with it, else from its type hints
and Google-style docstring, read by transformers' ``get_json_schema`` (what TRL and transformers' chat templates
use), so a tool written for them works here unchanged.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

from mindgrpo._spec import import_spec
from mindgrpo.tools.bwrap import BwrapSandbox
from mindgrpo.tools.calculator import calculator
from mindgrpo.tools.interpreter import ProcessSandbox
from mindgrpo.tools.remote import RemoteSandbox
from mindgrpo.tools.sandbox import Sandbox, SandboxLimits, SandboxResult

SIGNATURE_MARK = "__mindgrpo_tool_signature__"


class ToolSpecError(ValueError):
    """A tool named in the config cannot be used (unknown, not importable, or without a signature)."""


@dataclass(frozen=True)
class Tool:
    name: str
    function: Callable[..., Any]
    signature: Mapping[str, Any]
    """``{"type": "function", "function": {"name", "description", "parameters"}}``"""
    sandbox: Optional[Sandbox] = None
    """Where it runs model-written code (the python tool): :func:`check_sandboxes` before a run starts."""

    def check_arguments(self, arguments: Mapping[str, Any]) -> str:
        """Why ``function(**arguments)`` cannot be called ("" when it can): said to the model, not raised."""
        try:
            inspect.signature(self.function).bind(**arguments)
        except TypeError as err:
            params = ", ".join(self.signature["function"]["parameters"].get("properties", {}))
            return f"{self.name} takes ({params}): {err}"
        return ""


# The python tool's sandboxes by their rl_config.tool_sandbox names (mindgrpo.choices.TOOL_SANDBOXES),
# each made from rl_config.tool_sandbox_url (which only the remote one reads).
SANDBOXES: Dict[str, Callable[[str], Sandbox]] = {"bwrap": lambda url: BwrapSandbox(),
                                                  "process": lambda url: ProcessSandbox(),
                                                  "remote": lambda url: RemoteSandbox(url)}


def sandbox_for(mode: str, url: str = "") -> Sandbox:
    """The sandbox ``rl_config.tool_sandbox`` (and ``tool_sandbox_url``) name."""
    if mode not in SANDBOXES:
        raise ToolSpecError(f"unknown tool sandbox {mode!r}: choose one of {', '.join(SANDBOXES)}")
    return SANDBOXES[mode](url)


def run_python(code: str, limits: SandboxLimits = SandboxLimits(), sandbox: Optional[Sandbox] = None) -> SandboxResult:
    """Run ``code`` as the python tool does, in ``sandbox`` (default: ``bwrap``)."""
    return (sandbox or BwrapSandbox()).run(code, limits)


@dataclass(frozen=True)
class PythonTool:
    """The built-in ``python`` tool, bound to the run's sandbox: pickled by value into the tool workers, so every
    call runs where ``rl_config.tool_sandbox`` says."""
    sandbox: Sandbox
    limits: SandboxLimits = SandboxLimits()

    def __call__(self, code: str) -> str:
        return self.sandbox.run(code, self.limits).text()


# Written out rather than read from a docstring: prompts converted with --tools python carry it, and a run refuses
# data whose signatures differ from the tools' (mindgrpo.train.preflight.check_dataset_tools).
PYTHON_SIGNATURE = {"type": "function", "function": {
    "name": "python",
    "description": "Run Python code in a sandbox and return what it prints (and the value of a last bare expression).",
    "parameters": {"type": "object", "properties": {"code": {
        "type": "string", "description": "the Python source to run; there is no network and only a scratch folder "
                                         "to write in"}}, "required": ["code"]},
    "return": {"type": "string"}}}


def check_sandboxes(tools: Sequence[Tool], key: str = "the python tool's sandbox") -> None:
    """A ToolSpecError naming ``key`` (the config key or flag that chose the sandbox) when a tool's sandbox cannot run
    on this machine: refuse, don't degrade."""
    for tool in tools:
        problem = tool.sandbox.problem() if tool.sandbox is not None else ""
        if problem:
            raise ToolSpecError(f"{key} = {tool.sandbox.mode}: {problem}")


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


BUILTIN_TOOLS: Dict[str, Callable[[Sandbox], Tool]] = {
    "calculator": lambda sandbox: _builtin(calculator),
    "python": lambda sandbox: Tool("python", PythonTool(sandbox), PYTHON_SIGNATURE, sandbox)}


def resolve_tool(spec: str, sandbox: Optional[Sandbox] = None) -> Tool:
    """The tool a name (built-in) or a ``package.module:function`` spec stands for; the python tool runs its code in
    ``sandbox`` (default: ``bwrap``)."""
    if ":" not in spec:
        if spec not in BUILTIN_TOOLS:
            raise ToolSpecError(f"unknown tool {spec!r}: the built-in tools are {', '.join(BUILTIN_TOOLS)}; give a "
                                "tool of your own as 'package.module:function'")
        return BUILTIN_TOOLS[spec](sandbox or BwrapSandbox())
    function = import_spec(spec, "tool", ToolSpecError)
    if not inspect.isfunction(function):
        raise ToolSpecError(f"tool {spec!r} is a {type(function).__name__}, not a function: worker processes import "
                            "tools by name, so a tool must be a top-level function")
    signature = getattr(function, SIGNATURE_MARK, None) or _docstring_signature(function, spec)
    return Tool(signature["function"]["name"], function, signature)


def resolve_tools(specs: Sequence[str], sandbox: Optional[Sandbox] = None) -> Tuple[Tool, ...]:
    """The tools of ``rl_config.tools``, each name once (the python tool in ``sandbox``, default ``bwrap``)."""
    tools = tuple(resolve_tool(spec, sandbox) for spec in specs)
    names = [tool.name for tool in tools]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ToolSpecError(f"tools {repeated} are given twice in rl_config.tools: a model calls a tool by name")
    return tools


def offered_signatures(specs: Sequence[str]) -> Dict[str, Dict[str, Any]]:
    """Each name of ``rl_config.tools`` -> the JSON signature its prompts offer (what
    :func:`mindgrpo.data.convert_dataset` writes into them and stores beside them)."""
    return {spec: dict(tool.signature) for spec, tool in zip(specs, resolve_tools(list(specs)))}
