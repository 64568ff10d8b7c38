"""The broker's apply step: deterministic, idempotent, and recoverable from its checkpoint.

Entries are built in memory (no network, no clock, no threads), as in etcd's raft
tests: the same entries must give the same state and byte-identical files.
"""

from __future__ import annotations

import errno
import filecmp
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.state.machine import BrokerStateMachine, Outcome
from broker.store import consume_queue, index_file
from broker.store.commands import (
    CommitOffset,
    CreateTopic,
    DeleteTopic,
    Perm,
    RecordKind,
    encode_admin,
    record_kind,
)
from broker.store.entry_batch import pack_entries, unpack_entry
from broker.store.fragments import chain_payloads, encode_fragments, read_message, read_message_at
from dledger.storage import disk_guard
from dledger.storage.commitlog import CommitLog
from dledger.storage.disk_guard import DiskGuard
from dledger.storage.entry_format import Entry, EntryKind, record_size
from protocol.message_format import Message, decode_message, encode_message
from protocol.record_batch import encode_record
from tests.support.ram_dir import RAM_DIR, ram_dir


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """pytest's ``tmp_path``, in RAM (``tests.support.ram_dir``: these tests fsync a lot)."""
    yield from ram_dir()


class Log:
    """Builds entries with positions as a CommitLog would lay them out."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.position = 0

    def add(self, records: list[bytes], stamp: int = 1_700_000_000_000) -> Entry:
        (payload,) = pack_entries(records, stamp)
        return self.add_payload(payload)

    def add_payload(self, payload: bytes) -> Entry:
        entry = Entry(len(self.entries) + 1, 1, EntryKind.DATA, payload, self.position)
        self.position += record_size(len(payload))
        self.entries.append(entry)
        return entry

    def add_chain(self, message: bytes, stamp: int = 1_700_000_000_000, slice_bytes: int = 100,
                  upto: int | None = None) -> list[Entry]:
        """A large message's fragments (small slices: many fragments, small files); with
        ``upto``, only that many of them (a chain cut short)."""
        payloads = chain_payloads(message, message[4:20], stamp, slice_bytes)
        return [self.add_payload(p) for p in payloads[:upto]]

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
    assert all(b.startswith(b"\x02") for b in bodies)  # each unit points at a record
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
    sm.checkpoint()  # as the apply step may write one at any time
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
    with tempfile.TemporaryDirectory(dir=RAM_DIR) as tmp:
        root = Path(tmp)
        for name, step in (("a", 1), ("b", chunk)):
            sm = BrokerStateMachine(root / name, cq_units_per_file=8, index_slots=8, index_entries=32)
            for i in range(0, len(log.entries), step):
                sm.apply(log.entries[i:i + step])
            assert sm.applied_index() == len(log.entries)
            sm.close()
        files_equal(root / "a", root / "b")



# -- messages in chains of fragments --------------------------------------------------------

def big(topic: str, i: int, queue: int = 0, size: int = 1000, **kw: object) -> bytes:
    body = bytes((i * 7 + k) % 251 for k in range(size))
    return encode_message(Message(topic, body, queue, tags="big", keys=(f"big-{i}",),
                                  msg_id=(10_000 + i).to_bytes(16, "big"), **kw))  # type: ignore[arg-type]


def on_disk(log: Log, directory: Path) -> CommitLog:
    """The log's entries in a real CommitLog, at the same positions."""
    commitlog = CommitLog(directory)
    for e in log.entries:
        assert commitlog.append(e.index, e.term, e.kind, e.body) == e.position
    return commitlog


def chain_workload() -> tuple[Log, list[bytes]]:
    """Whole messages and chains mixed; one chain cut short by a no-op (a failover),
    then resent whole. Returns the log and the messages stored, in log order."""
    log = Log()
    log.noop()
    log.add([encode_admin(CreateTopic("orders", 2))])
    stored = []
    for n in range(6):
        small = [msg("orders", n * 3 + k, queue=k % 2) for k in range(3)]
        log.add(small, stamp=1_700_000_000_000 + n)
        large = big("orders", n, queue=n % 2, size=300 + 170 * n, producer_id="p",
                    sequence=n // 2)  # per queue: 0, 1, 2
        if n == 2:
            log.add_chain(large, stamp=1_700_000_000_100, upto=3)
            log.noop()
        log.add_chain(large, stamp=1_700_000_000_100 + n)
        stored += [*small, large]
    return log, stored


def test_a_chain_is_stored_when_complete_at_its_first_fragment(tmp_path: Path) -> None:
    log = Log()
    log.add([encode_admin(CreateTopic("t", 1))])
    large = big("t", 1, size=950)
    chain = log.add_chain(large, stamp=1_700_000_000_555)
    after = log.add([msg("t", 2)], stamp=1_700_000_000_999)
    assert len(chain) > 5
    sm = BrokerStateMachine(tmp_path / "s", index_slots=8, index_entries=64)
    sm.apply(log.entries[:4])
    assert sm.queue("t", 0) is None  # pending: nothing stored yet
    assert (sm.applied_index(), sm.checkpoint_index()) == (4, 1)
    assert sm.results(chain[1].index)[0].outcome == Outcome.FRAGMENT
    sm.apply(log.entries[4:])
    (done,) = sm.results(chain[-1].index)
    assert (done.outcome, done.queue_offset) == (Outcome.STORED, 0)
    assert sm.results(after.index)[0].queue_offset == 1
    unit = sm.queue("t", 0).get(0)
    assert unit.size == len(large) and done.position == unit.position
    assert chain[0].position < unit.position < chain[1].position  # slice 0 of the first entry
    commitlog = on_disk(log, tmp_path / "log")
    assert read_message(commitlog, unit.position, unit.size) == large
    assert read_message_at(commitlog, unit.position) == (large, unit.position)
    second = sm.queue("t", 0).get(1)
    assert read_message(commitlog, second.position, second.size) == msg("t", 2)
    assert read_message_at(commitlog, second.position) == (msg("t", 2), second.position)
    commitlog.close()
    # the store time is fragment 0's entry's stamp
    assert sm.query_key("big-1", 1_700_000_000_000, 1_700_000_000_600, 4) == [unit.position]
    assert sm.query_key("big-1", 1_700_000_001_000, 1_700_000_002_000, 4) == []
    assert sm.checkpoint_index() == sm.applied_index() == after.index
    sm.close()


def test_an_interrupted_chain_is_abandoned_and_the_retry_stored_once(tmp_path: Path) -> None:
    log = Log()
    log.add([encode_admin(CreateTopic("t", 1))])
    large = big("t", 1, size=700, producer_id="p", sequence=0)
    cut = log.add_chain(large, upto=4)
    between = log.add([msg("t", 2)])  # another entry between fragments 3 and 4
    stray = log.add_payload(chain_payloads(large, large[4:20], 1, 100)[4])  # continues nothing
    retry = log.add_chain(large)     # the producer's retry, same sequence
    again = log.add_chain(large)     # and a retry of the stored one
    sm = BrokerStateMachine(tmp_path / "s", index_slots=8, index_entries=64)
    for e in log.entries:
        sm.apply([e])
    assert [sm.results(e.index)[0].outcome for e in cut] == [Outcome.FRAGMENT] * 4
    assert sm.results(between.index)[0].queue_offset == 0  # the message after them is fine
    assert sm.results(stray.index)[0].outcome == Outcome.ABANDONED
    stored = sm.results(retry[-1].index)[0]
    assert (stored.outcome, stored.queue_offset) == (Outcome.STORED, 1)  # sequence 0 was free
    duplicate = sm.results(again[-1].index)[0]
    assert (duplicate.outcome, duplicate.queue_offset) == (Outcome.DUPLICATE, 1)
    assert sm.queue("t", 0).max_offset == 2
    commitlog = on_disk(log, tmp_path / "log")
    unit = sm.queue("t", 0).get(1)
    assert read_message(commitlog, unit.position, unit.size) == large
    commitlog.close()
    sm.close()


def test_bad_chains_store_nothing(tmp_path: Path) -> None:
    log = Log()
    log.add([encode_admin(CreateTopic("t", 1))])
    large = big("t", 1, size=300)
    records = encode_fragments(large, large[4:20], 100)
    shared = log.add([records[0], msg("t", 2)])  # a fragment must be alone in its entry
    log.add_payload(chain_payloads(large, large[4:20], 1, 100)[0])
    wrong_total = log.add_payload(pack_entries([encode_fragments(large + b"x", large[4:20], 100)[1]],
                                               1)[0])
    garbage = log.add_chain(b"\x93not a message at all", slice_bytes=8)
    missing = log.add_chain(big("missing", 2, size=300))
    sm = BrokerStateMachine(tmp_path / "s", index_slots=8, index_entries=64)
    sm.apply(log.entries)
    assert [r.outcome for r in sm.results(shared.index)] == [Outcome.INVALID, Outcome.STORED]
    assert sm.results(wrong_total.index)[0].outcome == Outcome.ABANDONED
    assert sm.results(garbage[-1].index)[0].outcome == Outcome.INVALID
    assert sm.results(missing[-1].index)[0].outcome == Outcome.TOPIC_NOT_EXIST
    assert sm.queue("t", 0).max_offset == 1 and sm.checkpoint_index() == sm.applied_index()
    sm.close()


def test_chains_in_any_apply_batching_give_identical_files(tmp_path: Path) -> None:
    log, stored = chain_workload()
    for name, step in (("one", 1), ("all", len(log.entries)), ("five", 5), ("seven", 7)):
        sm = BrokerStateMachine(tmp_path / name, cq_units_per_file=4, index_slots=8, index_entries=16)
        for i in range(0, len(log.entries), step):
            sm.apply(log.entries[i:i + step])
        sm.close()
        if name != "one":
            files_equal(tmp_path / "one", tmp_path / name)
    sm = BrokerStateMachine(tmp_path / "one", cq_units_per_file=4, index_slots=8, index_entries=16)
    commitlog = on_disk(log, tmp_path / "log")
    for q in (0, 1):
        cq = sm.queue("orders", q)
        got = [read_message(commitlog, u.position, u.size) for u in map(cq.get, range(cq.max_offset))]
        assert got == [m for m in stored if decode_message(m).queue_id == q]
    commitlog.close()
    sm.close()


def test_replay_with_the_checkpoint_inside_a_chain_gives_the_same_bytes(tmp_path: Path) -> None:
    log, _ = chain_workload()
    full = BrokerStateMachine(tmp_path / "full", cq_units_per_file=4, index_slots=8, index_entries=16)
    full.apply(log.entries)
    full.close()
    fragments = [e.index for e in log.entries if e.kind == EntryKind.DATA
                 and record_kind(unpack_entry(e.body).messages[0]) == RecordKind.FRAGMENT]
    cut_short = next(e.index for e in log.entries if e.kind == EntryKind.NOOP and e.index > 1)
    # crash points: in the first chain, in the one a no-op cut short, in a later one, at the end
    for cut in (fragments[2], cut_short - 1, fragments[-3], len(log.entries)):
        crashed = tmp_path / f"crashed-{cut}"
        sm = BrokerStateMachine(crashed, cq_units_per_file=4, index_slots=8, index_entries=16)
        sm.apply(log.entries[:cut])
        sm.checkpoint()  # as the apply step may write one at any time
        saved = (crashed / "state.checkpoint").read_bytes()
        resume = sm.checkpoint_index()
        sm.apply(log.entries[cut:cut + 9])  # applied past the checkpoint below
        sm.close()
        (crashed / "state.checkpoint").write_bytes(saved)
        again = BrokerStateMachine(crashed, cq_units_per_file=4, index_slots=8, index_entries=16)
        assert again.applied_index() == resume
        assert (resume < cut) == (cut != len(log.entries))  # inside a chain: re-applied from its start
        again.apply(log.entries[resume:])
        again.close()
        files_equal(tmp_path / "full", crashed)


item = st.one_of(
    st.lists(record, min_size=1, max_size=4).map(lambda rs: ("batch", rs)),
    st.builds(lambda i, q, size, upto: ("chain", big("orders", i, queue=q, size=size), upto),
              st.integers(0, 20), st.integers(0, 3), st.integers(1, 600),
              st.one_of(st.none(), st.integers(1, 5))),
    st.just(("noop",)),
)


@settings(max_examples=30, deadline=None)
@given(st.lists(item, max_size=10), st.integers(1, 6), st.integers(0, 40))
def test_chains_apply_deterministically_and_replay(items: list[tuple], step: int, crash: int) -> None:  # type: ignore[type-arg]
    """Chains (some cut short), batches and no-ops: any batching and any crash point
    give identical files."""
    log = Log()
    log.add([encode_admin(CreateTopic("orders", 4))])
    for it in items:
        if it[0] == "batch":
            log.add(it[1])
        elif it[0] == "chain":
            log.add_chain(it[1], slice_bytes=64, upto=it[2])
        else:
            log.noop()
    crash = min(crash, len(log.entries))
    with tempfile.TemporaryDirectory(dir=RAM_DIR) as tmp:
        root = Path(tmp)
        for name, k in (("a", len(log.entries)), ("b", step)):
            sm = BrokerStateMachine(root / name, cq_units_per_file=8, index_slots=8, index_entries=32)
            for i in range(0, len(log.entries), k):
                sm.apply(log.entries[i:i + k])
            sm.close()
        files_equal(root / "a", root / "b")
        sm = BrokerStateMachine(root / "c", cq_units_per_file=8, index_slots=8, index_entries=32)
        sm.apply(log.entries[:crash])
        sm.checkpoint()  # as the apply step may write one at any time
        saved = (root / "c" / "state.checkpoint").read_bytes()
        sm.apply(log.entries[crash:])
        sm.close()
        (root / "c" / "state.checkpoint").write_bytes(saved)
        sm = BrokerStateMachine(root / "c", cq_units_per_file=8, index_slots=8, index_entries=32)
        sm.apply(log.entries[sm.applied_index():])
        sm.close()
        files_equal(root / "a", root / "c")


def test_an_idempotent_producer_silent_for_a_day_is_forgotten(tmp_path: Path) -> None:
    """Its table entry goes (by the entries' store times, the same on every replica); its
    next message must start a new sequence, and the checkpoint no longer carries it."""
    from broker.state.machine import PRODUCER_EXPIRY_MS

    sm = BrokerStateMachine(tmp_path / "s", index_slots=8, index_entries=64)
    log = Log()
    log.add([encode_admin(CreateTopic("t", 1))], stamp=500)
    day = PRODUCER_EXPIRY_MS
    for body, seq, stamp in ((b"a", 0, 1_000), (b"b", 1, 2_000), (b"c", 2, 2_000 + day + 1),
                             (b"d", 0, 2_000 + day + 2)):
        log.add([encode_message(Message("t", body, 0, producer_id="p", sequence=seq))], stamp=stamp)
    sm.apply(log.entries)
    outcomes = [sm.results(e.index) for e in log.entries[1:]]
    assert [o[0].outcome for o in outcomes] == [Outcome.STORED, Outcome.STORED, Outcome.SEQUENCE_GAP,
                                                Outcome.STORED]
    sm.close()


def test_a_resend_is_answered_with_its_offset_for_the_last_recent_records(tmp_path: Path) -> None:
    """A producer's stored records keep their queue offsets (the last RECENT_RECORDS, also
    across a restart from the checkpoint); older resends are still refused, with offset -1."""
    from broker.state.machine import RECENT_RECORDS as RECENT_SEQUENCES

    n = 2 * RECENT_SEQUENCES + 40  # past the point where the in-memory window is trimmed
    log = Log()
    log.add([encode_admin(CreateTopic("t", 1))])
    log.add([msg("other", 0)])  # refused: does not move the offsets
    stored = [log.add([msg("t", i, producer_id="p", sequence=i)]) for i in range(n)]
    sm = BrokerStateMachine(tmp_path / "s", index_slots=8, index_entries=4 * n)
    sm.apply(log.entries)
    offsets = [sm.results(e.index)[0].queue_offset for e in stored]
    assert offsets == list(range(n))
    sm.close()
    sm = BrokerStateMachine(tmp_path / "s", index_slots=8, index_entries=4 * n)  # from the checkpoint
    oldest_kept = n - RECENT_SEQUENCES
    resends = [log.add([msg("t", i, producer_id="p", sequence=i)]) for i in (n - 1, oldest_kept,
                                                                              oldest_kept - 1, 0)]
    sm.apply(log.entries[sm.applied_index():])
    answers = [sm.results(e.index)[0] for e in resends]
    assert {a.outcome for a in answers} == {Outcome.DUPLICATE}
    assert [a.queue_offset for a in answers] == [n - 1, oldest_kept, -1, -1]
    assert sm.queue("t", 0).max_offset == n
    sm.close()


def test_recent_results_are_not_tracked_by_the_garbage_collector(tmp_path: Path) -> None:
    """One result per message is kept for a while; as tracked objects millions of them made
    every full collection (and the broker with it) stall."""
    import gc

    log = Log()
    log.add([encode_admin(CreateTopic("t", 1))])
    entry = log.add([msg("t", i) for i in range(50)])
    sm = BrokerStateMachine(tmp_path / "s", index_slots=8, index_entries=128)
    sm.apply(log.entries)
    gc.collect()
    kept = sm._results[entry.index]
    assert len(kept) == 50 and not any(gc.is_tracked(r) for r in kept)
    assert [r.queue_offset for r in sm.results(entry.index)] == list(range(50))  # read back as Applied
    sm.close()


def test_queue_locks_are_decided_by_the_log_and_expire_by_store_time(tmp_path: Path) -> None:
    """One client holds a queue's consume lock at a time; it expires LOCK_EXPIRY_MS (store
    time) after its last renewal; replicas and a restart from the checkpoint decide alike."""
    from broker.state.machine import LOCK_EXPIRY_MS
    from broker.store.commands import LockQueue

    t0 = 1_700_000_000_000

    def lock(client: str, q: int, at: int, take: bool = True) -> Entry:
        return log.add([encode_admin(LockQueue("g", client, "t", q, take))], stamp=at)

    log = Log()
    steps = [
        (lock("A", 0, t0), True),
        (lock("B", 0, t0 + 1), False),                        # held by A
        (lock("B", 1, t0 + 2), True),                         # another queue: free
        (lock("A", 0, t0 + 30_000), True),                    # A renews
        (lock("B", 0, t0 + 30_000 + LOCK_EXPIRY_MS), False),  # renewed 60 s ago: not yet expired
        (lock("B", 0, t0 + 30_001 + LOCK_EXPIRY_MS), True),   # expired: B takes it
        (lock("A", 0, t0 + 30_002 + LOCK_EXPIRY_MS), False),  # and A lost it
        (lock("B", 0, t0 + 30_003 + LOCK_EXPIRY_MS, take=False), True),  # B gives it back
        (lock("A", 0, t0 + 30_004 + LOCK_EXPIRY_MS), True),
    ]
    a = BrokerStateMachine(tmp_path / "a", index_slots=8, index_entries=64)
    b = BrokerStateMachine(tmp_path / "b", index_slots=8, index_entries=64)
    a.apply(log.entries)
    b.apply(log.entries[:3])
    b.close()
    b = BrokerStateMachine(tmp_path / "b", index_slots=8, index_entries=64)  # from its checkpoint
    b.apply(log.entries[b.applied_index():])
    for sm, decided in ((a, steps), (b, steps[3:])):  # results are kept in memory only
        got = [sm.results(e.index)[0].outcome == Outcome.DONE for e, _ in decided]
        assert got == [held for _, held in decided]
    assert "locked by A" in a.results(steps[1][0].index)[0].reason
    a.close()
    b.close()


def test_a_retried_send_back_is_stored_once_within_its_window(tmp_path: Path) -> None:
    """Retry copies carry where they came from; a consumer that retried its send-back after an
    unknown outcome does not get the message twice (within SENT_BACK_WINDOW_MS of store time)."""
    from broker.state.held import Prop
    from broker.state.machine import SENT_BACK_WINDOW_MS

    t0 = 1_700_000_000_000

    def copy(i: int, origin: str) -> bytes:
        return msg("%RETRY%g", i, properties={Prop.SENT_BACK: origin})

    log = Log()
    first = log.add([copy(1, "g:100")], stamp=t0)
    again = log.add([copy(1, "g:100")], stamp=t0 + 5_000)              # the same send-back, retried
    other = log.add([copy(2, "g:200"), copy(1, "h:100")], stamp=t0 + 6_000)  # other message / group
    late = log.add([copy(1, "g:100")], stamp=t0 + 1 + SENT_BACK_WINDOW_MS)
    a = BrokerStateMachine(tmp_path / "a", index_slots=8, index_entries=64)
    a.apply(log.entries[:2])
    a.close()
    a = BrokerStateMachine(tmp_path / "a", index_slots=8, index_entries=64)  # the window survives a restart
    a.apply(log.entries[a.applied_index():])
    assert a.results(other.index) is not None
    assert [r.outcome for r in a.results(other.index)] == [Outcome.STORED, Outcome.STORED]
    assert a.results(late.index)[0].outcome == Outcome.STORED
    b = BrokerStateMachine(tmp_path / "b", index_slots=8, index_entries=64)
    b.apply(log.entries)
    assert [b.results(e.index)[0].outcome for e in (first, again, late)] == [
        Outcome.STORED, Outcome.DUPLICATE, Outcome.STORED]
    assert a.queue("%RETRY%g", 0).max_offset == b.queue("%RETRY%g", 0).max_offset == 4  # all but again
    a.close()
    b.close()
    files_equal(tmp_path / "a" / "consumequeue", tmp_path / "b" / "consumequeue")


def test_the_apply_benchmark_runs(capsys) -> None:  # type: ignore[no-untyped-def]
    """``python -m benchmarks.apply`` (docs/BENCHMARKS.md) still works, on a small load."""
    from benchmarks.apply import main

    assert main(["--entries", "16", "--per-entry", "20"]) == 0
    assert "320 messages applied" in capsys.readouterr().out  # 16 entries x 20


def test_the_longest_group_names_retry_and_dead_letter_queues_are_stored_and_restored(tmp_path: Path) -> None:
    """%RETRY% + a 255-character group is 262 characters: more than a file name may be. Its
    ConsumeQueue directory gets a bounded name (the apply step died on every replica before)."""
    long_group = "de" + "-x" * 126 + "y"
    assert len(long_group) == 255
    log = Log()
    topics = [f"%RETRY%{long_group}", f"%DLQ%{long_group}", "t" * 127, f"%RETRY%{long_group[:-1]}z"]
    for i, topic in enumerate(topics):
        log.add([encode_admin(CreateTopic(topic, 1))])
        log.add([msg(topic, 10 * i + k) for k in range(3)])
    m = BrokerStateMachine(tmp_path / "s", index_slots=64, index_entries=1024)
    m.apply(log.entries)
    positions = {}
    for topic in topics:
        cq = m.queue(topic, 0)
        assert cq is not None and cq.max_offset == 3, topic
        positions[topic] = [cq.get(k).position for k in range(3)]
    m.close()
    again = BrokerStateMachine(tmp_path / "s", index_slots=64, index_entries=1024)
    try:
        for topic in topics:
            cq = again.queue(topic, 0)
            assert cq is not None and [cq.get(k).position for k in range(3)] == positions[topic], topic
        again.apply([log.add([encode_admin(DeleteTopic(topics[0]))])])
        assert again.queue(topics[0], 0) is None and again.queue(topics[3], 0) is not None
    finally:
        again.close()
    assert len({p.name for p in (tmp_path / "s" / "consumequeue").iterdir()}) == 3



def _restarted_from_checkpoint(store: Path, log: Log, checkpointed: int,
                               **options: Any) -> BrokerStateMachine:
    """A machine in ``store`` that applied every entry of ``log`` but had checkpointed after
    the first ``checkpointed`` only when it crashed: the files are the whole log's, the
    checkpoint the older one. Reopened, it replays from there (the caller closes it)."""
    crashed = BrokerStateMachine(store, index_slots=8, index_entries=64, **options)
    crashed.apply(log.entries[:checkpointed])
    crashed.checkpoint()
    saved = (store / "state.checkpoint").read_bytes()
    crashed.apply(log.entries[checkpointed:])
    crashed.close()
    (store / "state.checkpoint").write_bytes(saved)
    return BrokerStateMachine(store, index_slots=8, index_entries=64, **options)


def test_a_replay_over_a_topic_deleted_after_the_checkpoint_gives_the_same_offsets(tmp_path: Path) -> None:
    """The delete removed the queue's files before a checkpoint covered it; after a crash the
    replay stores the topic's messages again: they must get the offsets they got the first
    time, not restart at 0 -- and the delete then drops the topic's producer windows as it
    did the first time."""
    log = Log()
    log.add([encode_admin(CreateTopic("t", 1))])
    log.add([msg("t", 1, producer_id="p", sequence=0)])
    log.add([msg("t", 2, producer_id="p", sequence=1)])
    log.add([encode_admin(DeleteTopic("t")), encode_admin(CreateTopic("t", 1))])

    whole = BrokerStateMachine(tmp_path / "whole", index_slots=8, index_entries=64)
    whole.apply(log.entries)
    want = (whole._state.producers.state(), whole.recent_digests(), whole._state.state())
    whole.close()

    again = _restarted_from_checkpoint(tmp_path / "crashed", log, 2)
    try:
        again.apply(log.entries[again.applied_index():])
        assert "p\x00t\x000" not in again._state.producers.state()  # deleted with its topic, as before
        assert (again._state.producers.state(), again.recent_digests(), again._state.state()) == want
    finally:
        again.close()


def test_a_topic_deleted_and_created_again_after_the_checkpoint_replays_alike(tmp_path: Path) -> None:
    """Deleted and created again after the checkpoint, a topic's queue directory holds the new
    topic's files when the replica restarts: they are not the queue the checkpoint describes
    (shorter, or longer, than its next offset), so the replay must not continue them -- the
    messages applied again before the delete get the offsets they got the first time, and the
    state digests stay the peers'."""
    from broker.store.commands import LockQueue

    for recreated in (7, 1):  # the new topic's queue: longer, then shorter than the checkpoint's
        log = Log()
        log.add([encode_admin(CreateTopic("t", 1))])
        log.add([msg("t", i, producer_id="p", sequence=i) for i in range(5)])
        log.add([msg("t", 10 + i) for i in range(2)])  # after the checkpoint below
        log.add([encode_admin(DeleteTopic("t")), encode_admin(CreateTopic("t", 1))])
        log.add([msg("t", 20 + i) for i in range(recreated)])
        log.add([encode_admin(LockQueue("g", "c", "t", 0, True))])
        root = tmp_path / str(recreated)
        full = BrokerStateMachine(root / "full", index_slots=8, index_entries=64, digest_every=1)
        full.apply(log.entries)
        again = _restarted_from_checkpoint(root / "crashed", log, 2, digest_every=1)
        assert again.applied_index() == 2
        cq = again.queue("t", 0)  # the checkpoint's queue, none of the new topic's messages
        assert cq.max_offset == 5
        assert all(cq.get(o).position < log.entries[2].position for o in range(cq.min_offset, 5))
        again.apply(log.entries[2:3])
        assert [r.queue_offset for r in again.results(3)] == [5, 6]  # as the first time
        again.apply(log.entries[3:])
        assert again.recent_digests() == {i: d for i, d in full.recent_digests().items() if i > 2}
        full.close()
        again.close()
        files_equal(root / "full" / "consumequeue", root / "crashed" / "consumequeue")


class EveryNthFails:
    """Wraps a write function: every ``n``-th call raises ENOSPC before writing anything (the
    next call, the retry, goes through)."""

    def __init__(self, real: Callable[..., Any], n: int) -> None:
        self.real, self.n, self.calls, self.failed = real, n, 0, 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls % self.n == 0:
            self.failed += 1
            raise OSError(errno.ENOSPC, "No space left on device")
        return self.real(*args, **kwargs)


def test_writes_that_find_the_disk_full_are_tried_again_and_give_the_same_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ConsumeQueue unit, a new ConsumeQueue file, an IndexFile page or a new IndexFile that
    the disk cannot take: the apply step raises the disk flag and waits there, then goes on
    -- the files are byte for byte those of a replica that never met a full disk."""
    log = workload()
    for n in range(12):  # records of many: a record's keys span index files, units span CQ files
        log.add([encode_record("orders", q, [((n * 40 + q * 10 + i).to_bytes(16, "big"), 0, 0, f"t{i % 2}",
                                               (f"key-{n}-{i}",), {}, 0, b"m") for i in range(n % 9 + 1)])
                 for q in range(n % 4 + 1)])
    calm = BrokerStateMachine(tmp_path / "calm", cq_units_per_file=16, index_slots=8, index_entries=64)
    calm.apply(log.entries)
    calm.close()
    monkeypatch.setattr(disk_guard, "RETRY_S", 0.0)
    # a record's keys go in whole or not at all (IndexService.put_messages): the retry of one
    # that spans new index files allocates each again, so those faults leave it 3 calls
    faults = {"units": EveryNthFails(consume_queue.pwrite_all, 2),
              "index pages": EveryNthFails(os.posix_fallocate, 4),
              "new index files": EveryNthFails(index_file.pwrite_all, 4)}
    monkeypatch.setattr(consume_queue, "pwrite_all", faults["units"])
    monkeypatch.setattr(index_file.os, "posix_fallocate", faults["index pages"])
    monkeypatch.setattr(index_file, "pwrite_all", faults["new index files"])
    disk = DiskGuard(tmp_path, 1 << 30, free_bytes=lambda: 0)
    sm = BrokerStateMachine(tmp_path / "full", cq_units_per_file=16, index_slots=8, index_entries=64,
                            disk=disk)
    for i in range(0, len(log.entries), 5):
        sm.apply(log.entries[i:i + 5])
    sm.close()
    assert disk.full and all(f.failed for f in faults.values()), {k: f.failed for k, f in faults.items()}
    monkeypatch.undo()
    files_equal(tmp_path / "calm", tmp_path / "full")
