"""Checks shared by the multi-process and chaos tests of a LocalGroup of log nodes.

``converge`` and ``assert_replicas_agree`` judge every node of the group: a node that is
down fails them (naming it, with its exit status and log tail when it died on its own --
``LocalGroup.died_on_its_own``), as do ERROR/CRITICAL lines and tracebacks in any node's
log that the test does not expect (``log_problems``; the patterns of
``tests/chaos/node_health.unexpected_log_lines``). Before issue 31 (G5) dead nodes were
left out of the comparison and nothing read the logs.
"""

from __future__ import annotations

import filecmp
import time
from collections.abc import Iterable
from typing import Any

from dledger.process.recording_machine import read_records
from raftmq.local_group import LocalGroup
from tests.chaos.node_health import unexpected_log_lines
from tests.support.history import History, check_applied, check_history, check_identical

__all__ = ["assert_all_alive", "assert_identical_files", "assert_replicas_agree", "converge", "log_problems"]


def assert_all_alive(group: LocalGroup) -> None:
    """Every node of ``group`` runs; AssertionError naming each that does not (why, when
    it died on its own)."""
    down = [group.died_on_its_own(n) or f"{n} is not running (stopped by the test, or never started)"
            for n, p in group.nodes.items() if not p.alive]
    assert not down, "nodes down where every node must run:\n" + "\n".join(down)


def log_problems(group: LocalGroup, expected: Iterable[str] = ()) -> list[str]:
    """For each node whose log has ERROR/CRITICAL lines or tracebacks matching none of
    ``expected`` (regular expressions), one problem naming the first five."""
    problems = []
    for name in group.nodes:
        lines = unexpected_log_lines(group.base / f"{name}.log", expected)
        if lines:
            shown = "\n  ".join(lines[:5])
            problems.append(f"{name}'s log has {len(lines)} unexpected ERROR/CRITICAL lines or "
                            f"tracebacks:\n  {shown}")
    return problems


def converge(group: LocalGroup, timeout: float = 30.0) -> dict[str, list[Any]]:
    """Wait until every replica -- all must be alive -- has committed and applied the same
    last index, the leader's last, and return their committed entries read then. An entry
    the leader appends meanwhile (a restarted replica recorded, say) starts the wait again:
    entries read while one replica had committed it and another not differ by that entry."""
    assert_all_alive(group)
    deadline = time.monotonic() + timeout
    last: dict[str, Any] = {}
    while True:
        leader = group.wait_leader(max(0.1, deadline - time.monotonic()))
        statuses = {n: group.status(n) for n in group.nodes}
        last = statuses
        target = (statuses[leader] or {}).get("last_index")
        if target is not None and all(st is not None and st["commit_index"] == target
                                      and st["applied_index"] >= target for st in statuses.values()):
            logs = {name: group.all_entries(name) for name in group.nodes}
            if len({len(log) for log in logs.values()}) == 1:
                return logs
        assert_all_alive(group)
        if time.monotonic() >= deadline:
            raise TimeoutError(f"the replicas did not converge within {timeout}s: {last}")
        time.sleep(0.05)


def assert_replicas_agree(group: LocalGroup, history: History, expected_log: Iterable[str] = ()) -> None:
    """Every node alive and converged; their logs identical, holding what ``history`` says
    was acknowledged, applied exactly once in order, byte-identical on disk; and no node
    logged an ERROR, CRITICAL or traceback matching none of ``expected_log``."""
    logs = converge(group)
    check_identical(logs)
    for name, entries in logs.items():
        check_history(entries, history, who=name)
        check_applied(read_records(group.base / name / "applied.log"), entries, who=name)
    assert_identical_files(group)
    problems = log_problems(group, expected_log)
    assert not problems, "\n".join(problems)


def assert_identical_files(group: LocalGroup) -> None:
    """The committed CommitLog bytes are identical on every replica."""
    dirs = [group.base / name / "commitlog" for name in group.nodes]
    files = sorted(p.name for p in dirs[0].iterdir())
    for d in dirs[1:]:
        assert sorted(p.name for p in d.iterdir()) == files, f"segment names differ in {d}"
        _, mismatch, errors = filecmp.cmpfiles(dirs[0], d, files, shallow=False)
        assert not mismatch and not errors, f"segments differ between {dirs[0]} and {d}: {mismatch}"
