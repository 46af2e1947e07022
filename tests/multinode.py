"""Test helper: run a job as several msrun "nodes" on this one machine, through scripts/run_grpo_multinode.sh.

Each node is its own ``msrun --worker_num=W --local_worker_num=L --node_rank=N --master_addr=127.0.0.1`` launch,
all on one master port, as on real servers. One difference on a single host: msrun starts a scheduler on every node
whose ``--master_addr`` is one of its own addresses (``is_master = _is_local_ip(master_addr)`` in
``mindspore/parallel/cluster/process_entity/_api.py``), so here every node starts one. Node 0's binds the port
first (we wait for it); the others fail with "Failed to init the tcp server" while their workers join node 0's
scheduler and run normally, and msrun then exits with 1 on those nodes. :func:`check_nodes` accepts exactly that
failure and nothing else.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Mapping, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
LAUNCHER = REPO / "scripts" / "run_grpo_multinode.sh"
SECOND_SCHEDULER = "Failed to init the tcp server"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class NodeRun:
    node_rank: int
    returncode: int
    output: str
    log_dir: Path

    def worker_logs(self) -> List[Path]:
        return sorted(self.log_dir.glob("worker_*.log"))


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def launch_nodes(config: os.PathLike, args: Sequence[str] = (), *, nodes: int = 2, workers_per_node: int = 1,
                 log_root: os.PathLike, cwd: Optional[os.PathLike] = None, env: Optional[Mapping[str, str]] = None,
                 timeout: float = 900) -> List[NodeRun]:
    """Launch ``nodes`` msrun nodes of ``workers_per_node`` workers each running examples/grpo/main.py with
    ``config`` and ``args``, and wait for all of them (killing them, by process group, after ``timeout`` s)."""
    port = free_port()
    base = {**os.environ, **(env or {}), "MASTER_PORT": str(port), "CLUSTER_TIME_OUT": str(int(timeout))}
    procs = []
    deadline = time.monotonic() + timeout
    try:
        for node in range(nodes):
            log_dir = Path(log_root) / f"node{node}"
            log_dir.mkdir(parents=True, exist_ok=True)
            command = ["bash", str(LAUNCHER), str(config), str(node), "127.0.0.1", str(nodes), str(workers_per_node),
                       *args]
            with open(log_dir / "msrun.out", "w") as out:  # a file, not a pipe: no node blocks on a full buffer
                proc = subprocess.Popen(command, cwd=cwd, env={**base, "LOG_DIR": str(log_dir)},
                                        stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            procs.append((node, proc, log_dir))
            if node == 0:  # node 0's scheduler must own the port before another node's tries to
                while not _listening(port) and proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.2)
        runs = []
        for node, proc, log_dir in procs:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            runs.append(NodeRun(node, proc.returncode, (log_dir / "msrun.out").read_text(errors="replace"), log_dir))
        return runs
    finally:
        for _, proc, _ in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # our own launch's process group only
                proc.wait()


def check_nodes(runs: Sequence[NodeRun]) -> None:
    """Raise AssertionError (with the logs) unless every node's workers succeeded; a node other than 0 may exit 1
    only because of its own redundant scheduler (see the module doc)."""
    for run in runs:
        logs = {path.name: path.read_text(errors="replace") for path in run.worker_logs()}
        scheduler = run.log_dir / "scheduler.log"
        scheduler_text = scheduler.read_text(errors="replace") if scheduler.exists() else ""
        report = f"node {run.node_rank} exited {run.returncode}:\n{run.output[-4000:]}\n" + "\n".join(
            f"--- {name}\n{text[-4000:]}" for name, text in logs.items())
        assert logs, report
        assert not any("Traceback" in text for text in logs.values()), report
        if run.returncode != 0:
            assert run.node_rank != 0 and SECOND_SCHEDULER in scheduler_text, report
