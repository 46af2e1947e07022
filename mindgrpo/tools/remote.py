"""The ``remote`` sandbox: the python tool posts the code to a SandboxFusion-compatible ``/run_code`` service (the
sandbox verl's code tools call at scale) at ``rl_config.tool_sandbox_url``; the model's code never runs on the
training machine.

The request is SandboxFusion's ``RunCodeRequest``, with the fields verl sends: ``code``, ``language: python``,
``compile_timeout``, ``run_timeout`` (the limits' wall time), ``memory_limit_MB``, ``stdin``, ``files`` and
``fetch_files``. The code goes wrapped in :data:`~mindgrpo.tools.interpreter.CELL`, so the model reads what the local
sandboxes give it (the value of a last bare expression, the traceback of its own frames). The answer's ``run_result``
(``stdout``, ``stderr``, ``return_code``, ``status``: ``Finished``, ``TimeLimitExceeded`` or ``Error``) becomes the
:class:`~mindgrpo.tools.sandbox.SandboxResult`.

Every failure is the tool's answer, never the run's end: code over :data:`MAX_CODE_BYTES` is not sent; an answer over
:data:`MAX_ANSWER_BYTES` is cut like a local sandbox's long output; an unreachable, slow (``run_timeout`` +
:data:`HTTP_MARGIN_SECONDS`) or failing service, an HTTP error or an answer that is not SandboxFusion's raises
:class:`SandboxServiceError`, which the tool runner turns into an ``Error: ...`` text (and counts in
``tools/errors``).
"""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Set, Tuple

from mindgrpo.config.validate import sandbox_url_problem
from mindgrpo.tools.interpreter import CELL
from mindgrpo.tools.sandbox import Sandbox, SandboxLimits, SandboxResult

MAX_CODE_BYTES = 64 << 10
MAX_ANSWER_BYTES = 1 << 20
HTTP_MARGIN_SECONDS = 10.0  # the service's own start-up and queueing, on top of run_timeout (verl: 10 s too)
# URLs whose service ran 6 * 7: checked once per process. A failure is checked again each time: a service that was
# starting or restarting answers the next check.
_ANSWERED: Set[str] = set()


class SandboxServiceError(RuntimeError):
    """The sandbox service could not run the code (unreachable, too slow, an error of its own)."""


def program(code: str) -> str:
    """What the service runs: the cell runner with ``code`` in it."""
    return f"code = {code!r}\n{CELL}"


@dataclass(frozen=True)
class RemoteSandbox(Sandbox):
    """``remote``: a SandboxFusion-compatible service at ``url`` runs the code (its isolation is the service's)."""
    mode = "remote"
    isolates = True
    url: str = ""
    """The service's ``/run_code`` endpoint, e.g. ``http://sandbox:8080/run_code``."""

    def problem(self) -> str:
        url_problem = sandbox_url_problem(self.url)
        if url_problem:
            return f"{url_problem} (rl_config.tool_sandbox_url, --tool-sandbox-url); it is {self.url!r}"
        if self.url in _ANSWERED:
            return ""
        try:
            answer = self.run("6 * 7", SandboxLimits(wall_seconds=10)).output
        except SandboxServiceError as err:
            return str(err)
        if answer.strip() != "42":
            return f"{self.url} ran 6 * 7 and answered {answer!r}"
        _ANSWERED.add(self.url)
        return ""

    def describe(self) -> str:
        return f"SandboxFusion-compatible service at {self.url}"

    def run(self, code: str, limits: SandboxLimits) -> SandboxResult:
        size = len(code.encode("utf-8", "replace"))
        if size > MAX_CODE_BYTES:
            return SandboxResult(f"the code is {size} bytes; the sandbox takes at most {MAX_CODE_BYTES}", 1)
        request = {"code": program(code), "language": "python", "compile_timeout": limits.wall_seconds,
                   "run_timeout": limits.wall_seconds, "memory_limit_MB": int(limits.memory_bytes) >> 20,
                   "stdin": "", "files": {}, "fetch_files": []}
        body, cut = self._post(request, limits.wall_seconds + HTTP_MARGIN_SECONDS)
        if cut:
            return SandboxResult("", 1, truncated=True)
        status, run = self._read(body)
        output = (run.get("stdout") or "") + (run.get("stderr") or "")
        data = output.encode("utf-8", "replace")
        returned = run.get("return_code")
        return SandboxResult(data[:limits.output_bytes].decode("utf-8", "ignore"),
                             returned if isinstance(returned, int) else 1, timed_out=status == "TimeLimitExceeded",
                             truncated=len(data) > limits.output_bytes)

    def _post(self, request: dict, timeout: float) -> Tuple[bytes, bool]:
        """The answer's body, and whether it was longer than :data:`MAX_ANSWER_BYTES` (then cut there)."""
        http = urllib.request.Request(self.url, data=json.dumps(request).encode(), method="POST",
                                      headers={"Content-Type": "application/json", "Accept": "application/json"})
        try:
            with urllib.request.urlopen(http, timeout=timeout) as response:
                body = response.read(MAX_ANSWER_BYTES + 1)
        except urllib.error.HTTPError as err:
            raise SandboxServiceError(f"the sandbox service at {self.url} answered HTTP {err.code} {err.reason}"
                                      ) from None
        except (urllib.error.URLError, OSError) as err:  # refused, unresolvable, timed out, reset
            reason = getattr(err, "reason", err)
            raise SandboxServiceError(f"the sandbox service at {self.url} could not be reached or did not answer "
                                      f"within {timeout:g} s ({reason})") from None
        return body[:MAX_ANSWER_BYTES], len(body) > MAX_ANSWER_BYTES

    def _read(self, body: bytes) -> Tuple[str, dict]:
        """(the run's status, SandboxFusion's ``run_result``) from an answer; a SandboxServiceError when the answer is
        not one, or says the service failed."""
        try:
            answer = json.loads(body)
        except ValueError:
            answer = None
        if not isinstance(answer, dict) or answer.get("status") not in ("Success", "Failed", "SandboxError"):
            raise SandboxServiceError(f"the sandbox service at {self.url} gave an answer that is not SandboxFusion's "
                                      f"(starts {body[:80]!r})")
        run = answer.get("run_result")
        if answer["status"] == "SandboxError" or not isinstance(run, dict) or run.get("status") == "Error":
            message = str(answer.get("message") or (run or {}).get("stderr") or "no message")[:300]
            raise SandboxServiceError(f"the sandbox service at {self.url} failed to run the code: {message}")
        return str(run.get("status")), run
