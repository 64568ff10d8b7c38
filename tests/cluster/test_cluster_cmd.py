"""`raftmq cluster up|status|down`: background processes, leaders awaited, stopped by PID."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cluster_dir import cluster_pids, kill_alive, pid_alive, read_until_ready

pytestmark = [pytest.mark.cluster]


def raftmq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "raftmq", *args], capture_output=True, text=True,
                          timeout=120)


def test_up_status_down(tmp_path: Path) -> None:
    d = str(tmp_path / "c")
    pids: list[int] = []
    try:
        up = raftmq("cluster", "up", "--dir", d, "--groups", "2")
        assert up.returncode == 0, up.stderr
        assert "g1: leader" in up.stdout and "g2: leader" in up.stdout
        pids = cluster_pids(tmp_path / "c")
        assert len(pids) == 7 and all(pid_alive(p) for p in pids)
        again = raftmq("cluster", "up", "--dir", d)
        assert again.returncode == 1 and "already running" in again.stderr
        status = raftmq("cluster", "status", "--dir", d)
        assert status.returncode == 0 and status.stdout.count("leader") >= 2
        client_commands(d)
    finally:
        down = raftmq("cluster", "down", "--dir", d)
    assert down.returncode == 0, down.stderr
    assert not any(pid_alive(p) for p in pids)


def client_commands(d: str) -> None:
    """The client commands against the running cluster (found through --dir)."""
    made = raftmq("topic", "create", "orders", "--queues", "2", "--dir", d)
    assert made.returncode == 0 and "g1" in made.stdout and "g2" in made.stdout, made.stderr
    listed = raftmq("topic", "list", "--dir", d)
    assert "orders" in listed.stdout and "g2: 2 queues" in listed.stdout
    sent = subprocess.run([sys.executable, "-m", "raftmq", "send", "orders", "--dir", d, "--json",
                           "--shard-key", "k1", "--keys", "order-7", "--tags", "paid"],
                          input="one\ntwo\nthree\n", capture_output=True, text=True, timeout=60)
    rows = [json.loads(line) for line in sent.stdout.splitlines()]
    assert sent.returncode == 0 and [r["status"] for r in rows] == ["SEND_OK"] * 3, sent.stderr
    assert [r["queue_offset"] for r in rows] == [0, 1, 2] and len({r["queue_id"] for r in rows}) == 1
    got = raftmq("consume", "orders", "--group", "g", "--from", "first", "--idle", "2", "--json",
                 "--commit", "--dir", d)
    bodies = [json.loads(line)["body"] for line in got.stdout.splitlines()]
    assert got.returncode == 0 and bodies == ["one", "two", "three"], got.stderr
    progress = raftmq("group", "progress", "g", "orders", "--dir", d, "--json")
    assert sum(r["lag"] for r in json.loads(progress.stdout)) == 0
    found = raftmq("query", "orders", "--key", "order-7", "--dir", d, "--json")
    assert found.returncode == 0 and len(found.stdout.splitlines()) == 3
    nothing = raftmq("query", "orders", "--id", "00" * 16, "--dir", d)
    assert nothing.returncode == 1 and "no message found" in nothing.stderr
    missing = raftmq("send", "nope", "x", "--dir", d)
    assert missing.returncode == 1 and "create it" in missing.stderr


def test_up_in_the_foreground_prints_how_to_use_it_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    """What `scripts/run` runs: the cluster in the foreground until SIGINT."""
    import signal

    d = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "raftmq", "up", "--dir", str(d)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pids: list[int] = []
    try:
        text = read_until_ready(proc, timeout=90)
        assert "raftmq send orders" in text and "raftmq consume orders" in text
        pids = cluster_pids(d)
        assert all(pid_alive(p) for p in pids)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        assert not any(pid_alive(p) for p in pids)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_alive(pids)
