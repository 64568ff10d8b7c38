"""ConsumeQueue: one (topic, queue id)'s index into the CommitLog (as RocketMQ's).

A queue is an array of fixed 20-byte units, one per message, addressed by the
message's queue offset (0, 1, 2, ...). A unit says where the message's bytes are
in the CommitLog and carries the hash of its tag for the broker's tag filter::

    ┌──────────────────────────┬──────────────────┬───────────────────┐
    │ CommitLog position (i64) │ message size i32 │ tag hash (i64)    │   big-endian, 20 bytes
    └──────────────────────────┴──────────────────┴───────────────────┘

The units are stored in files of ``units_per_file`` units, each named by the
queue offset of its first unit, 20 digits, zero-padded (here 4 units a file); file
boundaries are multiples of ``units_per_file``::

    consumequeue/<topic directory>/<queue_id>/
      00000000000000000000   [u0][u1][u2][u3]     full
      00000000000000000004   [u4][u5][u6][u7]     full
      00000000000000000008   [u8][u9]             last: extended unit by unit
                                     ▲ max_offset = 10

The topic directory is the topic's name when it has at most ``TOPIC_DIR_MAX`` characters
(every user topic); a longer one (``%RETRY%`` or ``%DLQ%`` and a group name of up to 255
characters: more than a file name may hold) is its first 100 characters, ``~`` (which no
name contains) and the first 16 hex digits of the SHA-256 of the whole name
(``topic_directory``).

Determinism: the units are derived from committed CommitLog entries by the
broker's apply step, so replicas that apply the same entries must hold the same
bytes. Nothing here depends on anything but the appended values: files are
never preallocated (a file's length is 20 x its units), a new file is created by
the append that needs it, and truncation deletes a file it empties (except the
first, which keeps ``min_offset``). There is always at least one file; a new
queue starts with an empty ``00000000000000000000``, or, for a queue that begins at
offset N (a replica restored from a snapshot starts at the peers' numbering), an empty
file named N: that first file then ends at the next multiple of ``units_per_file``::

      00000000000000000006   [u6][u7]             first, starts at 6: holds 6..7
      00000000000000000008   [u8][u9]             aligned from here on

Recovery on open: a trailing partial unit (a torn write) is cut, and so are
trailing all-zero units (a size of 0 is never appended; a crash can leave a
file extended with zeros), and an empty last file after a full one is deleted.
Anything else that is not the layout above -- a file after the first whose name is
not a multiple of ``units_per_file``, a gap in the names, a file before the last
that is not full, a file holding more than its span -- raises ConsumeQueueCorrupt.

Durability: appends land in the page cache; ``flush`` fsyncs every file written
or truncated since the last flush, and the directory if files were created or
deleted. ``close`` does not flush.

Descriptors: only the last file is kept open; a read of an older file opens it
for the call (a broker has many queues, each with many files).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dledger.durable_file import fsync_directory

__all__ = [
    "DEFAULT_UNITS_PER_FILE",
    "FILTER_SCAN_FACTOR",
    "TOPIC_DIR_MAX",
    "UNIT",
    "UNIT_SIZE",
    "ConsumeQueue",
    "ConsumeQueueCorrupt",
    "CqRead",
    "CqUnit",
    "OffsetOutOfRange",
    "cq_file_name",
    "topic_directory",
]

UNIT = struct.Struct(">qiq")
UNIT_SIZE = 20
assert UNIT.size == UNIT_SIZE
DEFAULT_UNITS_PER_FILE = 300_000
FILTER_SCAN_FACTOR = 8
"""A filtered ``read`` of ``max_units`` scans at most ``max_units * FILTER_SCAN_FACTOR`` units."""

#: Topic names longer than this get a hashed directory name (file names hold 255 bytes).
TOPIC_DIR_MAX = 200
_NAME = re.compile(r"^\d{20}$")
_I32_MAX = (1 << 31) - 1
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1
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
class CqUnit:
    """One message in a queue: its bytes are CommitLog[position : position + size]."""

    position: int
    size: int
    tag_hash: int


@dataclass(frozen=True, slots=True)
class CqRead:
    """What ``read`` found: (queue offset, unit) pairs in offset order, and where to go on.

    ``next_offset`` is the offset after the last unit scanned (matched or skipped by
    the tag filter); it equals the offset read from only when there was nothing to scan.
    """

    units: list[tuple[int, CqUnit]]
    next_offset: int


def topic_directory(topic: str) -> str:
    """The directory name of ``topic``'s queues under ``consumequeue/`` (see the layout)."""
    if len(topic) <= TOPIC_DIR_MAX:
        return topic
    return f"{topic[:100]}~{hashlib.sha256(topic.encode()).hexdigest()[:16]}"


def cq_file_name(first_offset: int) -> str:
    """The name of the file whose first unit has queue offset ``first_offset``."""
    return f"{first_offset:020d}"


class _File:
    __slots__ = ("end", "fd", "path", "start", "units")

    def __init__(self, start: int, end: int, path: Path, units: int, fd: int = -1) -> None:
        self.start = start
        self.end = end  # one past the last offset it may hold: the next multiple of units_per_file
        self.path = path
        self.units = units
        self.fd = fd  # >= 0 only for the last file

    @property
    def full(self) -> bool:
        return self.start + self.units == self.end


class ConsumeQueue:
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
        self._dir = Path(directory)
        self._upf = units_per_file
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._files: list[_File] = []
        self._dirty: set[_File] = set()
        self._dir_dirty = False
        self._closed = False
        self._dir.mkdir(parents=True, exist_ok=True)
        try:
            self._open_existing()
            if not self._files:
                self._files.append(self._create(start_offset))
            last = self._files[-1]
            if last.fd < 0:
                last.fd = os.open(last.path, os.O_RDWR)
        except BaseException:
            self._close_fds()
            raise

    # -- properties ----------------------------------------------------------------
    @property
    def directory(self) -> Path:
        return self._dir

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
            return self._max()

    def __len__(self) -> int:
        with self._lock:
            return self._max() - self._files[0].start

    @property
    def closed(self) -> bool:
        with self._lock:
            return self._closed

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
        for position, size, tag in units:
            if not 0 <= position <= _I64_MAX:
                raise ValueError(f"CommitLog position {position} is not in 0..2**63-1")
            if not 0 < size <= _I32_MAX:
                raise ValueError(f"message size {size} is not in 1..2**31-1")
            if not _I64_MIN <= tag <= _I64_MAX:
                raise ValueError(f"tag hash {tag} is not a signed 64-bit integer")
        pack = UNIT.pack
        with self._lock:
            self._check_open()
            expected = self._max()
            if offset != expected:
                raise ValueError(f"append at queue offset {offset} in {self._dir}, "
                                 f"but the next offset is {expected}")
            done = 0
            while done < len(units):
                last = self._files[-1]
                if last.full:
                    last = self._roll()
                n = min(last.end - last.start - last.units, len(units) - done)
                data = b"".join([pack(*u) for u in units[done:done + n]])
                at = last.units * UNIT_SIZE
                _pwrite_all(last.fd, data, at, restore_length=at)
                last.units += n
                self._dirty.add(last)
                done += n

    def truncate_from(self, offset: int) -> None:
        """Drop the units at ``offset`` and after (durable at the next ``flush``).

        Files left empty are deleted, except the first. Raises OffsetOutOfRange if
        ``offset`` is not in [min_offset, max_offset].
        """
        with self._lock:
            self._check_open()
            low, high = self._files[0].start, self._max()
            if not low <= offset <= high:
                raise OffsetOutOfRange("truncate_from", offset, low, high)
            if offset == high:
                return
            keep = self._index_of(offset)
            for f in self._files[keep + 1:]:
                self._delete(f)
            del self._files[keep + 1:]
            f = self._files[keep]
            if f.fd < 0:
                f.fd = os.open(f.path, os.O_RDWR)
            os.ftruncate(f.fd, (offset - f.start) * UNIT_SIZE)
            f.units = offset - f.start
            self._dirty.add(f)
            if f.units == 0 and keep > 0:
                self._delete(f)
                self._files.pop()
                prev = self._files[-1]
                prev.fd = os.open(prev.path, os.O_RDWR)

    def delete_before(self, offset: int) -> list[int]:
        """Delete the files whose units all lie before ``offset``; never the last file.

        Whole files only: ``min_offset`` becomes the start of the first file kept.
        Returns the first offsets of the deleted files, oldest first.
        """
        with self._lock:
            self._check_open()
            deleted = []
            while len(self._files) > 1 and self._files[0].end <= offset:
                f = self._files.pop(0)
                self._delete(f)
                deleted.append(f.start)
            return deleted

    def flush(self) -> bool:
        """fsync what changed since the last flush; True if anything was synced.

        Raises OSError if an fsync fails; what it covered stays marked dirty, but the
        caller should treat the data as possibly lost (a later fsync may not report
        the same error again).
        """
        with self._flush_lock:
            with self._lock:
                self._check_open()
                if not self._dirty and not self._dir_dirty:
                    return False
                files, sync_dir = list(self._dirty), self._dir_dirty
                fds = []
                try:
                    for f in files:
                        fds.append(os.dup(f.fd) if f.fd >= 0 else os.open(f.path, os.O_RDONLY))
                except BaseException:
                    _close_all(fds)
                    raise
                self._dirty.clear()
                self._dir_dirty = False
            try:
                try:
                    for fd in fds:
                        os.fsync(fd)
                finally:
                    _close_all(fds)
                if sync_dir:
                    fsync_directory(self._dir)
            except BaseException:
                with self._lock:
                    self._dirty.update(f for f in files if f in self._files)
                    self._dir_dirty = self._dir_dirty or sync_dir
                raise
            return True

    def close(self) -> None:
        """Close the files (waits for a flush in progress; does not flush). Idempotent."""
        with self._flush_lock, self._lock:
            if self._closed:
                return
            self._closed = True
            self._close_fds()

    # -- reading ---------------------------------------------------------------------
    def get(self, offset: int) -> CqUnit:
        """The unit at ``offset``. Raises OffsetOutOfRange unless min_offset <= offset < max_offset."""
        with self._lock:
            self._check_open()
            low, high = self._files[0].start, self._max()
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
            self._check_open()
            low, high = self._files[0].start, self._max()
            if not low <= offset <= high:
                raise OffsetOutOfRange("read", offset, low, high)
            end = min(high, offset + scan)
            units: list[tuple[int, CqUnit]] = []
            cur = offset
            while cur < end:
                f = self._file_of(cur)
                n = min(end, f.start + f.units) - cur
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
            self._check_open()
            lo, hi = self._files[0].start, self._max()
        while lo < hi:
            mid = (lo + hi) // 2
            with self._lock:
                self._check_open()
                if mid < self._files[0].start:
                    below = True
                elif mid >= self._max():
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
            return min(max(lo, self._files[0].start), self._max())

    def offset_for_position(self, position: int) -> int:
        """The smallest offset whose CommitLog position is >= ``position`` (``max_offset`` if none)."""
        return self.bisect(lambda unit: unit.position, position)

    # -- internals -------------------------------------------------------------------
    def _max(self) -> int:
        last = self._files[-1]
        return last.start + last.units

    def _index_of(self, offset: int) -> int:
        """Which of ``_files`` holds ``offset`` (boundaries are multiples of units_per_file)."""
        return offset // self._upf - self._files[0].start // self._upf

    def _file_of(self, offset: int) -> _File:
        return self._files[self._index_of(offset)]

    def _read_units(self, offset: int, count: int) -> bytes:
        """The bytes of ``count`` units from ``offset``, all in one file (lock held)."""
        f = self._file_of(offset)
        size, at = count * UNIT_SIZE, (offset - f.start) * UNIT_SIZE
        if f.fd >= 0:
            data = _pread_full(f.fd, size, at)
        else:
            fd = os.open(f.path, os.O_RDONLY)
            try:
                data = _pread_full(fd, size, at)
            finally:
                os.close(fd)
        if len(data) != size:
            raise ConsumeQueueCorrupt(f"consume queue file {f.path} is shorter than expected: "
                                      f"{size} bytes at {at}")
        return data

    def _open_existing(self) -> None:
        names = sorted(p.name for p in self._dir.iterdir() if _NAME.match(p.name))
        for name in names:
            path, start = self._dir / name, int(name)
            if self._files and start % self._upf:
                raise ConsumeQueueCorrupt(f"consume queue file {path} does not start at a multiple "
                                          f"of units_per_file {self._upf} (only the first may)")
            if self._files and start != self._files[-1].end:
                raise ConsumeQueueCorrupt(
                    f"consume queue files in {self._dir} are not contiguous for units_per_file "
                    f"{self._upf}: {self._files[-1].path.name} is followed by {name}")
            self._files.append(_File(start, self._end_of(start), path, 0))
        for i, f in enumerate(self._files):
            length = f.path.stat().st_size
            full = (f.end - f.start) * UNIT_SIZE
            if length > full:
                raise ConsumeQueueCorrupt(f"consume queue file {f.path} has {length} bytes, more than "
                                          f"its span of {full // UNIT_SIZE} units x {UNIT_SIZE}")
            if i < len(self._files) - 1 and length != full:
                raise ConsumeQueueCorrupt(f"consume queue file {f.path} has {length} bytes but is not "
                                          f"the last file, so it must be full ({full} bytes)")
            f.units = length // UNIT_SIZE
        while self._files:
            last = self._files[-1]
            length = last.path.stat().st_size
            fd = os.open(last.path, os.O_RDWR)
            try:
                valid = _valid_units(fd, length // UNIT_SIZE)
                if valid * UNIT_SIZE != length:
                    os.ftruncate(fd, valid * UNIT_SIZE)
                    self._dirty.add(last)
            except BaseException:
                os.close(fd)
                raise
            last.units, last.fd = valid, fd
            if valid or len(self._files) == 1:
                return
            self._delete(last)
            self._files.pop()

    def _end_of(self, start: int) -> int:
        return (start // self._upf + 1) * self._upf

    def _create(self, start: int) -> _File:
        path = self._dir / cq_file_name(start)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self._dir_dirty = True
        return _File(start, self._end_of(start), path, 0, fd)

    def _roll(self) -> _File:
        old = self._files[-1]
        new = self._create(old.end)
        os.close(old.fd)
        old.fd = -1
        self._files.append(new)
        return new

    def _delete(self, f: _File) -> None:
        self._dirty.discard(f)
        if f.fd >= 0:
            os.close(f.fd)
            f.fd = -1
        f.path.unlink(missing_ok=True)
        self._dir_dirty = True

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"ConsumeQueue {self._dir} is closed")

    def _close_fds(self) -> None:
        for f in self._files:
            if f.fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(f.fd)
                f.fd = -1


def _valid_units(fd: int, units: int) -> int:
    """How many leading units of the file to keep: up to the last one with a size > 0."""
    end = units
    while end > 0:
        n = min(_RECOVER_CHUNK, end)
        data = _pread_full(fd, n * UNIT_SIZE, (end - n) * UNIT_SIZE)
        for i in range(len(data) // UNIT_SIZE - 1, -1, -1):
            if UNIT.unpack_from(data, i * UNIT_SIZE)[1] > 0:
                return end - n + i + 1
        end -= n
    return 0


def _pwrite_all(fd: int, data: bytes, offset: int, *, restore_length: int) -> None:
    """Write all of ``data`` at ``offset``; on failure cut the file back to ``restore_length``."""
    view = memoryview(data)
    try:
        while view:
            written = os.pwrite(fd, view, offset)
            view, offset = view[written:], offset + written
    except BaseException:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, restore_length)
        raise


def _pread_full(fd: int, size: int, offset: int) -> bytes:
    """pread until ``size`` bytes or end of file."""
    parts = []
    got = 0
    while got < size:
        data = os.pread(fd, size - got, offset + got)
        if not data:
            break
        parts.append(data)
        got += len(data)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
