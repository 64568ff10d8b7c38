"""SegmentedFile: append-only storage in fixed-size segment files (as RocketMQ's CommitLog).

A position is an absolute byte offset across segments; each segment file is
named by its start position, 20 digits, zero-padded::

    directory/
      00000000000000000000   [rec][rec][rec]...[rec][blank ........]   start 0
      00000000000000004096   [rec][rec]...[rec][blank .............]   start 4096
      00000000000000008192   [rec][rec][rec]                            active (last)
                                               ▲ write_position

A record never spans segments: when it does not fit in the active segment, the
rest of that segment is filled by a blank record (``entry_format.encode_blank``)
and the record goes to the start of the next one. The same records therefore
get the same positions on every replica. Record contents are not interpreted
here (``CommitLog`` validates and recovers them).

Durability: writes land in the page cache; ``flush`` fsyncs every file written
or truncated since the last flush, and the directory if segments were created
or deleted.

Log start: the storage normally starts at the first segment's start. ``reset``
(a Raft follower restarted at the leader's first retained entry) deletes every
segment and restarts the storage at any aligned ``start_position``, in the
segment that holds it, with a sparse hole before it; the caller records that
start durably and passes it back when opening, and it holds while that segment
is the first one::

      00000000000000004096   [ hole ..........][rec][rec]...        first segment after a reset
                                               ▲ start_position
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from dledger.durable_file import fsync_directory
from dledger.entry_format import ALIGN, encode_blank

__all__ = ["CorruptLogError", "SegmentInfo", "SegmentedFile", "segment_name"]

_NAME = re.compile(r"^\d{20}$")


class CorruptLogError(Exception):
    """The files on disk are not a well-formed log; the message names the file and offset."""


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """One segment file as it is on disk (for retention decisions)."""

    start: int
    path: Path
    size_on_disk: int
    mtime: float


def segment_name(start: int) -> str:
    """The file name of the segment starting at ``start``: 20 digits, zero-padded."""
    return f"{start:020d}"


class _Segment:
    __slots__ = ("fd", "length", "path", "start")

    def __init__(self, start: int, path: Path, fd: int, length: int) -> None:
        self.start = start
        self.path = path
        self.fd = fd
        self.length = length


class SegmentedFile:
    """Append-only byte storage split into ``segment_size`` files.

    Thread-safety: every public method takes the one internal lock, so any
    thread may call any method. ``flush`` holds it only to collect the files to
    sync (and waits for a flush already in progress, so that when it returns
    everything appended before the call is durable). Raises ValueError after
    ``close``.
    """

    def __init__(self, directory: Path, segment_size: int, start_position: int | None = None,
                 *, discard_existing: bool = False) -> None:
        """Open (or create) the segments in ``directory``.

        ``start_position`` is where an earlier ``reset`` restarted the storage (the
        caller keeps it durably). It is honoured while it lies in the first segment:
        nothing before it is readable, and if that segment is the only one and its
        file is shorter, it is extended to it. A start below the first segment is
        ignored (retention has deleted its segment since); with no segment file, the
        segment holding it is created. ``discard_existing`` (needs
        ``start_position``) first deletes every segment file, whatever their names,
        and restarts the storage there durably, as ``reset`` does.

        Raises ValueError for a bad ``segment_size`` or ``start_position``, and
        CorruptLogError when the segment names are not contiguous, a file is larger
        than a segment, or ``start_position`` lies past the end of the first segment.
        """
        if segment_size < ALIGN or segment_size % ALIGN:
            raise ValueError(f"segment_size must be a positive multiple of {ALIGN}")
        if start_position is not None:
            _check_start(start_position)
        elif discard_existing:
            raise ValueError("discard_existing needs a start_position")
        self._dir = Path(directory)
        self._size = segment_size
        self._lock = threading.Lock()
        self._flush_done = threading.Condition(self._lock)
        self._flushing = False
        self._dirty: set[_Segment] = set()
        self._dir_dirty = False
        self._closed = False
        self._dir.mkdir(parents=True, exist_ok=True)
        self._segs: list[_Segment] = []
        self._start = 0
        try:
            if discard_existing and start_position is not None:
                self._restart_at(start_position)
                return
            self._open_existing()
            if not self._segs:
                self._start = 0 if start_position is None else start_position
                self._segs.append(self._create_at(self._start))
            elif start_position is not None:
                self._adopt_start(start_position)
            else:
                self._start = self._segs[0].start
        except BaseException:
            self._close_fds()
            raise

    # -- properties ------------------------------------------------------------
    @property
    def directory(self) -> Path:
        return self._dir

    @property
    def segment_size(self) -> int:
        return self._size

    @property
    def write_position(self) -> int:
        """Position the next append would get if it fits in the active segment."""
        with self._lock:
            return self._end()

    @property
    def start_position(self) -> int:
        """Lowest readable position: the start of the first retained segment, or the
        ``reset`` start while the segment holding it is the first one."""
        with self._lock:
            return self._start

    @property
    def closed(self) -> bool:
        with self._lock:
            return self._closed

    @property
    def dirty(self) -> bool:
        """True while something written is not yet known to be durable."""
        with self._lock:
            return bool(self._dirty) or self._dir_dirty or self._flushing

    # -- writing -----------------------------------------------------------------
    def append(self, record: bytes) -> int:
        """Write ``record`` and return its position (see the module docstring on rolling).

        Raises ValueError if the record is empty, not a multiple of ALIGN or larger
        than a segment; OSError from the file system (nothing is then counted as
        written).
        """
        n = len(record)
        if n == 0 or n % ALIGN or n > self._size:
            raise ValueError(f"record of {n} bytes: must be a multiple of {ALIGN} "
                             f"and at most the segment size {self._size}")
        with self._lock:
            self._check_open()
            seg = self._segs[-1]
            if n > self._size - seg.length:
                seg = self._roll(seg)
            position = seg.start + seg.length
            self._pwrite(seg, record)
            return position

    def truncate(self, position: int) -> None:
        """Drop every byte at or after ``position`` (durable at the next ``flush``).

        Raises ValueError if ``position`` is outside [start_position, write_position].
        """
        with self._lock:
            self._check_open()
            if not self._start <= position <= self._end():
                raise ValueError(f"truncate position {position} outside "
                                 f"[{self._start}, {self._end()}]")
            if position == self._end():
                return
            keep = self._seg_index(position)
            for seg in self._segs[keep + 1:]:
                self._delete(seg)
            del self._segs[keep + 1:]
            seg = self._segs[keep]
            os.ftruncate(seg.fd, position - seg.start)
            seg.length = position - seg.start
            self._dirty.add(seg)

    def delete_segments_before(self, position: int) -> list[int]:
        """Delete whole segments ending at or before ``position``; never the last one.

        Returns the start positions of the deleted segments (oldest first).
        """
        with self._lock:
            self._check_open()
            deleted: list[int] = []
            while len(self._segs) > 1 and self._segs[0].start + self._size <= position:
                seg = self._segs.pop(0)
                self._delete(seg)
                deleted.append(seg.start)
            self._start = max(self._start, self._segs[0].start)
            return deleted

    def reset(self, start_position: int) -> None:
        """Delete every segment and restart the storage, empty, at ``start_position``.

        Creates the segment holding ``start_position`` (named by its segment start)
        with its length set to the offset of ``start_position`` (a sparse hole), so
        the next ``append`` lands there and later rolling is the same as on a
        storage that wrote everything before it. Durable when it returns (the new
        file and the directory are fsynced). Raises ValueError for a position that
        is negative or not a multiple of ALIGN; on OSError the object is closed
        (reopen it, with ``discard_existing``, to finish).
        """
        _check_start(start_position)
        with self._lock:
            while self._flushing:
                self._flush_done.wait()
            self._check_open()
            try:
                self._restart_at(start_position)
            except BaseException:
                self._closed = True
                self._close_fds()
                raise

    def flush(self) -> bool:
        """fsync what was written since the last flush; True if anything was synced.

        Raises OSError if an fsync fails; the files stay marked dirty, but the
        caller should treat the data as possibly lost (a later fsync may not
        report the same error again).
        """
        with self._lock:
            while self._flushing:
                self._flush_done.wait()
            self._check_open()
            if not self._dirty and not self._dir_dirty:
                return False
            segs, sync_dir = list(self._dirty), self._dir_dirty
            fds = [os.dup(seg.fd) for seg in segs]
            self._dirty.clear()
            self._dir_dirty = False
            self._flushing = True
        try:
            self._sync(fds, sync_dir)
        except BaseException:
            with self._lock:
                self._dirty.update(s for s in segs if s in self._segs)
                self._dir_dirty = self._dir_dirty or sync_dir
            raise
        finally:
            with self._lock:
                self._flushing = False
                self._flush_done.notify_all()
        return True

    # -- reading -------------------------------------------------------------------
    def read(self, position: int, size: int) -> bytes:
        """``size`` bytes from ``position`` (may span segments, blank padding included).

        Raises ValueError if the range is not inside [start_position, write_position),
        CorruptLogError if a file is shorter than the data it should hold.
        """
        with self._lock:
            self._check_open()
            if size < 0 or position < self._start or position + size > self._end():
                raise ValueError(f"read of {size} bytes at {position} outside "
                                 f"[{self._start}, {self._end()})")
            parts = []
            while size > 0:
                seg = self._segs[self._seg_index(position)]
                n = min(size, seg.start + seg.length - position)
                data = _pread_full(seg.fd, n, position - seg.start)
                if len(data) != n:
                    raise CorruptLogError(f"segment file {seg.path} is shorter than expected: "
                                          f"{n} bytes at offset {position - seg.start}")
                parts.append(data)
                position += n
                size -= n
            return b"".join(parts) if len(parts) != 1 else parts[0]

    def read_available(self, position: int, size: int) -> bytes:
        """Up to ``size`` bytes at ``position``, within its segment file as it is on disk.

        For recovery: returns fewer bytes (possibly none) at the end of the file
        or the segment. Raises ValueError if no retained segment holds ``position``.
        """
        with self._lock:
            self._check_open()
            if not self._start <= position < self._segs[-1].start + self._size:
                raise ValueError(f"position {position} is in no retained segment")
            seg = self._segs[self._seg_index(position)]
            n = max(0, min(size, seg.start + self._size - position))
            return _pread_full(seg.fd, n, position - seg.start)

    def locate(self, position: int) -> tuple[Path, int]:
        """(segment file, offset inside it) of ``position``, for messages."""
        with self._lock:
            index = (position - self._segs[0].start) // self._size
            start = self._segs[0].start + index * self._size
            return self._dir / segment_name(start), position - start

    def segments(self) -> list[SegmentInfo]:
        """The retained segments, oldest first, with their on-disk size and mtime."""
        with self._lock:
            self._check_open()
            infos = []
            for seg in self._segs:
                st = os.fstat(seg.fd)
                infos.append(SegmentInfo(seg.start, seg.path, st.st_size, st.st_mtime))
            return infos

    def close(self) -> None:
        """Close the files (waits for a flush in progress; does not flush). Idempotent."""
        with self._lock:
            while self._flushing:
                self._flush_done.wait()
            if self._closed:
                return
            self._closed = True
            self._close_fds()

    # -- internals -------------------------------------------------------------------
    def _open_existing(self) -> None:
        names = sorted(p.name for p in self._dir.iterdir() if _NAME.match(p.name))
        for name in names:
            start = int(name)
            if start % self._size:
                raise CorruptLogError(f"segment file {self._dir / name} does not start at a "
                                      f"multiple of the segment size {self._size}")
            if self._segs and start != self._segs[-1].start + self._size:
                raise CorruptLogError(
                    f"segment files in {self._dir} are not contiguous for segment size "
                    f"{self._size}: {self._segs[-1].path.name} is followed by {name}")
            path = self._dir / name
            fd = os.open(path, os.O_RDWR)
            length = os.fstat(fd).st_size
            self._segs.append(_Segment(start, path, fd, length))
            if length > self._size:
                raise CorruptLogError(f"segment file {path} has {length} bytes, "
                                      f"more than the segment size {self._size}")

    def _adopt_start(self, position: int) -> None:
        first = self._segs[0]
        if position < first.start:
            self._start = first.start  # its segment was deleted by retention since
            return
        if position >= first.start + self._size:
            raise CorruptLogError(f"log start position {position} lies past the first segment "
                                  f"file {first.path} (segment size {self._size})")
        if len(self._segs) == 1 and first.length < position - first.start:
            os.ftruncate(first.fd, position - first.start)
            first.length = position - first.start
            self._dirty.add(first)
        self._start = position

    def _restart_at(self, position: int) -> None:
        """Delete every segment file, create the one holding ``position``, sync both."""
        self._close_fds()
        self._segs = []
        self._dirty.clear()
        for name in sorted(p.name for p in self._dir.iterdir() if _NAME.match(p.name)):
            (self._dir / name).unlink(missing_ok=True)
        seg = self._create_at(position)
        self._segs.append(seg)
        os.fsync(seg.fd)
        fsync_directory(self._dir)
        self._dirty.clear()
        self._dir_dirty = False
        self._start = position

    def _create_at(self, position: int) -> _Segment:
        """Create the segment holding ``position``, its write offset at ``position``."""
        seg = self._create(position - position % self._size)
        if position > seg.start:
            os.ftruncate(seg.fd, position - seg.start)
            seg.length = position - seg.start
            self._dirty.add(seg)
        return seg

    def _create(self, start: int) -> _Segment:
        path = self._dir / segment_name(start)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self._dir_dirty = True
        return _Segment(start, path, fd, 0)

    def _roll(self, seg: _Segment) -> _Segment:
        remaining = self._size - seg.length
        if remaining > 0:
            self._pwrite(seg, encode_blank(remaining))
            os.ftruncate(seg.fd, self._size)
            seg.length = self._size
        new = self._create(seg.start + self._size)
        self._segs.append(new)
        return new

    def _pwrite(self, seg: _Segment, data: bytes) -> None:
        view, offset = memoryview(data), seg.length
        try:
            while view:
                written = os.pwrite(seg.fd, view, offset)
                view, offset = view[written:], offset + written
        except BaseException:
            with contextlib.suppress(OSError):
                os.ftruncate(seg.fd, seg.length)
            raise
        seg.length = offset
        self._dirty.add(seg)

    def _delete(self, seg: _Segment) -> None:
        self._dirty.discard(seg)
        os.close(seg.fd)
        seg.path.unlink(missing_ok=True)
        self._dir_dirty = True

    def _sync(self, fds: list[int], sync_dir: bool) -> None:
        try:
            for fd in fds:
                os.fsync(fd)
        finally:
            for fd in fds:
                os.close(fd)
        if sync_dir:
            fsync_directory(self._dir)

    def _seg_index(self, position: int) -> int:
        return min((position - self._segs[0].start) // self._size, len(self._segs) - 1)

    def _end(self) -> int:
        if not self._segs:  # only after a failed reset (closed)
            return self._start
        last = self._segs[-1]
        return last.start + last.length

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("SegmentedFile is closed")

    def _close_fds(self) -> None:
        for seg in self._segs:
            if seg.fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(seg.fd)
                seg.fd = -1


def _check_start(position: int) -> None:
    if position < 0 or position % ALIGN:
        raise ValueError(f"start position {position} must be >= 0 and a multiple of {ALIGN}")


def _pread_full(fd: int, size: int, offset: int) -> bytes:
    """pread until ``size`` bytes or end of file."""
    data = os.pread(fd, size, offset)
    if len(data) == size or not data:
        return data
    parts = [data]
    got = len(data)
    while got < size:
        more = os.pread(fd, size - got, offset + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)
