"""The ConsumeQueues of every queue, as the apply step writes them (``broker.store.consume_queue``).

Units assigned during one ``apply`` call are gathered per queue and written once at its end
(``write_appends``), before the applied index that covers them is published. The running
ConsumeQueue hash (``broker.state.snapshot.cq_hash_step``: equal only if the same units went to
the same queues at the same offsets, in order) is replicated state: a snapshot carries it
as ``"cq_hash"``, 16 bytes; the queues themselves appear as ``{topic: {queue id: next
offset}}`` (``next_offsets``).

Files: ``consumequeue/<topic directory>/<queue id>/``; a restart cuts them back to the
checkpoint's next offsets (``restore``).
"""

from __future__ import annotations

import bisect
import logging
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path

from broker.state.snapshot import cq_hash_prefix, cq_hash_step
from broker.store.consume_queue import ConsumeQueue, topic_directory

__all__ = ["QueueFiles"]

log = logging.getLogger("broker.state_machine")  # the apply step's, as before the split

NextOffsets = dict[str, dict[int, int]]
Unit = tuple[int, int, int, int, int, int, int]  # ConsumeQueue.append_many's: base at [4]


def _base(unit: Unit) -> int:
    return unit[4]


@dataclass(slots=True)
class _Appends:
    """Units assigned to one queue during an ``apply`` call, written at its end."""

    cq: ConsumeQueue
    hash_prefix: bytes  # cq_hash_prefix of its queue
    next_offset: int
    units: list[Unit] = field(default_factory=list)


class QueueFiles:
    """The apply thread appends, opens, drops and restores queues; any thread may ``get``
    a queue, list them or ``trim`` them."""

    def __init__(self, root: Path, units_per_file: int, cq_hash: bytes = b"") -> None:
        self._root = root
        self._units = units_per_file
        root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._appends: dict[tuple[str, int], _Appends] = {}
        self._grown: list[tuple[str, int]] = []  # queues written by a call that failed part-way
        self._hash = int.from_bytes(cq_hash, "big")
        # (id of a queue, log start) -> (the queue, its first offset kept)
        self._retained_min: dict[tuple[int, int], tuple[ConsumeQueue, int]] = {}

    # -- reading (any thread) --------------------------------------------------------------
    def get(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        with self._lock:
            return self._queues.get((topic, queue_id))

    def next_offset(self, topic: str, queue_id: int) -> int:
        """The apply step's next offset of a queue, counting the units this ``apply`` call
        assigned and has not written yet (0: no such queue). Apply thread."""
        appends = self._appends.get((topic, queue_id))
        if appends is not None:
            return appends.next_offset
        cq = self.get(topic, queue_id)
        return 0 if cq is None else cq.max_offset

    def all(self) -> list[tuple[tuple[str, int], ConsumeQueue]]:
        """Every open queue, by (topic, queue id)."""
        with self._lock:
            return sorted(self._queues.items())

    def __len__(self) -> int:
        return len(self._queues)

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
        """Delete the files that point only below CommitLog position ``log_start`` (whole
        files); returns how many went."""
        removed = 0
        for _, cq in self.all():
            try:
                removed += len(cq.delete_before(self.retained_min_offset(cq, log_start)))
            except ValueError:  # closed meanwhile (the topic was deleted)
                continue
        return removed

    # -- the apply step ------------------------------------------------------------------------
    def append(self, where: tuple[str, int], position: int, size: int, count: int, store_ms: int,
               tag_kind: int, tag: int) -> int:
        """Assign the next ``count`` offsets of queue ``where`` (topic, queue id) to a record's
        unit; returns the first (its base). Written by ``write_appends``."""
        appends = self._appends.get(where)
        if appends is None:
            cq = self._open(where)
            appends = self._appends[where] = _Appends(cq, cq_hash_prefix(*where), cq.max_offset)
        base = appends.next_offset
        unit = (position, size, count, tag_kind, base, store_ms, tag)
        appends.units.append(unit)
        appends.next_offset = base + count
        self._hash = cq_hash_step(self._hash, appends.hash_prefix, unit)
        return base

    def write_appends(self) -> list[tuple[str, int]]:
        """Write the units gathered by ``append``; returns the queues that grew. Raises OSError
        (a full disk) with the units not written still gathered: calling it again writes exactly
        those, and returns every queue that grew since the last complete call."""
        for where in list(self._appends):
            appends = self._appends[where]
            # units an earlier, failed call wrote: those below the queue's end (bases ascend)
            written = bisect.bisect_left(appends.units, appends.cq.max_offset, key=_base)
            if written < len(appends.units):
                appends.cq.append_many(_base(appends.units[written]), appends.units[written:])
            del self._appends[where]
            self._grown.append(where)
        grown, self._grown = self._grown, []
        return grown

    def drop_topic(self, topic: str) -> None:
        """A deleted topic's queues go, files and all (and its units of this apply call)."""
        for key in [k for k in self._appends if k[0] == topic]:
            del self._appends[key]
        with self._lock:
            for key in [k for k in self._queues if k[0] == topic]:
                self._queues.pop(key).close()
        shutil.rmtree(self._root / topic_directory(topic), ignore_errors=True)

    def next_offsets(self) -> NextOffsets:
        """Every queue's next offset, counting the units of this apply call not yet written."""
        out: NextOffsets = {}
        for (topic, qid), cq in sorted(self._queues.items()):
            appends = self._appends.get((topic, qid))
            out.setdefault(topic, {})[qid] = (
                cq.max_offset if appends is None else appends.next_offset)
        return out

    def hash_state(self) -> bytes:
        return self._hash.to_bytes(16, "big")

    def _open(self, where: tuple[str, int]) -> ConsumeQueue:
        cq = self._queues.get(where)
        if cq is None:
            cq = self._new(where)
            with self._lock:
                self._queues[where] = cq
        return cq

    def _new(self, where: tuple[str, int], start_offset: int = 0) -> ConsumeQueue:
        topic, queue_id = where
        return ConsumeQueue(self._root / topic_directory(topic) / str(queue_id), self._units,
                            start_offset=start_offset)

    # -- start, snapshot install, close -----------------------------------------------------------
    def restore(self, next_offsets: NextOffsets, covered: int) -> None:
        """Open every queue the checkpoint knows and cut what was applied after it.

        ``covered``: the CommitLog position of the last message the checkpoint covers (its
        index mark's end; -1 if none). A queue's files hold the checkpoint's queue only if its
        unit before the checkpoint's next offset is at or below it (or the files start at that
        offset, as after a snapshot install); otherwise they are a topic's created again after
        a delete the checkpoint does not know, and go: the replay deletes and recreates it."""
        topic_of = {topic_directory(t): t for t in next_offsets}
        for topic_dir in sorted(p for p in self._root.iterdir() if p.is_dir()):
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
                if end > cq.min_offset and not (end <= cq.max_offset and _holds_to(cq, end, covered)):
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
                    self._queues[(topic, int(qid))] = self._new((topic, int(qid)), int(next_offset))

    def reset(self, next_offsets: NextOffsets, cq_hash: bytes) -> None:
        """Every queue empty, starting at ``next_offsets`` (a snapshot installed); the files of
        the queues before are deleted."""
        self.close()
        shutil.rmtree(self._root, ignore_errors=True)
        self._root.mkdir(parents=True)
        self._hash = int.from_bytes(cq_hash, "big")
        with self._lock:
            for topic, by_queue in next_offsets.items():
                for qid, next_offset in by_queue.items():
                    self._queues[(topic, int(qid))] = self._new((topic, int(qid)), int(next_offset))

    def close(self) -> None:
        """Close every queue (files stay); pending appends are dropped (see ``close_queues``)."""
        self._appends.clear()
        with self._lock:
            for cq in self._queues.values():
                cq.close()
            self._queues.clear()


def _holds_to(cq: ConsumeQueue, end: int, covered: int) -> bool:
    """Whether ``cq`` has a record ending exactly at ``end`` at a position the checkpoint covers."""
    unit = cq.get(end - 1)
    return unit.end == end and unit.position <= covered
