"""Broker snapshots: taken before every CommitLog segment, installed on a replica that
lost the log before it, yielding exactly its peers' state (in memory, no network)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.state.held import Prop
from broker.state.machine import BrokerStateMachine
from broker.state.snapshot import Snapshot, SnapshotError
from broker.store.commands import CommitOffset, CreateTopic, DeleteTopic, LockQueue, encode_admin
from broker.store.entry_batch import pack_entries
from dledger.storage.entry_format import Entry, EntryKind, record_size
from protocol.message_format import Message, encode_message
from tests.support.ram_dir import ram_dir

SEGMENT = 4096
T0 = 1_700_000_000_000


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """pytest's ``tmp_path``, in RAM (``tests.support.ram_dir``: these tests fsync a lot)."""
    yield from ram_dir()


class SegmentedLog:
    """Entries laid out as a CommitLog with ``SEGMENT``-byte segments lays them out: an entry
    that does not fit in what is left of a segment starts the next one."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.position = 0

    def add(self, records: list[bytes], stamp: int = T0) -> Entry:
        (payload,) = pack_entries(records, stamp)
        size = record_size(len(payload))
        if self.position // SEGMENT != (self.position + size - 1) // SEGMENT:
            self.position = (self.position // SEGMENT + 1) * SEGMENT
        entry = Entry(len(self.entries) + 1, 1, EntryKind.DATA, payload, self.position)
        self.position += size
        self.entries.append(entry)
        return entry


def message(topic: str, i: int, queue: int = 0, **kw: object) -> bytes:
    return encode_message(Message(topic, f"body-{i}".encode() * 5, queue, tags=f"t{i % 3}",
                                  keys=(f"k{i}",), msg_id=i.to_bytes(16, "big"), **kw))  # type: ignore[arg-type]


def workload() -> SegmentedLog:
    log = SegmentedLog()
    log.add([encode_admin(CreateTopic("orders", 4)), encode_admin(CreateTopic("gone", 1))])
    for n in range(60):
        stamp = T0 + n * 1000
        records = [message("orders", n * 4 + k, queue=k, producer_id="p1", sequence=n) for k in range(4)]
        if n % 10 == 3:
            records.append(message("orders", 10_000 + n, queue=1,
                                   properties={Prop.DELIVER_AT: str(stamp + 3_600_000)}))
        if n % 7 == 0:
            records.append(encode_admin(CommitOffset("billing", "orders", n % 4, n)))
        if n == 20:
            records.append(encode_admin(LockQueue("billing", "c1", "orders", 2, True)))
        if n == 30:
            records.append(encode_admin(DeleteTopic("gone")))
        log.add(records, stamp)
    return log


def machine(path: Path) -> BrokerStateMachine:
    return BrokerStateMachine(path, cq_units_per_file=16, index_slots=64, index_entries=1024,
                              segment_bytes=SEGMENT)


def queue_units(m: BrokerStateMachine, topic: str, qid: int) -> dict[int, object]:
    cq = m.queue(topic, qid)
    assert cq is not None
    return {u.base: u for u in cq.read(cq.min_offset, 10_000).units}


def test_snapshots_are_taken_before_each_segment_and_equal_on_replicas_that_applied_alike(
        tmp_path: Path) -> None:
    log = workload()
    a, b = machine(tmp_path / "a"), machine(tmp_path / "b")
    try:
        a.apply(log.entries)
        for i in range(0, len(log.entries), 7):  # other apply batches: the same state
            b.apply(log.entries[i:i + 7])
        starts = [e.index for e in log.entries if e.position % SEGMENT == 0 and e.index > 1]
        assert len(starts) >= 4
        assert a.snapshot_indexes() == [s - 1 for s in starts] == b.snapshot_indexes()
        assert a.recent_digests() == b.recent_digests()
        assert a.snapshot_bytes(starts[1] - 1) == b.snapshot_bytes(starts[1] - 1)
    finally:
        a.close()
        b.close()


def test_a_replica_given_the_snapshot_and_the_log_after_it_ends_with_its_peers_state(tmp_path: Path) -> None:
    log = workload()
    peer = machine(tmp_path / "peer")
    peer.apply(log.entries)
    # the replica's log starts at the third segment
    cut = [e.index for e in log.entries if e.position % SEGMENT == 0 and e.index > 1][2]
    data = peer.snapshot_bytes(cut - 1)
    assert data is not None
    new = machine(tmp_path / "new")
    try:
        new.install_snapshot(cut - 1, data)
        assert new.applied_index() == cut - 1
        new.apply(log.entries[cut - 1:])
        assert new.topics == peer.topics and "gone" not in new.topics
        assert new.offsets == peer.offsets
        assert new.timers.state() == peer.timers.state() and len(new.timers) == 6
        assert new._state.producers.state() == peer._state.producers.state()
        assert new._state.locks.state() == peer._state.locks.state()
        last = max(peer.recent_digests())
        assert new.recent_digests()[last] == peer.recent_digests()[last]
        for qid in range(4):
            mine, theirs = queue_units(new, "orders", qid), queue_units(peer, "orders", qid)
            cq = new.queue("orders", qid)
            assert cq is not None and cq.max_offset == peer.queue("orders", qid).max_offset  # type: ignore[union-attr]
            assert cq.min_offset > 0  # starts where the retained log starts: the peers' numbering
            assert mine == {o: u for o, u in theirs.items() if o >= cq.min_offset}
        assert new.installs and (new.installs[0][0], new.installs[0][2]) == (cut - 1, 1)
    finally:
        new.close()
        peer.close()
    again = machine(tmp_path / "new")  # the install and what followed survive a restart
    try:
        assert again.applied_index() == len(log.entries)
        assert again.queue("orders", 1).max_offset == 60  # type: ignore[union-attr]
        assert again.installs[0][0] == cut - 1
        assert again.snapshot_bytes(cut - 1) == data
    finally:
        again.close()


def test_a_damaged_or_misnumbered_snapshot_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    log = workload()
    peer = machine(tmp_path / "peer")
    peer.apply(log.entries)
    index = peer.snapshot_indexes()[0]
    data = peer.snapshot_bytes(index)
    peer.close()
    assert data is not None
    new = machine(tmp_path / "new")
    try:
        damaged = bytearray(data)
        damaged[len(damaged) // 2] ^= 0xFF
        with pytest.raises(SnapshotError):
            new.install_snapshot(index, bytes(damaged))
        with pytest.raises(SnapshotError, match="not"):
            new.install_snapshot(index + 1, data)
        assert new.applied_index() == 0 and not new.topics
        assert Snapshot.decode(data).index == index
        with pytest.raises(RuntimeError, match="snapshot"):
            new.apply_gap(index + 1)
    finally:
        new.close()


def test_digests_do_not_depend_on_when_a_replica_checkpointed(tmp_path: Path) -> None:
    """Checkpoints prune expired producers and trim kept offsets whenever they run; a
    snapshot's tables are in the one form every replica has at its index."""
    log = SegmentedLog()
    log.add([encode_admin(CreateTopic("t", 1))])
    log.add([message("t", 0, producer_id="old", sequence=0)], stamp=T0)  # silent for > 24 h after
    for n in range(700):  # more sequences than a producer's kept offsets
        stamp = T0 + 25 * 3600_000 + n
        log.add([message("t", 1 + n, producer_id="busy", sequence=n)], stamp=stamp)
    often, never = machine(tmp_path / "often"), machine(tmp_path / "never")
    try:
        for entry in log.entries:
            often.apply([entry])
            often.checkpoint()
        never.apply(log.entries)
        assert len(often.recent_digests()) >= 3
        assert often.recent_digests() == never.recent_digests()
    finally:
        often.close()
        never.close()
