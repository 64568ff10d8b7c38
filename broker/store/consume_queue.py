"""ConsumeQueue: the files of one (topic, queue id) -- append, trim, truncate, look up.

The units (one per record) and the files they are stored in are drawn in
``broker/store/consume_queue_layout.py``. This module keeps a queue's files::

    consumequeue/<topic directory>/<queue_id>/
      00000000000000000000   [u][u][u][u]     full            (closed between reads)
      00000000000000000211   [u][u][u][u]     full
      00000000000000000450   [u][u]           last: open, appended to
                                       ▲ max_offset: the last unit's base + count

A queue offset is found with a binary search: over the files by name, then over the
units of one file by base offset (``_locate``; the offset after the last read is
remembered, as consumers read on from there).

Determinism: the units are derived from committed CommitLog entries by the broker's
apply step, so replicas that apply the same entries hold the same bytes. A new file is
created by the append that needs it; truncation deletes the files it empties (except
the first, which keeps ``min_offset`` in its name). There is always at least one file.

Recovery on open: ``broker.store.consume_queue_files`` (``adopt_files``).

Durability: appends land in the page cache; ``flush`` fsyncs every file written or
truncated since the last flush, and the directory if files were created or deleted.
``close`` does not flush. Only the last file is kept open; a read of an older file
opens it for the call.
"""

from __future__ import annotations

import bisect as bisection
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from broker.store.consume_queue_files import (
    ConsumeQueueCorrupt,
    QueueFile,
    adopt_files,
    read_units,
    unit_at,
)
from broker.store.consume_queue_layout import (
    DEFAULT_UNITS_PER_FILE,
    UNIT,
    UNIT_SIZE,
    CqUnit,
    cq_file_name,
    encode_units,
    topic_directory,
)
from dledger.storage.numbered_files import (
    PendingSync,
    close_quietly,
    delete_files_before,
    own_descriptor,
    pwrite_all,
    unlink_file,
)

__all__ = ["ConsumeQueue", "ConsumeQueueCorrupt", "CqRead", "CqUnit", "OffsetOutOfRange", "topic_directory"]

Unit = tuple[int, int, int, int, int, int, int]


class OffsetOutOfRange(ValueError):
    """A queue offset outside what the queue holds; carries the range at the time of the call."""

    def __init__(self, what: str, offset: int, min_offset: int, max_offset: int) -> None:
        super().__init__(f"{what}: queue offset {offset} is out of range "
                         f"(min_offset {min_offset}, max_offset {max_offset})")
        self.offset = offset
        self.min_offset = min_offset
        self.max_offset = max_offset


@dataclass(frozen=True, slots=True)
class CqRead:
    """What ``read`` found: units in offset order (the first holds the offset read from),
    and the offset after the last of them (the offset read from when there were none)."""

    units: list[CqUnit]
    next_offset: int


def units_end(units: list[CqUnit], offset: int) -> int:
    """Messages from ``offset`` to the end of the last of ``units`` (0 if none)."""
    return units[-1].end - offset if units else 0


class ConsumeQueue:
    """The units of one (topic, queue id), in ``directory``.

    Thread-safety: one internal lock guards every public method, so the apply thread may
    append while other threads read; ``bisect`` calls its ``key`` without it. Methods
    raise ValueError after ``close``.
    """

    def __init__(self, directory: Path, units_per_file: int = DEFAULT_UNITS_PER_FILE,
                 start_offset: int = 0) -> None:
        """Open the queue in ``directory`` (created, with an empty first file named
        ``start_offset``, if it has none). Raises ValueError if ``units_per_file`` < 1,
        ConsumeQueueCorrupt, OSError."""
        if units_per_file < 1:
            raise ValueError(f"units_per_file must be >= 1, not {units_per_file}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._upf = units_per_file
        self._lock = threading.Lock()
        self._files: list[QueueFile] = []
        self._pending: PendingSync[QueueFile] = PendingSync(self.directory)
        self._flushing = threading.Lock()
        self._closed = False
        self._hint = (-1, -1, -1)  # (offset, file start, unit index) of the last read's end
        try:
            self._files = adopt_files(self.directory, self._upf, self._pending)
            if not self._files:
                self._create(start_offset)
        except BaseException:
            close_quietly(f.fd for f in self._files if f.fd >= 0)
            raise

    # -- properties ----------------------------------------------------------------
    @property
    def units_per_file(self) -> int:
        return self._upf

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def min_offset(self) -> int:
        with self._lock:
            return self._files[0].start

    @property
    def max_offset(self) -> int:
        """The offset the next record's first message gets."""
        with self._lock:
            return self._files[-1].end

    def __len__(self) -> int:
        """Messages held."""
        with self._lock:
            return self._files[-1].end - self._files[0].start

    # -- writing ---------------------------------------------------------------------
    def append_many(self, offset: int, units: list[Unit]) -> None:
        """Append ``units`` (each (position, size, count, tag kind, base, store ms, tag)),
        the first at base ``offset``, which must be ``max_offset``. All are checked before
        any is written (ValueError); OSError: the failed file's write is not kept."""
        if units and units[0][4] != offset:
            raise ValueError(f"the first unit's base {units[0][4]} is not {offset}")
        data = memoryview(encode_units(units))
        with self._lock:
            self._check_open()
            if offset != self._files[-1].end:
                raise ValueError(f"append at queue offset {offset} in {self.directory}, "
                                 f"but the next offset is {self._files[-1].end}")
            i = 0
            while i < len(units):
                last = self._files[-1]
                if last.units == self._upf:
                    last = self._roll(units[i][4])
                n = min(self._upf - last.units, len(units) - i)
                pwrite_all(last.fd, data[i * UNIT_SIZE:(i + n) * UNIT_SIZE], last.units * UNIT_SIZE,
                           restore_length=last.units * UNIT_SIZE)
                self._pending.wrote(last)
                last.units += n
                last.end = units[i + n - 1][4] + units[i + n - 1][2]
                i += n

    def truncate_from(self, offset: int) -> None:
        """Drop the units from the one whose base is ``offset`` on (durable at the next
        ``flush``). Raises OffsetOutOfRange unless ``offset`` is a unit's base or the end."""
        with self._lock:
            self._check_open()
            if self._check_upto(offset, "truncate_from"):
                return
            k, i = self._locate(offset)
            f = self._files[k]
            if unit_at(f, i).base != offset:
                raise OffsetOutOfRange("truncate_from (inside a record)", offset, self._files[0].start,
                                       self._files[-1].end)
            for g in self._files[k + 1:]:
                self._delete(g)
            del self._files[k + 1:]
            if i == 0 and k > 0:
                self._delete(f)
                self._files.pop()
                f = self._files[-1]
            else:
                if f.fd < 0:
                    f.fd = os.open(f.path, os.O_RDWR)
                os.ftruncate(f.fd, i * UNIT_SIZE)
                self._pending.wrote(f)
                f.units, f.end = i, offset
            if f.fd < 0:
                f.fd = os.open(f.path, os.O_RDWR)
            self._hint = (-1, -1, -1)

    def delete_before(self, offset: int) -> list[int]:
        """Delete the files whose messages all lie before ``offset``; never the last file.
        Returns the deleted files' first offsets, oldest first."""
        with self._lock:
            self._check_open()
            return delete_files_before(self._files, offset, self._pending)

    # -- reading ---------------------------------------------------------------------
    def get(self, offset: int) -> CqUnit:
        """The unit holding ``offset``. Raises OffsetOutOfRange unless min <= offset < max."""
        with self._lock:
            self._check_open()
            self._check_in(offset, "get")
            k, i = self._locate(offset)
            return unit_at(self._files[k], i)

    def read(self, offset: int, max_units: int, max_messages: int | None = None) -> CqRead:
        """Up to ``max_units`` units from the one holding ``offset`` on, stopping at the unit
        that brings ``max_messages`` messages from ``offset`` (if given). Reading at
        ``max_offset`` returns none. Raises ValueError if ``max_units`` < 1,
        OffsetOutOfRange unless min_offset <= offset <= max_offset."""
        if max_units < 1:
            raise ValueError(f"max_units must be >= 1, not {max_units}")
        with self._lock:
            self._check_open()
            if self._check_upto(offset, "read"):
                return CqRead([], offset)
            k, i = self._locate(offset)
            units: list[CqUnit] = []
            wanted = self._files[-1].end - offset if max_messages is None else max_messages
            chunk = 8 if max_messages is not None else max_units  # records hold many messages
            while k < len(self._files) and len(units) < max_units and units_end(units, offset) < wanted:
                f = self._files[k]
                n = min(f.units - i, max_units - len(units), chunk)
                data = read_units(f, i, n)
                for p, s, c, kind, _, b, t, tag in UNIT.iter_unpack(data):
                    units.append(CqUnit(p, s, c, kind, b, t, tag))
                    i += 1
                    if b + c - offset >= wanted:
                        break
                chunk *= 2
                if i == f.units:
                    k, i = k + 1, 0
            end = units[-1].end
            if k < len(self._files):
                self._hint = (end, self._files[k].start, i)
            return CqRead(units, end)

    def read_stored(self, offset: int, max_units: int) -> bytes:
        """The bytes of up to ``max_units`` units as the files hold them (``UNIT_SIZE`` each,
        nothing decoded or checked), from the unit holding ``offset`` on, across files; empty
        at ``max_offset``. What a verify marker hashes (``broker.state.marker_digest``). Raises as
        ``read``, and ConsumeQueueCorrupt or OSError when a file cannot be read."""
        if max_units < 1:
            raise ValueError(f"max_units must be >= 1, not {max_units}")
        with self._lock:
            self._check_open()
            if self._check_upto(offset, "read_stored"):
                return b""
            k, i = self._locate(offset)
            parts: list[bytes] = []
            left = max_units
            while k < len(self._files) and left:
                f = self._files[k]
                n = min(f.units - i, left)
                if n > 0:
                    parts.append(read_units(f, i, n))
                    left -= n
                k, i = k + 1, 0
            return b"".join(parts)

    def bisect(self, key: Callable[[CqUnit], int], target: int) -> int:
        """The first queue offset of the first unit whose ``key(unit) >= target``
        (``max_offset`` if none). ``key`` must be non-decreasing over the units (a store
        time, a position); it is called without the lock held. Units deleted or truncated
        meanwhile count as below / above the target."""
        with self._lock:
            self._check_open()
            files = [(f, f.units) for f in self._files]
        ordinals = [0]
        for _, n in files:
            ordinals.append(ordinals[-1] + n)
        lo, hi = 0, ordinals[-1]
        while lo < hi:
            mid = (lo + hi) // 2
            f, _ = files[bisection.bisect_right(ordinals, mid) - 1]
            i = mid - ordinals[bisection.bisect_right(ordinals, mid) - 1]
            with self._lock:
                self._check_open()
                gone = f not in self._files
                unit = None if gone or i >= f.units else unit_at(f, i)
            below = gone if unit is None else key(unit) < target
            if below:
                lo = mid + 1
            else:
                hi = mid
        with self._lock:
            if lo >= ordinals[-1]:
                return self._files[-1].end
            k = bisection.bisect_right(ordinals, lo) - 1
            f, i = files[k][0], lo - ordinals[k]
            if f not in self._files:
                return self._files[0].start
            return unit_at(f, i).base if i < f.units else self._files[-1].end

    def offset_for_position(self, position: int) -> int:
        """The first offset of the first record at CommitLog ``position`` or after
        (``max_offset`` if none)."""
        return self.bisect(lambda unit: unit.position, position)

    # -- durability ------------------------------------------------------------------
    def flush(self) -> bool:
        """fsync what changed since the last flush; True if anything was synced."""
        with self._flushing:
            with self._lock:
                self._check_open()
                if not self._pending:
                    return False
                batch = self._pending.take(own_descriptor)
            self._pending.sync(batch, self._lock, self._files)
            return True

    def close(self) -> None:
        """Close the files (waits for a flush in progress; does not flush). Idempotent."""
        with self._flushing, self._lock:
            if self._closed:
                return
            self._closed = True
            close_quietly(f.fd for f in self._files if f.fd >= 0)
            for f in self._files:
                f.fd = -1

    # -- internals (lock held) ----------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"ConsumeQueue {self.directory} is closed")

    def _check_in(self, offset: int, what: str) -> None:
        low, high = self._files[0].start, self._files[-1].end
        if not low <= offset < high:
            raise OffsetOutOfRange(what, offset, low, high)

    def _check_upto(self, offset: int, what: str) -> bool:
        """Whether ``offset`` is the end (max_offset); OffsetOutOfRange unless min <= offset <= max."""
        low, high = self._files[0].start, self._files[-1].end
        if not low <= offset <= high:
            raise OffsetOutOfRange(what, offset, low, high)
        return offset == high

    def _locate(self, offset: int) -> tuple[int, int]:
        """(file index, unit index) of the unit holding ``offset`` (min <= offset < max)."""
        hint_offset, hint_start, hint_unit = self._hint
        starts = [f.start for f in self._files]
        if hint_offset == offset:
            k = bisection.bisect_left(starts, hint_start)
            if k < len(starts) and starts[k] == hint_start and hint_unit < self._files[k].units:
                return k, hint_unit
        k = bisection.bisect_right(starts, offset) - 1
        while self._files[k].units == 0:  # an empty file holds nothing: the one before
            k -= 1
        f = self._files[k]
        lo, hi = 0, f.units - 1
        while lo < hi:  # the last unit whose base <= offset
            mid = (lo + hi + 1) // 2
            if unit_at(f, mid).base <= offset:
                lo = mid
            else:
                hi = mid - 1
        return k, lo

    def _create(self, start: int) -> QueueFile:
        path = self.directory / cq_file_name(start)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        f = QueueFile(start, path, fd)
        self._files.append(f)
        self._pending.entries_changed()
        return f

    def _roll(self, start: int) -> QueueFile:
        old = self._files[-1]
        if old.fd >= 0:
            os.close(old.fd)
            old.fd = -1
        return self._create(start)

    def _delete(self, f: QueueFile) -> None:
        unlink_file(f, self._pending)
