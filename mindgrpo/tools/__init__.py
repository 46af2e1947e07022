"""Tools for multi-turn rollouts: Qwen2.5's tool-call format, the built-in ``calculator`` and ``python`` (its code
isolated by the kernel, a remote service, or, explicitly, nothing: ``rl_config.tool_sandbox``), user tools, and a
runner that turns any failure into a text for the model instead of a crashed run."""
from mindgrpo.data.tool_format import ToolCall, parse_calls, responses_text, system_turn
from mindgrpo.tools.registry import (BUILTIN_TOOLS, SANDBOXES, Tool, ToolSpecError, check_sandboxes,
                                     offered_signatures, resolve_tool, resolve_tools, run_python, sandbox_for,
                                     tool_signature)
from mindgrpo.tools.runner import ToolResult, ToolRunner
from mindgrpo.tools.sandbox import Sandbox, SandboxLimits, SandboxResult
from mindgrpo.tools.turns import ToolTurns

__all__ = ["BUILTIN_TOOLS", "SANDBOXES", "Sandbox", "SandboxLimits", "SandboxResult", "Tool", "ToolCall", "ToolResult",
           "ToolRunner", "ToolSpecError", "ToolTurns", "check_sandboxes", "offered_signatures", "parse_calls",
           "resolve_tool",
           "resolve_tools", "responses_text", "run_python", "sandbox_for", "system_turn", "tool_signature"]
