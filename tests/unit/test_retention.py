"""Retention: the pure plan, and deletion on a live group without breaking Raft."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dledger.config import MAX_ENTRY_BYTES, GroupConfig
from dledger.raft.replicated_log import ReplicatedLog
from dledger.storage.retention import plan_retention
from dledger.storage.segments import SegmentInfo
from raftmq.local_group import free_port
from tests.support.founding import founding

SEG = 1000


def segs(n: int, age_s: float = 0.0, now: float = 10_000.0, size: int = SEG) -> list[SegmentInfo]:
    return [SegmentInfo(i * SEG, Path(f"{i}"), size, now - age_s) for i in range(n)]


def test_expired_segments_go_up_to_the_floor() -> None:
    plan = plan_retention(segs(5, age_s=100), SEG, now=10_000, max_age_s=50, max_bytes=None,
                          floor_position=2500, node_floor_position=2500)
    assert (plan.delete_below_position, plan.segments, plan.blocked_by_floor) == (2000, 2, 1)


def test_fresh_segments_stay() -> None:
    plan = plan_retention(segs(5, age_s=10), SEG, now=10_000, max_age_s=50, max_bytes=None,
                          floor_position=4000, node_floor_position=4000)
    assert plan.segments == 0


def test_active_segment_is_never_deleted() -> None:
    plan = plan_retention(segs(3, age_s=100), SEG, now=10_000, max_age_s=50, max_bytes=None,
                          floor_position=10**9, node_floor_position=10**9)
    assert plan.delete_below_position == 2000 and plan.segments == 2


def test_size_cap_overrides_a_lagging_follower_but_not_this_node() -> None:
    plan = plan_retention(segs(5), SEG, now=10_000, max_age_s=10**9, max_bytes=2500,
                          floor_position=0, node_floor_position=10**9)
    assert plan.segments == 3  # 5000 -> 2000 bytes
    plan = plan_retention(segs(5), SEG, now=10_000, max_age_s=10**9, max_bytes=2500,
                          floor_position=0, node_floor_position=1500)
    assert plan.segments == 1


def wait_for(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.02)


@pytest.fixture
def single(tmp_path: Path) -> Iterator[ReplicatedLog]:
    cfg = GroupConfig(node="n1", peers={"n1": f"127.0.0.1:{free_port()}"}, data_dir=tmp_path, secret="t",
                      segment_bytes=4 * MAX_ENTRY_BYTES, retention_hours=0.0,
                      retention_check_s=0.05)
    rlog = ReplicatedLog(founding(cfg))
    yield rlog
    rlog.close()


@pytest.mark.sockets
def test_old_segments_are_deleted_and_the_rest_still_serves(single: ReplicatedLog) -> None:
    wait_for(lambda: single.is_leader, 10, "leader")
    single.set_applied_floor(lambda: 9)  # a state machine that has applied up to 9
    body = b"z" * (MAX_ENTRY_BYTES - 100)
    done = [single.propose(body + bytes([i])).result(timeout=10) for i in range(14)]
    wait_for(lambda: single.commitlog.first_index > 1, 10, "retention to delete a segment")
    first = single.commitlog.first_index
    assert 1 < first <= 9, "retention must keep the entries the state machine still needs"
    assert single.commitlog.start_position > 0
    for i, a in enumerate(done):
        if a.index >= first:
            assert single.commitlog.position_of(a.index) == a.position
            assert single.read(a.index)[0].body[-1] == i
    more = single.propose(b"after retention").result(timeout=10)
    assert single.read(more.index)[0].body == b"after retention"


@pytest.mark.sockets
def test_leader_keeps_what_a_lagging_follower_needs(tmp_path: Path) -> None:
    peers = {f"n{i}": f"127.0.0.1:{free_port()}" for i in (1, 2, 3)}

    def open_node(name: str) -> ReplicatedLog:
        return ReplicatedLog(founding(GroupConfig(
            node=name, peers=peers, data_dir=tmp_path / name, secret="t",
            segment_bytes=4 * MAX_ENTRY_BYTES, retention_hours=0.0, retention_check_s=0.05)))

    nodes = {name: open_node(name) for name in peers}
    try:
        wait_for(lambda: any(n.is_leader for n in nodes.values()), 15, "leader")
        leader = next(n for n in nodes.values() if n.is_leader)
        lagging = next(name for name, n in nodes.items() if n is not leader)
        nodes[lagging].close()
        body = b"q" * (MAX_ENTRY_BYTES - 100)
        last = [leader.propose(body).result(timeout=10) for _ in range(14)][-1]
        wait_for(lambda: leader.committed_index >= last.index, 10, "commit")
        plan = leader.enforce_retention()
        assert plan.blocked_by_floor > 0 and leader.commitlog.first_index <= 3
        nodes[lagging] = open_node(lagging)
        wait_for(lambda: nodes[lagging].committed_index >= last.index, 20, "catch-up")
        wait_for(lambda: leader.commitlog.first_index > 3, 10, "retention after catch-up")
        follower = nodes[lagging]
        caught_up = follower.read(follower.commitlog.first_index, 1 << 30)
        # no hole, through ``last`` at least (the leader may append more: a bind entry
        # recording the returning follower's storage, dledger.raft.storage_binding)
        indexes = [e.index for e in caught_up]
        assert indexes == list(range(indexes[0], indexes[-1] + 1)) and indexes[-1] >= last.index
        assert leader.followers_behind_retained_start() == []
    finally:
        for n in nodes.values():
            n.close()


@pytest.mark.sockets
def test_follower_behind_the_retained_start_restarts_its_log_there(tmp_path: Path) -> None:
    """The size cap deletes what a stopped follower still needs: when it returns, its
    log restarts at the leader's first retained entry, at the same position; the gap
    is reported in status and in its state machine, and it then follows normally."""
    from dledger.applier import Applier
    from dledger.process.recording_machine import GAP_KIND, RecordingMachine, read_records

    peers = {f"n{i}": f"127.0.0.1:{free_port()}" for i in (1, 2, 3)}
    seg = 4 * MAX_ENTRY_BYTES
    opened: list[tuple[ReplicatedLog, Applier, RecordingMachine]] = []

    def open_node(name: str) -> ReplicatedLog:
        rlog = ReplicatedLog(founding(GroupConfig(
            node=name, peers=peers, data_dir=tmp_path / name, secret="t", segment_bytes=seg,
            retention_hours=1000.0, retention_bytes=3 * seg, retention_check_s=0.05)))
        machine = RecordingMachine(tmp_path / name / "applied.log")
        applier = Applier(rlog, machine).start()
        rlog.set_applied_floor(machine.applied_index)
        opened.append((rlog, applier, machine))
        return rlog

    def close(rlog: ReplicatedLog) -> None:
        for r, applier, machine in opened:
            if r is rlog:
                applier.stop()
                r.close()
                machine.close()

    nodes = {name: open_node(name) for name in peers}
    try:
        wait_for(lambda: any(n.is_leader for n in nodes.values()), 15, "leader")
        leader = next(n for n in nodes.values() if n.is_leader)
        lagging = next(name for name, n in nodes.items() if n is not leader)
        wait_for(lambda: nodes[lagging].committed_index >= 2, 10, "follower joined")
        close(nodes[lagging])
        body = b"g" * (MAX_ENTRY_BYTES - 100)
        done = [leader.propose(body + i.to_bytes(2, "big")).result(timeout=10) for i in range(40)]
        wait_for(lambda: leader.commitlog.first_index > 8, 10, "the size cap to delete segments")
        nodes[lagging] = follower = open_node(lagging)
        wait_for(lambda: follower.committed_index >= done[-1].index, 20, "catch-up across the gap")
        assert follower.status().log_resets, "the gap must be reported"
        start = follower.commitlog.first_index
        assert start > 3
        for a in done:
            if a.index >= max(start, leader.commitlog.first_index):
                assert follower.commitlog.position_of(a.index) == a.position
                assert follower.read(a.index)[0].body == leader.read(a.index)[0].body
        more = leader.propose(b"after the gap").result(timeout=10)
        wait_for(lambda: follower.committed_index >= more.index, 10, "following again")
        records = read_records(tmp_path / lagging / "applied.log")
        wait_for(lambda: read_records(tmp_path / lagging / "applied.log")[-1][0] >= more.index, 10,
                 "the follower's state machine to apply past the gap")
        records = read_records(tmp_path / lagging / "applied.log")
        assert any(r[2] == GAP_KIND and r[0] == start - 1 for r in records)
        token = follower.identity.token
        close(follower)  # a log restarted at the retained start forgot nothing it acknowledged
        nodes[lagging] = follower = open_node(lagging)
        assert (follower.forgot, follower.identity.token) == (None, token)
    finally:
        for rlog, _, _ in opened:
            close(rlog)


@pytest.mark.sockets
def test_a_crash_inside_a_log_restart_is_finished_from_the_received_dump(tmp_path: Path) -> None:
    from dledger.raft.codec import encode_payload_command
    from dledger.raft.storage_identity import format_founder
    from dledger.storage.commitlog import CommitLog
    from dledger.storage.entry_format import EntryKind, record_size
    from dledger.storage.log_start import DumpEntry, encode_log_start

    seg = 4 * MAX_ENTRY_BYTES
    start = 3 * seg + 4096  # a position inside the fourth segment
    format_founder(tmp_path)  # a founder's storage, before the crash staged below
    log = CommitLog(tmp_path / "commitlog", seg)
    log.reset(40, start)  # ... and the process dies before appending 40 and 41
    log.close()
    first = DumpEntry(encode_payload_command(b"forty"), 40, 2, start)
    second = DumpEntry(encode_payload_command(b"forty-one"), 41, 2,
                       start + record_size(len(b"forty")))
    (tmp_path / "log-start.dump").write_bytes(encode_log_start(first, second))
    rlog = ReplicatedLog(founding(GroupConfig(node="n1", peers={"n1": f"127.0.0.1:{free_port()}"},
                                     data_dir=tmp_path, segment_bytes=seg, secret="t")))
    try:
        assert (rlog.commitlog.first_index, rlog.commitlog.position_of(41)) == (40, second.position)
        assert rlog.commitlog.entry(40).kind == EntryKind.DATA
        wait_for(lambda: rlog.is_leader, 10, "leader")
        appended = rlog.propose(b"next").result(timeout=10)
        assert appended.index > 41 and rlog.read(41)[0].body == b"forty-one"
    finally:
        rlog.close()


class FakeSnapshots:
    """A state machine's snapshots as ReplicatedLog sees them."""

    def __init__(self, indexes: list[int], held: int | None = None) -> None:
        self.indexes, self.held, self.pruned_below = indexes, held, 0

    def snapshot_indexes(self) -> list[int]:
        return self.indexes

    def snapshot_bytes(self, index: int) -> bytes | None:
        return f"state@{index}".encode() if index in self.indexes else None

    def prune_snapshots_below(self, index: int) -> None:
        self.pruned_below = index

    def oldest_held_position(self) -> int | None:
        return self.held


@pytest.mark.sockets
def test_retention_cuts_only_where_a_snapshot_is_held_and_keeps_held_messages(single: ReplicatedLog) -> None:
    from dledger.storage.log_start import decode_log_start

    wait_for(lambda: single.is_leader, 10, "leader")
    single.set_snapshot_source(FakeSnapshots([]))
    body = b"s" * (MAX_ENTRY_BYTES - 100)
    done = [single.propose(body + bytes([i])).result(timeout=10) for i in range(20)]
    starts = [a.index for a in done if a.position % single.config.segment_bytes == 0 and a.index > 1]
    assert len(starts) >= 4
    single.enforce_retention()
    assert single.commitlog.first_index == 1  # no snapshot: nothing may go

    by_index = {a.index: a for a in done}
    held_in = by_index[starts[1]].position + 10  # a held message in the segment from starts[1]
    source = FakeSnapshots([starts[0] - 1, starts[1] - 1, starts[2] - 1], held=held_in)
    single.set_snapshot_source(source)
    single.enforce_retention()
    assert single.commitlog.first_index == starts[1]  # the held message's segment stays

    source.held = None
    single.enforce_retention()
    assert single.commitlog.first_index == starts[2]  # the newest cut with a snapshot
    assert source.pruned_below == starts[2] - 1
    start = decode_log_start((single.config.data_dir / "log-start.dump").read_bytes())
    state = f"state@{starts[2] - 1}".encode()
    assert start.first.index == starts[2] and start.state_ref is not None
    assert (start.state_ref.index, start.state_ref.size) == (starts[2] - 1, len(state))
