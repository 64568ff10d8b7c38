"""CommitLog: the Raft log, stored as the broker's CommitLog (DLedger style).

Entries have contiguous Raft indexes ``first_index..last_index``; each is one
record (``entry_format``) at a fixed absolute position in a ``SegmentedFile``.
Only ``(position, term, kind, body length)`` per entry is kept in memory, in
flat arrays indexed by ``index - first_index``; bodies are read from disk::

    index:      first_index   first_index+1   ...   last_index
    positions:  [    0     ][     48       ] ...  [ 8192      ]   array('q')
    terms:      [    1     ][      1       ] ...  [    3      ]   array('q')
    body lens:  [   13     ][     80       ] ...  [    0      ]   array('q')
    kinds:      [  NOOP    ][    DATA      ] ...  [  NOOP     ]   array('B')

Recovery (on open) scans the records from the first segment. Older segments
are checked by their 32-byte headers only (magic, kind, size, contiguous
index); the last segment's bodies are read and CRC-checked too. A bad record
with nothing valid after it is a torn tail (never fsynced, so never
acknowledged) and is cut. A bad record followed by a valid one is mid-log
corruption: ``CorruptLogError``, unless ``repair=True``, which verifies every
record's CRC and cuts the log at the first bad one (Raft then re-fetches the
rest from the peers). A bad body CRC in an older segment is therefore found
when the entry is read (``CorruptLogError``), or by a repair run.

Reset (``reset``): a follower whose next entry the leader has already deleted
throws its log away and restarts it at the leader's first retained entry, at
the same position as on the leader (DLedger's truncate to the leader's begin
index), so positions keep naming the same entries on every replica. The start
is recorded in ``LOG_START`` (``dledger.storage.log_start_marker``: its layout, the
steps of a reset and why a crash at any of them recovers as the reset log).
Recovery's scan of the records is ``dledger.storage.log_scan``.
"""

from __future__ import annotations

import logging
import threading
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from common.durable_file import atomic_write, fsync_directory, read_or_none
from dledger.storage.entry_format import (
    ALIGN,
    Entry,
    EntryKind,
    FormatError,
    decode_entry,
    encode_entry,
    record_size,
)
from dledger.storage.log_scan import scan_segment, valid_record_after
from dledger.storage.log_start_marker import (
    MAGIC_START,
    MAGIC_START_PENDING,
    START_MARKER,
    StartMarker,
    check_start,
    decode_start_marker,
    encode_start_marker,
)
from dledger.storage.segments import CorruptLogError, SegmentedFile, SegmentInfo

__all__ = [
    "MAGIC_START",
    "MAGIC_START_PENDING",
    "START_MARKER",
    "CommitLog",
    "CorruptLogError",
    "LogGap",
    "RecoveryReport",
    "StartMarker",
    "decode_start_marker",
    "encode_start_marker",
]

log = logging.getLogger("dledger.commitlog")

_REPAIR_HINT = ("Restart the node with repair enabled (--repair-log, repair=True) to cut the "
                "log at this point and re-fetch the rest from its peers.")


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What recovery found: entries kept, and where (if anywhere) the log was cut.

    ``finished_reset`` is True when recovery completed a ``reset`` that a crash
    had interrupted (the log is then empty at the reset start).
    """

    entries: int
    cut_at: int | None
    cut_bytes: int
    finished_reset: bool = False
    #: the cut was a repair's (valid records followed the bad one: entries once fsynced are gone)
    repaired: bool = False


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
        self._first = 0
        self._positions = array("q")
        self._terms = array("q")
        self._lens = array("q")
        self._kinds = array("B")
        # While the segment holding a reset start is the first one: that start.
        self._reset_index = 0
        self._reset_position = 0
        self._files, finished = self._open_files(directory, segment_size)
        try:
            report = self._recover(repair)
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
            return self._first if self._positions else 0

    @property
    def last_index(self) -> int:
        with self._lock:
            return self._last()

    @property
    def last_term(self) -> int:
        with self._lock:
            return self._terms[-1] if self._terms else 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._positions)

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
            return 0 if self._positions else self._reset_index

    def append(self, index: int, term: int, kind: EntryKind, body: bytes) -> int:
        """Append one entry and return its position (durable after ``flush``).

        ``index`` must be ``last_index + 1``; when the log is empty, the reset
        start index if the log was reset (see ``reset``), else any index >= 1.
        Raises ValueError otherwise, or for a body that does not fit in a
        segment; OSError from the file system (the entry is then not appended).
        """
        record = encode_entry(index, term, EntryKind(kind), body)
        with self._lock:
            expected = self._last() + 1 if self._positions else self._reset_index
            if expected and index != expected:
                raise ValueError(f"append of index {index}: expected {expected}")
            position = self._files.append(record)
            self._push(position, index, term, kind, len(body))
            return position

    def truncate_from(self, index: int) -> None:
        """Remove entry ``index`` and every later one (no-op past ``last_index``).

        Raises IndexError below ``first_index``. Durable at the next ``flush``.
        """
        with self._lock:
            if not self._positions or index > self._last():
                return
            i = self._slot(index)
            # Cut at the end of the entry before, not at this entry's position: an entry
            # that rolled the segment has a blank before it, and the next append must
            # land where a log that never held the entry would put it (positions are
            # the same on every replica: ConsumeQueue units name them).
            end = self._positions[i - 1] + self._size(i - 1) if i else self._positions[0]
            self._files.truncate(end)
            for arr in (self._positions, self._terms, self._lens, self._kinds):
                del arr[i:]

    def delete_before(self, index: int) -> int:
        """Retention: delete whole segments all of whose entries are below ``index``.

        The last segment is never deleted; positions of the remaining entries do
        not change. Returns how many entries were dropped.
        """
        with self._lock:
            if self._positions and index <= self._first:
                return 0
            if self._positions and index <= self._last():
                bound = self._positions[index - self._first]
            else:
                bound = self._files.write_position
            self._files.delete_segments_before(bound)
            start = self._files.start_position
            if self._reset_index and start != self._reset_position:
                self._reset_index = 0  # the reset segment is gone: LOG_START is stale
            dropped = bisect_left(self._positions, start)
            for arr in (self._positions, self._terms, self._lens, self._kinds):
                del arr[:dropped]
            self._first += dropped
            return dropped

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
            for arr in (self._positions, self._terms, self._lens, self._kinds):
                del arr[:]
            self._first = 0
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
            i = self._slot(index)
            return self._read_run(i, i + 1)[0]

    def term_at(self, index: int) -> int:
        return self._column_at(self._terms, index)

    def kind_at(self, index: int) -> EntryKind:
        return EntryKind(self._column_at(self._kinds, index))

    def position_of(self, index: int) -> int:
        return self._column_at(self._positions, index)

    def record_size_of(self, index: int) -> int:
        return record_size(self._column_at(self._lens, index))

    def _column_at(self, column: Sequence[int], index: int) -> int:
        """Entry ``index``'s value in one of the per-entry columns (IndexError if not held)."""
        with self._lock:
            return column[self._slot(index)]

    def entries(self, from_index: int, max_bytes: int,
                upto_index: int | None = None) -> list[Entry]:
        """Consecutive entries from ``from_index``, never past ``upto_index`` (or last).

        Returns at least one entry if ``from_index`` exists, then more while the
        total body bytes stay within ``max_bytes``; ``[]`` when ``from_index`` is
        past the end. Contiguous records are read with one pread per segment.
        Raises IndexError if ``from_index`` was deleted (below first_index),
        CorruptLogError on a bad record.
        """
        with self._lock:
            last = self._last() if upto_index is None else min(upto_index, self._last())
            if not self._positions or from_index > last:
                return []
            i0 = self._slot(from_index)
            stop, total = i0 + 1, self._lens[i0]
            while stop <= last - self._first and total + self._lens[stop] <= max_bytes:
                total += self._lens[stop]
                stop += 1
            result: list[Entry] = []
            run = i0
            for i in range(i0 + 1, stop + 1):
                if i == stop or self._positions[i] != self._positions[i - 1] + self._size(i - 1):
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
            i = bisect_left(self._positions, position)
            if i < len(self._positions) and self._positions[i] == position:
                return self._first + i
            return None

    def entry_containing(self, position: int) -> tuple[int, int] | None:
        """(index, record position) of the entry whose record holds ``position``, or None."""
        with self._lock:
            i = bisect_right(self._positions, position) - 1
            if i < 0:
                return None
            start = self._positions[i]
            if position >= start + record_size(self._lens[i]):
                return None
            return self._first + i, start

    def segments(self) -> list[SegmentInfo]:
        """The segment files (oldest first), for age/size retention decided by the caller."""
        return self._files.segments()

    # -- internals -----------------------------------------------------------------
    def _last(self) -> int:
        return self._first + len(self._positions) - 1 if self._positions else 0

    def _slot(self, index: int) -> int:
        if not self._positions or not self._first <= index <= self._last():
            first = self._first if self._positions else 0
            raise IndexError(f"index {index} outside [{first}, {self._last()}]")
        return index - self._first

    def _size(self, i: int) -> int:
        return record_size(self._lens[i])

    def _push(self, position: int, index: int, term: int, kind: int, body_len: int) -> None:
        if not self._positions:
            self._first = index
        self._positions.append(position)
        self._terms.append(term)
        self._lens.append(body_len)
        self._kinds.append(kind)

    def _read_run(self, i0: int, i1: int) -> list[Entry]:
        start = self._positions[i0]
        data = self._files.read(start, self._positions[i1 - 1] + self._size(i1 - 1) - start)
        result = []
        for i in range(i0, i1):
            position = self._positions[i]
            try:
                entry = decode_entry(data, position - start, position)
            except FormatError as e:
                raise self._corrupt(position, f"entry {self._first + i}: {e}") from None
            if entry.index != self._first + i or entry.term != self._terms[i]:
                raise self._corrupt(position, f"record holds index {entry.index} term "
                                    f"{entry.term}, expected {self._first + i} / {self._terms[i]}")
            result.append(entry)
        return result

    def _corrupt(self, position: int, reason: str) -> CorruptLogError:
        path, offset = self._files.locate(position)
        return CorruptLogError(f"corrupt CommitLog record in segment file {path} at offset "
                               f"{offset} (position {position}): {reason}. {_REPAIR_HINT} "
                               "(repair verifies the CRC of every record.)")

    # -- recovery ------------------------------------------------------------------
    def _open_files(self, directory: Path, segment_size: int) -> tuple[SegmentedFile, bool]:
        """Open the segments as ``LOG_START`` says; True if an interrupted reset was finished."""
        if segment_size < ALIGN or segment_size % ALIGN:
            raise ValueError(f"segment_size must be a positive multiple of {ALIGN}")
        directory.mkdir(parents=True, exist_ok=True)
        data = read_or_none(self._marker_path)
        if data is None:
            return SegmentedFile(directory, segment_size), False
        try:
            marker = decode_start_marker(data)
        except FormatError as e:
            raise CorruptLogError(f"unreadable log start marker {self._marker_path}: {e}") from None
        if not marker.complete:
            log.warning("finishing a log reset interrupted by a crash: the log restarts at index "
                        "%d, position %d (every segment file is deleted)",
                        marker.index, marker.position)
            files = SegmentedFile(directory, segment_size, marker.position, discard_existing=True)
        else:
            files = SegmentedFile(directory, segment_size, marker.position)
        try:
            if not marker.complete:
                atomic_write(self._marker_path,
                             encode_start_marker(marker.index, marker.position, complete=True))
            if files.start_position == marker.position:
                self._reset_index, self._reset_position = marker.index, marker.position
            else:  # stale: retention deleted the reset segment; make that durable first
                fsync_directory(directory)
                self._marker_path.unlink(missing_ok=True)
        except BaseException:
            files.close()
            raise
        return files, not marker.complete

    def _recover(self, repair: bool) -> RecoveryReport:
        infos = self._files.segments()
        start = self._files.start_position
        bad = None
        for k, info in enumerate(infos):
            bad = scan_segment(self._files, info, max(info.start, start), deep=repair or k == len(infos) - 1,
                               is_last=k == len(infos) - 1, expected=self._next_expected,
                               found=lambda pos, h: self._push(pos, h.index, h.term, h.kind, h.body_len))
            if bad is not None:
                break
        if bad is None:
            return RecoveryReport(len(self._positions), None, 0)
        path, offset = self._files.locate(bad.position)
        min_index = self._last() + 1 if self._positions else max(1, self._reset_index)
        follower = valid_record_after(self._files, bad.position, min_index)
        where = f"segment file {path} at offset {offset} (position {bad.position})"
        if follower is not None and not repair:
            raise CorruptLogError(
                f"corrupt CommitLog record in {where}: {bad.reason}; a valid record follows at "
                f"position {follower}, so this is not a torn tail. {_REPAIR_HINT}")
        end = self._files.write_position
        self._files.truncate(bad.position)
        self._files.flush()
        what = "repair: cut corrupt log" if follower is not None else "cut torn log tail"
        log.warning("%s in %s: %s; %d bytes removed, last index now %d",
                    what, where, bad.reason, end - bad.position, self._last())
        return RecoveryReport(len(self._positions), bad.position, end - bad.position,
                              repaired=follower is not None)

    def _next_expected(self) -> int | None:
        """The index the next record recovered must have (None: any, an empty log)."""
        return self._last() + 1 if self._positions else self._reset_index or None
