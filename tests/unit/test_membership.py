"""Membership changes through the log (dledger.membership, ReplicatedLog.change_membership):
the member set is the log's, survives restarts, rolls back with truncations; a learner
catches up without a vote, then counts; pysyncobj's own set is kept equal to the log's."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from broker.namesrv.server import Registration, RouteTable
from dledger.config import FlushPolicy, GroupConfig
from dledger.membership import Change, Member, MemberHistory, decode_change, encode_change
from dledger.raft.replicated_log import ReplicatedLog
from dledger.storage.log_start import DumpEntry, decode_log_start, encode_log_start
from raftmq.local_group import free_port
from tests.support.founding import founding
from tests.support.procs import wait_until

N1, N2, N3 = Member("n1", "h:1", "c:1"), Member("n2", "h:2"), Member("n3", "h:3", "c:3")


def test_a_change_is_plain_data_in_pysyncobjs_membership_command() -> None:
    change = Change("add", N3)
    command = b"\x02" + encode_change(change)
    assert b"dledger" not in command and b"PeerNode" not in command  # no pickled classes
    assert decode_change(command) == change
    assert decode_change(b"\x00whatever") is None
    assert decode_change(b"\x02not a pickle") is None
    with pytest.raises(ValueError):
        Member("bad name", "h:1").check()
    with pytest.raises(ValueError):
        Member("n4", "nohostport").check()


def test_history_follows_appends_truncations_restarts_and_retention(tmp_path: Path) -> None:
    path = tmp_path / "members"
    h = MemberHistory(path, {"n1": N1, "n2": N2}, last_index=10)
    h.record(20, Change("add", N3))
    h.record(30, Change("rem", N1))
    assert sorted(h.current()) == ["n2", "n3"] and sorted(h.at(25)) == ["n1", "n2", "n3"]
    assert sorted(MemberHistory(path, {}, last_index=40).current()) == ["n2", "n3"]  # durable
    # entries lost in a crash before their fsync: the change goes with them
    assert sorted(MemberHistory(path, {}, last_index=25).current()) == ["n1", "n2", "n3"]
    h = MemberHistory(path, {}, last_index=40)
    h.truncate_from(30)  # a conflicting leader replaced the entries from 30 on
    assert sorted(h.current()) == ["n1", "n2", "n3"] and h.changed_at() == 20
    h.forget_below(25)  # retention: the newest change below the cut is kept
    assert sorted(h.at(21)) == ["n1", "n2", "n3"]
    h.restart_at(100, {"n9": Member("n9", "h:9")})  # a log restart at the leader's snapshot
    assert list(h.current()) == ["n9"] and h.changed_at() == 100


def test_the_log_start_dump_carries_the_members() -> None:
    first, second = DumpEntry(b"\x01", 5, 1, 100), DumpEntry(b"\x01", 6, 1, 120)
    start = decode_log_start(encode_log_start(first, second, b"state", [N1.member_id]))
    assert start.members == [N1.member_id]
    assert decode_log_start(encode_log_start(first, second, b"state")).members is None


def test_the_name_server_routes_only_the_leaders_members() -> None:
    table = RouteTable()
    for node, role, members in (("n1", "follower", None), ("n2", "leader", ["n2", "n3"]),
                                ("n3", "follower", ["n2", "n3"])):
        table.register(Registration("g1", node, role, f"{node}:1", {"t": (1, 6)}, term=2,
                                    members=None if members is None else tuple(members)))
    assert table.route("t").groups[0].replicas == {"n2": "n2:1", "n3": "n3:1"}


@pytest.fixture
def open_logs(tmp_path: Path) -> Iterator[Callable[..., ReplicatedLog]]:
    opened: list[ReplicatedLog] = []

    def open_log(name: str, peers: dict[str, str], join: bool = False) -> ReplicatedLog:
        rlog = ReplicatedLog(founding(GroupConfig(node=name, peers=peers, data_dir=tmp_path / name,
                                         secret="test-secret", segment_bytes=1 << 20,
                                         flush=FlushPolicy.SYNC, join=join)))
        opened.append(rlog)
        return rlog

    yield open_log
    for rlog in opened:
        rlog.close()


@pytest.mark.sockets
def test_a_learner_catches_up_without_a_vote_then_counts_and_a_removed_member_stops_counting(
        open_logs: Callable[..., ReplicatedLog]) -> None:
    peers = {f"n{i}": f"127.0.0.1:{free_port()}" for i in (1, 2)}
    logs = {n: open_logs(n, peers) for n in peers}
    wait_until(lambda: any(r.is_leader for r in logs.values()), 15, what="a leader")
    leader = next(r for r in logs.values() if r.is_leader)
    for i in range(30):
        leader.propose(f"m{i}".encode()).result(timeout=10)
    learner = open_logs("n3", {**peers, "n3": f"127.0.0.1:{free_port()}"}, join=True)
    assert not learner.is_member and learner.status().member is False
    wait_until(lambda: learner.committed_index >= leader.committed_index, 15, what="the learner caught up")
    assert sorted(leader.members()) == ["n1", "n2"]  # it does not count yet
    # added with the storage it joined with (as `raftmq replica add` does): it counts once committed
    members = leader.change_membership(Change("add", Member("n3", learner.config.address, "c:3",
                                                            learner.status().storage)))
    assert sorted(members) == ["n1", "n2", "n3"]
    wait_until(lambda: learner.is_member and not learner.is_learner, 10, what="n3 a member")
    wait_until(lambda: learner.status().voter, 10, what="n3 a voter")
    assert learner.client_addresses()["n3"] == "c:3"
    # with n3 a member, the group of three commits with either old node down: stop the follower
    follower = next(r for r in logs.values() if not r.is_leader)
    follower.close()
    leader.propose(b"needs n3").result(timeout=10)
    with pytest.raises(ValueError, match="transfer the leadership"):
        leader.change_membership(Change("rem", Member(leader.config.node, "x:1")))
    leader.change_membership(Change("rem", Member(follower.config.node, "x:1")))
    assert sorted(leader.members()) == sorted({"n1", "n2", "n3"} - {follower.config.node})
    leader.propose(b"two of two").result(timeout=10)


@pytest.mark.sockets
def test_pysyncobjs_member_set_is_put_back_to_the_logs(open_logs: Callable[..., ReplicatedLog]) -> None:
    peers = {f"n{i}": f"127.0.0.1:{free_port()}" for i in (1, 2, 3)}
    logs = {n: open_logs(n, peers) for n in peers}
    wait_until(lambda: any(r.is_leader for r in logs.values()), 15, what="a leader")
    follower = next(r for r in logs.values() if not r.is_leader)
    wait_until(lambda: follower._node._getLeader() is not None, 15, what="the follower knowing its leader")
    other = next(m for m in follower.members().values()
                 if m.raft not in (follower.config.address, follower._node._getLeader().address))
    # as pysyncobj does after a stale prevLogIdx: it undoes a change the journal keeps
    follower._node._SyncObj__doChangeCluster(["rem", other.raft])

    def partners() -> set[str]:
        status = follower._node.getStatus()
        return {k.rsplit("_", 1)[1] for k in status if k.startswith("partner_node_status")}

    assert other.raft not in partners()
    follower._members.mark_dirty()
    wait_until(lambda: other.raft in partners(), 5, what="the member put back")
