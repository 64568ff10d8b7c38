"""ReplicatedLog in one process: propose/read/commit, leadership, entry size, peer secrets."""

from __future__ import annotations

import errno
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dledger.config import (
    APPEND_BATCH_BYTES,
    MAX_ENTRY_BYTES,
    ConfigError,
    FlushPolicy,
    GroupConfig,
)
from dledger.errors import DiskFull, EntryTooLarge, NotLeader
from dledger.raft.codec import encode_payload_command
from dledger.raft.replica_wiring import held_through
from dledger.raft.replicated_log import ReplicatedLog
from dledger.storage.commitlog import CommitLog
from dledger.storage.entry_format import EntryKind
from raftmq.local_group import free_port
from tests.support.founding import founding


def wait_for(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout}s")
        time.sleep(0.02)


@pytest.fixture
def make_group(tmp_path: Path) -> Iterator[Callable[..., dict[str, ReplicatedLog]]]:
    opened: list[ReplicatedLog] = []

    def make(n: int = 3, secrets: dict[str, str] | None = None,
             flush: str = "sync") -> dict[str, ReplicatedLog]:
        peers = {f"n{i + 1}": f"127.0.0.1:{free_port()}" for i in range(n)}
        logs = {}
        for name in peers:
            cfg = GroupConfig(node=name, peers=peers, data_dir=tmp_path / name,
                              secret=(secrets or {}).get(name, "test-secret"),
                              segment_bytes=1 << 20, flush=FlushPolicy(flush))
            logs[name] = ReplicatedLog(founding(cfg))
            opened.append(logs[name])
        return logs

    yield make
    for rlog in opened:
        rlog.close()


def leader_of(logs: dict[str, ReplicatedLog], timeout: float = 15.0) -> ReplicatedLog:
    found: list[ReplicatedLog] = []
    wait_for(lambda: found.extend(r for r in logs.values() if r.is_leader) or found, timeout,
             "a leader")
    return found[0]


@pytest.mark.sockets
def test_single_node_propose_and_read(make_group: Callable[..., dict[str, ReplicatedLog]]) -> None:
    (rlog,) = make_group(1).values()
    leader_of({"n1": rlog})
    appended = [rlog.propose(f"m{i}".encode()).result(timeout=10) for i in range(5)]
    assert [a.index for a in appended] == sorted(a.index for a in appended)
    assert rlog.committed_index >= appended[-1].index
    entries = {e.index: e for e in rlog.read(1)}
    for i, a in enumerate(appended):
        e = entries[a.index]
        assert (e.kind, e.body, e.position) == (EntryKind.DATA, f"m{i}".encode(), a.position)
    assert rlog.status().last_fsync_time is not None


@pytest.mark.sockets
def test_three_nodes_replicate_and_followers_redirect(
        make_group: Callable[..., dict[str, ReplicatedLog]]) -> None:
    logs = make_group(3)
    leader = leader_of(logs)
    last = None
    for i in range(20):
        last = leader.propose(f"x{i}".encode()).result(timeout=10)
    for rlog in logs.values():
        wait_for(lambda r=rlog: r.committed_index >= last.index, 10, "followers commit")
        bodies = [e.body for e in rlog.read(1) if e.kind == EntryKind.DATA]
        assert bodies == [f"x{i}".encode() for i in range(20)]
        assert rlog.commitlog.position_of(last.index) == last.position
    follower = next(r for r in logs.values() if not r.is_leader)
    with pytest.raises(NotLeader) as info:
        follower.propose(b"nope").result(timeout=5)
    assert info.value.leader == leader.config.node
    assert info.value.leader_address == leader.config.address


def test_entry_size_limit_keeps_clear_of_chunking() -> None:
    """Defect 3: pysyncobj chunks (wrongly) any entry >= appendEntriesBatchSizeBytes."""
    biggest = encode_payload_command(b"\xff" * MAX_ENTRY_BYTES)
    assert len(biggest) < APPEND_BATCH_BYTES


def test_chunked_transmission_is_refused_at_the_transport() -> None:
    from dledger.raft.transport import GroupTransport

    with pytest.raises(RuntimeError, match="chunked transmission"):
        GroupTransport.send(object.__new__(GroupTransport), None,  # type: ignore[arg-type]
                            {"type": "append_entries", "transmission": "start", "data": b""})


@pytest.mark.sockets
def test_async_flush_policy(make_group: Callable[..., dict[str, ReplicatedLog]]) -> None:
    logs = make_group(3, flush="async")
    leader = leader_of(logs)
    done = [leader.propose(f"a{i}".encode()).result(timeout=10) for i in range(10)]
    for rlog in logs.values():
        wait_for(lambda r=rlog: r.committed_index >= done[-1].index, 10, "commit")
        wait_for(lambda r=rlog: r.status().last_fsync_time is not None
                 and not r.commitlog.dirty, 5, "the periodic fsync")
        assert rlog.status().flush == "async"


@pytest.mark.sockets
def test_oversized_entry_is_refused(make_group: Callable[..., dict[str, ReplicatedLog]]) -> None:
    (rlog,) = make_group(1).values()
    leader_of({"n1": rlog})
    with pytest.raises(EntryTooLarge, match="limit"):
        rlog.propose(b"x" * (MAX_ENTRY_BYTES + 1))
    ok = rlog.propose(b"y" * MAX_ENTRY_BYTES).result(timeout=10)
    assert rlog.read(ok.index)[0].body == b"y" * MAX_ENTRY_BYTES


@pytest.mark.sockets
def test_wrong_secret_peer_never_joins(make_group: Callable[..., dict[str, ReplicatedLog]]) -> None:
    logs = make_group(3, secrets={"n3": "a-different-secret"})
    leader = leader_of(logs)
    assert leader.config.node != "n3"
    done = leader.propose(b"secret-data").result(timeout=10)
    intruder = logs["n3"]
    others = [logs["n1"], logs["n2"]]
    wait_for(lambda: all(r.committed_index >= done.index for r in others), 10,
             "the two good peers to commit")
    assert intruder.committed_index < done.index
    assert all(e.body != b"secret-data" for e in intruder.read(1))
    assert intruder.status().peers_connected == {"n1": False, "n2": False}


@pytest.mark.sockets
def test_address_in_use_is_a_clear_error(tmp_path: Path,
                                         make_group: Callable[..., dict[str, ReplicatedLog]]) -> None:
    (rlog,) = make_group(1).values()
    cfg = GroupConfig(node="n1", peers={"n1": rlog.config.address}, data_dir=tmp_path / "other", secret="t")
    with pytest.raises(ConfigError, match="cannot listen on Raft address"):
        ReplicatedLog(cfg)


class NoRoom:
    """A replica's disk made full: its CommitLog appends fail with ENOSPC and its file system
    reads 0 bytes free, until ``room()``."""

    def __init__(self, rlog: ReplicatedLog) -> None:
        self.rlog = rlog
        self._append = rlog.commitlog.append
        self.full = True
        rlog.commitlog.append = self._refuse  # type: ignore[method-assign]
        rlog.disk.measure_free = lambda: 0 if self.full else 1 << 40

    def _refuse(self, *args: Any) -> int:
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        return self._append(*args)

    def room(self) -> None:
        self.full = False


def terms(logs: dict[str, ReplicatedLog]) -> set[int]:
    return {r.status().term for r in logs.values()}


@pytest.mark.sockets
def test_two_full_followers_refuse_without_elections_then_resume(
        make_group: Callable[..., dict[str, ReplicatedLog]]) -> None:
    """The leader keeps its lease (the full followers still answer), learns from their answers
    that no majority can store and refuses at once with DiskFull naming them; the entry it
    had already appended commits after room came back -- nothing lost, no new term."""
    logs = make_group(3)
    leader = leader_of(logs)
    leader.propose(b"before").result(timeout=10)
    followers = [r for r in logs.values() if r is not leader]
    names = sorted(r.config.node for r in followers)
    wait_for(lambda: len(terms(logs)) == 1 and all(r.committed_index >= 2 for r in followers), 10,
             "every replica in the leader's term")
    full = [NoRoom(r) for r in followers]
    term = terms(logs)
    waiting = leader.propose(b"appended-before-anyone-knew")
    wait_for(lambda: leader.disk_full_nodes() == names, 10, "the leader hearing of both full disks")
    with pytest.raises(DiskFull) as refused:
        leader.propose(b"refused").result(timeout=5)
    assert refused.value.nodes == names and refused.value.definitely_not_committed
    assert all(n in str(refused.value) for n in names)
    time.sleep(3 * leader.config.leader_lease_ms / 1000)  # longer than the lease: no election
    assert leader.is_leader and terms(logs) == term and not waiting.done()
    for r in followers:
        assert r.status().disk["full"] is True and r.status().role == "follower"
    for f in full:
        f.room()
    committed = waiting.result(timeout=15)  # the entry appended before: committed, not lost
    wait_for(lambda: not any(r.disk.full for r in followers) and not leader.disk_full_nodes(), 10,
             "the flags lowered (a check about once a second)")
    after = leader.propose(b"after").result(timeout=10)
    assert after.index > committed.index and terms(logs) == term and leader.is_leader


@pytest.mark.sockets
def test_a_full_leader_hands_over_and_stands_again_once_there_is_room(
        make_group: Callable[..., dict[str, ReplicatedLog]]) -> None:
    logs = make_group(3)
    old = leader_of(logs)
    old.propose(b"before").result(timeout=10)
    full = NoRoom(old)
    with pytest.raises(DiskFull) as refused:
        old.propose(b"no room here").result(timeout=5)
    assert refused.value.nodes == [old.config.node]
    others = {n: r for n, r in logs.items() if r is not old}
    new = leader_of(others, timeout=15)
    wait_for(lambda: not old.is_leader, 10, "the full leader stepping down")
    done = new.propose(b"on the new leader").result(timeout=10)  # two of three have room
    time.sleep(2.0)  # several election timeouts: the full replica does not stand
    assert new.is_leader and not old.is_leader and old.status().role == "follower"
    full.room()
    wait_for(lambda: not old.disk.full and old.commitlog.last_index >= done.index, 15,
             "the old leader catching up once it has room")
    assert new.is_leader


def test_the_transport_says_a_full_disk_and_sends_a_full_follower_no_entries(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from pysyncobj.transport import TCPTransport

    from dledger.raft.transport import make_transport_class

    sent: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(TCPTransport, "send",
                        lambda self, node, message: sent.append((node, message)) or True)
    full = {"here": False}
    cls = make_transport_class(None, lambda: 7, disk_full=lambda: full["here"],
                               follower_full=lambda node: node == "n3")
    t = object.__new__(cls)
    append = {"type": "append_entries", "term": 2, "prevLogIdx": 4, "prevLogTerm": 2, "commit_index": 4,
              "entries": [(b"\x00x", 5, 2)]}
    t.send("n3", append)
    t.send("n2", append)
    assert sent[0][1]["entries"] == [] and sent[0][1]["prevLogIdx"] == 4  # a heartbeat: safe
    assert sent[1][1] is append
    rejection = {"type": "next_node_idx", "next_node_idx": 9, "reset": True, "success": False}
    t.send("n1", rejection)
    full["here"] = True
    t.send("n1", rejection)
    assert "disk_full" not in sent[2][1] and sent[2][1]["next_node_idx"] == 7
    assert sent[3][1] == {**rejection, "next_node_idx": 7, "disk_full": True}


@pytest.mark.sockets
def test_a_replica_that_must_not_lead_refuses_a_leadership_transfer(
        make_group: Callable[..., dict[str, ReplicatedLog]]) -> None:
    """A full disk (or a snapshot awaited, or a divergent state) keeps a replica from standing;
    a leader's TimeoutNow must not make it stand anyway -- it would only hand the leadership
    on again (an extra election). The leader then picks another member."""
    logs = make_group(3)
    leader = leader_of(logs)
    leader.propose(b"before").result(timeout=10)
    target, other = sorted((r for r in logs.values() if r is not leader), key=lambda r: r.config.node,
                           reverse=True)
    wait_for(lambda: target.commitlog.last_index >= 2 and other.commitlog.last_index >= 2, 10,
             "both followers holding every entry")
    target.stand_for_election(False, "a test's reason")
    term = leader.status().term
    assert leader.transfer_leadership(target.config.node, timeout=2.0) is None  # not taken
    assert leader.is_leader and leader.status().term == term and not target.is_leader
    # the default choice passes over the member that did not take it, whatever the match indexes
    assert leader.transfer_leadership(timeout=5.0) == other.config.node
    target.stand_for_election(True, "a test's reason")


@pytest.mark.sockets
def test_a_deaf_leader_whose_lease_lapsed_has_a_follower_stand_at_once(
        make_group: Callable[..., dict[str, ReplicatedLog]]) -> None:
    """A leader that hears nothing (its peers still hear it) steps down when its lease
    lapses, and its last heartbeats kept its followers from standing for an election
    timeout more: it sends TimeoutNow to the member furthest ahead, which stands at once
    -- without a pre-vote round, as after any TimeoutNow (issue 35: the deaf leader's
    failover was the lease plus an election timeout)."""
    logs = make_group(3)
    leader = leader_of(logs)
    leader.propose(b"before").result(timeout=10)
    others = [r for r in logs.values() if r is not leader]
    wait_for(lambda: all(r.commitlog.last_index >= 2 for r in others), 10, "followers holding every entry")
    won_before = {r.config.node: r.status().pre_vote_won for r in others}
    leader._transport.intercept = lambda node, message: True  # deaf: every message dropped
    new = leader_of({r.config.node: r for r in others}, timeout=15)
    assert leader.status().lease_hand_offs == 1
    assert new.status().pre_vote_won == won_before[new.config.node], "stood on TimeoutNow, not a pre-vote"


def _stage_counts(rlog: ReplicatedLog) -> dict[str, int]:
    return {stage: h.snapshot()[0][-1][1] for stage, h in rlog.stage_seconds.items()}


@pytest.mark.sockets
def test_every_stage_of_a_commit_is_timed_on_the_leader_and_the_followers(
        make_group: Callable[..., dict[str, ReplicatedLog]]) -> None:
    """Issue 30: each proposal passes every leader stage once; each follower times its own."""
    logs = make_group(3)
    leader = leader_of(logs)
    for i in range(10):
        leader.propose(f"s{i}".encode()).result(timeout=10)
    leader_stages = ("queue", "append", "leader_fsync", "send", "replicate", "commit", "apply")
    counts = _stage_counts(leader)
    assert {s: counts[s] for s in leader_stages} == dict.fromkeys(leader_stages, 10)
    assert all(counts[s] == 0 for s in ("follower_append", "follower_fsync", "follower_ack"))
    for follower in (r for r in logs.values() if r is not leader):
        wait_for(lambda f=follower: _stage_counts(f)["follower_ack"] >= 10, 10, "a follower's acks")
        counts = _stage_counts(follower)
        assert min(counts[s] for s in ("follower_append", "follower_fsync")) >= 10
        assert all(counts[s] == 0 for s in leader_stages)



def _one_node_with_entries(tmp_path: Path) -> tuple[GroupConfig, str]:
    """A one-node group that committed ~800 KB over several 256 KiB segments, then closed
    (closing stores the commit hint); its config and storage token."""
    cfg = founding(GroupConfig(node="n1", peers={"n1": f"127.0.0.1:{free_port()}"},
                               data_dir=tmp_path / "n1", secret="test-secret", segment_bytes=256 << 10,
                               flush=FlushPolicy("sync")))
    rlog = ReplicatedLog(cfg)
    try:
        leader_of({"n1": rlog})
        for i in range(40):
            rlog.propose(b"m%d" % i + b"x" * 20_000).result(timeout=10)
        return cfg, rlog.identity.token
    finally:
        rlog.close()


@pytest.mark.sockets
@pytest.mark.parametrize("lost", ["commitlog", "last-segments"])
def test_a_log_lost_without_a_cut_below_its_commit_hint_makes_a_new_storage(
        tmp_path: Path, lost: str) -> None:
    """Issue 24: a replica whose CommitLog folder (or its newest segments) is gone while its
    hard state and storage id survive forgot entries it acknowledged -- recovery cut nothing,
    so only the commit hint can tell. It must come back as a new storage that does not vote."""
    cfg, first = _one_node_with_entries(tmp_path)
    folder = cfg.data_dir / "commitlog"
    segments = sorted(p for p in folder.iterdir() if p.name.isdigit())
    assert len(segments) >= 3, segments
    for path in segments if lost == "commitlog" else segments[1:]:
        path.unlink()
    reopened = ReplicatedLog(cfg)
    try:
        assert reopened.forgot is not None and "commit index" in reopened.forgot, reopened.forgot
        assert reopened.identity.token.startswith("j-") and reopened.identity.token != first
        assert reopened.candidacy.reasons, "a replica that forgot must neither vote nor stand"
    finally:
        reopened.close()


@pytest.mark.sockets
def test_a_replica_reopened_with_its_whole_log_keeps_its_storage(tmp_path: Path) -> None:
    cfg, first = _one_node_with_entries(tmp_path)
    reopened = ReplicatedLog(cfg)
    try:
        assert reopened.forgot is None and reopened.identity.token == first
        assert not reopened.candidacy.reasons
    finally:
        reopened.close()


def test_a_log_restarted_at_a_retained_start_holds_through_that_start(tmp_path: Path) -> None:
    """The journal counts a reset log's start as committed before the entry arrives; the
    forgetting check must not take that log for one that lost entries."""
    log = CommitLog(tmp_path / "commitlog", 4 * MAX_ENTRY_BYTES)
    try:
        assert held_through(log) == 0
        log.reset(40, 4096)
        assert held_through(log) == 40
        log.append(40, 2, EntryKind.DATA, b"forty")
        log.append(41, 2, EntryKind.DATA, b"forty-one")
        assert held_through(log) == 41
    finally:
        log.close()
