"""Qwen2.5's tool-call format, as its chat template renders it (``tests/fixtures/qwen2_5_chat_template.jinja``).

A prompt offers tools in its system turn: the template's ``# Tools`` block, one JSON signature per line inside
``<tools></tools>``. The model calls them in its own turn, one JSON object per ``<tool_call>...</tool_call>`` block,
and ends the turn with ``<|im_end|>``. The results come back as one ``user`` turn holding a
``<tool_response>...</tool_response>`` per call, and a new assistant turn opens. In a rollout the model's turn is
the tokens it sampled, up to its ``<|im_end|>``; what follows it is :func:`responses_text`, tokenised once and
appended (the model's own tokens are never re-tokenised: their text would not always give back the same ids).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence

DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
_TOOLS_INTRO = ("\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
_TOOLS_OUTRO = ("\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
                "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
                "<args-json-object>}\n</tool_call>")
_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def system_turn(signatures: Sequence[Mapping[str, Any]], system: Optional[str] = None) -> str:
    """The system turn offering ``signatures`` (``{"type": "function", "function": {...}}`` each), ending with
    ``<|im_end|>\\n``, byte for byte as the template renders it (``system``: the system message, Qwen's default
    without one)."""
    lines = "".join("\n" + json.dumps(dict(s), ensure_ascii=False) for s in signatures)
    return f"<|im_start|>system\n{system or DEFAULT_SYSTEM}{_TOOLS_INTRO}{lines}{_TOOLS_OUTRO}<|im_end|>\n"


def responses_text(contents: Sequence[str]) -> str:
    """What follows a model turn that ended (with ``<|im_end|>``) in tool calls: one user turn with each call's
    result in order, then the next assistant turn's header."""
    body = "".join(f"\n<tool_response>\n{content}\n</tool_response>" for content in contents)
    return f"\n<|im_start|>user{body}<|im_end|>\n<|im_start|>assistant\n"


@dataclass(frozen=True)
class ToolCall:
    """One ``<tool_call>`` block of a model turn: the tool's name and arguments, or why it could not be read."""
    name: str = ""
    arguments: Dict[str, Any] = field(default_factory=dict)
    error: str = ""
    """Non-empty when the block is not a call (bad JSON, no name, arguments not an object): the model is told so."""


def parse_calls(turn: str) -> List[ToolCall]:
    """The tool calls of a model turn's text, in order (empty: the turn calls no tool and ends the completion)."""
    return [_parse_one(body.strip()) for body in _CALL.findall(turn)]


def _parse_one(body: str) -> ToolCall:
    try:
        call = json.loads(body)
    except json.JSONDecodeError as err:
        return ToolCall(error=f"the tool call is not valid JSON ({err.msg} at character {err.pos}); write "
                              '{"name": <function-name>, "arguments": <args-json-object>}')
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return ToolCall(error='the tool call has no "name": write {"name": <function-name>, '
                              '"arguments": <args-json-object>}')
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string, as OpenAI's API carries them
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    if not isinstance(arguments, dict):
        return ToolCall(name=call["name"], error=f'the "arguments" of {call["name"]!r} must be a JSON object')
    return ToolCall(name=call["name"], arguments=arguments)
