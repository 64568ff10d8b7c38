"""A node that died on its own is never taken for one the test stopped (issue 31 row 1, G5).

``LocalGroup.kill`` and ``terminate`` of a process that had already exited by itself raise
``NodeDiedError`` naming the node, its exit status and its log tail (before, ``kill`` said
nothing: a crash mid-test looked like the test's own kill -9); ``stop`` stops the others
and records it. ``tests/support/log_checks.converge`` and ``assert_replicas_agree`` fail
unless every node is alive (before, dead nodes were left out of the comparison). No log
node runs here: the nodes' processes are small Python programs.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftmq.local_group import LocalGroup, NodeDiedError
from tests.support.history import History
from tests.support.log_checks import assert_replicas_agree, converge, log_problems

pytestmark = pytest.mark.sockets  # LocalGroup picks its nodes' ports (a bind each); none is used

CRASH_STATUS = 7


def _run(group: LocalGroup, name: str, code: str) -> subprocess.Popen[bytes]:
    """Give ``name`` a process running ``code`` (its output in the node's log)."""
    with open(group.base / f"{name}.log", "ab") as out:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=out, stderr=subprocess.STDOUT)
    group.nodes[name].proc = proc
    return proc


def _crashed(group: LocalGroup, name: str) -> None:
    proc = _run(group, name, f"print('CRASHING NODE {name}'); raise SystemExit({CRASH_STATUS})")
    proc.wait(10)


def _sleeping(group: LocalGroup, name: str) -> None:
    _run(group, name, "import time; time.sleep(60)")


@pytest.fixture
def group(tmp_path: Path) -> Iterator[LocalGroup]:
    g = LocalGroup(tmp_path / "g", 3)
    yield g
    g.stop()


def test_killing_a_node_that_died_on_its_own_raises_with_its_exit_status(group: LocalGroup) -> None:
    _crashed(group, "n1")
    with pytest.raises(NodeDiedError, match=f"n1 \\(pid \\d+\\) died on its own with exit status "
                                            f"{CRASH_STATUS}") as died:
        group.kill("n1")
    assert "CRASHING NODE n1" in str(died.value)  # the log tail is shown
    assert group.deaths and group.deaths[0].startswith("n1 (pid")


def test_terminating_a_node_that_died_on_its_own_raises(group: LocalGroup) -> None:
    _crashed(group, "n2")
    with pytest.raises(NodeDiedError, match=f"exit status {CRASH_STATUS}"):
        group.terminate("n2")


def test_a_node_the_test_killed_is_not_a_death(group: LocalGroup) -> None:
    _sleeping(group, "n1")
    group.kill("n1")
    group.kill("n1")  # again: it is the test's own kill, already reaped
    group.terminate("n1")
    assert group.deaths == []


def test_stop_stops_every_node_and_records_the_one_that_died(group: LocalGroup) -> None:
    _crashed(group, "n1")
    _sleeping(group, "n2")
    group.stop()
    assert not group.nodes["n2"].alive
    assert len(group.deaths) == 1 and group.deaths[0].startswith("n1 (pid")


def test_converge_and_assert_replicas_agree_fail_on_a_dead_node(group: LocalGroup) -> None:
    _crashed(group, "n3")
    died = f"n3 \\(pid \\d+\\) died on its own with exit status {CRASH_STATUS}"
    with pytest.raises(AssertionError, match=died):
        converge(group, timeout=1)
    with pytest.raises(AssertionError, match=died):
        assert_replicas_agree(group, History())


def test_log_problems_names_unexpected_errors_and_tracebacks(group: LocalGroup) -> None:
    (group.base / "n1.log").write_text(
        "2026-11-28 10:00:00,000 INFO dledger.node: started\n"
        "2026-11-28 10:00:01,000 ERROR dledger.http: GET /ws failed\n"  # a client reset: expected
        "Traceback (most recent call last):\n"
        "ConnectionResetError: [Errno 104] Connection reset by peer\n"
        "2026-11-28 10:00:02,000 ERROR dledger.journal: entry 7 does not match\n")
    (group.base / "n2.log").write_text("2026-11-28 10:00:00,000 INFO dledger.node: started\n")
    problems = log_problems(group)
    assert len(problems) == 1 and problems[0].startswith("n1's log has 1 unexpected")
    assert "entry 7 does not match" in problems[0]
    assert log_problems(group, expected=[r"entry \d+ does not match"]) == []
