"""What the python tool's sandboxes share: the limits of one run of model-written code, its result, and the
:class:`Sandbox` every mode implements.

The modes (``rl_config.tool_sandbox``; :data:`mindgrpo.tools.registry.SANDBOXES` maps each name to its class):

- ``bwrap`` (default, :mod:`mindgrpo.tools.bwrap`): the kernel isolates the code (namespaces, a read-only file
  system with a scratch tmpfs, a seccomp filter); where the kernel refuses namespaces a run stops before it starts.
- ``remote`` (:mod:`mindgrpo.tools.remote`): the code goes to a SandboxFusion-compatible service.
- ``process`` (:mod:`mindgrpo.tools.interpreter`): a plain child interpreter with limits and an audit hook. It
  isolates nothing from code written to escape it: for trusted models, or machines where nothing else runs.

docs/sandbox.md says what each mode isolates, one test per sentence.
"""
from __future__ import annotations

import signal
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class SandboxLimits:
    """What one run of model-written code may use."""
    wall_seconds: float = 10.0
    """Killed (with everything it started) after this long."""
    cpu_seconds: int = 5
    memory_bytes: int = 1 << 30
    """Address space: numpy alone maps about 0.4 GB."""
    output_bytes: int = 16 << 10
    """stdout and stderr together; more is cut (the process is killed) and the text says so."""
    file_bytes: int = 16 << 20
    """The largest file it may write in its scratch folder."""
    scratch_bytes: int = 64 << 20
    """All its scratch folder may hold (``bwrap``: the size of its tmpfs, which lives in memory)."""


@dataclass(frozen=True)
class SandboxResult:
    output: str
    """stdout and stderr, interleaved as written (cut at ``output_bytes``)."""
    exit_code: int
    """0 on success, 1 when the code raised, ``-N`` when signal N ended it."""
    timed_out: bool = False
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def text(self) -> str:
        """What the model reads back: the output, and why it stopped when it did not finish cleanly."""
        notes = []
        if self.truncated:
            notes.append("[output truncated: too long]")
        elif self.timed_out:
            notes.append("[killed: time limit]")
        elif self.exit_code == -signal.SIGXCPU:
            notes.append("[killed: CPU time limit]")
        elif self.exit_code < 0:
            notes.append(f"[killed by signal {-self.exit_code}]")
        return "\n".join([self.output.rstrip("\n")] + notes).strip("\n")


class Sandbox(ABC):
    """Where the python tool runs model-written code. Instances are pickled into the tool workers with the tool."""
    mode: ClassVar[str]
    """Its ``rl_config.tool_sandbox`` name."""
    isolates: ClassVar[bool]
    """Whether it claims to keep code written to escape away from the run (the escape tests run every such mode)."""

    @abstractmethod
    def problem(self) -> str:
        """Why it cannot run code on this machine ("" when it can): checked before a run builds anything."""

    @abstractmethod
    def describe(self) -> str:
        """One line for ``mindgrpo doctor`` when it can run: what it is and where it comes from."""

    @abstractmethod
    def run(self, code: str, limits: SandboxLimits) -> SandboxResult:
        """Run ``code`` as a notebook cell (its output and the value of a last bare expression) within ``limits``."""
