"""A cluster that ``raftmq up`` or ``raftmq cluster up`` started in a directory, as a test
sees it: the PIDs its ``cluster.json`` names and whether they live, the foreground
command's output read up to the line that says it is ready, and what is left killed by PID."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

__all__ = ["READY_LINE", "cluster_pids", "kill_alive", "pid_alive", "read_until_ready"]

READY_LINE = "Ctrl-C stops"
"""Printed by ``raftmq up`` (and ``scripts/run``) once every group has a leader."""


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (signal 0; a zombie counts as alive)."""
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def cluster_pids(run_dir: Path) -> list[int]:
    """The name server's PID, then every broker replica's, from ``run_dir/cluster.json``."""
    state = json.loads((run_dir / "cluster.json").read_text())
    return [state["namesrv"]["pid"]] + [n["pid"] for g in state["groups"].values() for n in g.values()]


def read_until_ready(proc: subprocess.Popen[str], timeout: float) -> str:
    """``proc``'s output up to and with the READY_LINE; fails with the output so far if
    ``proc`` ends first or ``timeout`` s pass (checked between lines)."""
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while not any(READY_LINE in line for line in lines):
        assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)
        lines.append(proc.stdout.readline())  # type: ignore[union-attr]
    return "".join(lines)


def kill_alive(pids: Iterable[int]) -> None:
    """SIGKILL each of ``pids`` that still lives (a test's cleanup after a failure)."""
    for pid in pids:
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
