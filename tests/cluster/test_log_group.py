"""Multi-process CommitLog tests: 3 log-node processes on 127.0.0.1.

Every acknowledged entry survives kill -9 of a follower, then of the leader, and
of all three at once; all replicas end byte-identical; every replica applies each
committed entry exactly once, in order.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from raftmq.local_group import LocalGroup
from tests.support.history import History
from tests.support.log_checks import assert_replicas_agree
from tests.support.log_load import LogLoad

pytestmark = [pytest.mark.cluster]

SEGMENT = 1 << 20  # small segments so the runs roll several of them


@pytest.fixture
def group(make_group: Callable[..., LocalGroup]) -> LocalGroup:
    return make_group(segment_bytes=SEGMENT)


@pytest.mark.slow
def test_kill_follower_then_leader_then_all(group: LocalGroup) -> None:
    group.start()
    group.wait_leader()
    history = History()
    with LogLoad(group, history, workers=24, payload_bytes=256) as load:
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
    with LogLoad(group, history, workers=24, payload_bytes=64, limit=6000) as load:
        load.wait_acked(6000, timeout=120)
    group.start_node(follower)
    assert_replicas_agree(group, history)
    status = group.status(follower)
    assert status["first_index"] == 1


@pytest.mark.slow
def test_repeated_leader_kills_leave_no_stale_tail(group: LocalGroup) -> None:
    """Each killed leader may hold a tail of uncommitted entries; after it returns, the
    journal must replace exactly that tail (and never a committed entry), and the leader
    must be able to repair it (no nextIndex oscillation)."""
    group.start()
    history = History()
    with LogLoad(group, history, workers=24, payload_bytes=256) as load:
        for round_ in range(3):
            load.wait_acked(1500 * (round_ + 1), timeout=120)
            leader = group.wait_leader()
            group.kill(leader)
            group.wait_leader(among=[n for n in group.nodes if n != leader])
            group.start_node(leader)
        load.wait_acked(history.acked_count + 1000, timeout=120)
    assert_replicas_agree(group, history)
    truncations = {n: group.status(n)["conflict_truncations"] for n in group.nodes}
    print(f"conflict truncations per node: {truncations}; unknown outcomes: {len(history.unknown)}")


def test_a_failed_wait_for_a_leader_says_what_each_node_knows(group: LocalGroup) -> None:
    """A wait for a leader that times out reports each node's election state (role, term,
    leader, pre-vote rounds and wins, links) or that it is not running, beside its log tail:
    a CI run once failed with log tails alone, which could not tell a replica that never
    stood from one that stood and lost."""
    group.start()
    leader = group.wait_leader(timeout=30)
    alone = next(n for n in group.nodes if n != leader)
    for name in group.nodes:
        if name != alone:
            group.kill(name)
    with pytest.raises(TimeoutError) as failed:
        group.wait_leader(timeout=2, among=[alone])
    report = str(failed.value)
    assert f"--- {alone}: {{'role': " in report and "'pre_vote_rounds': " in report
    assert f"--- {leader}: not running" in report
