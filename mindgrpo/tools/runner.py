"""Run a rollout's tool calls in worker processes that can be killed (:class:`mindgrpo.workers.WorkerPool`).

Whatever a call does, the rollout gets a text back for the model and the run goes on: a call that cannot be read,
names no known tool, has the wrong arguments, raises, overruns ``timeout``, kills its worker, or returns something
that cannot be printed answers with an ``Error: ...`` text, and :class:`ToolResult` says which of these happened
(the step's tool metrics count them).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Sequence

from mindgrpo.data.tool_format import ToolCall
from mindgrpo.tools.registry import Tool, check_sandboxes
from mindgrpo.workers import WorkerPool


@dataclass(frozen=True)
class ToolResult:
    text: str
    """What the model reads in its ``<tool_response>``."""
    name: str = ""
    error: bool = False
    """The call failed (any reason below, timeouts included); ``text`` says why."""
    timed_out: bool = False


def invoke(function: Callable[..., Any], arguments: Mapping[str, Any]) -> str:
    """In a worker: call the tool and turn its result into text there, so a result that cannot be printed fails
    that call only."""
    value = function(**arguments)
    return value if isinstance(value, str) else str(value)


class ToolRunner:
    """The run's tools, called ``processes`` at a time, each call cut at ``timeout`` seconds. A tool whose sandbox
    cannot run on this machine is refused here (ToolSpecError), whatever path built the runner."""

    def __init__(self, tools: Sequence[Tool], processes: int, timeout: float):
        check_sandboxes(tools)
        self.tools: Dict[str, Tool] = {tool.name: tool for tool in tools}
        self.timeout = float(timeout)
        self.pool = WorkerPool({"invoke": invoke}, processes, timeout=timeout, kind="tool")

    def close(self) -> None:
        self.pool.close()

    def run(self, calls: Sequence[ToolCall]) -> List[ToolResult]:
        """One result per call, in order."""
        results: List[ToolResult] = [None] * len(calls)  # type: ignore[list-item]
        runnable = []
        for index, call in enumerate(calls):
            problem = self._problem(call)
            if problem:
                results[index] = ToolResult(f"Error: {problem}", call.name, error=True)
            else:
                runnable.append(index)
        outcomes = self.pool.run([("invoke", (self.tools[calls[i].name].function, dict(calls[i].arguments)), {})
                                  for i in runnable])
        for index, outcome in zip(runnable, outcomes):
            name = calls[index].name
            if outcome.timed_out:
                results[index] = ToolResult(f"Error: {name} took longer than {self.timeout:g} s and was stopped",
                                            name, error=True, timed_out=True)
            elif outcome.error:
                results[index] = ToolResult(f"Error: {name} {outcome.error}", name, error=True)
            elif not isinstance(outcome.value, str):  # the worker could not send it back
                results[index] = ToolResult(f"Error: {name}'s result could not be sent back", name, error=True)
            else:
                results[index] = ToolResult(outcome.value, name)
        return results

    def _problem(self, call: ToolCall) -> str:
        if call.error:
            return call.error
        if call.name not in self.tools:
            return f"there is no tool {call.name!r}; the tools are {', '.join(self.tools)}"
        return self.tools[call.name].check_arguments(call.arguments)
