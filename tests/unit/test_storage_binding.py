"""The storage rule on pysyncobj's messages (dledger/raft/storage_binding.py) and pre-vote's
side of it (dledger/raft/prevote.py), with stand-ins for pysyncobj's nodes and messages
(issue 24): what a replica whose storage does not count may not do, and what a leader or
candidate does with the answers of such a storage."""

from __future__ import annotations

import pickle
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pysyncobj.config import FAIL_REASON

from dledger.membership import BIND_FUNC_ID, Change, Member, MemberHistory, decode_changes, encode_bindings
from dledger.raft.election.prevote import PreVote
from dledger.raft.storage_binding import StorageBinding
from dledger.raft.storage_identity import StorageIdentity, read_identity
from tests.unit.test_prevote import Clock, FakeSyncObj, grant

F1, F2, F3 = (StorageIdentity(bytes([k]) * 16, founder=True) for k in (1, 2, 3))
J2 = StorageIdentity(b"\x22" * 16, founder=False)
ADDRESSES = {"h:1": "n1", "h:2": "n2", "h:3": "n3"}


@dataclass(frozen=True)
class FakeNode:
    """A pysyncobj node as the binding sees one: its Raft address."""

    address: str


N2, N3 = FakeNode("h:2"), FakeNode("h:3")


class Harness:
    """One replica's ``StorageBinding`` (``n1``) with the callbacks it is given recorded."""

    def __init__(self, tmp_path: Path, me: StorageIdentity, recorded: dict[str, StorageIdentity],
                 leader: bool = False, committed: int = 100) -> None:
        initial = {name: Member(name, raft, "", recorded[name].token if name in recorded else "")
                   for raft, name in ADDRESSES.items()}
        tmp_path.mkdir(parents=True, exist_ok=True)
        self.history = MemberHistory(tmp_path / "members", initial, 0)
        self.committed = committed
        self.leader = leader
        self.proposed: list[tuple[bytes, Any]] = []
        self.stands: list[bool] = []
        self.binding = StorageBinding(
            "n1", me, self.history, committed_index=lambda: self.committed, is_leader=lambda: self.leader,
            names=lambda: dict(ADDRESSES), propose=lambda payload, cb: self.proposed.append((payload, cb)),
            stand=self.stands.append, clock=Clock())


def ack(next_index: int, storage: StorageIdentity, success: bool = True) -> dict[str, Any]:
    return {"type": "next_node_idx", "next_node_idx": next_index, "reset": False, "success": success,
            "storage": storage.token}


# -- a replica whose own storage does not count ---------------------------------------------
def test_a_vote_request_to_a_replica_whose_storage_does_not_count_is_dropped(tmp_path: Path) -> None:
    request = {"type": "request_vote", "term": 9, "last_log_index": 5, "last_log_term": 3}
    new = Harness(tmp_path / "new", J2, {})  # a joiner nothing recorded yet: fed, not counted
    assert new.binding.refusal() is not None
    assert new.binding.on_message(N2, dict(request)), "a storage that does not count must not vote"
    replaced = Harness(tmp_path / "replaced", J2, {"n1": F1})  # another storage under its name
    assert replaced.binding.on_message(N2, dict(request))
    kept = Harness(tmp_path / "kept", F1, {"n1": F1})
    assert kept.binding.refusal() is None
    assert not kept.binding.on_message(N2, dict(request)), "the recorded storage votes (passed on)"


def test_a_replica_learns_at_its_tick_that_it_may_vote_and_stand(tmp_path: Path) -> None:
    h = Harness(tmp_path, J2, {}, committed=10)
    h.history.record(11, Change("bind", Member("n1", "h:1", "", J2.token)))
    h.binding.tick()
    assert "not committed yet" in (h.binding.refusal() or "") and h.stands == [False]
    h.committed = 11
    h.binding.tick()
    assert h.binding.refusal() is None and h.stands == [False, True]
    assert not h.binding.on_message(N2, {"type": "request_vote", "term": 9})


# -- a candidate counting votes and pre-vote grants ------------------------------------------
def test_a_vote_from_a_storage_that_does_not_count_is_ignored(tmp_path: Path) -> None:
    h = Harness(tmp_path, F1, {"n1": F1, "n2": F2, "n3": F3})
    vote = {"type": "response_vote", "term": 9, "granted": True}
    assert h.binding.on_message(N2, {**vote, "storage": J2.token}), "n2's recorded storage is F2"
    assert h.binding.on_message(N2, {**vote, "storage": ""}), "a malformed token"
    assert h.binding.on_message(FakeNode("h:9"), {**vote, "storage": F2.token}), "not a member"
    assert not h.binding.on_message(N2, {**vote, "storage": F2.token})
    assert not h.binding.on_message(N3, {**vote, "storage": F3.token})


def test_a_pre_vote_grant_from_a_storage_that_does_not_count_is_a_refusal(tmp_path: Path) -> None:
    h = Harness(tmp_path, F1, {"n1": F1, "n2": F2})
    foreign = {"type": "pre_vote_response", "round": 3, "granted": True, "storage": J2.token}
    assert not h.binding.on_message(N2, foreign)  # passed on to pre-vote, as a refusal
    assert foreign["granted"] is False
    recorded = {"type": "pre_vote_response", "round": 3, "granted": True, "storage": F2.token}
    assert not h.binding.on_message(N2, recorded)
    assert recorded["granted"] is True
    unrecorded_founder = {"type": "pre_vote_response", "round": 3, "granted": True, "storage": F3.token}
    assert not h.binding.on_message(N3, unrecorded_founder)  # n3: nothing recorded, a founder counts
    assert unrecorded_founder["granted"] is True


@pytest.mark.parametrize("may_vote", [True, False])
def test_pre_vote_is_not_granted_by_a_replica_that_may_not_vote(may_vote: bool) -> None:
    node = FakeSyncObj(["b", "c"])
    clock = Clock()
    pv = PreVote(node, lambda: 0.4, lambda: (0.4, 1.2), clock, random.Random(1), may_vote=lambda: may_vote)
    clock.now = 50  # no leader heard for longer than the minimum election timeout
    assert grant(pv, node) is may_vote


# -- a leader feeding a storage that does not count ------------------------------------------
def test_an_ack_from_a_storage_not_recorded_is_a_resume_at_and_never_counted(tmp_path: Path) -> None:
    h = Harness(tmp_path, F1, {"n1": F1, "n2": F2}, leader=True, committed=100)
    answer = ack(51, J2)
    assert not h.binding.on_message(N2, answer)  # passed on, rewritten
    assert answer["success"] is False and answer["reset"] is True and answer["next_node_idx"] == 51, \
        "pysyncobj must move n2's next index only, never its match index"
    catching_up = h.binding.status()["storages_catching_up"]
    assert catching_up == {"n2": {"storage": J2.token, "holds": 50, "needs": 100}}
    counted = ack(51, F3)
    assert not h.binding.on_message(N3, counted)
    assert counted["success"] is True and counted["reset"] is False
    follower = Harness(tmp_path / "follower", F1, {"n1": F1, "n2": F2}, leader=False)
    untouched = ack(51, J2)
    follower.binding.on_message(N2, untouched)
    assert untouched["success"] is True, "only a leader counts acknowledgements"


def test_the_leader_records_a_new_storage_once_it_holds_its_arrivals_commit_index(tmp_path: Path) -> None:
    h = Harness(tmp_path, F1, {"n1": F1, "n2": F2, "n3": F3}, leader=True, committed=100)
    h.binding.on_message(N2, ack(61, J2))
    h.committed = 130  # what commits after its arrival it receives as it goes
    h.binding.on_message(N2, ack(100, J2, success=False))  # a rejection: holds nothing more
    h.binding.tick()
    assert h.proposed == [], "recorded before it holds index 100"
    h.binding.on_message(N2, ack(101, J2))
    catching_up = h.binding.status()["storages_catching_up"]
    assert catching_up["n2"] == {"storage": J2.token, "holds": 100, "needs": 100}
    h.binding.tick()
    assert len(h.proposed) == 1
    payload, done = h.proposed[0]
    assert payload == encode_bindings({"n2": J2.token})
    entry = b"\x00" + pickle.dumps((BIND_FUNC_ID, (payload,)), protocol=5)  # as pysyncobj logs it
    changes = [(c.op, c.member.name, c.member.storage) for c in decode_changes(entry)]
    assert changes == [("bind", "n2", J2.token)]
    h.binding.tick()
    assert len(h.proposed) == 1, "one bind entry in flight at a time"
    done(None, FAIL_REASON.SUCCESS)
    h.history.record(131, Change("bind", Member("n2", "h:2", "", J2.token)))
    h.committed = 131
    counted = ack(140, J2)
    h.binding.on_message(N2, counted)
    assert counted["success"] is True and h.binding.status()["storages_catching_up"] == {}


def test_a_founder_answering_where_nothing_is_recorded_is_recorded_at_once(tmp_path: Path) -> None:
    h = Harness(tmp_path, F1, {}, leader=True)
    h.binding.on_message(N2, ack(5, F2))
    h.binding.tick()
    assert [p for p, _ in h.proposed] == [encode_bindings({"n1": F1.token, "n2": F2.token})]



def test_a_replica_about_to_drop_what_it_acknowledged_becomes_a_new_storage_at_once(tmp_path: Path) -> None:
    """``forget`` (a snapshot install over a log that was not behind, dledger/raft/journal.py):
    a new joiner identity on disk, and no vote from that moment -- not at the next tick."""
    h = Harness(tmp_path, F1, {"n1": F1, "n2": F2, "n3": F3})
    assert h.binding.refusal() is None
    new = h.binding.forget(tmp_path, "a snapshot install restarted its log at index 8 over entries up to 12")
    assert not new.founder and h.binding.token == new.token and read_identity(tmp_path) == new
    assert h.binding.refusal() is not None and h.stands == [False]
    assert h.binding.on_message(N2, {"type": "request_vote", "term": 9}), "it must not vote any more"
    h.binding.tick()
    assert h.stands == [False], "already held back: nothing changes at the tick"
