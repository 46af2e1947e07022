"""Tools for multi-turn rollouts: Qwen2.5's tool-call format, the built-in ``calculator`` and sandboxed ``python``,
user tools, and a runner that turns any failure into a text for the model instead of a crashed run."""
from mindgrpo.tools.format import ToolCall, parse_calls, responses_text, system_turn
from mindgrpo.tools.registry import BUILTIN_TOOLS, Tool, ToolSpecError, resolve_tool, resolve_tools, tool_signature
from mindgrpo.tools.runner import ToolResult, ToolRunner
from mindgrpo.tools.sandbox import SandboxLimits, SandboxResult, run_python
from mindgrpo.tools.turns import ToolTurns

__all__ = ["BUILTIN_TOOLS", "SandboxLimits", "SandboxResult", "Tool", "ToolCall", "ToolResult", "ToolRunner",
           "ToolSpecError", "ToolTurns", "parse_calls", "resolve_tool", "resolve_tools", "responses_text", "run_python",
           "system_turn", "tool_signature"]
