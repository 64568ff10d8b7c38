"""Pre-vote (dledger/raft/election/prevote.py) against a stand-in for pysyncobj's private state."""

from __future__ import annotations

import random
from typing import Any

from dledger.raft.election.prevote import ElectionDeadlineHold, PreVote

FAR = 1e18


class FakeTransport:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def send(self, node: str, message: dict[str, Any]) -> bool:
        self.sent.append((node, message))
        return True


class FakeSyncObj:
    """The private attributes PreVote reads, under pysyncobj's mangled names; the election
    deadline held as on ``dledger.raft_node.RaftNode``."""

    _SyncObj__raftElectionDeadline = ElectionDeadlineHold()

    def __init__(self, others: list[str], term: int = 5, log: tuple[int, int] = (5, 100)) -> None:
        self._SyncObj__raftState = 0
        self._SyncObj__selfNode = "me"
        self._SyncObj__transferInProgress = False
        self._SyncObj__raftElectionDeadline = 10.0
        self._SyncObj__raftCurrentTerm = term
        self._SyncObj__otherNodes = set(others)
        self._SyncObj__transport = FakeTransport()
        self.log = log
        self._SyncObj__getCurrentLogTerm = lambda: self.log[0]
        self._SyncObj__getCurrentLogIndex = lambda: self.log[1]

    @property
    def sent(self) -> list[tuple[str, dict[str, Any]]]:
        return self._SyncObj__transport.sent  # type: ignore[no-any-return]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make(others: list[str] | None = None, standing: bool = True,
         **kw: Any) -> tuple[PreVote, FakeSyncObj, Clock]:
    node = FakeSyncObj(others if others is not None else ["b", "c"], **kw)
    clock = Clock()
    timeouts = (0.4, 1.2) if standing else (1e9, 1e9)
    return PreVote(node, lambda: 0.4, lambda: timeouts, clock, random.Random(1)), node, clock


def test_it_holds_the_deadline_and_asks_instead_of_standing() -> None:
    pv, node, clock = make()
    pv.tick()
    assert node._SyncObj__raftElectionDeadline == FAR  # pysyncobj will not stand by itself
    clock.now = 9.9
    pv.tick()
    assert node.sent == []
    clock.now = 10.1
    pv.tick()
    asked = sorted(n for n, m in node.sent if m["type"] == "pre_vote")
    assert asked == ["b", "c"]
    message = node.sent[0][1]
    assert (message["term"], message["last_log_term"], message["last_log_index"]) == (6, 5, 100)
    assert node._SyncObj__raftCurrentTerm == 5 and node._SyncObj__raftElectionDeadline == FAR
    assert pv.rounds == 1


def test_a_majority_of_grants_lets_pysyncobj_stand_and_a_stale_round_counts_for_nothing() -> None:
    pv, node, clock = make(["b", "c", "d", "e"])
    clock.now = 11
    pv.tick()
    first_round = node.sent[0][1]["round"]
    clock.now = 13  # the round timed out: a new one
    pv.tick()
    assert pv.rounds == 2
    pv.on_message("b", {"type": "pre_vote_response", "round": first_round, "granted": True})
    pv.on_message("c", {"type": "pre_vote_response", "round": first_round, "granted": True})
    assert node._SyncObj__raftElectionDeadline == FAR
    current = node.sent[-1][1]["round"]
    pv.on_message("b", {"type": "pre_vote_response", "round": current, "granted": True})
    pv.on_message("b", {"type": "pre_vote_response", "round": current, "granted": True})  # twice: once
    assert node._SyncObj__raftElectionDeadline == FAR
    pv.on_message("c", {"type": "pre_vote_response", "round": current, "granted": True})
    assert node._SyncObj__raftElectionDeadline == 0 and pv.won == 1


def test_a_transfer_and_a_replica_that_does_not_stand() -> None:
    pv, node, clock = make()
    node._SyncObj__transferInProgress = True
    node._SyncObj__raftElectionDeadline = 0  # TimeoutNow
    pv.tick()
    assert node._SyncObj__raftElectionDeadline == 0  # left alone: it stands at once
    pv, node, clock = make(standing=False)
    clock.now = 1e6
    pv.tick()
    pv.tick()
    assert node.sent == [] and node._SyncObj__raftElectionDeadline == FAR


def test_a_replica_that_stepped_down_asks_again() -> None:
    pv, node, clock = make()
    node._SyncObj__raftState = 2
    pv.tick()
    node._SyncObj__raftState = 0  # stepped down; pysyncobj's deadline still the old FAR
    node._SyncObj__raftElectionDeadline = FAR
    clock.now = 100
    pv.tick()
    clock.now = 102
    pv.tick()
    assert pv.rounds == 1


def grant(pv: PreVote, node: FakeSyncObj, sender: str = "b", **message: Any) -> bool:
    ask = {"type": "pre_vote", "round": 7, "term": 6, "last_log_term": 5, "last_log_index": 100, **message}
    assert pv.on_message(sender, ask)
    reply_to, reply = node.sent[-1]
    assert reply_to == sender and reply["round"] == 7
    return bool(reply["granted"])


def test_the_grant_rule() -> None:
    pv, node, clock = make()
    clock.now = 50
    assert grant(pv, node)
    assert grant(pv, node, last_log_index=150)
    assert not grant(pv, node, last_log_index=99), "a shorter log"
    assert not grant(pv, node, last_log_term=4, last_log_index=500), "an older last term"
    assert not grant(pv, node, term=5), "a term not above ours"
    assert not grant(pv, node, sender="x"), "not a member"
    assert not grant(pv, node, term="six"), "malformed"
    assert not pv.on_message("b", {"type": "append_entries", "term": 5})  # passed on to pysyncobj
    assert not grant(pv, node), "a leader was heard from within the minimum election timeout"
    clock.now = 50.5
    assert grant(pv, node)
    pv.on_message("b", {"type": "append_entries", "term": 4})  # a deposed leader: not a leader heard
    assert grant(pv, node)
    node._SyncObj__raftState = 2
    assert not grant(pv, node), "the leader"


def test_a_deadline_pysyncobj_sets_is_held_before_its_next_election_check() -> None:
    """pysyncobj's tick checks its election deadline before the tick callbacks run, and sets
    a fresh one while reading messages at the end of a tick: a process paused in between
    (SIGSTOP, a starved box) found that deadline passed and stood without a pre-vote (a
    lagging follower raised its term in a CI run). The deadline is held the moment
    pysyncobj sets it, so its own check never sees one it could act on."""
    pv, node, clock = make()
    pv.tick()
    node._SyncObj__raftElectionDeadline = 3.0  # an append_entries, at the end of a tick
    clock.now = 60.0  # paused: the next tick comes a minute later
    assert node._SyncObj__raftElectionDeadline == FAR  # pysyncobj's check: nothing to stand for
    pv.tick()
    assert pv.rounds == 1 and node._SyncObj__raftCurrentTerm == 5  # it asked first


def test_a_won_round_and_timeout_now_release_the_deadline_until_pysyncobj_stands() -> None:
    pv, node, clock = make(["b", "c"])
    clock.now = 11
    pv.tick()
    pv.on_message("b", {"type": "pre_vote_response", "round": node.sent[-1][1]["round"], "granted": True})
    assert node._SyncObj__raftElectionDeadline == 0  # stands on its next tick
    node._SyncObj__raftElectionDeadline = 12.0  # pysyncobj stood and drew its candidate deadline
    assert node._SyncObj__raftElectionDeadline == FAR
    node._SyncObj__raftElectionDeadline = 0  # TimeoutNow from the leader
    assert node._SyncObj__raftElectionDeadline == 0


def test_a_timeout_now_overtaken_by_a_vote_does_not_silence_the_replica_for_good() -> None:
    """TimeoutNow sets pysyncobj's transfer flag and releases the deadline; a vote request
    of a higher term arriving before pysyncobj stands makes it vote and set a new deadline,
    and the flag stays set (pysyncobj clears it only when it stands or hears a higher term).
    Pre-vote skipped every round while the flag was set, and pysyncobj never saw its
    deadline: the replica never stood again (a CI run: two healed followers, no leader for
    20 s). The stale flag is cleared; the replica asks when its deadline passes."""
    pv, node, clock = make()
    node._SyncObj__transferInProgress = True
    node._SyncObj__raftElectionDeadline = 0  # TimeoutNow
    node._SyncObj__raftCurrentTerm = 6  # a candidate's request_vote of term 6 arrived first:
    node._SyncObj__raftElectionDeadline = 11.0  # pysyncobj voted and drew a new deadline
    pv.tick()
    assert node._SyncObj__raftElectionDeadline == FAR  # held, as any deadline is
    clock.now = 11.5
    pv.tick()
    assert sorted(n for n, m in node.sent if m["type"] == "pre_vote") == ["b", "c"]
    assert node._SyncObj__transferInProgress is False
