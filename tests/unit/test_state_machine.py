"""The broker's apply step: deterministic, idempotent, and recoverable from its checkpoint.

Entries are built in memory (no network, no clock, no threads), as in etcd's raft
tests: the same entries must give the same state and byte-identical files.
"""

from __future__ import annotations

import filecmp
import shutil
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.commands import CommitOffset, CreateTopic, DeleteTopic, Perm, encode_admin
from broker.entry_batch import pack_entries
from broker.message_format import Message, encode_message
from broker.state_machine import BrokerStateMachine, Outcome
from dledger.entry_format import Entry, EntryKind, record_size


class Log:
    """Builds entries with positions as a CommitLog would lay them out."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.position = 0

    def add(self, records: list[bytes], stamp: int = 1_700_000_000_000) -> Entry:
        (payload,) = pack_entries(records, stamp)
        entry = Entry(len(self.entries) + 1, 1, EntryKind.DATA, payload, self.position)
        self.position += record_size(len(payload))
        self.entries.append(entry)
        return entry

    def noop(self) -> None:
        self.entries.append(Entry(len(self.entries) + 1, 1, EntryKind.NOOP, b"", self.position))
        self.position += record_size(0)


def msg(topic: str, i: int, queue: int = 0, **kw: object) -> bytes:
    return encode_message(Message(topic, f"body-{i}".encode(), queue, tags=f"t{i % 3}",
                                  keys=(f"order-{i % 7}",),
                                  msg_id=i.to_bytes(16, "big"), **kw))  # type: ignore[arg-type]


def workload() -> Log:
    log = Log()
    log.noop()
    log.add([encode_admin(CreateTopic("orders", 4))])
    for n in range(30):
        log.add([msg("orders", n * 10 + k, queue=(n + k) % 4) for k in range(10)])
    log.add([encode_admin(CommitOffset("billing", "orders", 1, 17))])
    log.add([encode_admin(CreateTopic("audit", 2, Perm.READ_WRITE))])
    log.add([msg("audit", 1000 + k, queue=k % 2) for k in range(5)])
    return log


def files_equal(a: Path, b: Path) -> None:
    cmp = filecmp.dircmp(a, b)
    assert not cmp.left_only and not cmp.right_only, (cmp.left_only, cmp.right_only)
    _, mismatch, errors = filecmp.cmpfiles(a, b, cmp.common_files, shallow=False)
    assert not mismatch and not errors, mismatch
    for sub in cmp.common_dirs:
        files_equal(a / sub, b / sub)


def test_two_replicas_derive_identical_files(tmp_path: Path) -> None:
    log = workload()
    for name in ("r1", "r2"):
        sm = BrokerStateMachine(tmp_path / name, cq_units_per_file=16, index_slots=8, index_entries=64)
        for i in range(0, len(log.entries), 7):  # different batching, same result
            sm.apply(log.entries[i:i + 7] if name == "r1" else log.entries[i:i + 7][:3])
            if name == "r2":
                sm.apply(log.entries[i + 3:i + 7])
        sm.close()
    files_equal(tmp_path / "r1", tmp_path / "r2")


def test_messages_land_in_their_queues_in_order(tmp_path: Path) -> None:
    log = workload()
    sm = BrokerStateMachine(tmp_path / "s", cq_units_per_file=16, index_slots=8, index_entries=64)
    sm.apply(log.entries)
    assert sm.applied_index() == len(log.entries)
    total = sum(sm.queue("orders", q).max_offset for q in range(4))
    assert total == 300
    cq = sm.queue("orders", 2)
    bodies = []
    for off in range(cq.max_offset):
        unit = cq.get(off)
        entry = max((e for e in log.entries if e.position <= unit.position), key=lambda e: e.position)
        start = unit.position - entry.position - 32
        bodies.append(entry.body[start:start + unit.size])
    assert all(b.startswith(b"\x9e\x01") for b in bodies)  # each unit points at a message
    assert sm.committed_offset("billing", "orders", 1) == 17
    by_id = sm.query_key((123).to_bytes(16, "big").hex(), 0, 2**62, 10)
    assert len(by_id) == 1 and any(u.position == by_id[0] for q in range(4)
                                   for u in (sm.queue("orders", q).get(o)
                                             for o in range(sm.queue("orders", q).max_offset)))
    assert len(sm.index.files()) > 1  # 300 ids in 63-entry files: the index rolled
    sm.close()


def test_retried_idempotent_message_is_not_stored_twice(tmp_path: Path) -> None:
    log = Log()
    log.add([encode_admin(CreateTopic("t", 1))])
    first = log.add([msg("t", 0, producer_id="p", sequence=0), msg("t", 1, producer_id="p", sequence=1)])
    retry = log.add([msg("t", 1, producer_id="p", sequence=1)])
    gap = log.add([msg("t", 3, producer_id="p", sequence=3)])
    sm = BrokerStateMachine(tmp_path / "s", index_slots=8, index_entries=64)
    sm.apply(log.entries)
    original = sm.results(first.index)[1]
    again = sm.results(retry.index)[0]
    assert original.outcome == Outcome.STORED
    assert (again.outcome, again.queue_offset) == (Outcome.DUPLICATE, original.queue_offset)
    assert sm.results(gap.index)[0].outcome == Outcome.SEQUENCE_GAP
    assert sm.queue("t", 0).max_offset == 2
    sm.close()


def test_refusals_store_nothing(tmp_path: Path) -> None:
    log = Log()
    log.add([encode_admin(CreateTopic("ro", 1, Perm.READ)), encode_admin(CreateTopic("rw", 1))])
    e = log.add([msg("missing", 1), msg("ro", 2), msg("rw", 3, queue=5), b"\x93garbage",
                 encode_admin(DeleteTopic("missing"))])
    sm = BrokerStateMachine(tmp_path / "s", index_slots=8, index_entries=64)
    sm.apply(log.entries)
    assert [r.outcome for r in sm.results(e.index)] == [
        Outcome.TOPIC_NOT_EXIST, Outcome.NO_PERMISSION, Outcome.INVALID, Outcome.INVALID,
        Outcome.TOPIC_NOT_EXIST]
    assert sm.queue("ro", 0) is None and sm.queue("rw", 0) is None
    sm.close()


def test_replay_after_a_crash_gives_the_same_bytes(tmp_path: Path) -> None:
    log = workload()
    full = BrokerStateMachine(tmp_path / "full", cq_units_per_file=16, index_slots=8, index_entries=64)
    full.apply(log.entries)
    full.close()

    crashed = tmp_path / "crashed"
    sm = BrokerStateMachine(crashed, cq_units_per_file=16, index_slots=8, index_entries=64)
    sm.apply(log.entries[:12])
    saved = (crashed / "state.checkpoint").read_bytes()
    sm.apply(log.entries[12:20])  # applied to the queues, but the checkpoint below is older
    sm.close()
    (crashed / "state.checkpoint").write_bytes(saved)

    again = BrokerStateMachine(crashed, cq_units_per_file=16, index_slots=8, index_entries=64)
    assert again.applied_index() == 12
    again.apply(log.entries[12:])
    again.close()
    files_equal(tmp_path / "full", crashed)


def test_deleted_topic_drops_its_queues(tmp_path: Path) -> None:
    log = Log()
    log.add([encode_admin(CreateTopic("gone", 2))])
    log.add([msg("gone", 1), msg("gone", 2, queue=1)])
    log.add([encode_admin(DeleteTopic("gone"))])
    sm = BrokerStateMachine(tmp_path / "s", index_slots=8, index_entries=64)
    sm.apply(log.entries)
    assert "gone" not in sm.topics and sm.queue("gone", 0) is None
    assert not (tmp_path / "s" / "consumequeue" / "gone").exists()
    sm.close()
    shutil.rmtree(tmp_path / "s")


record = st.one_of(
    st.builds(lambda t, i, q, pid: msg(t, i, queue=q, producer_id=pid, sequence=i if pid else None),
              st.sampled_from(["orders", "audit", "ghost"]), st.integers(0, 50), st.integers(0, 5),
              st.sampled_from([None, "p1", "p2"])),
    st.builds(lambda t, q: encode_admin(CreateTopic(t, q)), st.sampled_from(["orders", "audit"]),
              st.integers(1, 4)),
    st.builds(lambda t: encode_admin(DeleteTopic(t)), st.sampled_from(["orders", "audit", "ghost"])),
    st.builds(lambda q, o: encode_admin(CommitOffset("g", "orders", q, o)), st.integers(0, 3),
              st.integers(0, 99)),
    st.binary(max_size=40),
)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(record, min_size=1, max_size=6), max_size=12), st.integers(1, 5))
def test_apply_is_deterministic_for_any_records(batches: list[list[bytes]], chunk: int) -> None:
    """Any records, valid or not, in any apply batching: never raises, identical files."""
    log = Log()
    for records in batches:
        log.add(records)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name, step in (("a", 1), ("b", chunk)):
            sm = BrokerStateMachine(root / name, cq_units_per_file=8, index_slots=8, index_entries=32)
            for i in range(0, len(log.entries), step):
                sm.apply(log.entries[i:i + step])
            assert sm.applied_index() == len(log.entries)
            sm.close()
        files_equal(root / "a", root / "b")
