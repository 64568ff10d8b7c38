"""`raftmq cluster up|status|down`: background processes, leaders awaited, stopped by PID."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.cluster]


def raftmq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "broker.cli", *args], capture_output=True, text=True,
                          timeout=120)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def test_up_status_down(tmp_path: Path) -> None:
    d = str(tmp_path / "c")
    pids: list[int] = []
    try:
        up = raftmq("cluster", "up", "--dir", d, "--groups", "2")
        assert up.returncode == 0, up.stderr
        assert "g1: leader" in up.stdout and "g2: leader" in up.stdout
        state = json.loads((tmp_path / "c" / "cluster.json").read_text())
        pids = [state["namesrv"]["pid"]] + [n["pid"] for g in state["groups"].values() for n in g.values()]
        assert len(pids) == 7 and all(alive(p) for p in pids)
        again = raftmq("cluster", "up", "--dir", d)
        assert again.returncode == 1 and "already running" in again.stderr
        status = raftmq("cluster", "status", "--dir", d)
        assert status.returncode == 0 and status.stdout.count("leader") >= 2
    finally:
        down = raftmq("cluster", "down", "--dir", d)
    assert down.returncode == 0, down.stderr
    assert not any(alive(p) for p in pids)
