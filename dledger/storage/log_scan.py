"""Recovery's scan of a CommitLog's records (``CommitLog`` on open; the record layout:
``dledger.storage.entry_format``).

    scan_segment(files, info, pos, ...)   the segment's valid entries from ``pos``, each
                                          handed to ``found``; the first bad record, if any
    valid_record_after(files, pos, min)   where a fully valid entry record follows a bad
                                          one (then it is mid-log corruption, not a torn tail)

A segment is scanned by its 32-byte headers (magic, kind, size, index and term in range,
contiguous index), and with ``deep`` its records' CRCs too (header fields and body; the
last segment always, every one under repair). It ends with a blank record padding it to
the segment size; the last segment's file may end earlier (it is being written).

Pure reads of the files: nothing here changes them; the caller holds whatever lock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dledger.storage.entry_format import (
    ALIGN,
    HEADER_SIZE,
    MAGIC_PREFIX,
    EntryHeader,
    FormatError,
    decode_header,
    record_damage,
)
from dledger.storage.segments import SegmentedFile, SegmentInfo

__all__ = ["BadRecord", "scan_segment", "valid_record_after"]

_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class BadRecord:
    """The first record recovery cannot keep: where, and why."""

    position: int
    reason: str


class _Reader:
    """Recovery reads of one segment: whole chunks (``chunk`` > 32) or single headers."""

    __slots__ = ("_base", "_buf", "_chunk", "_files")

    def __init__(self, files: SegmentedFile, chunk: int) -> None:
        self._files, self._chunk, self._base, self._buf = files, chunk, 0, b""

    def get(self, position: int, n: int) -> bytes:
        lo = position - self._base
        if lo < 0 or lo + n > len(self._buf):
            self._base, lo = position, 0
            self._buf = self._files.read_available(position, max(n, self._chunk))
        return self._buf[lo:lo + n]


def scan_segment(files: SegmentedFile, info: SegmentInfo, pos: int, *, deep: bool, is_last: bool,
                 expected: Callable[[], int | None],
                 found: Callable[[int, EntryHeader], None]) -> BadRecord | None:
    """Hand each valid entry of the segment from ``pos`` on to ``found(position, header)``;
    return the first bad record (None: the segment is whole). ``expected()``: the index the
    next entry must have (None: any index >= 1, an empty log with no reset start)."""
    seg_end = info.start + files.segment_size
    file_end = info.start + info.size_on_disk
    reader = _Reader(files, _CHUNK if deep else HEADER_SIZE)
    while pos < seg_end:
        if pos >= file_end:
            return None if is_last else BadRecord(pos, "segment file ends without blank padding")
        try:
            header = decode_header(reader.get(pos, HEADER_SIZE))
        except FormatError as e:
            return BadRecord(pos, str(e))
        if header.is_blank:
            return _check_blank(header, pos, seg_end, file_end, is_last)
        problem = _check_entry(header, pos, seg_end, file_end, expected())
        if problem is None and deep:
            damage = record_damage(header, reader.get(pos + HEADER_SIZE, header.size - HEADER_SIZE))
            if damage is not None:
                problem = f"{damage} in entry {header.index}" if "CRC" in damage else damage
        if problem is not None:
            return BadRecord(pos, problem)
        found(pos, header)
        pos += header.size
    return None


def _check_blank(header: EntryHeader, pos: int, seg_end: int, file_end: int,
                 is_last: bool) -> BadRecord | None:
    if header.size != seg_end - pos:
        return BadRecord(pos, f"blank record of {header.size} bytes, {seg_end - pos} bytes "
                         "before the segment end")
    if is_last and file_end < seg_end:
        return BadRecord(pos, "incomplete segment roll (blank record not extended)")
    return None


def _check_entry(header: EntryHeader, pos: int, seg_end: int, file_end: int,
                 expected: int | None) -> str | None:
    if pos + header.size > seg_end:
        return f"record of {header.size} bytes runs past the segment end"
    if expected is None and header.index < 1:
        return f"index {header.index}"
    if expected is not None and header.index != expected:
        return f"index {header.index} where {expected} was expected"
    if pos + header.size > file_end:
        return f"short record: {file_end - pos} of {header.size} bytes on disk"
    return None


def valid_record_after(files: SegmentedFile, position: int, min_index: int) -> int | None:
    """Position of a fully valid entry record (index >= ``min_index``) after ``position``, if
    any (the error path: it reads every segment from there)."""
    for info in files.segments():
        pos = max(info.start, position + ALIGN)
        end = info.start + info.size_on_disk
        while pos < end:
            chunk = files.read_available(pos, _CHUNK)
            if not chunk:
                break
            hit = chunk.find(MAGIC_PREFIX)
            while hit >= 0:
                if hit % ALIGN == 0 and _valid_at(files, pos + hit, info.start, min_index):
                    return pos + hit
                hit = chunk.find(MAGIC_PREFIX, hit + 1)
            pos += len(chunk)
    return None


def _valid_at(files: SegmentedFile, position: int, seg_start: int, min_index: int) -> bool:
    try:
        header = decode_header(files.read_available(position, HEADER_SIZE))
    except FormatError:
        return False
    seg_end = seg_start + files.segment_size
    if header.index < min_index or position + header.size > seg_end:
        return False
    record = files.read_available(position, header.size)
    if len(record) < header.size:
        return False
    return record_damage(header, record[HEADER_SIZE:header.size]) is None
