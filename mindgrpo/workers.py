"""Calls in worker processes that can be killed: verifiers (`reward_config.verifier_parallel`, `verifier_timeout`)
and tools (`mindgrpo.tools.runner`).

Why processes, and why started this way:

- A verifier stuck in C code (a catastrophic regular expression backtracking inside `re`) never returns to the
  interpreter, so no signal or thread in the trainer's process can cut it short. A worker process can be killed,
  and replaced.
- The trainer's process runs MindSpore's threads, and `fork` alone would copy their locks in whatever state they
  were in. Each worker is a new interpreter (fork + exec through `subprocess`, what multiprocessing's `spawn` does),
  given the parent's `sys.path`; it imports each verifier by name (pickle by reference), so a verifier must be a
  top-level function of an importable module. Unlike multiprocessing's `spawn`, the trainer's `__main__` script is
  not imported again in every worker: a script that starts training without an `if __name__ == "__main__":` guard
  cannot start a second run there.
- A worker runs one call at a time. The parent times each call from the moment it hands it over and kills the
  worker that overruns; a replacement starts at once. A worker ignores Ctrl-C (the trainer handles it) and is
  killed by the kernel when the trainer dies (Linux `PR_SET_PDEATHSIG`), even in the middle of a hung call.
"""
from __future__ import annotations

import json
import pickle
import signal
import subprocess
import sys
import time
import traceback
import weakref
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection, Pipe, wait
from typing import Callable, Deque, Dict, List, Mapping, Optional, Sequence, Tuple

# How long a new worker may take to import the verifiers before the pool gives up on it (numpy and mindgrpo's rewards
# take about 0.1 s; a verifier module that loads a model may take much longer).
START_TIMEOUT = 300.0

_BOOT = ("import json, sys; sys.path[:] = json.loads(sys.argv[2]); "
         "from mindgrpo.workers import serve; serve(int(sys.argv[1]))")

Call = Tuple[str, tuple, dict]  # (function name, positional args, keyword args)


@dataclass
class CallOutcome:
    """One call's result: its return value, or why there is none."""

    value: object = None
    error: str = ""  # what went wrong, as a phrase: "raised ValueError: bad input", "took longer than 5 s"; "" if none
    exception: Optional[BaseException] = None  # the exception itself, or a RemoteTraceback from a worker
    timed_out: bool = False


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a worker process, chained below the trainer's own error."""

    def __str__(self) -> str:
        return f"\n\"\"\"\n{self.args[0]}\"\"\""


class WorkerStartError(RuntimeError):
    """A worker could not load the verifiers (a module that imports in the trainer but not in a fresh interpreter),
    or died or hung while starting."""


class Unsendable:
    """Stands for a return value that could not be pickled back to the trainer (it is no number either)."""

    def __init__(self, value: object, error: Exception):
        self.text = f"<{type(value).__name__} that cannot be sent between processes: {error}>"

    def __repr__(self) -> str:
        return self.text


class _Worker:
    def __init__(self, payload: bytes):
        ours, theirs = Pipe(duplex=True)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _BOOT, str(theirs.fileno()), json.dumps(sys.path)],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        finally:
            theirs.close()
        self.conn: Connection = ours
        self.conn.send(payload)  # a few hundred bytes: fits the socket buffer while the worker boots
        self.born = time.monotonic()
        self.ready = False
        self.task: Optional[int] = None  # index of the call it is running
        self.started = 0.0

    def kill(self) -> None:
        try:
            self.process.kill()
        except OSError:
            pass
        self.process.wait()
        self.conn.close()


def _kill_all(workers: List[_Worker]) -> None:
    while workers:
        workers.pop().kill()


class WorkerPool:
    """`processes` workers that run named functions; with `timeout > 0` each call gets at most that many seconds.

    Workers start on the first :meth:`run` and stay up between runs; :meth:`close` (also called when the pool is
    garbage collected or the interpreter exits) kills them, and a later :meth:`run` starts new ones.
    """

    def __init__(self, functions: Mapping[str, Callable], processes: int, timeout: float = 0.0,
                 kind: str = "verifier"):
        """``kind`` names the functions in errors ("verifier", "tool")."""
        if processes < 1:
            raise ValueError(f"WorkerPool needs at least one process, got {processes}")
        self.payload = pickle.dumps({name: pickle.dumps(fn) for name, fn in functions.items()})
        self.processes = processes
        self.timeout = float(timeout)
        self.kind = kind
        self._workers: List[_Worker] = []
        weakref.finalize(self, _kill_all, self._workers)  # also runs at interpreter exit

    def close(self) -> None:
        _kill_all(self._workers)

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def run(self, calls: Sequence[Call]) -> List[CallOutcome]:
        """Run every call, `processes` at a time; outcomes in the order of `calls`.

        A call that raises gives its exception's text and the worker's traceback; one that overruns the timeout is cut
        (its worker killed and replaced) and marked `timed_out`; one whose worker dies gives the exit status. Raises
        WorkerStartError when a worker cannot start. Any exception out of here (Ctrl-C, SIGTERM) kills the workers,
        so no call of this run can answer a later one."""
        if not calls:
            return []
        outcomes: List[Optional[CallOutcome]] = [None] * len(calls)
        queue: Deque[int] = deque(range(len(calls)))
        try:
            while len(self._workers) < self.processes:
                self._workers.append(_Worker(self.payload))
            while queue or any(w.task is not None for w in self._workers):
                for worker in self._workers:
                    if worker.ready and worker.task is None and queue:
                        self._hand_over(worker, queue.popleft(), calls, queue)
                self._wait(outcomes, queue)
        except BaseException:
            self.close()
            raise
        return outcomes  # type: ignore[return-value]

    def _hand_over(self, worker: _Worker, index: int, calls: Sequence[Call], queue: Deque[int]) -> None:
        try:
            worker.conn.send(calls[index])
        except (BrokenPipeError, ConnectionResetError):  # it died while idle: the call never started
            queue.appendleft(index)
            self._replace(worker)
            return
        worker.task, worker.started = index, time.monotonic()

    def _wait(self, outcomes: List[Optional[CallOutcome]], queue: Deque[int]) -> None:
        now = time.monotonic()
        deadlines = [w.born + START_TIMEOUT for w in self._workers if not w.ready]
        if self.timeout > 0:
            deadlines += [w.started + self.timeout for w in self._workers if w.task is not None]
        waiting = [w.conn for w in self._workers if not w.ready or w.task is not None]
        answered = wait(waiting, max(0.0, min(deadlines) - now) if deadlines else None)
        by_conn = {w.conn: w for w in self._workers}
        for conn in answered:
            self._receive(by_conn[conn], outcomes, queue)
        now = time.monotonic()
        for worker in list(self._workers):
            if not worker.ready and now - worker.born > START_TIMEOUT:
                raise WorkerStartError(f"a {self.kind} worker process did not start within {START_TIMEOUT:.0f} s "
                                       f"(importing the {self.kind}s' modules took too long)")
            if self.timeout > 0 and worker.task is not None and now - worker.started >= self.timeout:
                outcomes[worker.task] = CallOutcome(error=f"took longer than {self.timeout:g} s", timed_out=True)
                self._replace(worker)

    def _receive(self, worker: _Worker, outcomes: List[Optional[CallOutcome]], queue: Deque[int]) -> None:
        try:
            message = worker.conn.recv()
        except (EOFError, OSError):
            status = worker.process.wait()
            if worker.task is None:
                raise WorkerStartError(f"a {self.kind} worker process exited with status {status} while starting "
                                       "(its error, if any, is printed above)") from None
            outcomes[worker.task] = CallOutcome(error=f"ended its worker process (exit status {status})")
            self._replace(worker)
            return
        kind = message[0]
        if kind == "ready":
            worker.ready = True
        elif kind == "failed":
            _, name, error = message
            raise WorkerStartError(f"{self.kind} {name!r} cannot be loaded in a worker process: {error}. Workers "
                                   f"import {self.kind}s by name: it must be a top-level function of a module on "
                                   "PYTHONPATH")
        else:
            assert worker.task is not None
            outcomes[worker.task] = (CallOutcome(value=message[1]) if kind == "returned" else
                                     CallOutcome(error=f"raised {message[1]}", exception=RemoteTraceback(message[2])))
            worker.task = None

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        self._workers[self._workers.index(worker)] = _Worker(self.payload)


# ------------------------------------------------------------------------------------------------ worker side

def _die_with_parent() -> None:
    """Have the kernel kill this worker when the trainer dies, even while a call hangs (Linux only)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def serve(fd: int) -> None:
    """A worker's loop: load the functions, then answer one call at a time until the trainer hangs up."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group; the trainer handles it
    conn = Connection(fd)
    functions: Dict[str, Callable] = {}
    for name, blob in pickle.loads(conn.recv()).items():
        try:
            functions[name] = pickle.loads(blob)
        except Exception as exc:
            conn.send(("failed", name, f"{type(exc).__name__}: {exc}"))
            return
    conn.send(("ready",))
    while True:
        try:
            name, args, kwargs = conn.recv()
        except (EOFError, OSError):
            return
        try:
            value = functions[name](*args, **kwargs)
        except Exception as exc:
            conn.send(("raised", f"{type(exc).__name__}: {exc}", traceback.format_exc()))
            continue
        try:
            conn.send(("returned", value))
        except Exception as exc:  # send pickles before writing anything, so nothing half-sent is on the wire
            conn.send(("returned", Unsendable(value, exc)))
