"""The node-health checks of the chaos harness on hand-made logs and processes (no broker)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from raftmq.local_group import LocalGroup
from tests.chaos.node_health import NodeDeaths, unexpected_log_lines

LOG = """\
2026-11-28 00:38:42,705 INFO dledger.replicated_log: membership recorded
2026-11-28 00:38:42,836 ERROR dledger.http: GET /ws failed
Traceback (most recent call last):
  File "x.py", line 1, in f
aiohttp.client_exceptions.ClientConnectionResetError: Cannot write to closing transport
2026-11-28 00:38:43,000 WARNING dledger.storage: a storage identity note
2026-11-28 00:38:43,100 ERROR dledger.disk_guard: the disk of n1 is full
Traceback (most recent call last):
  File "crash.py", line 3, in run
RuntimeError: boom
"""


def test_errors_and_tracebacks_not_expected_are_named(tmp_path: Path) -> None:
    log = tmp_path / "n1.log"
    log.write_text(LOG)
    assert unexpected_log_lines(log) == [
        "2026-11-28 00:38:43,100 ERROR dledger.disk_guard: the disk of n1 is full",
        "Traceback (most recent call last): after: 2026-11-28 00:38:43,100 ERROR dledger.disk_guard: "
        "the disk of n1 is full"]
    assert unexpected_log_lines(log, [r"ERROR dledger\.disk_guard: the disk of \w+ is full"]) == []


def test_a_ws_failure_is_expected_only_as_a_connection_reset(tmp_path: Path) -> None:
    """``GET /ws failed`` is expected when a client's connection was reset (chaos resets
    links); the same line with any other exception is a broker error."""
    log = tmp_path / "n1.log"
    other = [*LOG.splitlines()[1:4], "KeyError: 'opaque'"]
    log.write_text("\n".join(other) + "\n")
    failed = "2026-11-28 00:38:42,836 ERROR dledger.http: GET /ws failed"
    assert unexpected_log_lines(log) == [failed, f"Traceback (most recent call last): after: {failed}"]
    log.write_text("\n".join(LOG.splitlines()[1:5]) + "\n")  # its reset: expected
    assert unexpected_log_lines(log) == []


def test_a_traceback_after_unrelated_lines_is_shown_by_its_exception(tmp_path: Path) -> None:
    log = tmp_path / "n1.log"
    ws_failed = "\n".join(LOG.splitlines()[1:5])  # the expected /ws failure, its traceback
    log.write_text(f"{ws_failed}\nTraceback (most recent call last):\n  File \"t.py\"\nRuntimeError: boom\n")
    assert unexpected_log_lines(log) == ["traceback: RuntimeError: boom"]


def test_a_process_that_exits_unasked_is_a_death_and_one_stopped_is_not(tmp_path: Path) -> None:
    group = LocalGroup(tmp_path, 2)
    deaths = NodeDeaths(group)
    crashed = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    stopped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    group.nodes["n1"].proc, group.nodes["n2"].proc = crashed, stopped
    try:
        crashed.wait(timeout=10)
        deaths.stopping("n2")  # what ChaosBrokers.kill does before it kills
    finally:
        stopped.kill()
        stopped.wait(timeout=10)
    assert [(d.node, d.pid, d.exit_status) for d in deaths.check()] == [("n1", crashed.pid, 3)]
    assert deaths.check() == []  # once per process
    assert "n1 (pid" in deaths.deaths[0].describe(deaths.deaths[0].seen_at) and "exit status 3" in \
        deaths.deaths[0].describe(0.0)
