"""CommitLog group under network faults injected by a real Toxiproxy server.

Every Raft link goes through its own proxy (the dialing node reaches its peer at a
Toxiproxy listener while the peer keeps its identity). The tests isolate the
leader and check that it steps down (stock pysyncobj keeps it for 30 s; the time it took,
the 0.3 s lease, is printed -- speed is not asserted), that the majority goes on, and that
after healing no acknowledged entry is lost and all replicas are identical.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftmq.local_group import LocalGroup
from tests.chaos.toxi import Link, Toxi
from tests.support.history import History
from tests.support.log_checks import assert_replicas_agree
from tests.support.log_load import LogLoad

pytestmark = [pytest.mark.chaos, pytest.mark.cluster]

#: how long an isolated leader may keep leading before the test fails: a liveness bound, well
#: above the 0.3 s lease it steps down at and well below the 30 s stock pysyncobj keeps it
STEP_DOWN_DEADLINE_S = 15.0


class ProxiedGroup:
    """A LocalGroup whose every peer link (a -> b) goes through Toxiproxy."""

    def __init__(self, base: Path, toxi: Toxi) -> None:
        self.group = LocalGroup(base, 3)
        self.links: dict[tuple[str, str], Link] = {}
        for a in self.group.nodes:
            dial = {}
            for b, node in self.group.nodes.items():
                if a == b:
                    continue
                upstream = int(node.raft.rsplit(":", 1)[1])
                link = toxi.proxy(f"{a}-to-{b}", 0, upstream)
                self.links[(a, b)] = link
                dial[b] = link.listen
            self.group.write_config(a, dial)

    def isolate(self, name: str) -> None:
        for (a, b), link in self.links.items():
            if name in (a, b):
                link.cut("both")


@pytest.fixture
def proxied(tmp_path: Path, toxi: Toxi) -> Iterator[ProxiedGroup]:
    pg = ProxiedGroup(tmp_path / "group", toxi)
    try:
        yield pg
    finally:
        pg.group.stop()


def test_isolated_leader_steps_down_and_nothing_is_lost(proxied: ProxiedGroup, toxi: Toxi) -> None:
    group = proxied.group
    group.start()
    old = group.wait_leader(timeout=30)
    history = History()
    with LogLoad(group, history, workers=8, payload_bytes=128) as load:
        load.wait_acked(500, timeout=60)
        cut_at = time.monotonic()
        proxied.isolate(old)
        group.wait_status(old, lambda s: s["role"] != "leader", STEP_DOWN_DEADLINE_S,
                          "the isolated leader stepping down")
        stepped_down_after = time.monotonic() - cut_at
        new = group.wait_leader(timeout=15, among=[n for n in group.nodes if n != old])
        acked_before = history.acked_count
        load.wait_acked(acked_before + 500, timeout=60)
        code, body = group.propose(old, b"to-the-isolated-node", timeout=5)
        assert code != 200, f"the isolated old leader acknowledged a write: {body}"
        toxi.reset()
        group.wait_status(old, lambda s: s["leader"] is not None, 20,
                          "the healed node following the new leader")
        load.wait_acked(history.acked_count + 200, timeout=60)
    print(f"isolated leader {old} stepped down after {stepped_down_after:.2f}s; new leader {new}")
    assert_replicas_agree(group, history)


def test_isolated_follower_catches_up_after_heal(proxied: ProxiedGroup, toxi: Toxi) -> None:
    group = proxied.group
    group.start()
    leader = group.wait_leader(timeout=30)
    follower = next(n for n in group.nodes if n != leader)
    history = History()
    with LogLoad(group, history, workers=8, payload_bytes=128) as load:
        load.wait_acked(300, timeout=60)
        proxied.isolate(follower)
        load.wait_acked(history.acked_count + 1000, timeout=60)
        stale = group.status(follower)
        assert stale is not None and stale["commit_index"] < group.status(leader)["commit_index"]
        toxi.reset()
        load.wait_acked(history.acked_count + 300, timeout=60)
    assert_replicas_agree(group, history)


def test_isolated_leader_never_serves_its_uncommitted_tail(proxied: ProxiedGroup, toxi: Toxi) -> None:
    """Guarantee 3: reads stop at the commit index, even on a node holding more entries."""
    import threading

    group = proxied.group
    group.start()
    old = group.wait_leader(timeout=30)
    code, _ = group.propose(old, b"committed-before-the-cut")
    assert code == 200
    # a majority acknowledged the proposal: the third node may not have heard the leader yet
    # (issue 32); the two left must both know its term before it is cut off
    group.wait_following(old, timeout=20)
    proxied.isolate(old)
    answers: list[int] = []
    stranded = threading.Thread(target=lambda: answers.append(
        group.propose(old, b"stranded-on-the-old-leader", timeout=20)[0]))
    stranded.start()
    status = group.wait_status(old, lambda s: s["last_index"] > s["commit_index"], 5,
                               "the isolated leader appending an entry it cannot commit")
    bodies = [row[4] for row in group.all_entries(old)]
    assert b"committed-before-the-cut" in bodies
    assert b"stranded-on-the-old-leader" not in bodies, "served an uncommitted entry"
    assert status["commit_index"] == max(row[0] for row in group.all_entries(old))
    stranded.join(timeout=30)
    assert answers and answers[0] != 200, "the isolated leader acknowledged a write"
    toxi.reset()
    new = group.wait_leader(timeout=20, among=[n for n in group.nodes if n != old])
    group.wait_status(old, lambda s: s["leader"] is not None and s["commit_index"] >= group.status(
        new)["commit_index"], 30, "the old leader rejoining")
    for name in group.nodes:  # the stranded entry was replaced everywhere
        assert b"stranded-on-the-old-leader" not in [row[4] for row in group.all_entries(name)]


def _pre_vote_rounds(group: LocalGroup, name: str) -> int:
    status = group.status(name)
    assert status is not None, f"{name} gives no status"
    return int(status.get("pre_vote_rounds", 0))


@pytest.mark.parametrize("cut", ["after-following", "before-the-first-append"])
def test_a_follower_cut_off_with_its_connections_up_forces_no_election_when_healed(
        proxied: ProxiedGroup, toxi: Toxi, cut: str) -> None:
    """Pre-vote (issue 13, row 7): a follower whose links swallow bytes while the TCP
    connections stay up -- so pysyncobj's "connected to no one" guard does not hold it
    back -- asks before it stands; it raises no term above the leader's, and the leader
    keeps leading when the links heal.

    ``after-following``: cut once the follower has joined the leader's term (the
    premise the assertion compares against, issue 32: ``wait_leader`` returns before
    the leader's first append reached anyone). ``before-the-first-append``: the race of
    issue 32 made deterministic -- the follower is cut before the group starts, so it
    never hears the leader and stays at term 0; it must still raise nothing."""
    group = proxied.group
    if cut == "before-the-first-append":
        follower = "n3"
        proxied.isolate(follower)
        group.start()
        leader = group.wait_leader(timeout=30, among=[n for n in group.nodes if n != follower])
        term = group.status(leader)["term"]  # type: ignore[index]
        rounds_at_cut = 0  # cut before it started: every round it made came after the cut
    else:
        group.start()
        leader = group.wait_leader(timeout=30)
        follower = next(n for n in group.nodes if n != leader)
        term = group.wait_following(leader, timeout=20)
        rounds_at_cut = _pre_vote_rounds(group, follower)
        proxied.isolate(follower)
    # three of its election timeouts (0.3-0.8 s) pass after the cut: it asks (pre-vote) or
    # stands. Counted from the cut (rounds made at start-up, before it heard the leader, are
    # no evidence the cut did anything: with >= 3 of them a cumulative count returned at once)
    group.wait_status(follower, lambda s: s.get("pre_vote_rounds", 0) >= rounds_at_cut + 3
                      or s["term"] > term, 15, "the cut-off follower noticing the leader is gone")
    cut_off = group.status(follower)
    assert cut_off is not None and cut_off["term"] <= term, \
        f"the cut-off follower raised its term above the leader's {term}: {cut_off}"
    assert cut_off["pre_vote_won"] == 0, f"the cut-off follower won a pre-vote: {cut_off}"
    toxi.reset()
    group.wait_status(follower, lambda s: s["leader"] == leader and s["role"] == "follower", 20,
                      "the healed follower following the leader")
    after = {n: group.status(n) for n in group.nodes}
    assert {s["term"] for s in after.values() if s} == {term}, f"an election happened: {after}"
    assert group.wait_leader() == leader
