"""A minimal state machine that records what it applied: the log node's default.

Layout of ``applied.log`` (one fixed-size record per applied entry)::

    ┌───────────────┬───────────────┬──────────┬──────────┬──────────┐
    │ index (8)     │ term (8)      │ kind (1) │ pad (3)  │ crc (4)  │  = 24 bytes
    └───────────────┴───────────────┴──────────┴──────────┴──────────┘

A record of kind ``GAP_KIND`` (0xFF) says that every index up to its own was
deleted by retention before this node received it.

The applied index is the index of the last whole record, so the state and the
applied index are persisted together by one append; a torn last record is cut
on open. Tests read the file to check exactly-once, in-order application.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path

from dledger.storage.entry_format import Entry

__all__ = ["GAP_KIND", "RECORD", "RecordingMachine", "read_records"]

RECORD = struct.Struct(">QQB3xI")
assert RECORD.size == 24
GAP_KIND = 0xFF  # "everything up to this index was deleted before it reached this node"


class RecordingMachine:
    """Appends one record per applied entry; fsyncs each applied batch."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        size = os.fstat(self._fd).st_size
        whole = size - size % RECORD.size
        if whole != size:
            os.ftruncate(self._fd, whole)
        self._applied = 0
        if whole:
            last = os.pread(self._fd, RECORD.size, whole - RECORD.size)
            self._applied = RECORD.unpack(last)[0]
        os.lseek(self._fd, whole, os.SEEK_SET)

    def applied_index(self) -> int:
        return self._applied

    def apply(self, entries: Sequence[Entry]) -> None:
        out = bytearray()
        for e in entries:
            if e.index != self._applied + 1:
                raise RuntimeError(f"apply out of order: {e.index} after {self._applied}")
            out += RECORD.pack(e.index, e.term, e.kind, zlib.crc32(e.body))
            self._applied = e.index
        os.write(self._fd, out)
        os.fsync(self._fd)

    def apply_gap(self, first_index: int) -> None:
        """Record that entries up to ``first_index - 1`` were never received (kind GAP)."""
        os.write(self._fd, RECORD.pack(first_index - 1, 0, GAP_KIND, 0))
        os.fsync(self._fd)
        self._applied = first_index - 1

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def read_records(path: Path) -> list[tuple[int, int, int, int]]:
    """All whole records of an ``applied.log`` as (index, term, kind, crc)."""
    data = path.read_bytes()
    usable = len(data) - len(data) % RECORD.size
    return [RECORD.unpack_from(data, off) for off in range(0, usable, RECORD.size)]
