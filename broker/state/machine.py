"""The broker's deterministic apply step: committed entries -> topics, queues, offsets.

Implements ``dledger.applier.StateMachine``. Everything here depends only on the
entries (their bytes, index and position), never on the clock or the node, so
every replica derives byte-identical ConsumeQueues and the same state.

``BrokerStateMachine`` keeps the apply loop, the recent results, checkpoints and
snapshots around the state it derives (``broker.state.derived.DerivedState``: the
typed tables of ``broker.state``, the ConsumeQueues, the IndexFiles). Files
(``store/``)::

    consumequeue/<topic>/<queue>/   ConsumeQueue files (broker.store.consume_queue; long names hashed)
    index/                          IndexFiles: message keys and ids -> positions
    state.checkpoint                the state and the entry it is after (broker.state.checkpoint)
    snapshots/<index>.snap          the state just before each CommitLog segment
                                    (broker.state.snapshot): what a replica behind the
                                    retained log start is sent; its digest is what
                                    replicas compare

Digests of the state are taken at every snapshot, after every ``digest_every``-th entry,
and after every entry holding a verify marker (``raftmq cluster verify``), where the
ConsumeQueue units are also read back from their files (``broker.state.marker_digest``);
the snapshots held and the recent digests are ``broker.state.snapshot_keeper``'s.

At most every CHECKPOINT_EVERY_S (and when idle) the apply thread takes the state
and a checkpoint thread fsyncs the ConsumeQueues and IndexFiles -- which then hold
at least what the state describes -- and writes it atomically, so the applied index
is persisted with the state it describes while the apply step goes on. On start the
files are cut back to the checkpoint (undoing anything applied after it), and the
applier re-applies from ``applied + 1``: replaying yields the same bytes.

Messages too large for one entry arrive as a chain of fragments in consecutive
entries (``broker.store.fragments``); while a chain is pending the checkpoint records the
entry before its first fragment as applied (``checkpoint_index``), so a restart
re-applies the chain from its start: nothing else changes state in between.

Cost: every replica applies every message, so the per-message work is kept small:
one decode, ConsumeQueue units gathered per queue and written once per ``apply``
call (before the applied index and results are published), the IndexFile updated
in its mapping, results kept as plain tuples (``broker.state.outcome``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from broker.state.access import AccessTables
from broker.state.checkpoint import CheckpointWriter, read_checkpoint
from broker.state.derived import DerivedState
from broker.state.held import Halves, Timers
from broker.state.locks import LOCK_EXPIRY_MS
from broker.state.marker_digest import MarkerDigests
from broker.state.offsets import ConsumerOffsets
from broker.state.outcome import Applied, Kept, Outcome, applied
from broker.state.pops import PopTables
from broker.state.producers import PRODUCER_EXPIRY_MS, RECENT_RECORDS
from broker.state.send_backs import SENT_BACK_WINDOW_MS
from broker.state.snapshot import Snapshot, SnapshotError
from broker.state.snapshot_keeper import SnapshotKeeper
from broker.state.topics import TopicConfig, Topics
from broker.store.consume_queue import ConsumeQueue
from broker.store.index_layout import DEFAULT_INDEX_NUM, DEFAULT_SLOT_NUM
from broker.store.index_service import IndexService
from dledger.storage.disk_guard import DiskGuard
from dledger.storage.entry_format import Entry, EntryKind

__all__ = ["DIGEST_EVERY", "LOCK_EXPIRY_MS", "PRODUCER_EXPIRY_MS", "RECENT_RECORDS",
           "SENT_BACK_WINDOW_MS", "Applied", "BrokerStateMachine", "Outcome", "TopicConfig"]

log = logging.getLogger("broker.state_machine")

RECENT_RESULTS = 20_000  # entries whose outcomes stay available to the proposer
#: At most this often (and when idle). Each checkpoint fsyncs the ConsumeQueues and the
#: IndexFile, whose puts dirty random pages of its slot table: the bigger the write-back,
#: the longer it delays the CommitLog's fsyncs on the same disk (every 1 s: sends of
#: 1,000 msgs/s stalled 20-40 ms once a second, p99 20-22 ms; every 0.25 s: p99 15-16 ms).
#: After an fsync the first store into each written page faults again (the kernel
#: write-protects pages it writes back): every 0.1 s that cost ~1.3 us per message at
#: full load, every 0.25 s about 5 % of throughput. A crash replays <= ~0.25 s of entries.
CHECKPOINT_EVERY_S = 0.25
#: The state's digest is also recorded after every this-many entries (replicas compare them).
DIGEST_EVERY = 4096


class BrokerStateMachine:
    """Apply thread calls ``apply``/``apply_gap``; any thread may read the snapshots."""

    def __init__(self, store: Path, cq_units_per_file: int = 300_000,
                 index_slots: int = DEFAULT_SLOT_NUM, index_entries: int = DEFAULT_INDEX_NUM,
                 segment_bytes: int | None = None, digest_every: int = DIGEST_EVERY,
                 disk: DiskGuard | None = None) -> None:
        """``segment_bytes``: the CommitLog's segment size; a snapshot is taken before the
        first entry of every segment (None: no snapshots, as for a machine in a test).
        The state's digest is also recorded after every ``digest_every``-th entry.
        ``disk``: the replica's disk-full flag -- a ConsumeQueue or IndexFile write that
        fails for want of space raises it and waits there until the write fits; a
        checkpoint that cannot be written is tried again later (None: such errors raise)."""
        self._disk = disk
        self._checkpoint_stuck_at = -1  # durable index when a checkpoint last failed (logged once)
        self._segment_bytes = segment_bytes
        self._digest_every = digest_every
        self._snapshots = SnapshotKeeper(store / "snapshots", disk)
        self._lock = threading.Lock()  # the results, the applied index
        self._results: OrderedDict[int, list[Kept]] = OrderedDict()  # untracked by the gc
        self.on_applied: list[Callable[[int], None]] = []  # run on the apply thread
        #: run on the apply thread with the (topic, queue id)s an apply call appended to
        self.on_queues_grown: list[Callable[[list[tuple[str, int]]], None]] = []
        checkpoint = read_checkpoint(store / "state.checkpoint")
        self._applied: int = checkpoint.get("applied", 0)
        self._checkpointed_at = 0.0
        self._checkpoints = CheckpointWriter(store / "state.checkpoint", self._applied)
        self._dirty = False
        #: snapshots installed here: [snapshot index, when (ms), the first entry this replica
        #: never applied (the gap is from there to the snapshot index)] (not replicated state)
        self.installs: list[list[int]] = checkpoint.get("installs", [])
        self._state = DerivedState(store, checkpoint, cq_units_per_file, index_slots, index_entries,
                                   disk.wait_for_space if disk is not None else None)
        #: the digests taken at verify markers (broker.state.marker_digest; read by any thread)
        self.markers = MarkerDigests(self._state.queue_files)

    # -- the state, for readers (see each table's thread contract) -------------------
    @property
    def topics(self) -> Topics:
        return self._state.topics

    @property
    def offsets(self) -> ConsumerOffsets:
        return self._state.offsets

    @property
    def access(self) -> AccessTables:
        """Users and policies (read by any thread; replaced whole by the apply thread)."""
        return self._state.access

    @property
    def pops(self) -> PopTables:
        """Each group's POP windows and retry policy (``broker.state.pops``)."""
        return self._state.pops

    @property
    def timers(self) -> Timers:
        return self._state.deferral.timers

    @property
    def halves(self) -> Halves:
        return self._state.deferral.halves

    @property
    def index(self) -> IndexService:
        return self._state.index

    @property
    def last_store_ms(self) -> int:
        """The latest store time applied (the leader stamps no entry before it)."""
        return self._state.last_store_ms

    # -- StateMachine contract -------------------------------------------------
    def applied_index(self) -> int:
        return self._applied

    def checkpoint_index(self) -> int:
        """The applied index the checkpoint records: a restart re-applies what follows.

        Below ``applied_index()`` while a chain of fragments is pending (it is
        re-applied from its first fragment); retention must keep those entries.
        """
        first = self._state.chains.first_index
        return self._applied if first is None else min(self._applied, first - 1)

    def idle(self) -> None:
        """Nothing to apply for a while: write the checkpoint if it is behind."""
        if self.durable_index() != self.checkpoint_index() or self._dirty:
            self._checkpoint(background=True)

    def durable_index(self) -> int:
        """What the last written checkpoint records: a restart replays from after it, so
        retention must keep every entry after it."""
        return self._checkpoints.durable_index

    def apply(self, entries: Sequence[Entry]) -> None:
        state = self._state
        done: list[tuple[int, list[Kept]]] = []
        for entry in entries:
            if self._segment_bytes and entry.position % self._segment_bytes == 0 and entry.index > 1:
                self._take_snapshot(entry.index - 1)  # the first entry of a segment
            if entry.kind == EntryKind.DATA:
                done.append((entry.index, state.apply_entry(entry)))
                if state.markers:
                    self._take_markers(entry.index)
            else:
                state.chains.abandon()  # e.g. a new leader's no-op between two fragments
                done.append((entry.index, []))
            if entry.index % self._digest_every == 0:
                self._snapshots.record(Snapshot.of(entry.index, self._canonical_state()))
        try:  # the units before the applied index that covers them
            grown = state.queue_files.write_appends()
        except OSError as e:
            grown = state.written_once_there_is_room(e, "writing ConsumeQueue units",
                                                     state.queue_files.write_appends)
        self.markers.written()  # their units are in the files: they can be read back
        with self._lock:
            for index, results in done:
                self._applied = index
                if results:
                    self._results[index] = results
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
        for grew in self.on_queues_grown if grown else ():
            try:
                grew(grown)
            except Exception:
                log.exception("on_queues_grown listener failed")
        self._dirty = True
        if time.monotonic() - self._checkpointed_at >= CHECKPOINT_EVERY_S:
            self._checkpoint(background=True)

    def apply_gap(self, first_index: int) -> None:
        """Never: skipping entries would leave this replica's state unlike its peers'. The
        applier installs the snapshot at ``first_index - 1`` instead (``install_snapshot``)."""
        raise RuntimeError(f"a broker replica cannot skip to entry {first_index}: it needs the "
                           f"snapshot at {first_index - 1}")

    # -- reading -----------------------------------------------------------------
    def results(self, index: int) -> list[Applied] | None:
        """Outcomes of the records of entry ``index`` (None: not applied or forgotten)."""
        with self._lock:
            results = self._results.get(index)
        return None if results is None else [applied(r) for r in results]

    def queue(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self._state.queue_files.get(topic, queue_id)

    def retained_min_offset(self, cq: ConsumeQueue, log_start: int) -> int:
        """The first offset of ``cq`` whose message is still in the CommitLog, which now starts
        at position ``log_start`` (units below it may linger until ``trim``)."""
        return self._state.queue_files.retained_min_offset(cq, log_start)

    def trim(self, log_start: int) -> int:
        """Retention moved the CommitLog's start to ``log_start``: delete the ConsumeQueue
        files and IndexFiles that point only below it (whole files; any thread). Returns
        how many files went."""
        return (self._state.queue_files.trim(log_start)
                + len(self._state.index.delete_before_position(log_start)))

    def committed_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        return self._state.offsets.committed(group, topic, queue_id)

    def query_key(self, key: str, begin_ms: int, end_ms: int, max_results: int) -> list[int]:
        """CommitLog positions of messages with ``key`` (or message id in hex), newest first.

        Hash matches: the caller checks the real key in the message it reads.
        """
        return self._state.index.query(key, begin_ms, end_ms, max_results)

    def close(self) -> None:
        self.markers.close()
        self._checkpoint()
        self._checkpoints.close()
        self._state.close()

    # -- snapshots -----------------------------------------------------------------
    def snapshot_indexes(self) -> list[int]:
        """The indexes of the snapshots held (durable), oldest first."""
        return self._snapshots.indexes()

    def snapshot_bytes(self, index: int) -> bytes | None:
        """The encoded snapshot of the state after entry ``index``, if held."""
        return self._snapshots.read(index)

    def prune_snapshots_below(self, index: int) -> None:
        """Retention moved the log start past ``index + 1``: older snapshots are not needed."""
        self._snapshots.prune_below(index)

    def oldest_held_position(self) -> int | None:
        """The lowest CommitLog position of a held (delayed, retried or transaction half)
        message's bytes: retention keeps it until it is released, or carried forward
        (``broker.deferred.carry_forward``: its bytes are then read from a newer copy)."""
        for _ in range(10):  # the apply thread may change the tables meanwhile
            try:
                held = self._state.deferral.held_positions()
                return min(held) if held else None
            except RuntimeError:  # "dictionary changed size during iteration"
                continue
        return 0  # keep everything this time

    def recent_digests(self) -> dict[int, str]:
        """Digests of the derived state at the most recent snapshot indexes."""
        return self._snapshots.recent_digests()

    def _take_snapshot(self, index: int) -> None:
        """Apply thread, between two entries: the state after ``index``. Skipped while a
        chain of fragments is pending (its start would be missing after the cut)."""
        if self._state.chains.first_index is not None:
            log.info("no snapshot at %d: a large message's fragments span the segment boundary", index)
            return
        self._snapshots.take(Snapshot.of(index, self._canonical_state()))

    def _take_markers(self, index: int) -> None:
        """Apply thread, after entry ``index``, which held verify markers: the state's digest
        there (kept with the others), and the ConsumeQueues' ends for the read-back."""
        snap = Snapshot.of(index, self._canonical_state())
        self._snapshots.record(snap)
        for marker in self._state.take_markers():
            self.markers.taken(index, marker, snap.digest, self._state.last_store_ms)
        log.info("verify marker at index %d: state digest %s", index, snap.digest[:16])

    def _canonical_state(self) -> dict[str, Any]:
        """The replicated state now, its tables in the one form every replica has at this
        index (checkpoints prune expired entries whenever they run)."""
        self._state.forget_expired()
        return self._state.state()

    def install_snapshot(self, index: int, data: bytes) -> None:
        """Apply thread: replace all derived state with the snapshot ``data`` of the state
        after ``index`` (raises SnapshotError if it is not intact). ConsumeQueues restart
        empty at the snapshot's next offsets, the IndexFile empty; applying goes on at
        ``index + 1``."""
        snap = Snapshot.decode(data)
        if snap.index != index:
            raise SnapshotError(f"the snapshot received is of index {snap.index}, not {index}")
        gap_from = self._applied + 1
        self._checkpoints.wait()
        with self._lock:
            self._results.clear()
        self._state.install(snap.state)
        with self._lock:
            self._applied = index
            self._snapshots.add_installed(snap)
        self._snapshots.store.write(snap)  # this replica can now send it on
        self.installs.append([index, int(time.time() * 1000), gap_from])
        self._checkpoint()
        log.info("installed the snapshot at index %d (state digest %s; entries %d..%d were never "
                 "applied here): %d topics, %d queues", index, snap.digest[:16], gap_from, index,
                 len(self._state.topics), len(self._state.queue_files))

    # -- checkpoint ------------------------------------------------------------------
    def checkpoint(self) -> None:
        """Write a checkpoint of the state now and return when it is durable (apply thread,
        or while nothing is applied)."""
        self._checkpoint()

    def _checkpoint(self, background: bool = False) -> None:
        """Apply thread only (the one writer), so the state is read without the lock.

        The state is taken here; the fsyncs and the write run on the checkpoint thread
        (``background``: this returns at once; a due one is skipped while the previous is
        still being written) or are waited for. A failure to make a checkpoint durable is
        raised here, at the next call.
        """
        if background and self._checkpoints.busy():
            return  # still dirty: the next call takes a newer state
        self._checkpointed_at = time.monotonic()
        self._state.forget_expired()
        self._dirty = False
        state = {**self._state.state(), "applied": self.checkpoint_index(),
                 "index_mark": self._state.index_mark(), "installs": self.installs}
        queues = [cq for _, cq in self._state.queue_files.all()]
        try:
            self._checkpoints.write(state, queues, self._state.index, background)
        except OSError as e:  # this one's or the previous background one's
            if not background or self._disk is None or not self._disk.note("writing a checkpoint", e):
                raise
            self._dirty = True  # tried again at the next one: a restart replays from the last
            if self._checkpoint_stuck_at != self._checkpoints.durable_index:
                self._checkpoint_stuck_at = self._checkpoints.durable_index
                log.warning("cannot write a checkpoint (the disk is full); a restart replays from "
                            "index %d until one is written", self._checkpoint_stuck_at)
