"""Multi-process CommitLog tests: 3 log-node processes on 127.0.0.1.

Every acknowledged entry survives kill -9 of a follower, then of the leader, and
of all three at once; all replicas end byte-identical; every replica applies each
committed entry exactly once, in order.
"""

from __future__ import annotations

import filecmp
from collections.abc import Iterator
from pathlib import Path

import pytest

from dledger.local_group import LocalGroup
from dledger.recording_machine import read_records
from tests.support.history import History, check_applied, check_history, check_identical
from tests.support.log_load import LogLoad

pytestmark = [pytest.mark.cluster]

SEGMENT = 1 << 20  # small segments so the runs roll several of them


@pytest.fixture
def group(tmp_path: Path) -> Iterator[LocalGroup]:
    g = LocalGroup(tmp_path / "group", 3, raft={"segment_bytes": SEGMENT})
    try:
        yield g
    finally:
        g.stop()


def converge(group: LocalGroup, timeout: float = 30.0) -> dict[str, list]:
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


@pytest.mark.slow
def test_kill_follower_then_leader_then_all(group: LocalGroup) -> None:
    group.start()
    group.wait_leader()
    history = History()
    load = LogLoad(group, history, workers=24, payload_bytes=256).start()
    try:
        load.wait_acked(2500, timeout=120)
        leader = group.wait_leader()
        follower = next(n for n in group.nodes if n != leader)
        group.kill(follower)
        load.wait_acked(5000, timeout=120)
        leader = group.wait_leader(among=[n for n in group.nodes if n != follower])
        group.kill(leader)
        group.start_node(follower)
        group.start_node(leader)
        load.wait_acked(10000, timeout=180)
    finally:
        load.stop()
    assert history.acked_count >= 10000
    assert_replicas_agree(group, history)

    for name in group.nodes:  # all at once
        group.kill(name)
    group.start()
    assert_replicas_agree(group, history)


def test_restarted_follower_catches_up_from_the_log(group: LocalGroup) -> None:
    """More entries than pysyncobj's default compaction threshold while a follower is down:
    it must be caught up entry by entry (no snapshot: no holes, no duplicates)."""
    group.start()
    leader = group.wait_leader()
    follower = next(n for n in group.nodes if n != leader)
    group.kill(follower)
    history = History()
    load = LogLoad(group, history, workers=24, payload_bytes=64, limit=6000).start()
    try:
        load.wait_acked(6000, timeout=120)
    finally:
        load.stop()
    group.start_node(follower)
    assert_replicas_agree(group, history)
    status = group.status(follower)
    assert status["first_index"] == 1
