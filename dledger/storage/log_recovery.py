"""How a ``CommitLog`` is opened and recovered (``dledger.storage.commitlog``).

``open_files`` opens the segments where ``LOG_START`` (``dledger.storage.log_start_marker``)
says the log starts, finishing a reset a crash interrupted. ``recover`` then scans the
records from the first segment (``dledger.storage.log_scan``) into the ``EntryColumns``.
Older segments are checked by their 32-byte headers only (magic, kind, size, contiguous
index); the last segment's bodies are read and CRC-checked too. A bad record with nothing
valid after it is a torn tail (never fsynced, so never acknowledged) and is cut. A bad
record followed by a valid one is mid-log corruption: ``CorruptLogError``, unless
``repair``, which verifies every record's CRC and cuts the log at the first bad one (Raft
then re-fetches the rest from the peers). A bad body CRC in an older segment is therefore
found when the entry is read (``CorruptLogError``), or by a repair run.

Runs while the ``CommitLog`` is being constructed: nothing else holds the files yet.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from common.durable_file import atomic_write, fsync_directory, read_or_none
from dledger.storage.entry_columns import EntryColumns
from dledger.storage.entry_format import ALIGN, FormatError
from dledger.storage.log_scan import scan_segment, valid_record_after
from dledger.storage.log_start_marker import decode_start_marker, encode_start_marker
from dledger.storage.segments import CorruptLogError, SegmentedFile

__all__ = ["REPAIR_HINT", "RecoveryReport", "open_files", "recover"]

log = logging.getLogger("dledger.commitlog")

REPAIR_HINT = ("Restart the node with repair enabled (--repair-log, repair=True) to cut the "
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


def open_files(directory: Path, segment_size: int,
               marker_path: Path) -> tuple[SegmentedFile, tuple[int, int] | None, bool]:
    """The segments opened as ``LOG_START`` at ``marker_path`` says: (the files, the reset
    start ``(index, position)`` while its segment is still the first one, else None, whether
    an interrupted reset was finished). Raises ValueError for a bad ``segment_size``,
    CorruptLogError for an unreadable marker, OSError."""
    if segment_size < ALIGN or segment_size % ALIGN:
        raise ValueError(f"segment_size must be a positive multiple of {ALIGN}")
    directory.mkdir(parents=True, exist_ok=True)
    data = read_or_none(marker_path)
    if data is None:
        return SegmentedFile(directory, segment_size), None, False
    try:
        marker = decode_start_marker(data)
    except FormatError as e:
        raise CorruptLogError(f"unreadable log start marker {marker_path}: {e}") from None
    if not marker.complete:
        log.warning("finishing a log reset interrupted by a crash: the log restarts at index "
                    "%d, position %d (every segment file is deleted)",
                    marker.index, marker.position)
        files = SegmentedFile(directory, segment_size, marker.position, discard_existing=True)
    else:
        files = SegmentedFile(directory, segment_size, marker.position)
    reset = None
    try:
        if not marker.complete:
            atomic_write(marker_path, encode_start_marker(marker.index, marker.position, complete=True))
        if files.start_position == marker.position:
            reset = (marker.index, marker.position)
        else:  # stale: retention deleted the reset segment; make that durable first
            fsync_directory(directory)
            marker_path.unlink(missing_ok=True)
    except BaseException:
        files.close()
        raise
    return files, reset, not marker.complete


def recover(files: SegmentedFile, columns: EntryColumns, reset_index: int, repair: bool) -> RecoveryReport:
    """Scan every segment's records into ``columns`` (empty), cutting a torn tail, or under
    ``repair`` a corrupt one; ``reset_index``: the index a reset log starts at (0: none).
    Raises CorruptLogError for mid-log corruption without ``repair``, OSError."""
    def next_expected() -> int | None:
        """The index the next record recovered must have (None: any, an empty log)."""
        return columns.last() + 1 if columns else reset_index or None

    infos = files.segments()
    start = files.start_position
    bad = None
    for k, info in enumerate(infos):
        bad = scan_segment(files, info, max(info.start, start), deep=repair or k == len(infos) - 1,
                           is_last=k == len(infos) - 1, expected=next_expected,
                           found=lambda pos, h: columns.push(pos, h.index, h.term, h.kind, h.body_len))
        if bad is not None:
            break
    if bad is None:
        return RecoveryReport(len(columns), None, 0)
    path, offset = files.locate(bad.position)
    min_index = columns.last() + 1 if columns else max(1, reset_index)
    follower = valid_record_after(files, bad.position, min_index)
    where = f"segment file {path} at offset {offset} (position {bad.position})"
    if follower is not None and not repair:
        raise CorruptLogError(
            f"corrupt CommitLog record in {where}: {bad.reason}; a valid record follows at "
            f"position {follower}, so this is not a torn tail. {REPAIR_HINT}")
    end = files.write_position
    files.truncate(bad.position)
    files.flush()
    what = "repair: cut corrupt log" if follower is not None else "cut torn log tail"
    log.warning("%s in %s: %s; %d bytes removed, last index now %d",
                what, where, bad.reason, end - bad.position, columns.last())
    return RecoveryReport(len(columns), bad.position, end - bad.position, repaired=follower is not None)
