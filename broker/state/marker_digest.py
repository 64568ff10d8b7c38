"""Digests at a verify marker (``broker.store.commands.VerifyMarker``): what ``raftmq cluster
verify`` compares between the replicas of a group (``broker.http_api.verify``).

A replica applying the marker's entry, index i, takes -- on the apply thread, as the
periodic digests are taken (``broker.state.machine``) -- the digest of its derived state
after i, and notes every queue's next offset there. A thread of its own then reads back
each ConsumeQueue's units as its files hold them, from the first unit at CommitLog
position ``from_position`` or after up to that next offset, and hashes them::

    queue digest    BLAKE2b-128 of the units' stored bytes (40 each), in offset order
    queues digest   SHA-256 of every queue's row [topic, queue id, first offset, next
                    offset, units, queue digest], sorted: equal on two replicas exactly
                    when every row is

The state's digest holds the running ConsumeQueue hash (``broker.state.snapshot``), which is
taken when units are appended and never re-reads a file: a byte flipped in a
ConsumeQueue file behind the process's back (stopped, altered, restarted) changes this
read-back, on that replica only. Units a replica lacks because it was restored from a
snapshot, or because retention trimmed them, lie below the replica's log start; the
leader's ``from_position`` is at or above every member's (a queue a replica still holds
from a later offset only is reported as not comparable, not as different).

The units below a queue's next offset at i never change, so the read-back is of the state
at i while the apply step goes on. Cost: 40 bytes read and hashed per unit at or above
``from_position``, off the apply thread, ``CHUNK_UNITS`` per read under the queue's lock.
A queue deleted or trimmed while read back makes the result incomplete (verify again);
files that cannot be read back as units give the queue a digest saying why (a difference).

Threads: ``taken`` and ``written`` on the apply thread; any thread reads the results.
"""

from __future__ import annotations

import hashlib
import json
import logging
import queue
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from broker.state.queues import QueueFiles
from broker.store.commands import VerifyMarker
from broker.store.consume_queue import ConsumeQueue, ConsumeQueueCorrupt, OffsetOutOfRange
from broker.store.consume_queue_layout import UNIT, UNIT_SIZE

__all__ = ["CHUNK_UNITS", "MARKERS_KEPT", "MarkerDigests", "MarkerResult", "QueueRow", "read_back"]

log = logging.getLogger("broker.marker_digest")

CHUNK_UNITS = 4096  # units read per call (160 KiB)
MARKERS_KEPT = 8  # results of the most recent markers kept in memory

READING = "reading"
DONE = "done"
INCOMPLETE = "incomplete"

#: [topic, queue id, first offset read back, next offset at the marker, units, digest, the
#: queue's first offset held here] -- all but the last in the queues digest
QueueRow = list[Any]


class Incomplete(Exception):
    """What was read back is not the state at the marker (the queue went meanwhile)."""


@dataclass(slots=True)
class MarkerResult:
    """One marker's digests on this replica; ``state`` is READING until the read-back ends,
    then DONE or INCOMPLETE (``why`` says what)."""

    index: int
    marker_id: str
    from_position: int
    at_ms: int  # the marker entry's store time (the leader's clock, as every replica has it)
    state_digest: str
    #: (topic, queue id, the queue, its next offset) at the marker: the queue itself, not its
    #: name (a topic deleted and created again meanwhile is another queue: closed, not read)
    ends: list[tuple[str, int, ConsumeQueue, int]]
    state: str = READING
    why: str = ""
    rows: list[QueueRow] = field(default_factory=list)
    queues_digest: str = ""
    units: int = 0
    done: threading.Event = field(default_factory=threading.Event)

    def summary(self) -> dict[str, Any]:
        """The JSON a replica answers for the marker (``broker.http_api.verify``)."""
        return {"index": self.index, "marker_id": self.marker_id, "from_position": self.from_position,
                "at_ms": self.at_ms, "state": self.state, "why": self.why,
                "state_digest": self.state_digest, "queues_digest": self.queues_digest,
                "queues": len(self.ends), "units": self.units}


def read_back(cq: ConsumeQueue, from_position: int, end: int) -> tuple[int, int, str]:
    """(first offset, units, digest) of ``cq``'s units from the first at CommitLog position
    ``from_position`` or after, up to queue offset ``end``, as stored. Raises Incomplete
    when the queue is closed or trimmed past them meanwhile; the digest is "unreadable: why"
    when the files do not read back as units up to ``end``."""
    first = offset = end
    h = hashlib.blake2b(digest_size=16)
    units = 0
    try:
        first = offset = min(cq.offset_for_position(from_position), end)
        while offset < end:
            data = cq.read_stored(offset, CHUNK_UNITS)
            keep, after = 0, offset
            for _, _, count, _, _, base, _, _ in UNIT.iter_unpack(data):
                if base >= end:
                    break
                keep, after = keep + 1, base + count
            if keep == 0 or after <= offset:
                raise ConsumeQueueCorrupt(f"the units read at queue offset {offset} do not lead on "
                                          f"towards {end}")
            h.update(data[:keep * UNIT_SIZE])
            units += keep
            offset = after
    except (ConsumeQueueCorrupt, OSError, ValueError) as e:
        if cq.closed:
            raise Incomplete("it was closed while read back (its topic deleted, or a snapshot "
                             "installed)") from None
        if isinstance(e, OffsetOutOfRange | OSError) and cq.min_offset > offset:
            raise Incomplete(f"retention deleted its units from offset {offset} while read back") from None
        return first, units, f"unreadable: {e}"
    return first, units, h.hexdigest()


class MarkerDigests:
    """The results of the markers applied here (the most recent ``MARKERS_KEPT``)."""

    def __init__(self, queue_files: QueueFiles) -> None:
        self._queue_files = queue_files
        self._lock = threading.Lock()
        self._results: OrderedDict[int, MarkerResult] = OrderedDict()
        self._taken: list[MarkerResult] = []  # this apply call's, read once its units are written
        self._jobs: queue.SimpleQueue[MarkerResult | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    # -- the apply thread ---------------------------------------------------------------
    def taken(self, index: int, marker: VerifyMarker, state_digest: str, at_ms: int) -> None:
        """The marker applied at ``index``: its state digest; the queues' ends noted now."""
        offsets = self._queue_files.next_offsets()
        ends = [(t, q, cq, offsets[t][q]) for (t, q), cq in self._queue_files.all()]
        result = MarkerResult(index, marker.marker_id, marker.from_position, at_ms, state_digest, ends)
        with self._lock:
            self._results[index] = result  # a replay after a restart takes it again
            while len(self._results) > MARKERS_KEPT:
                self._results.popitem(last=False)
        self._taken.append(result)

    def written(self) -> None:
        """The apply call's units are in the files: read back those of its markers."""
        if not self._taken:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="marker-digest", daemon=True)
            self._thread.start()
        for result in self._taken:
            self._jobs.put(result)
        self._taken = []

    # -- any thread ------------------------------------------------------------------------
    def get(self, index: int) -> MarkerResult | None:
        with self._lock:
            return self._results.get(index)

    def by_id(self, marker_id: str) -> MarkerResult | None:
        with self._lock:
            return next((r for r in reversed(self._results.values()) if r.marker_id == marker_id), None)

    def last(self) -> MarkerResult | None:
        with self._lock:
            return next(reversed(self._results.values()), None)

    def close(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join(timeout=5)

    # -- the read-back thread ------------------------------------------------------------
    def _run(self) -> None:
        while (result := self._jobs.get()) is not None:
            try:
                self._read(result)
            except Exception as e:  # never leave a caller waiting on a result
                log.exception("reading back the ConsumeQueues at the marker at %d failed", result.index)
                result.why, result.state = f"the read-back failed: {e}", INCOMPLETE
            result.done.set()

    def _read(self, result: MarkerResult) -> None:
        rows: list[QueueRow] = []
        for topic, queue_id, cq, end in result.ends:
            try:
                held_from = cq.min_offset
                first, units, digest = read_back(cq, result.from_position, end)
            except (Incomplete, ValueError) as e:  # ValueError: closed before it was read
                why = "it was closed (its topic deleted, or a snapshot installed)" if cq.closed else e
                result.why = f"topic {topic} queue {queue_id}: {why}; verify again"
                result.state = INCOMPLETE
                return
            rows.append([topic, queue_id, first, end, units, digest, held_from])
        text = json.dumps(sorted(r[:6] for r in rows), separators=(",", ":")).encode()
        result.rows, result.units = rows, sum(r[4] for r in rows)
        result.queues_digest = hashlib.sha256(text).hexdigest()
        result.state = DONE
        log.info("verify marker at %d: %d queues, %d ConsumeQueue units read back, digest %s", result.index,
                 len(rows), result.units, result.queues_digest[:16])
