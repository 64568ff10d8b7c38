"""``LOG_START``: where a CommitLog restarted, after a follower's log was reset to the
leader's retained start (``CommitLog.reset``).

A follower whose next entry the leader has already deleted
throws its log away and restarts it at the leader's first retained entry, at
the same position as on the leader (DLedger's truncate to the leader's begin
index), so positions keep naming the same entries on every replica. The start
is recorded in the file ``LOG_START`` (24 bytes, big-endian, replaced with
``durable_file.atomic_write``)::

    ┌───────────┬─────────────────┬────────────────────┬───────────┐
    │ magic (4) │ start_index (8) │ start_position (8) │ crc32 (4) │
    └───────────┴─────────────────┴────────────────────┴───────────┘

* ``magic`` is ``MAGIC_START_PENDING`` while the reset is under way and
  ``MAGIC_START`` once it is complete;
* ``crc32`` is ``zlib.crc32`` of the 20 bytes before it.

``reset`` steps (1 is durable before 2 starts; 2-3 are made durable by 4, before 5)::

    1. LOG_START := PENDING(index, position)       the decision; nothing deleted yet
    2. delete every segment file                   ─┐ SegmentedFile.reset; the new
    3. create the segment holding position,         │ file and the directory are
       ftruncate'd to it (a sparse hole before)     │ fsynced
    4. fsync the new file and the directory        ─┘
    5. LOG_START := START(index, position)          the reset is complete

Crash safety: a reset interrupted at any point recovers as the RESET log, never
the old one. A PENDING marker means steps 2-4 may be partly done (any subset of
old segments left, the new file missing or short), so recovery redoes them
(deleting whatever segment files are there) and then writes step 5; the old log
cannot be kept in general, since after step 2 began it may have lost any of its
segments. Rolling forward is also what Raft wants: the leader has already
decided that this node restarts at ``index``. A crash before step 1 is durable
leaves the old marker (or none) and the untouched old log. The two magics make
the state explicit, so recovery never has to guess from the records whether a
segment is old or new, and a corrupt first record of a completed reset is
treated as corruption (cut as a torn tail, or ``CorruptLogError``), not as
an unfinished reset.

A complete marker is honoured while its position lies in the first segment:
recovery scans from that position and the first record must be ``index`` (with
no record there the log is empty, and the next append must be ``index``). When
retention has since deleted that segment (position below the first segment),
the marker is stale: ignored, and deleted once the directory is fsynced. A
complete marker past the end of the first segment cannot come from ``reset``
(step 5 follows the durable deletion of every older segment):
``CorruptLogError``.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from dledger.storage.entry_format import ALIGN, FormatError

__all__ = ["MAGIC_START", "MAGIC_START_PENDING", "START_MARKER", "StartMarker", "check_start",
           "decode_start_marker", "encode_start_marker"]

START_MARKER = "LOG_START"
"""File name of the log-start marker in the CommitLog directory."""
MAGIC_START = 0xD1ED5751
MAGIC_START_PENDING = 0xD1ED5750
_MARKER = struct.Struct(">IQQI")
assert _MARKER.size == 24
_I63 = (1 << 63) - 1  # the index arrays are signed 64-bit


@dataclass(frozen=True, slots=True)
class StartMarker:
    """A decoded ``LOG_START``: the log restarts at ``index`` at ``position``."""

    index: int
    position: int
    complete: bool


def check_start(index: int, position: int) -> None:
    """ValueError unless ``index`` and ``position`` can start a log (index >= 1, position aligned)."""
    if not 1 <= index <= _I63:
        raise ValueError(f"start index {index} must be in [1, 2**63)")
    if not 0 <= position <= _I63 or position % ALIGN:
        raise ValueError(f"start position {position} must be >= 0 and a multiple of {ALIGN}")


def encode_start_marker(index: int, position: int, *, complete: bool) -> bytes:
    """The 24 bytes of ``LOG_START`` (see the module docstring). Raises ValueError."""
    check_start(index, position)
    magic = MAGIC_START if complete else MAGIC_START_PENDING
    head = _MARKER.pack(magic, index, position, 0)[:-4]
    return head + zlib.crc32(head).to_bytes(4, "big")


def decode_start_marker(data: bytes) -> StartMarker:
    """Decode ``LOG_START``; raises FormatError for a bad length, magic, CRC or field."""
    if len(data) != _MARKER.size:
        raise FormatError(f"log start marker of {len(data)} bytes, expected {_MARKER.size}")
    magic, index, position, crc = _MARKER.unpack(data)
    if magic not in (MAGIC_START, MAGIC_START_PENDING):
        raise FormatError(f"bad log start marker magic 0x{magic:08x}")
    if zlib.crc32(data[:-4]) != crc:
        raise FormatError("log start marker CRC mismatch")
    try:
        check_start(index, position)
    except ValueError as e:
        raise FormatError(str(e)) from None
    return StartMarker(index, position, magic == MAGIC_START)
