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
or deleted. The files themselves are kept by a ``FileRun`` (``dledger/storage/file_run.py``,
shared with the broker's ConsumeQueue): span = segment size, one byte a number.

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

import os
from dataclasses import dataclass
from pathlib import Path

from common.durable_file import fsync_directory
from dledger.storage.entry_format import ALIGN, encode_blank
from dledger.storage.file_run import FileRun, FileRunStore, RunFile
from dledger.storage.numbered_files import number_name

__all__ = ["CorruptLogError", "SegmentInfo", "SegmentedFile", "segment_name"]


class CorruptLogError(Exception):
    """The files on disk are not a well-formed log; the message names the file and offset."""


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """One segment file as it is on disk (for retention decisions)."""

    start: int
    path: Path
    size_on_disk: int
    mtime: float


segment_name = number_name
"""The file name of the segment starting at a position: 20 digits, zero-padded."""


class SegmentedFile(FileRunStore):
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
        self._size = segment_size
        self._run = FileRun(directory, segment_size, 1, keep_open=True, corrupt=CorruptLogError,
                            what="segment file", span_name="the segment size",
                            closed_error="SegmentedFile is closed")
        self._lock = self._run.lock
        self._segs = self._run.files
        self._start = 0
        with self._run.closed_on_error():
            if discard_existing and start_position is not None:
                self._restart_at(start_position)
            else:
                self._open(start_position)

    # -- properties ------------------------------------------------------------
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
    def dirty(self) -> bool:
        """True while something written is not yet known to be durable."""
        with self._lock:
            return self._run.dirty

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
            self._run.check_open()
            seg = self._segs[-1]
            if n > self._size - seg.length:
                seg = self._roll(seg)
            position = seg.start + seg.length
            self._run.write_at_end(seg, record)
            return position

    def truncate(self, position: int) -> None:
        """Drop every byte at or after ``position`` (durable at the next ``flush``).

        Raises ValueError if ``position`` is outside [start_position, write_position].
        """
        with self._lock:
            self._run.check_open()
            if not self._start <= position <= self._end():
                raise ValueError(f"truncate position {position} outside "
                                 f"[{self._start}, {self._end()}]")
            if position < self._end():
                self._run.truncate_at(position)

    def delete_segments_before(self, position: int) -> list[int]:
        """Delete whole segments ending at or before ``position``; never the last one.

        Returns the start positions of the deleted segments (oldest first).
        """
        with self._lock:
            self._run.check_open()
            deleted = self._run.delete_before(position)
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
            self._run.wait_flushes()
            self._run.check_open()
            try:
                self._restart_at(start_position)
            except BaseException:
                self._run.closed = True
                self._run.close_fds()
                raise

    # -- reading -------------------------------------------------------------------
    def read(self, position: int, size: int) -> bytes:
        """``size`` bytes from ``position`` (may span segments, blank padding included).

        Raises ValueError if the range is not inside [start_position, write_position),
        CorruptLogError if a file is shorter than the data it should hold.
        """
        with self._lock:
            self._run.check_open()
            if size < 0 or position < self._start or position + size > self._end():
                raise ValueError(f"read of {size} bytes at {position} outside "
                                 f"[{self._start}, {self._end()})")
            parts = []
            while size > 0:
                seg = self._run.file_of(position)
                n = min(size, seg.start + seg.length - position)
                data = self._run.pread(seg, n, position - seg.start)
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
            self._run.check_open()
            if not self._start <= position < self._segs[-1].end:
                raise ValueError(f"position {position} is in no retained segment")
            seg = self._run.file_of(position)
            return self._run.pread(seg, max(0, min(size, seg.end - position)), position - seg.start)

    def locate(self, position: int) -> tuple[Path, int]:
        """(segment file, offset inside it) of ``position``, for messages."""
        with self._lock:
            start = position - position % self._size
            return self._run.directory / segment_name(start), position - start

    def segments(self) -> list[SegmentInfo]:
        """The retained segments, oldest first, with their on-disk size and mtime."""
        with self._lock:
            self._run.check_open()
            infos = []
            for seg in self._segs:
                st = os.fstat(seg.fd)
                infos.append(SegmentInfo(seg.start, seg.path, st.st_size, st.st_mtime))
            return infos

    # -- internals -------------------------------------------------------------------
    def _open(self, start_position: int | None) -> None:
        self._run.adopt_existing(aligned_first=True)
        if not self._segs:
            self._start = 0 if start_position is None else start_position
            self._create_at(self._start)
        elif start_position is not None:
            self._adopt_start(start_position)
        else:
            self._start = self._segs[0].start

    def _adopt_start(self, position: int) -> None:
        first = self._segs[0]
        if position < first.start:
            self._start = first.start  # its segment was deleted by retention since
            return
        if position >= first.end:
            raise CorruptLogError(f"log start position {position} lies past the first segment "
                                  f"file {first.path} (segment size {self._size})")
        if len(self._segs) == 1 and first.length < position - first.start:
            self._run.set_length(first, position - first.start)
        self._start = position

    def _restart_at(self, position: int) -> None:
        """Delete every segment file, create the one holding ``position``, sync both."""
        self._run.delete_every_file()
        seg = self._create_at(position)
        os.fsync(seg.fd)
        fsync_directory(self._run.directory)
        self._run.pending.clear()
        self._start = position

    def _create_at(self, position: int) -> RunFile:
        """Create the segment holding ``position``, its write offset at ``position``."""
        seg = self._run.create(position - position % self._size)
        if position > seg.start:
            self._run.set_length(seg, position - seg.start)
        return seg

    def _roll(self, seg: RunFile) -> RunFile:
        remaining = self._size - seg.length
        if remaining > 0:
            self._run.write_at_end(seg, encode_blank(remaining))
            self._run.set_length(seg, self._size)
        return self._run.roll()

    def _end(self) -> int:
        if not self._segs:  # only after a failed reset (closed)
            return self._start
        return self._run.end


def _check_start(position: int) -> None:
    if position < 0 or position % ALIGN:
        raise ValueError(f"start position {position} must be >= 0 and a multiple of {ALIGN}")
