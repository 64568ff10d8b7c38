"""The broker's deterministic apply step: committed entries -> topics, queues, offsets.

Implements ``dledger.applier.StateMachine``. Everything here depends only on the
entries (their bytes, index and position), never on the clock or the node, so
every replica derives byte-identical ConsumeQueues and the same state.

State and where it lives (``store/``)::

    consumequeue/<topic>/<queue>/   ConsumeQueue files (broker.consume_queue; long names hashed)
    index/                          IndexFiles: message keys and ids -> positions
    state.checkpoint                msgpack: applied index, topics, next queue offsets,
                                    consumer offsets, idempotent-producer table,
                                    the index's mark (last file and its header)
    snapshots/<index>.snap          the state just before each CommitLog segment
                                    (broker.snapshot): what a replica behind the
                                    retained log start is sent; its digest is what
                                    replicas compare

At most every CHECKPOINT_EVERY_S (and when idle) the apply thread takes a
snapshot of the state (queue ends, the index's mark, tables) and a checkpoint
thread fsyncs the ConsumeQueues and IndexFiles -- which then hold at least what
the snapshot describes -- and writes the snapshot atomically, so the applied index
is persisted with the state it describes while the apply step goes on. On start
the ConsumeQueues are cut back to the checkpoint's queue offsets and the index is
rolled back to its mark (undoing anything applied after the checkpoint), and the
applier re-applies from ``applied + 1``: replaying yields the same bytes.

Messages too large for one entry arrive as a chain of fragments in consecutive
entries (``broker.fragments``): they are collected in log order and the message
is applied when its last fragment is; any other entry in between abandons the
chain. While a chain is pending, the checkpoint records the applied index as
the entry before its first fragment (``checkpoint_index``), so a restart
re-applies the chain from its start: nothing else changes state in between.

Idempotent producer: a message carrying (producer_id, sequence) is stored only
if sequence == last + 1 for that producer and queue; a retry of a stored one
(sequence <= last) is answered with its original queue offset (for the last
RECENT_SEQUENCES) and not stored again; a gap (sequence > last + 1) is refused.

Cost: every replica applies every message, so the per-message work is kept small:
one decode, ConsumeQueue units gathered per queue and written once per ``apply``
call (before the applied index and results are published), the IndexFile updated
in its mapping.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import astuple, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import msgpack

from broker.commands import (
    CheckHalf,
    CommitOffset,
    CreateTopic,
    DeleteTopic,
    LockQueue,
    Perm,
    RecordKind,
    RollbackHalf,
    decode_admin,
    record_kind,
)
from broker.consume_queue import ConsumeQueue, topic_directory
from broker.deferred import (
    PROP_DELAY,
    PROP_DELIVER_AT,
    PROP_PGROUP,
    PROP_SCHEDULED_FROM,
    PROP_SENT_BACK,
    PROP_TRAN,
    PROP_TRANSACTION_OF,
    Halves,
    Timers,
)
from broker.entry_batch import read_records
from broker.fragments import parse_fragment
from broker.index_file import DEFAULT_INDEX_NUM, DEFAULT_SLOT_NUM, IndexHeader, IndexService
from broker.snapshot import Snapshot, SnapshotError, SnapshotStore, cq_hash_prefix, cq_hash_step
from dledger.durable_file import atomic_write, read_or_none
from dledger.entry_format import HEADER_SIZE, Entry, EntryKind
from protocol.message_format import Message, MessageFormatError, decode_message
from protocol.names import DLQ_PREFIX, RETRY_PREFIX, SCHEDULE_TOPIC, TRANS_HALF_TOPIC
from protocol.tags import tag_hash

__all__ = ["Applied", "BrokerStateMachine", "Outcome", "TopicConfig"]

log = logging.getLogger("broker.state_machine")

RECENT_RESULTS = 20_000  # entries whose outcomes stay available to the proposer
RECENT_SEQUENCES = 256   # per producer and queue: sequences answered on a retry
#: At most this often (and when idle). Each checkpoint fsyncs the ConsumeQueues and the
#: IndexFile, whose puts dirty random pages of its slot table: the bigger the write-back,
#: the longer it delays the CommitLog's fsyncs on the same disk (every 1 s: sends of
#: 1,000 msgs/s stalled 20-40 ms once a second, p99 20-22 ms; every 0.25 s: p99 15-16 ms).
#: After an fsync the first store into each written page faults again (the kernel
#: write-protects pages it writes back): every 0.1 s that cost ~1.3 us per message at
#: full load, every 0.25 s about 5 % of throughput. A crash replays <= ~0.25 s of entries.
CHECKPOINT_EVERY_S = 0.25
#: An idempotent producer silent on a queue this long is forgotten (its next sequence must be 0).
PRODUCER_EXPIRY_MS = 24 * 3600 * 1000
#: A queue's consume lock not renewed for this long (by store time) may be taken by another
#: client (RocketMQ's 60 s); clients stop consuming after 30 s without a renewal.
LOCK_EXPIRY_MS = 60_000
#: A send-back (retry or dead-letter copy) of one message by one group is stored once within
#: this much store time: a consumer retries its send-back only within seconds.
SENT_BACK_WINDOW_MS = 60_000
DIGESTS_KEPT = 16  # recent state digests kept in memory (shown in /status, compared)
#: The state's digest is also recorded after every this-many entries (replicas compare them).
DIGEST_EVERY = 4096
_PERM_WRITE = int(Perm.WRITE)


class Outcome:
    STORED = "stored"
    DUPLICATE = "duplicate"
    DONE = "done"
    TOPIC_NOT_EXIST = "topic_not_exist"
    NO_PERMISSION = "no_permission"
    INVALID = "invalid"
    SEQUENCE_GAP = "sequence_gap"
    LOCKED = "locked"        # the queue's consume lock is held by another client
    FRAGMENT = "fragment"    # a fragment before the last of its chain: nothing yet
    ABANDONED = "abandoned"  # a fragment that does not continue a chain: nothing stored


class Applied(NamedTuple):
    """What happened to one record: for messages, where it is (or was) stored.

    The recent results (``results``) keep one per message for a while; they are kept
    as exact tuples of atoms, which the garbage collector stops tracking (it does not
    untrack tuple subclasses): as tracked objects they made every full collection walk
    millions of them (39 ms per 240,000)."""

    outcome: str
    queue_id: int = -1
    queue_offset: int = -1
    position: int = -1
    reason: str = ""


@dataclass(slots=True)
class _Chain:
    """The fragments of a large message applied so far (see ``broker.fragments``)."""

    chain_id: bytes
    total: int
    first_index: int
    position: int  # the message's CommitLog position: slice 0's first byte
    stamp: int     # the message's store time: fragment 0's entry
    next_number: int = 0
    received: int = 0
    parts: list[bytes] = field(default_factory=list)


@dataclass(slots=True)
class _Appends:
    """Units assigned to one queue during an ``apply`` call, written at its end."""

    cq: ConsumeQueue
    first_offset: int
    hash_prefix: bytes  # cq_hash_prefix of its queue
    units: list[tuple[int, int, int]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class TopicConfig:
    queues: int
    perm: int


class BrokerStateMachine:
    """Apply thread calls ``apply``/``apply_gap``; any thread may read the snapshots."""

    def __init__(self, store: Path, cq_units_per_file: int = 300_000,
                 index_slots: int = DEFAULT_SLOT_NUM, index_entries: int = DEFAULT_INDEX_NUM,
                 segment_bytes: int | None = None, digest_every: int = DIGEST_EVERY) -> None:
        """``segment_bytes``: the CommitLog's segment size; a snapshot is taken before the
        first entry of every segment (None: no snapshots, as for a machine in a test).
        The state's digest is also recorded after every ``digest_every``-th entry."""
        self._store = store
        self._segment_bytes = segment_bytes
        self._digest_every = digest_every
        self._index_geometry = (index_slots, index_entries)
        self.snapshots = SnapshotStore(store / "snapshots")
        self._cq_root = store / "consumequeue"
        self._cq_root.mkdir(parents=True, exist_ok=True)
        self._units = cq_units_per_file
        self._lock = threading.Lock()
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._results: OrderedDict[int, list[tuple[Any, ...]]] = OrderedDict()  # Applied as tuples
        # (id of a queue, log start) -> (the queue, its first offset kept)
        self._retained_min: dict[tuple[int, int], tuple[ConsumeQueue, int]] = {}
        self.on_applied: list[Callable[[int], None]] = []  # run on the apply thread
        state = msgpack.unpackb(read_or_none(self._checkpoint_path) or msgpack.packb({}),
                                strict_map_key=False)
        self._applied: int = state.get("applied", 0)
        self._checkpointed_at = 0.0
        self._checkpointer = ThreadPoolExecutor(1, thread_name_prefix="broker-checkpoint")
        self._writing: Future[None] | None = None  # the checkpoint being made durable
        self._durable = self._applied
        self._dirty = False
        self._chain: _Chain | None = None  # never in a checkpoint: replay re-derives it
        self.last_store_ms: int = state.get("last_store_ms", 0)
        self.topics: dict[str, TopicConfig] = {
            t: TopicConfig(*v) for t, v in state.get("topics", {}).items()}
        self.offsets: dict[str, dict[str, dict[int, int]]] = state.get("offsets", {})
        # "producer\0topic\0queue" -> [last sequence, offsets of the last sequences, last store ms]
        self._producers: dict[str, list[Any]] = state.get("producers", {})
        for entry in self._producers.values():
            if entry[1] and isinstance(entry[1][0], list):  # written as [sequence, offset] pairs
                entry[1] = [offset for _, offset in entry[1]]
        self._appends: dict[tuple[str, int], _Appends] = {}
        # "group\0topic\0queue" -> [client id, store ms of its last lock]
        self._locks: dict[str, list[Any]] = state.get("locks", {})
        self._sent_back: dict[str, int] = state.get("sent_back", {})  # "group:position" -> store ms
        self.timers = Timers(state.get("timers"))
        self.halves = Halves(state.get("halves"))
        self._cq_hash = int.from_bytes(state.get("cq_hash", b""), "big")
        #: snapshots installed here: [snapshot index, when (ms), the first entry this replica
        #: never applied (the gap is from there to the snapshot index)] (not replicated state)
        self.installs: list[list[int]] = state.get("installs", [])
        self._digests: dict[int, str] = {}  # recent snapshot index -> digest
        for index in self.snapshots.indexes()[-DIGESTS_KEPT:]:
            with contextlib.suppress(SnapshotError, OSError):
                snap = self.snapshots.load(index)
                if snap is not None:
                    self._digests[index] = snap.digest
        mark = state.get("index_mark")
        index_mark = None if mark is None else (mark[0], IndexHeader(*mark[1]))
        covered = -1 if index_mark is None else index_mark[1].end_position
        self._restore_queues(state.get("queues", {}), covered)
        self.index = IndexService(store / "index", index_slots, index_entries)
        self.index.rollback(index_mark)

    # -- StateMachine contract -------------------------------------------------
    def applied_index(self) -> int:
        return self._applied

    def checkpoint_index(self) -> int:
        """The applied index the checkpoint records: a restart re-applies what follows.

        Below ``applied_index()`` while a chain of fragments is pending (it is
        re-applied from its first fragment); retention must keep those entries.
        """
        chain = self._chain
        return self._applied if chain is None else min(self._applied, chain.first_index - 1)

    def idle(self) -> None:
        """Nothing to apply for a while: write the checkpoint if it is behind."""
        if self._durable != self.checkpoint_index() or self._dirty:
            self._checkpoint(background=True)

    def durable_index(self) -> int:
        """What the last written checkpoint records: a restart replays from after it, so
        retention must keep every entry after it."""
        return self._durable

    def apply(self, entries: Sequence[Entry]) -> None:
        done: list[tuple[int, list[Applied]]] = []
        for entry in entries:
            if self._segment_bytes and entry.position % self._segment_bytes == 0 and entry.index > 1:
                self._take_snapshot(entry.index - 1)  # the first entry of a segment
            if entry.kind == EntryKind.DATA:
                done.append((entry.index, self._apply_entry(entry)))
            else:
                self._chain = None  # e.g. a new leader's no-op between two fragments
                done.append((entry.index, []))
            if entry.index % self._digest_every == 0:
                self._record(Snapshot.of(entry.index, self._canonical_state()))
        self._write_appends()  # the units before the applied index that covers them
        with self._lock:
            for index, results in done:
                self._applied = index
                if results:
                    self._results[index] = [tuple(a) for a in results]  # untracked by the gc
            while len(self._results) > RECENT_RESULTS:
                self._results.popitem(last=False)
        # Listeners first: results and pulls need only the in-memory state, and what
        # was applied is durable in the log already. The checkpoint's fsyncs then
        # overlap the next commit, at most every CHECKPOINT_EVERY_S (a crash before it
        # only means a longer replay: the files are cut back to the checkpoint).
        for callback in self.on_applied:
            try:
                callback(self._applied)
            except Exception:  # a listener must never stop the apply thread
                log.exception("on_applied listener failed")
        self._dirty = True
        if time.monotonic() - self._checkpointed_at >= CHECKPOINT_EVERY_S:
            self._checkpoint(background=True)

    def apply_gap(self, first_index: int) -> None:
        """Never: skipping entries would leave this replica's state unlike its peers'. The
        applier installs the snapshot at ``first_index - 1`` instead (``install_snapshot``)."""
        raise RuntimeError(f"a broker replica cannot skip to entry {first_index}: it needs the "
                           f"snapshot at {first_index - 1}")

    # -- snapshots -----------------------------------------------------------------
    def snapshot_indexes(self) -> list[int]:
        """The indexes of the snapshots held (durable), oldest first."""
        return self.snapshots.indexes()

    def snapshot_bytes(self, index: int) -> bytes | None:
        """The encoded snapshot of the state after entry ``index``, if held."""
        return self.snapshots.read(index)

    def prune_snapshots_below(self, index: int) -> None:
        """Retention moved the log start past ``index + 1``: older snapshots are not needed."""
        if self.snapshots.prune_below(index):
            log.info("snapshots before %d deleted with the log", index)

    def oldest_held_position(self) -> int | None:
        """The lowest CommitLog position of a held (delayed, retried or transaction half)
        message: retention keeps it until it is released."""
        for _ in range(10):  # the apply thread may change the tables meanwhile
            try:
                held = [*self.timers.positions(), *self.halves.positions()]
                return min(held) if held else None
            except RuntimeError:  # "dictionary changed size during iteration"
                continue
        return 0  # keep everything this time

    def recent_digests(self) -> dict[int, str]:
        """Digests of the derived state at the most recent snapshot indexes."""
        with self._lock:
            return dict(self._digests)

    def _take_snapshot(self, index: int) -> None:
        """Apply thread, between two entries: the state after ``index``. Skipped while a
        chain of fragments is pending (its start would be missing after the cut)."""
        if self._chain is not None:
            log.info("no snapshot at %d: a large message's fragments span the segment boundary", index)
            return
        snap = Snapshot.of(index, self._canonical_state())
        try:
            self.snapshots.write(snap)
        except OSError as e:
            log.error("cannot write the snapshot at %d (retention cannot cut the log there): %s", index, e)
            return
        self._record(snap)
        log.info("snapshot at index %d, state digest %s", index, snap.digest[:16])

    def _canonical_state(self) -> dict[str, Any]:
        """The replicated state now, its tables in the one form every replica has at this
        index (checkpoints prune expired entries whenever they run)."""
        self._forget_expired()
        return self._replicated_state(self._next_offsets())

    def _record(self, snap: Snapshot) -> None:
        with self._lock:
            self._digests[snap.index] = snap.digest
            for old in sorted(self._digests)[:-DIGESTS_KEPT]:
                del self._digests[old]

    def install_snapshot(self, index: int, data: bytes) -> None:
        """Apply thread: replace all derived state with the snapshot ``data`` of the state
        after ``index`` (raises SnapshotError if it is not intact). ConsumeQueues restart
        empty at the snapshot's next offsets, the IndexFile empty; applying goes on at
        ``index + 1``."""
        snap = Snapshot.decode(data)
        if snap.index != index:
            raise SnapshotError(f"the snapshot received is of index {snap.index}, not {index}")
        gap_from = self._applied + 1
        if self._writing is not None:
            self._writing.result()
            self._writing = None
        state = snap.state
        with self._lock:
            for cq in self._queues.values():
                cq.close()
            self._queues.clear()
            self.index.close()
            self._results.clear()
        self._appends.clear()
        self._chain = None
        shutil.rmtree(self._cq_root, ignore_errors=True)
        self._cq_root.mkdir(parents=True)
        shutil.rmtree(self._store / "index", ignore_errors=True)
        self.index = IndexService(self._store / "index", *self._index_geometry)
        self._load_tables(state)
        with self._lock:
            for topic, by_queue in state["queues"].items():
                for qid, next_offset in by_queue.items():
                    self._queues[(topic, int(qid))] = ConsumeQueue(
                        self._cq_root / topic_directory(topic) / str(qid), self._units,
                        start_offset=int(next_offset))
            self._applied = index
            self._digests[index] = snap.digest
        self.snapshots.write(snap)  # this replica can now send it on
        self.installs.append([index, int(time.time() * 1000), gap_from])
        self._checkpoint()
        log.info("installed the snapshot at index %d (state digest %s; entries %d..%d were never "
                 "applied here): %d topics, %d queues", index, snap.digest[:16], gap_from, index,
                 len(self.topics), len(self._queues))

    # -- reading -----------------------------------------------------------------
    def results(self, index: int) -> list[Applied] | None:
        """Outcomes of the records of entry ``index`` (None: not applied or forgotten)."""
        with self._lock:
            kept = self._results.get(index)
        return None if kept is None else [Applied._make(a) for a in kept]

    def queue(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        with self._lock:
            return self._queues.get((topic, queue_id))

    def retained_min_offset(self, cq: ConsumeQueue, log_start: int) -> int:
        """The first offset of ``cq`` whose message is still in the CommitLog, which now starts
        at position ``log_start`` (units below it may linger until ``trim``)."""
        key = (id(cq), log_start)
        cached = self._retained_min.get(key)  # holds the queue: its id is not reused meanwhile
        if cached is not None and cached[0] is cq and cached[1] >= cq.min_offset:
            return cached[1]
        found = cq.offset_for_position(log_start)
        if len(self._retained_min) > 100_000:
            self._retained_min.clear()
        self._retained_min[key] = (cq, found)
        return found

    def trim(self, log_start: int) -> int:
        """Retention moved the CommitLog's start to ``log_start``: delete the ConsumeQueue
        files and IndexFiles that point only below it (whole files; any thread). Returns
        how many files went."""
        with self._lock:
            queues = list(self._queues.values())
        removed = 0
        for cq in queues:
            try:
                removed += len(cq.delete_before(self.retained_min_offset(cq, log_start)))
            except ValueError:  # closed meanwhile (the topic was deleted)
                continue
        removed += len(self.index.delete_before_position(log_start))
        return removed

    def committed_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        with self._lock:
            return self.offsets.get(group, {}).get(topic, {}).get(queue_id)

    def query_key(self, key: str, begin_ms: int, end_ms: int, max_results: int) -> list[int]:
        """CommitLog positions of messages with ``key`` (or message id in hex), newest first.

        Hash matches: the caller checks the real key in the message it reads.
        """
        return self.index.query(key, begin_ms, end_ms, max_results)

    def checkpoint(self) -> None:
        """Write a checkpoint of the state now and return when it is durable (apply thread,
        or while nothing is applied)."""
        self._checkpoint()

    def close(self) -> None:
        self._checkpoint()
        self._checkpointer.shutdown()
        with self._lock:
            for cq in self._queues.values():
                cq.close()
            self._queues.clear()
            self.index.close()

    # -- apply ---------------------------------------------------------------------
    def _apply_entry(self, entry: Entry) -> list[Applied]:
        try:
            stamp, records = read_records(entry.body)
        except ValueError as e:
            self._chain = None
            return [Applied(Outcome.INVALID, reason=f"entry is not a batch: {e}")]
        base = entry.position + HEADER_SIZE
        self.last_store_ms = max(self.last_store_ms, stamp)
        if len(records) == 1:
            offset, record = records[0]
            if record_kind(record) == RecordKind.FRAGMENT:
                return [self._apply_fragment(record, base + offset, stamp, entry.index)]
        self._chain = None  # any other entry abandons a pending chain
        out = []
        for offset, record in records:
            kind = record_kind(record)
            if kind == RecordKind.MESSAGE:
                out.append(self._apply_message(record, base + offset, stamp))
            elif kind == RecordKind.FRAGMENT:
                out.append(Applied(Outcome.INVALID,
                                   reason="a fragment must be the only record of its entry"))
            else:
                out.append(self._apply_admin(record, stamp))
        return out

    def _apply_fragment(self, record: bytes, position: int, stamp: int, index: int) -> Applied:
        """One fragment of a chain (``position``: its record's); see ``broker.fragments``."""
        try:
            fragment = parse_fragment(record)
        except ValueError as e:
            self._chain = None
            return Applied(Outcome.INVALID, reason=str(e))
        chain = self._chain
        if fragment.number == 0:
            chain = self._chain = _Chain(fragment.chain_id, fragment.total, index,
                                         position + fragment.offset, stamp)
        elif chain is None or (chain.chain_id, chain.total, chain.next_number) != (
                fragment.chain_id, fragment.total, fragment.number):
            self._chain = None
            return Applied(Outcome.ABANDONED, reason=(
                f"fragment {fragment.number} of message {fragment.chain_id.hex()} does not follow "
                "its previous fragment (another entry came between them, e.g. a leader change); "
                "nothing was stored: send the message again"))
        chain.parts.append(fragment.data)
        chain.received += len(fragment.data)
        chain.next_number += 1
        if chain.received < chain.total:
            return Applied(Outcome.FRAGMENT, reason=f"{chain.received} of {chain.total} bytes")
        self._chain = None
        if chain.received > chain.total:
            return Applied(Outcome.INVALID, reason=(
                f"the fragments of message {chain.chain_id.hex()} hold {chain.received} bytes, "
                f"more than its {chain.total}"))
        return self._apply_message(b"".join(chain.parts), chain.position, chain.stamp)

    def _apply_message(self, record: bytes, position: int, store_ts_ms: int) -> Applied:
        try:
            m = decode_message(record)
        except MessageFormatError as e:
            return Applied(Outcome.INVALID, reason=str(e))
        topic = self.topics.get(m.topic)
        if topic is None and m.topic.startswith((RETRY_PREFIX, DLQ_PREFIX)):
            # a group's retry and dead-letter topics are made on first use (one queue)
            topic = self.topics[m.topic] = TopicConfig(1, int(Perm.READ_WRITE))
        if topic is None:
            self._drop_hold(m)
            return Applied(Outcome.TOPIC_NOT_EXIST, reason=f"topic {m.topic!r} does not exist")
        if not topic.perm & _PERM_WRITE:
            self._drop_hold(m)
            return Applied(Outcome.NO_PERMISSION, reason=f"topic {m.topic!r} is not writable")
        if not 0 <= m.queue_id < topic.queues:
            self._drop_hold(m)
            return Applied(Outcome.INVALID, reason=f"queue {m.queue_id} is not in 0..{topic.queues - 1}")
        producer = m.producer_id
        if producer is not None:
            key = f"{producer}\x00{m.topic}\x00{m.queue_id}"
            last_seq, recent = self._producer_state(key, store_ts_ms)
            if m.sequence <= last_seq:
                back = last_seq - m.sequence  # recent[-1] is last_seq's offset
                original = recent[-1 - back] if back < min(len(recent), RECENT_SEQUENCES) else -1
                return Applied(Outcome.DUPLICATE, m.queue_id, original,
                               reason=f"sequence {m.sequence} was already stored")
            if m.sequence > last_seq + 1:
                return Applied(Outcome.SEQUENCE_GAP, m.queue_id,
                               reason=f"sequence {m.sequence} after {last_seq}: a gap")
        if m.properties:
            where = self._deferral(m, position, len(record), store_ts_ms)
            if isinstance(where, Applied):
                return where
        else:
            where = (m.topic, m.queue_id)
        appends = self._appends.get(where)
        if appends is None:
            cq = self._open_queue(*where)
            appends = self._appends[where] = _Appends(cq, cq.max_offset, cq_hash_prefix(*where))
        queue_offset = appends.first_offset + len(appends.units)
        tag = tag_hash(m.tags)
        appends.units.append((position, len(record), tag))
        self._cq_hash = cq_hash_step(self._cq_hash, appends.hash_prefix, queue_offset, position,
                                     len(record), tag)
        self.index.put_keys([*m.keys, m.msg_id.hex()], position, store_ts_ms)
        # a held message (delayed, a transaction half) has no offset in its queue until it
        # is delivered: its sender is told -1, not the offset in the internal queue
        shown = queue_offset if where == (m.topic, m.queue_id) else -1
        if producer is not None:
            entry = self._producers.get(key)
            if entry is None:
                self._producers[key] = [m.sequence, [shown], store_ts_ms]
            else:
                entry[0], entry[2] = m.sequence, store_ts_ms
                offsets = entry[1]
                offsets.append(shown)
                if len(offsets) > 2 * RECENT_SEQUENCES:  # trimmed now and then: amortised O(1)
                    del offsets[:-RECENT_SEQUENCES]
        if shown < 0:
            return Applied(Outcome.STORED, m.queue_id, -1, position,
                           reason="held: its queue offset is assigned when it is delivered")
        return Applied(Outcome.STORED, where[1], queue_offset, position)

    def _write_appends(self) -> None:
        for appends in self._appends.values():
            appends.cq.append_many(appends.first_offset, appends.units)
        self._appends.clear()

    def _producer_state(self, key: str, stamp: int) -> tuple[int, list[Any]]:
        """(last sequence, queue offsets of the sequences up to it) of a producer on a queue. A
        producer silent for PRODUCER_EXPIRY_MS (by the entries' store times, so every
        replica decides alike) is forgotten: it starts again at sequence 0."""
        entry = self._producers.get(key)
        if entry is None:
            return -1, []
        last_ms = entry[2] if len(entry) > 2 else 0
        # "now" never behind what _forget_expired used (last_store_ms only grows)
        if last_ms < max(stamp, self.last_store_ms) - PRODUCER_EXPIRY_MS:
            del self._producers[key]
            return -1, []
        return entry[0], entry[1]

    def _forget_expired(self) -> None:
        """Drop from memory and the checkpoint what lookups already treat as absent (so when
        this runs changes nothing a replica decides): producers silent for
        PRODUCER_EXPIRY_MS, queue locks past LOCK_EXPIRY_MS, send-backs past their window;
        producers keep the offsets of their last RECENT_SEQUENCES sequences."""
        now = self.last_store_ms
        _drop_older(self._producers, now - PRODUCER_EXPIRY_MS, lambda v: v[2] if len(v) > 2 else 0)
        for v in self._producers.values():
            del v[1][:-RECENT_SEQUENCES]
        _drop_older(self._locks, now - LOCK_EXPIRY_MS, lambda v: v[1])
        _drop_older(self._sent_back, now - SENT_BACK_WINDOW_MS, lambda ms: ms)

    def _drop_hold(self, m: Message) -> None:
        """A released copy that cannot be stored (its topic went away): the hold goes too,
        or the leader would release it again forever."""
        released = m.properties.get(PROP_SCHEDULED_FROM, "")
        if released.isdigit():
            self.timers.release(int(released))
        committed = m.properties.get(PROP_TRANSACTION_OF, "")
        if committed.isdigit():
            self.halves.resolve(int(committed))

    def _deferral(self, m: Message, position: int, size: int, stamp: int) -> tuple[str, int] | Applied:
        """Where a valid message is stored: its own queue, or held (delay, transaction half).
        A released copy whose hold is gone was delivered already: it is not stored again."""
        props = m.properties
        released = props.get(PROP_SCHEDULED_FROM)
        if released is not None:
            if not (released.isdigit() and self.timers.release(int(released))):
                return Applied(Outcome.DUPLICATE, m.queue_id, reason="this delayed message was delivered")
            return m.topic, m.queue_id
        committed = props.get(PROP_TRANSACTION_OF)
        if committed is not None:
            if not (committed.isdigit() and self.halves.resolve(int(committed))):
                return Applied(Outcome.DUPLICATE, m.queue_id, reason="this transaction was resolved")
            return m.topic, m.queue_id
        sent_back = props.get(PROP_SENT_BACK)
        if sent_back is not None:
            seen = self._sent_back.get(sent_back)
            if seen is not None and seen >= stamp - SENT_BACK_WINDOW_MS:
                return Applied(Outcome.DUPLICATE, m.queue_id, reason="this message was sent back already")
            self._sent_back[sent_back] = stamp
        if props.get(PROP_TRAN) == "true":
            self.halves.hold(position, size, stamp, props.get(PROP_PGROUP, ""))
            return TRANS_HALF_TOPIC, 0
        due = props.get(PROP_DELIVER_AT, "")
        if due.isdigit() and int(due) > stamp:
            self.timers.hold(position, size, int(due))
            level = props.get(PROP_DELAY, "")
            return SCHEDULE_TOPIC, int(level) if level.isdigit() and int(level) < 1024 else 0
        return m.topic, m.queue_id

    def _apply_admin(self, record: bytes, stamp: int) -> Applied:
        try:
            cmd = decode_admin(record)
        except ValueError as e:
            return Applied(Outcome.INVALID, reason=str(e))
        with self._lock:
            if isinstance(cmd, CreateTopic):
                self.topics[cmd.topic] = TopicConfig(cmd.queues, int(cmd.perm))
            elif isinstance(cmd, DeleteTopic):
                if self.topics.pop(cmd.topic, None) is None:
                    return Applied(Outcome.TOPIC_NOT_EXIST, reason=f"no topic {cmd.topic!r}")
                self._drop_queues(cmd.topic)
                self._forget_topic(cmd.topic)
            elif isinstance(cmd, CommitOffset):
                if cmd.topic not in self.topics:
                    return Applied(Outcome.TOPIC_NOT_EXIST, reason=f"no topic {cmd.topic!r}")
                self.offsets.setdefault(cmd.group, {}).setdefault(cmd.topic, {})[cmd.queue_id] = (
                    cmd.offset)
            elif isinstance(cmd, RollbackHalf):
                if not self.halves.resolve(cmd.position):
                    return Applied(Outcome.DUPLICATE, reason="the transaction was already resolved")
            elif isinstance(cmd, CheckHalf) and not self.halves.checked(cmd.position, cmd.at_ms):
                return Applied(Outcome.DUPLICATE, reason="the transaction was already resolved")
            elif isinstance(cmd, LockQueue):
                return self._lock_queue(cmd, stamp)
        return Applied(Outcome.DONE)

    def _lock_queue(self, cmd: LockQueue, stamp: int) -> Applied:
        """Take or give back a queue's consume lock, as of the entry's store time ``stamp``."""
        key = f"{cmd.group}\x00{cmd.topic}\x00{cmd.queue_id}"
        held = self._locks.get(key)
        mine = held is None or held[0] == cmd.client_id or held[1] < stamp - LOCK_EXPIRY_MS
        if not cmd.lock:
            if held is not None and held[0] == cmd.client_id:
                del self._locks[key]
            return Applied(Outcome.DONE, cmd.queue_id)
        if not mine:
            assert held is not None
            return Applied(Outcome.LOCKED, cmd.queue_id, reason=(
                f"locked by {held[0]} (renewed at {held[1]}, expires {LOCK_EXPIRY_MS // 1000} s later)"))
        self._locks[key] = [cmd.client_id, stamp]
        return Applied(Outcome.DONE, cmd.queue_id)

    # -- queues and checkpoint -----------------------------------------------------
    def _open_queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        cq = self._queues.get((topic, queue_id))
        if cq is None:
            cq = ConsumeQueue(self._cq_root / topic_directory(topic) / str(queue_id), self._units)
            with self._lock:
                self._queues[(topic, queue_id)] = cq
        return cq

    def _forget_topic(self, topic: str) -> None:
        """Deleted means deleted (guarantee 6): the topic's consumer offsets, its producers'
        sequence windows and its queue locks go with it, so a topic created again under the
        name starts empty -- no group skips its first messages, no producer's sequence 0 is
        taken for a resend."""
        for by_topic in self.offsets.values():
            by_topic.pop(topic, None)
        for group in [g for g, by_topic in self.offsets.items() if not by_topic]:
            del self.offsets[group]
        for table in (self._producers, self._locks):
            for key in [k for k in table if k.split("\x00")[1:2] == [topic]]:
                del table[key]

    def _drop_queues(self, topic: str) -> None:
        for key in [k for k in self._appends if k[0] == topic]:
            del self._appends[key]  # units of this apply call for the deleted topic
        for key in [k for k in self._queues if k[0] == topic]:
            self._queues.pop(key).close()
        shutil.rmtree(self._cq_root / topic_directory(topic), ignore_errors=True)

    def _restore_queues(self, next_offsets: dict[str, dict[int, int]], covered: int) -> None:
        """Open every queue the checkpoint knows and cut what was applied after it.

        ``covered``: the CommitLog position of the last message the checkpoint covers (its
        index mark's end; -1 if none). A queue's files hold the checkpoint's queue only if its
        unit before the checkpoint's next offset is at or below it (or the files start at that
        offset, as after a snapshot install); otherwise they are a topic's created again after
        a delete the checkpoint does not know, and go: the replay deletes and recreates it."""
        topic_of = {topic_directory(t): t for t in next_offsets}
        for topic_dir in sorted(p for p in self._cq_root.iterdir() if p.is_dir()):
            topic = topic_of.get(topic_dir.name)
            if topic is None:
                shutil.rmtree(topic_dir)  # created after the checkpoint: replay recreates it
                continue
            known = next_offsets[topic]
            for queue_dir in sorted(topic_dir.iterdir(), key=lambda p: p.name):
                qid = int(queue_dir.name)
                if qid not in known:
                    shutil.rmtree(queue_dir)
                    continue
                cq = ConsumeQueue(queue_dir, self._units)
                end = known[qid]
                if end > cq.min_offset and not (end <= cq.max_offset and cq.get(end - 1).position <= covered):
                    log.info("queue %s/%s: its files are of the topic created again after the checkpoint; "
                             "they go, the replay makes them again", topic, qid)
                    cq.close()
                    shutil.rmtree(queue_dir)
                    continue  # restarted at the checkpoint's offset below
                if cq.max_offset > end:
                    cq.truncate_from(end)
                self._queues[(topic, qid)] = cq
        # A queue the checkpoint knows but whose files are gone (or were the new topic's): its
        # topic was deleted after the checkpoint, and the replay applies messages to it again
        # before deleting it again. It restarts at the checkpoint's next offset, so they get the
        # offsets they got the first time (the producer table and the ConsumeQueue hash record them).
        for topic, by_queue in next_offsets.items():
            for qid, next_offset in by_queue.items():
                if (topic, int(qid)) not in self._queues and next_offset > 0:
                    log.info("queue %s/%s has no files; restarted at offset %d (its topic was deleted "
                             "after the checkpoint)", topic, qid, next_offset)
                    self._queues[(topic, int(qid))] = ConsumeQueue(
                        self._cq_root / topic_directory(topic) / str(qid), self._units,
                        start_offset=int(next_offset))

    @property
    def _checkpoint_path(self) -> Path:
        return self._store / "state.checkpoint"

    def _checkpoint(self, background: bool = False) -> None:
        """Apply thread only (the one writer), so the state is read without the lock.

        The snapshot is taken here; the fsyncs and the write run on the checkpoint
        thread (``background``: this returns at once; one checkpoint at a time, a due
        one is skipped while the previous is still being written) or are waited for.
        A failure to make a checkpoint durable is raised here, at the next call.
        """
        writing = self._writing
        if writing is not None:
            if background and not writing.done():
                return  # still dirty: the next call takes a newer snapshot
            self._writing = None
            writing.result()  # raises what the checkpoint thread met
        self._checkpointed_at = time.monotonic()
        self._forget_expired()
        self._dirty = False
        with self._lock:
            open_queues = sorted(self._queues.items())
        queues: dict[str, dict[int, int]] = {}
        for (topic, qid), cq in open_queues:
            queues.setdefault(topic, {})[qid] = cq.max_offset
        mark = self.index.mark()
        state = {
            **self._replicated_state(queues),
            "applied": self.checkpoint_index(),
            "index_mark": None if mark is None else [mark[0], list(astuple(mark[1]))],
            "installs": self.installs,
        }
        data = msgpack.packb(state, use_bin_type=True)  # a copy: the tables change on
        cqs = [cq for _, cq in open_queues]
        if background:
            self._writing = self._checkpointer.submit(self._write_checkpoint, cqs, data, state["applied"])
        else:
            self._write_checkpoint(cqs, data, state["applied"])

    def _replicated_state(self, queues: dict[str, dict[int, int]]) -> dict[str, Any]:
        """The tables every replica derives alike (``broker.snapshot``'s state), with
        ``queues``: the next offset of every queue."""
        return {
            "last_store_ms": self.last_store_ms,
            "topics": {t: [c.queues, c.perm] for t, c in sorted(self.topics.items())},
            "queues": queues,
            "offsets": self.offsets,
            "producers": self._producers,
            "timers": self.timers.state(),
            "halves": self.halves.state(),
            "locks": self._locks,
            "sent_back": self._sent_back,
            "cq_hash": self._cq_hash.to_bytes(16, "big"),
        }

    def _load_tables(self, state: dict[str, Any]) -> None:
        self.last_store_ms = state.get("last_store_ms", 0)
        self.topics = {t: TopicConfig(*v) for t, v in state.get("topics", {}).items()}
        self.offsets = state.get("offsets", {})
        self._producers = state.get("producers", {})
        self._locks = state.get("locks", {})
        self._sent_back = state.get("sent_back", {})
        self.timers = Timers(state.get("timers"))
        self.halves = Halves(state.get("halves"))
        self._cq_hash = int.from_bytes(state.get("cq_hash", b""), "big")

    def _next_offsets(self) -> dict[str, dict[int, int]]:
        """Every queue's next offset, counting the units of this apply call not yet written."""
        queues: dict[str, dict[int, int]] = {}
        for (topic, qid), cq in sorted(self._queues.items()):
            appends = self._appends.get((topic, qid))
            queues.setdefault(topic, {})[qid] = (
                cq.max_offset if appends is None else appends.first_offset + len(appends.units))
        return queues

    def _write_checkpoint(self, cqs: list[ConsumeQueue], data: bytes, applied: int) -> None:
        """The files first (they hold at least what ``data`` describes: only appended
        since), then the checkpoint; a restart cuts the files back to it."""
        for cq in cqs:
            if not cq.closed:  # a queue deleted meanwhile: replay deletes it again
                cq.flush()
        self.index.flush()
        atomic_write(self._checkpoint_path, data)
        self._durable = applied


def _drop_older(table: dict[str, Any], horizon: int, ms_of: Callable[[Any], int]) -> None:
    """Delete the entries of ``table`` whose store time (``ms_of(value)``) is before ``horizon``."""
    for key in [k for k, v in table.items() if ms_of(v) < horizon]:
        del table[key]
