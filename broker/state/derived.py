"""What a broker replica derives from the committed entries, and how each record changes it.

``DerivedState`` composes the replicated tables -- each owning its data, its apply
operations and its checkpoint form -- with the files derived alongside::

    topics        Topics             name -> queues, permission
    offsets       ConsumerOffsets    (group, topic, queue) -> committed offset
    producers     ProducerWindows    (producer, topic, queue) -> last sequence, recent records
    locks         QueueLocks         (group, topic, queue) -> the client holding its consume lock
    deferral      Deferral           held messages: Timers, Halves (broker.deferred), SendBacks
    access        AccessTables       users (SCRAM credentials), access policies, RocketMQ access keys
    pops          PopTables          per-message acknowledgement: each group's windows of
                                     messages in flight, its retry policy (broker.state.pops)
    queue_files   QueueFiles         the ConsumeQueues and their running hash
    index         IndexService       IndexFiles: message keys and ids -> positions
    chains        ChainCollector     a large message's fragments so far (not replicated)
    markers       [VerifyMarker]     the verify markers of the entry applied last, for the
                                     machine to digest after it (``take_markers``)
    last_store_ms                    the latest store time applied: the apply step's clock,
                                     by which producers, locks and send-backs expire

``apply_entry`` applies one DATA entry's records in order: message records (stored whole,
held or refused, their bodies never decoded), fragments of a chain, admin records
(``broker.store.commands``). Every decision depends
only on the entries, so every replica derives the same state; ``state`` is its canonical
form (``broker.state.snapshot``), what checkpoints and snapshots hold and digests are over.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import astuple
from pathlib import Path
from typing import Any, TypeVar

from broker.state.access import AccessTables
from broker.state.chain import ChainCollector, Whole
from broker.state.deferral import Deferral
from broker.state.held import Prop
from broker.state.locks import QueueLocks
from broker.state.offsets import ConsumerOffsets
from broker.state.outcome import DONE, STORED, Kept, Outcome, kept
from broker.state.pops import PopTables
from broker.state.producers import ProducerWindows
from broker.state.queues import QueueFiles
from broker.state.topics import TopicConfig, Topics
from broker.store.access_key_commands import PutAccessKey, RevokeAccessKey
from broker.store.commands import (
    CheckHalf,
    CommitOffset,
    CreateTopic,
    DeleteTopic,
    DeleteUser,
    Grant,
    LockQueue,
    Perm,
    PutUser,
    RecordKind,
    RollbackHalf,
    VerifyMarker,
    decode_admin,
    record_kind,
)
from broker.store.consume_queue_layout import tag_summary
from broker.store.entry_batch import read_records
from broker.store.index_layout import IndexHeader
from broker.store.index_service import IndexService
from broker.store.pop_commands import POP_TYPES, GroupPolicy, PopRecord
from dledger.storage.disk_guard import is_out_of_space
from dledger.storage.entry_format import HEADER_SIZE, Entry
from protocol.message_format import MessageFormatError, decode_message
from protocol.record_batch import read_header

__all__ = ["DerivedState"]

_PERM_WRITE = int(Perm.WRITE)
_MESSAGE = int(RecordKind.MESSAGE)
_FRAGMENT = int(RecordKind.FRAGMENT)
_HELD = "held: its queue offset is assigned when it is delivered"
_CARRIED = "carried forward: the held message is read from here"

T = TypeVar("T")
#: ``wait_for_space(what, write)``: run ``write`` until the disk has room for it
#: (``dledger.storage.disk_guard.DiskGuard.wait_for_space``).
WaitForSpace = Callable[[str, Callable[[], T]], T]


class DerivedState:
    """Apply thread only, but for the reads each part allows other threads."""

    def __init__(self, store: Path, checkpoint: dict[str, Any], cq_units_per_file: int,
                 index_slots: int, index_entries: int,
                 wait_for_space: WaitForSpace[Any] | None = None) -> None:
        """The state ``checkpoint`` describes (``broker.state.checkpoint``; empty: none), its
        files in ``store`` cut back to it. ``wait_for_space``: what a file write that failed
        for want of space is handed to, to be tried again until it fits (None: raised)."""
        self._store = store
        self._wait_for_space = wait_for_space
        self._index_geometry = (index_slots, index_entries)
        self.chains = ChainCollector()
        self.markers: list[VerifyMarker] = []
        self._load_tables(checkpoint)
        mark = checkpoint.get("index_mark")
        index_mark = None if mark is None else (mark[0], IndexHeader(*mark[1]))
        self.queue_files = QueueFiles(store / "consumequeue", cq_units_per_file,
                                      checkpoint.get("cq_hash", b""))
        self.queue_files.restore(checkpoint.get("queues", {}),
                                 -1 if index_mark is None else index_mark[1].end_position)
        self.index = IndexService(store / "index", index_slots, index_entries)
        self.index.rollback(index_mark)

    def _load_tables(self, state: dict[str, Any]) -> None:
        self.last_store_ms: int = state.get("last_store_ms", 0)
        self.topics = Topics(state.get("topics"))
        self.offsets = ConsumerOffsets(state.get("offsets"))
        self.producers = ProducerWindows(state.get("producers"))
        self.locks = QueueLocks(state.get("locks"))
        self.deferral = Deferral(state)
        self.access = AccessTables(state.get("users"), state.get("policies"), state.get("access_keys"))
        self.pops = PopTables(state.get("pops"), state.get("retry"))

    # -- applying ----------------------------------------------------------------------
    def apply_entry(self, entry: Entry) -> list[Kept]:
        """The results of a DATA entry's records. Units go to ``queue_files``, written by its
        ``write_appends``."""
        try:
            stamp, records = read_records(entry.body)
        except ValueError as e:
            self.chains.abandon()
            return [kept(Outcome.INVALID, reason=f"entry is not a batch: {e}")]
        base = entry.position + HEADER_SIZE
        self.last_store_ms = max(self.last_store_ms, stamp)
        if len(records) == 1:
            offset, record = records[0]
            if record_kind(record) == _FRAGMENT:
                result = self.chains.add(record, base + offset, stamp, entry.index)
                return [self._apply_message(*result) if isinstance(result, Whole) else result]
        self.chains.abandon()  # any other entry abandons a pending chain
        out = []
        for offset, record in records:
            kind = record_kind(record)
            if kind == _MESSAGE:
                out.append(self._apply_message(record, base + offset, stamp))
            elif kind == _FRAGMENT:
                out.append(kept(Outcome.INVALID, reason="a fragment must be the only record of its entry"))
            elif kind is not None and kind < _FRAGMENT:
                out.append(kept(Outcome.INVALID, reason=f"a message record of format {kind}: not read "
                                                        f"(this broker stores format {_MESSAGE})"))
            else:
                out.append(self._apply_admin(record, stamp))
        return out

    def _apply_message(self, record: bytes, position: int, store_ts_ms: int) -> Kept:
        """A message record: checked from its header (topic, permission, queue, producer
        sequences), stored as one ConsumeQueue unit, its keys and ids indexed; its body never
        decoded (but for a SPECIAL record of one: where to hold it)."""
        try:
            h = read_header(record)
        except MessageFormatError as e:
            return kept(Outcome.INVALID, reason=str(e))
        m = None
        if h.special:  # a property the broker acts on: the leader sent it as a record of one
            try:
                m = decode_message(record)
            except MessageFormatError as e:
                return kept(Outcome.INVALID, reason=str(e))
            if Prop.CARRIED_FROM in m.properties:  # a held message's new copy: in no queue
                why = self.deferral.carry(m, position, len(record))
                if why is not None:
                    return kept(Outcome.DUPLICATE, reason=why)
                return (DONE, -1, -1, position, _CARRIED)
        topic = self.topics.for_message(h.topic)
        qid = h.queue_id
        if topic is None or not topic.perm & _PERM_WRITE or not 0 <= qid < topic.queues:
            if m is not None:
                self.deferral.drop_hold(m)
            return _refusal(h.topic, qid, topic)
        count, producer = h.count, h.producer_id
        if producer is not None:  # base sequence with it (record_batch)
            key = (producer, h.topic, qid)
            refused = self.producers.admit(key, h.base_sequence, count, self.last_store_ms)
            if refused is not None:
                return refused
        try:
            keys = h.keys(record)
        except MessageFormatError as e:
            return kept(Outcome.INVALID, reason=str(e))
        if m is not None:
            where = self.deferral.route(m, position, len(record), store_ts_ms)
            if isinstance(where, str):
                return kept(Outcome.DUPLICATE, qid, reason=where)
        else:
            where = (h.topic, qid)
        kind, tag = tag_summary(h.tag_hashes(record))
        unit = (where, position, len(record), count, store_ts_ms, kind, tag)
        try:  # each write may be tried again on its own: both leave nothing half done
            base = self.queue_files.append(*unit)
        except OSError as e:
            base = self.written_once_there_is_room(e, "opening a ConsumeQueue",
                                                   lambda: self.queue_files.append(*unit))
        ids = h.msg_ids(record)
        pairs = [((*keys[i], ids[i].hex()), position + i) for i in range(count)]
        try:
            self.index.put_messages(pairs, store_ts_ms)
        except OSError as e:
            self.written_once_there_is_room(e, "indexing a record's keys",
                                            lambda: self.index.put_messages(pairs, store_ts_ms))
        # a held message (delayed, a transaction half) has no offset in its queue until it
        # is delivered: its sender is told -1, not the offset in the internal queue
        shown = base if where == (h.topic, qid) else -1
        if producer is not None:
            self.producers.record(key, h.base_sequence, count, shown, store_ts_ms)
        if shown < 0:
            return (STORED, qid, -1, position, _HELD)
        return (STORED, qid, base, position, "")

    def _apply_admin(self, record: bytes, stamp: int) -> Kept:
        try:
            cmd = decode_admin(record)
        except ValueError as e:
            return kept(Outcome.INVALID, reason=str(e))
        if isinstance(cmd, POP_TYPES):
            return self._apply_pop(cmd)
        match cmd:
            case CreateTopic():
                self.topics.create(cmd.topic, cmd.queues, int(cmd.perm))
            case DeleteTopic():
                if not self.topics.delete(cmd.topic):
                    return kept(Outcome.TOPIC_NOT_EXIST, reason=f"no topic {cmd.topic!r}")
                self._forget_topic(cmd.topic)
            case CommitOffset():
                if cmd.topic not in self.topics:
                    return kept(Outcome.TOPIC_NOT_EXIST, reason=f"no topic {cmd.topic!r}")
                self.offsets.commit(cmd.group, cmd.topic, cmd.queue_id, cmd.offset)
            case RollbackHalf():
                if not self.deferral.halves.resolve(cmd.position):
                    return kept(Outcome.DUPLICATE, reason="the transaction was already resolved")
            case CheckHalf():
                if not self.deferral.halves.checked(cmd.position, cmd.at_ms):
                    return kept(Outcome.DUPLICATE, reason="the transaction was already resolved")
            case LockQueue():
                return self.locks.apply(cmd, stamp)
            case PutUser() | DeleteUser() | Grant() | PutAccessKey() | RevokeAccessKey():
                why = self.access.apply(cmd)
                if why is not None:
                    return kept(Outcome.INVALID, reason=why)
            case VerifyMarker():
                self.markers.append(cmd)  # changes nothing: digested after its entry
        return (DONE, -1, -1, -1, "")

    def _apply_pop(self, cmd: PopRecord) -> Kept:
        """A POP record or a group's retry policy, at the apply step's clock (``broker.state.pops``)."""
        if isinstance(cmd, GroupPolicy):
            return self.pops.apply(cmd, self.last_store_ms, 0)
        if cmd.topic not in self.topics:
            return kept(Outcome.TOPIC_NOT_EXIST, reason=f"no topic {cmd.topic!r}")
        return self.pops.apply(cmd, self.last_store_ms, self.queue_files.next_offset(cmd.topic, cmd.queue_id))

    def take_markers(self) -> list[VerifyMarker]:
        """The verify markers applied since the last call (the machine digests the state
        after their entry: ``broker.state.marker_digest``)."""
        taken, self.markers = self.markers, []
        return taken

    def written_once_there_is_room(self, error: OSError, what: str, write: Callable[[], T]) -> T:
        """``write`` failed with ``error``: if for want of space, wait until it succeeds (the
        apply step cannot skip it); else raise ``error``."""
        if self._wait_for_space is None or not is_out_of_space(error):
            raise error
        result: T = self._wait_for_space(what, write)
        return result

    def _forget_topic(self, topic: str) -> None:
        """Deleted means deleted (guarantee 6): the topic's queues, consumer offsets, its
        producers' sequence windows, its queue locks, its held delayed messages and retries and
        its transaction halves go with it, so a topic created again under the name starts
        empty -- no group skips its first messages, no producer's sequence 0 is taken for a
        resend, no old message comes back through a group's retry topic or a late commit."""
        self.queue_files.drop_topic(topic)
        self.offsets.forget_topic(topic)
        self.producers.forget_topic(topic)
        self.locks.forget_topic(topic)
        self.deferral.forget_topic(topic)
        self.pops.forget_topic(topic)

    # -- canonical form ----------------------------------------------------------------
    def forget_expired(self) -> None:
        """Drop from memory and the checkpoint what lookups already treat as absent (so when
        this runs changes nothing a replica decides)."""
        now = self.last_store_ms
        self.producers.forget_expired(now)
        self.locks.forget_expired(now)
        self.deferral.send_backs.forget_expired(now)

    def state(self) -> dict[str, Any]:
        """The replicated state now: ``broker.state.snapshot``'s "state" (it shares the tables'
        lists and maps: encode it before the next entry is applied)."""
        deferral = self.deferral.state()
        return {
            "last_store_ms": self.last_store_ms,
            "topics": self.topics.state(),
            "queues": self.queue_files.next_offsets(),
            "offsets": self.offsets.state(),
            "producers": self.producers.state(),
            "timers": deferral["timers"],
            "halves": deferral["halves"],
            "locks": self.locks.state(),
            "sent_back": deferral["sent_back"],
            "cq_hash": self.queue_files.hash_state(),
            **self.access.state(),  # nothing while there are no users: the form is unchanged
            **self.pops.state(),  # nothing while no group pops nor has a retry policy: the same
        }

    def index_mark(self) -> list[Any] | None:
        """Where the IndexFiles stand, in the checkpoint's form."""
        mark = self.index.mark()
        return None if mark is None else [mark[0], list(astuple(mark[1]))]

    # -- install, close --------------------------------------------------------------------
    def install(self, state: dict[str, Any]) -> None:
        """Replace everything with ``state`` (a snapshot's): ConsumeQueues restart empty at
        its next offsets, the IndexFiles empty."""
        self.chains.abandon()
        self.index.close()
        shutil.rmtree(self._store / "index", ignore_errors=True)
        self.index = IndexService(self._store / "index", *self._index_geometry)
        self._load_tables(state)
        self.queue_files.reset(state["queues"], state.get("cq_hash", b""))

    def close(self) -> None:
        self.queue_files.close()
        self.index.close()


def _refusal(name: str, queue_id: int, topic: TopicConfig | None) -> Kept:
    """Why a record to a missing or read-only topic, or to no queue of it, is not stored."""
    if topic is None:
        return kept(Outcome.TOPIC_NOT_EXIST, reason=f"topic {name!r} does not exist")
    if not topic.perm & _PERM_WRITE:
        return kept(Outcome.NO_PERMISSION, reason=f"topic {name!r} is not writable")
    return kept(Outcome.INVALID, reason=f"queue {queue_id} is not in 0..{topic.queues - 1}")
