"""ConsumeQueue: the files of one (topic, queue id) -- append, trim, truncate, look up.

The units and the files they are stored in are drawn in ``broker/consume_queue_layout.py``.
This module keeps a queue's files::

    consumequeue/<topic directory>/<queue_id>/
      00000000000000000000   [u0][u1][u2][u3]     full            (closed between reads)
      00000000000000000004   [u4][u5][u6][u7]     full
      00000000000000000008   [u8][u9]             last: open, appended to
                                     ▲ max_offset = 10

Determinism: the units are derived from committed CommitLog entries by the broker's
apply step, so replicas that apply the same entries must hold the same bytes. Nothing
here depends on anything but the appended values: a new file is created by the append
that needs it, and truncation deletes a file it empties (except the first, which keeps
``min_offset``). There is always at least one file; a new queue starts with an empty
file named by its start offset (0, or N for a queue restored from a snapshot).

Recovery on open: a trailing partial unit (a torn write) is cut, and so are trailing
all-zero units, and an empty last file after a full one is deleted. Anything else that
is not the layout -- a file after the first whose name is not a multiple of
``units_per_file``, a gap in the names, a file before the last that is not full, a file
holding more than its span -- raises ConsumeQueueCorrupt.

Durability: appends land in the page cache; ``flush`` fsyncs every file written or
truncated since the last flush, and the directory if files were created or deleted.
``close`` does not flush.

Descriptors: only the last file is kept open; a read of an older file opens it for the
call (a broker has many queues, each with many files).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from broker.consume_queue_layout import (
    DEFAULT_UNITS_PER_FILE,
    UNIT,
    UNIT_SIZE,
    CqUnit,
    encode_units,
    topic_directory,
    used_units,
)
from dledger.file_run import FileRun, FileRunStore
from dledger.numbered_files import pread_full

# CqUnit and topic_directory are named from here by the apply step and the pull path.
__all__ = [
    "FILTER_SCAN_FACTOR",
    "ConsumeQueue",
    "ConsumeQueueCorrupt",
    "CqRead",
    "CqUnit",
    "OffsetOutOfRange",
    "topic_directory",
]

FILTER_SCAN_FACTOR = 8
"""A filtered ``read`` of ``max_units`` scans at most ``max_units * FILTER_SCAN_FACTOR`` units."""

_RECOVER_CHUNK = 4096  # units read at a time when looking for the valid end on open


class ConsumeQueueCorrupt(Exception):
    """The files on disk are not a well-formed ConsumeQueue; the message names the file."""


class OffsetOutOfRange(ValueError):
    """A queue offset outside what the queue holds; carries the range at the time of the call,
    so a caller can answer "offset too small" / "overflow" without a second, racy look."""

    def __init__(self, what: str, offset: int, min_offset: int, max_offset: int) -> None:
        super().__init__(f"{what}: queue offset {offset} is out of range "
                         f"(min_offset {min_offset}, max_offset {max_offset})")
        self.offset = offset
        self.min_offset = min_offset
        self.max_offset = max_offset


@dataclass(frozen=True, slots=True)
class CqRead:
    """What ``read`` found: (queue offset, unit) pairs in offset order, and where to go on.

    ``next_offset`` is the offset after the last unit scanned (matched or skipped by
    the tag filter); it equals the offset read from only when there was nothing to scan.
    """

    units: list[tuple[int, CqUnit]]
    next_offset: int


class ConsumeQueue(FileRunStore):
    """The units of one (topic, queue id), in ``directory``.

    Thread-safety: one internal lock guards every public method, so the apply
    thread may append while any other threads read. ``bisect`` calls its ``key``
    without the lock held. ``flush`` syncs outside the lock, and concurrent
    flushes are serialised so that when one returns, everything appended before
    it was called is durable. Methods raise ValueError after ``close``.
    """

    def __init__(self, directory: Path, units_per_file: int = DEFAULT_UNITS_PER_FILE,
                 start_offset: int = 0) -> None:
        """Open the queue in ``directory`` (created, with an empty first file at
        ``start_offset``, if it has none).

        Raises ValueError if ``units_per_file`` < 1, ConsumeQueueCorrupt (see the module
        docstring), OSError from the file system.
        """
        if units_per_file < 1:
            raise ValueError(f"units_per_file must be >= 1, not {units_per_file}")
        self._upf = units_per_file
        self._run = FileRun(directory, units_per_file, UNIT_SIZE, keep_open=False,
                            corrupt=ConsumeQueueCorrupt, what="consume queue file",
                            span_name="units_per_file", closed_error=f"ConsumeQueue {directory} is closed")
        self._lock = self._run.lock
        self._files = self._run.files
        with self._run.closed_on_error():
            self._open_existing()
            if not self._files:
                self._run.create(start_offset)

    # -- properties ----------------------------------------------------------------
    @property
    def units_per_file(self) -> int:
        return self._upf

    @property
    def min_offset(self) -> int:
        """The first offset held: the first file's start (moves with ``delete_before``)."""
        with self._lock:
            return self._files[0].start

    @property
    def max_offset(self) -> int:
        """The offset the next ``append`` must use (one past the last unit)."""
        with self._lock:
            return self._run.end

    def __len__(self) -> int:
        with self._lock:
            return self._run.end - self._files[0].start

    # -- writing ---------------------------------------------------------------------
    def append(self, offset: int, position: int, size: int, tag_hash: int) -> None:
        """Write the unit of queue offset ``offset``, which must be ``max_offset``.

        Raises ValueError if ``offset`` is not ``max_offset`` (the apply step passes
        the offset it assigned, so a mismatch is a bug, not something to paper over),
        or if ``position`` < 0, ``size`` is not in 1..2**31-1 or ``tag_hash`` is not an
        i64; OSError from the file system (the unit is then not written).
        """
        self.append_many(offset, [(position, size, tag_hash)])

    def append_many(self, offset: int, units: list[tuple[int, int, int]]) -> None:
        """``append`` each (position, size, tag hash) of ``units`` from queue offset ``offset``
        on, with one write per file touched. All are checked before any is written; on
        an OSError the units of the failed write are not written (earlier files' are)."""
        data = memoryview(encode_units(units))
        with self._lock:
            self._run.check_open()
            expected = self._run.end
            if offset != expected:
                raise ValueError(f"append at queue offset {offset} in {self.directory}, "
                                 f"but the next offset is {expected}")
            done = 0
            while done < len(data):
                last = self._files[-1]
                room = (last.end - last.start) * UNIT_SIZE - last.length
                if room == 0:
                    last, room = self._run.roll(), (self._upf * UNIT_SIZE)
                n = min(room, len(data) - done)
                self._run.write_at_end(last, data[done:done + n])
                done += n

    def truncate_from(self, offset: int) -> None:
        """Drop the units at ``offset`` and after (durable at the next ``flush``).

        Files left empty are deleted, except the first. Raises OffsetOutOfRange if
        ``offset`` is not in [min_offset, max_offset].
        """
        with self._lock:
            self._run.check_open()
            low, high = self._files[0].start, self._run.end
            if not low <= offset <= high:
                raise OffsetOutOfRange("truncate_from", offset, low, high)
            if offset < high:
                f = self._run.truncate_at(offset)
                if f.length == 0 and len(self._files) > 1:
                    self._drop_empty_last()

    def delete_before(self, offset: int) -> list[int]:
        """Delete the files whose units all lie before ``offset``; never the last file.

        Whole files only: ``min_offset`` becomes the start of the first file kept.
        Returns the first offsets of the deleted files, oldest first.
        """
        with self._lock:
            self._run.check_open()
            return self._run.delete_before(offset)

    # -- reading ---------------------------------------------------------------------
    def get(self, offset: int) -> CqUnit:
        """The unit at ``offset``. Raises OffsetOutOfRange unless min_offset <= offset < max_offset."""
        with self._lock:
            self._run.check_open()
            low, high = self._files[0].start, self._run.end
            if not low <= offset < high:
                raise OffsetOutOfRange("get", offset, low, high)
            return CqUnit(*UNIT.unpack(self._read_units(offset, 1)))

    def read(self, offset: int, max_units: int, tag_hashes: frozenset[int] | None = None) -> CqRead:
        """Up to ``max_units`` units from ``offset`` on, with the offset to continue from.

        With ``tag_hashes``, units whose tag hash is not in it are skipped, and at most
        ``max_units * FILTER_SCAN_FACTOR`` units are scanned, so a selective filter
        returns fewer units (possibly none) with ``next_offset`` moved past the scanned
        ones rather than scanning to the end. Reading at ``max_offset`` returns no units
        and ``next_offset == offset``.

        Raises ValueError if ``max_units`` < 1, OffsetOutOfRange unless
        min_offset <= offset <= max_offset.
        """
        if max_units < 1:
            raise ValueError(f"max_units must be >= 1, not {max_units}")
        scan = max_units if tag_hashes is None else max_units * FILTER_SCAN_FACTOR
        with self._lock:
            self._run.check_open()
            low, high = self._files[0].start, self._run.end
            if not low <= offset <= high:
                raise OffsetOutOfRange("read", offset, low, high)
            end = min(high, offset + scan)
            units: list[tuple[int, CqUnit]] = []
            cur = offset
            while cur < end:
                n = min(end, self._run.file_of(cur).end) - cur
                data = self._read_units(cur, n)
                for i, (position, size, tag) in enumerate(UNIT.iter_unpack(data)):
                    if tag_hashes is None or tag in tag_hashes:
                        units.append((cur + i, CqUnit(position, size, tag)))
                        if len(units) == max_units:
                            return CqRead(units, cur + i + 1)
                cur += n
            return CqRead(units, cur)

    def bisect(self, key: Callable[[CqUnit], int], target: int) -> int:
        """The smallest offset whose ``key(unit) >= target`` (``max_offset`` if none).

        ``key`` must be non-decreasing over the offsets (a CommitLog position, a store
        time the broker looks up). Binary search: O(log n) unit reads and ``key`` calls.
        ``key`` is called without the lock held, so a slow one (a CommitLog read) does
        not block appends; units deleted or truncated meanwhile count as below / above
        the target, so the answer is right for the queue as it is when the search ends.
        Exceptions from ``key`` propagate.
        """
        with self._lock:
            self._run.check_open()
            lo, hi = self._files[0].start, self._run.end
        while lo < hi:
            mid = (lo + hi) // 2
            with self._lock:
                self._run.check_open()
                if mid < self._files[0].start:
                    below = True
                elif mid >= self._run.end:
                    below = False
                else:
                    unit = CqUnit(*UNIT.unpack(self._read_units(mid, 1)))
                    below = None
            if below is None:
                below = key(unit) < target
            if below:
                lo = mid + 1
            else:
                hi = mid
        with self._lock:
            return min(max(lo, self._files[0].start), self._run.end)

    def offset_for_position(self, position: int) -> int:
        """The smallest offset whose CommitLog position is >= ``position`` (``max_offset`` if none)."""
        return self.bisect(lambda unit: unit.position, position)

    # -- internals -------------------------------------------------------------------
    def _read_units(self, offset: int, count: int) -> bytes:
        """The bytes of ``count`` units from ``offset``, all in one file (lock held)."""
        f = self._run.file_of(offset)
        size, at = count * UNIT_SIZE, (offset - f.start) * UNIT_SIZE
        data = self._run.pread(f, size, at)
        if len(data) != size:
            raise ConsumeQueueCorrupt(f"consume queue file {f.path} is shorter than expected: "
                                      f"{size} bytes at {at}")
        return data

    def _open_existing(self) -> None:
        """Adopt the files on disk and recover the end of the last (module docstring)."""
        self._run.adopt_existing(aligned_first=False)
        for f in self._files[:-1]:
            full = (f.end - f.start) * UNIT_SIZE
            if f.length != full:
                raise ConsumeQueueCorrupt(f"consume queue file {f.path} has {f.length} bytes but is not "
                                          f"the last file, so it must be full ({full} bytes)")
        while self._files:
            last = self._files[-1]
            valid = _valid_units(last.fd, last.length // UNIT_SIZE) * UNIT_SIZE
            if valid != last.length:
                self._run.set_length(last, valid)
            if valid or len(self._files) == 1:
                return
            self._drop_empty_last()

    def _drop_empty_last(self) -> None:
        """Delete the empty last file; the one before becomes the last (opened)."""
        self._run.delete_from(len(self._files) - 1)
        prev = self._files[-1]
        prev.fd = os.open(prev.path, os.O_RDWR)


def _valid_units(fd: int, units: int) -> int:
    """How many leading units of the file to keep: up to the last one with a size > 0."""
    end = units
    while end > 0:
        n = min(_RECOVER_CHUNK, end)
        used = used_units(pread_full(fd, n * UNIT_SIZE, (end - n) * UNIT_SIZE))
        if used:
            return end - n + used
        end -= n
    return 0
