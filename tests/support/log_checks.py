"""Checks shared by the multi-process and chaos tests of a LocalGroup of log nodes."""

from __future__ import annotations

import filecmp
from typing import Any

from dledger.process.recording_machine import read_records
from raftmq.local_group import LocalGroup
from tests.support.history import History, check_applied, check_history, check_identical

__all__ = ["assert_identical_files", "assert_replicas_agree", "converge"]


def converge(group: LocalGroup, timeout: float = 30.0) -> dict[str, list[Any]]:
    """Wait until every live replica has committed and applied the same last index."""
    names = [n for n, p in group.nodes.items() if p.alive]
    leader = group.wait_leader(timeout)
    target = group.status(leader)["last_index"]
    for name in names:
        group.wait_status(name, lambda s, t=target: s["commit_index"] >= t
                          and s["applied_index"] >= t, timeout, f"commit and apply of {target}")
    return {name: group.all_entries(name) for name in names}


def assert_replicas_agree(group: LocalGroup, history: History) -> None:
    logs = converge(group)
    check_identical(logs)
    for name, entries in logs.items():
        check_history(entries, history, who=name)
        check_applied(read_records(group.base / name / "applied.log"), entries, who=name)
    assert_identical_files(group)


def assert_identical_files(group: LocalGroup) -> None:
    """The committed CommitLog bytes are identical on every replica."""
    dirs = [group.base / name / "commitlog" for name in group.nodes]
    files = sorted(p.name for p in dirs[0].iterdir())
    for d in dirs[1:]:
        assert sorted(p.name for p in d.iterdir()) == files, f"segment names differ in {d}"
        _, mismatch, errors = filecmp.cmpfiles(dirs[0], d, files, shallow=False)
        assert not mismatch and not errors, f"segments differ between {dirs[0]} and {d}: {mismatch}"
