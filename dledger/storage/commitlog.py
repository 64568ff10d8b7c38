"""CommitLog: the Raft log, stored as the broker's CommitLog (DLedger style).

Entries have contiguous Raft indexes ``first_index..last_index``; each is one
record (``entry_format``) at a fixed absolute position in a ``SegmentedFile``.
Only ``(position, term, kind, body length)`` per entry is kept in memory
(``dledger.storage.entry_columns``: its layout); bodies are read from disk.

Recovery (on open: ``dledger.storage.log_recovery``) scans the records from the first
segment, cuts a torn tail, and refuses mid-log corruption with ``CorruptLogError`` unless
``repair=True`` cuts the log at the first bad record.

Reset (``reset``): a follower whose next entry the leader has already deleted
throws its log away and restarts it at the leader's first retained entry, at
the same position as on the leader (DLedger's truncate to the leader's begin
index), so positions keep naming the same entries on every replica. The start
is recorded in ``LOG_START`` (``dledger.storage.log_start_marker``: its layout, the
steps of a reset and why a crash at any of them recovers as the reset log).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path

from common.durable_file import atomic_write
from dledger.storage.entry_columns import EntryColumns
from dledger.storage.entry_format import (
    Entry,
    EntryKind,
    FormatError,
    decode_entry,
    encode_entry,
    record_size,
)
from dledger.storage.log_recovery import REPAIR_HINT, RecoveryReport, open_files, recover
from dledger.storage.log_start_marker import START_MARKER, check_start, encode_start_marker
from dledger.storage.segments import CorruptLogError, SegmentInfo

__all__ = ["CommitLog", "CorruptLogError", "LogGap"]

log = logging.getLogger("dledger.commitlog")


class LogGap(LookupError):
    """The entries asked for were deleted by retention; the log resumes at ``first_index``."""

    def __init__(self, wanted: int, first_index: int) -> None:
        self.wanted = wanted
        self.first_index = first_index
        super().__init__(f"entry {wanted} is no longer retained; the log starts at {first_index}")


class CommitLog:
    """The Raft log on disk (see the module docstring).

    Thread-safety: one lock guards the index arrays and every file operation
    except ``flush``, so appends/truncation (normally one thread), ``entries``
    readers and a flusher thread may run concurrently. A reader never sees a
    half-appended entry: the arrays are extended only after the write returned.
    Lock order: CommitLog lock, then the SegmentedFile lock.
    """

    def __init__(self, directory: Path, segment_size: int = 1 << 30, repair: bool = False) -> None:
        """Open the log in ``directory`` and recover it (honouring ``LOG_START``).

        Raises CorruptLogError for mid-log corruption (unless ``repair``),
        inconsistent segment files or an unreadable ``LOG_START``, ValueError for
        a bad ``segment_size``, OSError.
        """
        directory = Path(directory)
        self._marker_path = directory / START_MARKER
        self._lock = threading.Lock()
        self._cols = EntryColumns()
        # While the segment holding a reset start is the first one: that start.
        self._reset_index = 0
        self._reset_position = 0
        self._files, reset, finished = open_files(directory, segment_size, self._marker_path)
        if reset is not None:
            self._reset_index, self._reset_position = reset
        try:
            report = recover(self._files, self._cols, self._reset_index, repair)
        except BaseException:
            self._files.close()
            raise
        self.recovery: RecoveryReport = (
            RecoveryReport(report.entries, report.cut_at, report.cut_bytes, True, report.repaired)
            if finished else report)

    # -- properties ----------------------------------------------------------------
    @property
    def first_index(self) -> int:
        with self._lock:
            return self._cols.first if self._cols.positions else 0

    @property
    def last_index(self) -> int:
        with self._lock:
            return self._cols.last()

    @property
    def last_term(self) -> int:
        with self._lock:
            return self._cols.terms[-1] if self._cols.terms else 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._cols.positions)

    @property
    def write_position(self) -> int:
        return self._files.write_position

    @property
    def start_position(self) -> int:
        return self._files.start_position

    @property
    def dirty(self) -> bool:
        return self._files.dirty

    # -- writing -------------------------------------------------------------------
    @property
    def awaiting_start(self) -> int:
        """The only index an empty reset log accepts (0: not an empty reset log)."""
        with self._lock:
            return 0 if self._cols.positions else self._reset_index

    def append(self, index: int, term: int, kind: EntryKind, body: bytes) -> int:
        """Append one entry and return its position (durable after ``flush``).

        ``index`` must be ``last_index + 1``; when the log is empty, the reset
        start index if the log was reset (see ``reset``), else any index >= 1.
        Raises ValueError otherwise, or for a body that does not fit in a
        segment; OSError from the file system (the entry is then not appended).
        """
        record = encode_entry(index, term, EntryKind(kind), body)
        with self._lock:
            expected = self._cols.last() + 1 if self._cols.positions else self._reset_index
            if expected and index != expected:
                raise ValueError(f"append of index {index}: expected {expected}")
            position = self._files.append(record)
            self._cols.push(position, index, term, kind, len(body))
            return position

    def truncate_from(self, index: int) -> None:
        """Remove entry ``index`` and every later one (no-op past ``last_index``).

        Raises IndexError below ``first_index``. Durable at the next ``flush``.
        """
        with self._lock:
            if not self._cols.positions or index > self._cols.last():
                return
            i = self._cols.slot(index)
            # Cut at the end of the entry before, not at this entry's position: an entry
            # that rolled the segment has a blank before it, and the next append must
            # land where a log that never held the entry would put it (positions are
            # the same on every replica: ConsumeQueue units name them).
            end = self._cols.positions[i - 1] + self._cols.size(i - 1) if i else self._cols.positions[0]
            self._files.truncate(end)
            self._cols.cut_from(i)

    def delete_before(self, index: int) -> int:
        """Retention: delete whole segments all of whose entries are below ``index``.

        The last segment is never deleted; positions of the remaining entries do
        not change. Returns how many entries were dropped.
        """
        with self._lock:
            if self._cols.positions and index <= self._cols.first:
                return 0
            if self._cols.positions and index <= self._cols.last():
                bound = self._cols.positions[index - self._cols.first]
            else:
                bound = self._files.write_position
            self._files.delete_segments_before(bound)
            start = self._files.start_position
            if self._reset_index and start != self._reset_position:
                self._reset_index = 0  # the reset segment is gone: LOG_START is stale
            return self._cols.drop_below(start)

    def reset(self, start_index: int, start_position: int) -> None:
        """Throw the whole log away and restart it, empty, at ``start_index``.

        For a follower behind the leader's first retained entry: ``start_index``
        and ``start_position`` are that entry's index and position on the leader.
        Afterwards the log is empty, ``write_position == start_position ==
        self.start_position``, and the next append must be ``start_index`` (also
        after a reopen, or after ``truncate_from`` empties the log again) and lands
        at ``start_position``; segments then roll exactly as on the leader.
        Durable when it returns; see the module docstring for the steps and why
        a crash during them recovers as the reset log.

        Raises ValueError if ``start_index < 1``, ``start_position`` is negative or
        not a multiple of 8, or the log is closed. Raises OSError from the file
        system: if the first step (the PENDING marker) failed, nothing changed;
        otherwise the log is closed and must be reopened, which finishes the reset.
        """
        check_start(start_index, start_position)
        with self._lock:
            if self._files.closed:
                raise ValueError("CommitLog is closed")
            atomic_write(self._marker_path,
                         encode_start_marker(start_index, start_position, complete=False))
            self._cols.clear()
            self._reset_index, self._reset_position = start_index, start_position
            try:
                self._files.reset(start_position)
                atomic_write(self._marker_path,
                             encode_start_marker(start_index, start_position, complete=True))
            except BaseException:
                self._files.close()
                raise
            log.info("log reset: it now starts empty at index %d, position %d",
                        start_index, start_position)

    def flush(self) -> bool:
        """fsync everything appended or truncated so far; True if anything was synced.

        Any thread; does not block appends while syncing. Raises OSError.
        """
        return self._files.flush()

    def close(self) -> None:
        """Close the files without flushing. Idempotent."""
        with self._lock:
            self._files.close()

    # -- reading -------------------------------------------------------------------
    def entry(self, index: int) -> Entry:
        """The entry at ``index`` (body read from disk and CRC-checked).

        Raises IndexError outside [first_index, last_index], CorruptLogError on a
        bad record.
        """
        with self._lock:
            i = self._cols.slot(index)
            return self._read_run(i, i + 1)[0]

    def term_at(self, index: int) -> int:
        return self._column_at(self._cols.terms, index)

    def kind_at(self, index: int) -> EntryKind:
        return EntryKind(self._column_at(self._cols.kinds, index))

    def position_of(self, index: int) -> int:
        return self._column_at(self._cols.positions, index)

    def record_size_of(self, index: int) -> int:
        return record_size(self._column_at(self._cols.lens, index))

    def _column_at(self, column: Sequence[int], index: int) -> int:
        """Entry ``index``'s value in one of the per-entry columns (IndexError if not held)."""
        with self._lock:
            return column[self._cols.slot(index)]

    def entries(self, from_index: int, max_bytes: int,
                upto_index: int | None = None) -> list[Entry]:
        """Consecutive entries from ``from_index``, never past ``upto_index`` (or last).

        Returns at least one entry if ``from_index`` exists, then more while the
        total body bytes stay within ``max_bytes``; ``[]`` when ``from_index`` is
        past the end. Contiguous records are read with one pread per segment.
        Raises IndexError if ``from_index`` was deleted (below first_index),
        CorruptLogError on a bad record.
        """
        cols = self._cols
        with self._lock:
            last = cols.last() if upto_index is None else min(upto_index, cols.last())
            if not cols.positions or from_index > last:
                return []
            i0 = cols.slot(from_index)
            stop, total = i0 + 1, cols.lens[i0]
            while stop <= last - cols.first and total + cols.lens[stop] <= max_bytes:
                total += cols.lens[stop]
                stop += 1
            result: list[Entry] = []
            run = i0
            for i in range(i0 + 1, stop + 1):
                if i == stop or cols.positions[i] != cols.positions[i - 1] + cols.size(i - 1):
                    result.extend(self._read_run(run, i))
                    run = i
            return result

    def committed_entries(self, from_index: int, max_bytes: int, committed: int) -> list[Entry]:
        """Entries from ``from_index`` up to ``committed`` (at least one if any; see
        ``entries``). Raises ``LogGap`` when ``from_index`` is below the first retained entry."""
        if from_index > committed:
            return []
        first = self.first_index
        if from_index < first:
            raise LogGap(from_index, first)
        return self.entries(from_index, max_bytes, committed)

    def read_at(self, position: int, size: int) -> bytes:
        """``size`` raw bytes at ``position`` (a message inside an entry, found through a
        ConsumeQueue). The caller must only ask for bytes of applied, hence committed,
        entries. Raises ValueError outside the held range."""
        with self._lock:
            return self._files.read(position, size)

    def index_at_position(self, position: int) -> int | None:
        """The index of the entry whose record starts at ``position``, or None."""
        with self._lock:
            return self._cols.index_at_position(position)

    def entry_containing(self, position: int) -> tuple[int, int] | None:
        """(index, record position) of the entry whose record holds ``position``, or None."""
        with self._lock:
            return self._cols.entry_containing(position)

    def segments(self) -> list[SegmentInfo]:
        """The segment files (oldest first), for age/size retention decided by the caller."""
        return self._files.segments()

    # -- internals -----------------------------------------------------------------
    def _read_run(self, i0: int, i1: int) -> list[Entry]:
        """The entries of slots ``i0..i1-1``, whose records are contiguous: one read."""
        cols = self._cols
        start = cols.positions[i0]
        data = self._files.read(start, cols.positions[i1 - 1] + cols.size(i1 - 1) - start)
        result = []
        for i in range(i0, i1):
            position = cols.positions[i]
            try:
                entry = decode_entry(data, position - start, position)
            except FormatError as e:
                raise self._corrupt(position, f"entry {cols.first + i}: {e}") from None
            if entry.index != cols.first + i or entry.term != cols.terms[i]:
                raise self._corrupt(position, f"record holds index {entry.index} term "
                                    f"{entry.term}, expected {cols.first + i} / {cols.terms[i]}")
            result.append(entry)
        return result

    def _corrupt(self, position: int, reason: str) -> CorruptLogError:
        path, offset = self._files.locate(position)
        return CorruptLogError(f"corrupt CommitLog record in segment file {path} at offset "
                               f"{offset} (position {position}): {reason}. {REPAIR_HINT} "
                               "(repair verifies the CRC of every record.)")
