"""The IndexFile's on-disk layout: a hash table from message keys to CommitLog positions.

As RocketMQ's IndexFile: a hash table laid out in one fixed-size file, with chaining
through the entries. ``slot_num`` slots hold the number of the newest entry whose key
hashes to them; each entry links to the previous entry of its slot. All integers
big-endian::

    ┌──────────────────────────────────── header, 40 bytes ───────────────────────────────────┐
    │ begin_timestamp i64 │ end_timestamp i64 │ begin_position i64 │ end_position i64 │
    │ hash_slot_count i32 │ index_count i32 │
    ├──────────────────────────────── slots, slot_num x 4 bytes ──────────────────────────────┤
    │ slot 0: newest entry number (i32, 0 = empty) │ slot 1 │ ... │ slot slot_num-1 │
    ├──────────────────────────────── entries, index_num x 20 bytes ──────────────────────────┤
    │ entry 0: geometry stamp  "RMQI" │ slot_num i32 │ index_num i32 │ 8 zero bytes │
    │ entry n: key_hash i32 │ position i64 │ time_diff i32 │ prev_index i32 │   n = 1 .. index_num-1
    └─────────────────────────────────────────────────────────────────────────────────────────┘

* ``key_hash = mmh3.hash(key, signed=False) & 0x7FFFFFFF``; its slot is ``key_hash % slot_num``.
* Entry numbers start at 1, so 0 means "none" in a slot or a ``prev_index``; a file
  holds ``index_num - 1`` entries. Entry 0 is never an entry: it holds the geometry the
  file was created with, so that opening it with other sizes is detected instead of
  misread.
* Timestamps are the leader's store times in ms since the epoch, carried in the entry.
  ``begin_*`` are those of the first put; ``end_position`` is the last put's;
  ``end_timestamp`` is the largest store time put (the last one's, as store times do
  not decrease). ``time_diff = (ts - begin_timestamp) // 1000``: whole seconds, floored,
  so an entry's time is known to be in ``[t0, t0 + 999]`` with
  ``t0 = begin_timestamp + 1000 * time_diff`` (clamped to i32; 68 years).
* ``hash_slot_count`` counts the slots in use; ``index_count`` the entries (0 in a new
  file, whose header is all zeros).

A directory of IndexFiles (``broker/store/index_service.py``) names them by a sequence number
(``00000000000000000000``, ``...01``, ...), never by time; its first files are smaller
(``geometry_of``).

Everything here is pure; ``broker/store/index_file.py`` maps one file, ``broker/store/index_service.py``
keeps the directory.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import mmh3

from dledger.storage.numbered_files import number_name

__all__ = [
    "DEFAULT_INDEX_NUM",
    "DEFAULT_SLOT_NUM",
    "ENTRY",
    "ENTRY_SIZE",
    "GEOMETRY",
    "GRADED_FILES",
    "HEADER",
    "HEADER_SIZE",
    "MAGIC",
    "SLOT",
    "SLOT_SIZE",
    "TIME_UNIT_MS",
    "IndexFileCorrupt",
    "IndexHeader",
    "check_geometry",
    "geometry_of",
    "index_file_name",
    "index_file_size",
    "key_hash",
    "time_diff",
]

HEADER = struct.Struct(">qqqqii")
HEADER_SIZE = 40
assert HEADER.size == HEADER_SIZE
SLOT = struct.Struct(">i")
SLOT_SIZE = 4
assert SLOT.size == SLOT_SIZE
ENTRY = struct.Struct(">iqii")
ENTRY_SIZE = 20
assert ENTRY.size == ENTRY_SIZE
GEOMETRY = struct.Struct(">4sii8x")
assert GEOMETRY.size == ENTRY_SIZE
MAGIC = b"RMQI"

DEFAULT_SLOT_NUM = 5_000_000
DEFAULT_INDEX_NUM = 20_000_000
TIME_UNIT_MS = 1000
"""Entries keep their time to the second (``time_diff``), as RocketMQ's do."""

#: Files 0, 1, 2 of an IndexService are 1/64, 1/16, 1/4 of its geometry; later ones whole.
GRADED_FILES = 3

_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1


class IndexFileCorrupt(Exception):
    """A file that is not a well-formed IndexFile of the expected geometry; names the file."""


@dataclass(frozen=True, slots=True)
class IndexHeader:
    begin_timestamp: int
    end_timestamp: int
    begin_position: int
    end_position: int
    hash_slot_count: int
    index_count: int


def key_hash(key: str) -> int:
    """The 31-bit hash an entry stores for ``key``. Pure and thread-safe."""
    return mmh3.hash(key, signed=False) & 0x7FFFFFFF


def time_diff(ts_ms: int, begin_ms: int) -> int:
    """An entry's ``time_diff``: whole seconds from the file's begin_timestamp, clamped to i32."""
    return min(max((ts_ms - begin_ms) // TIME_UNIT_MS, _I32_MIN), _I32_MAX)


index_file_name = number_name
"""The name of an IndexService's file of a sequence number: 20 digits, zero-padded."""


def index_file_size(slot_num: int, index_num: int) -> int:
    """Bytes in an IndexFile of this geometry."""
    return HEADER_SIZE + slot_num * SLOT_SIZE + index_num * ENTRY_SIZE


def geometry_of(sequence: int, slot_num: int, index_num: int) -> tuple[int, int]:
    """(slot_num, index_num) of an IndexService's file number ``sequence``. Pure."""
    shrink = 4 ** max(0, GRADED_FILES - sequence)
    return max(1, slot_num // shrink), max(2, index_num // shrink)


def check_geometry(slot_num: int, index_num: int) -> None:
    """Raises ValueError unless the geometry fits the layout's i32 fields."""
    if not 1 <= slot_num <= _I32_MAX:
        raise ValueError(f"slot_num must be in 1..2**31-1, not {slot_num}")
    if not 2 <= index_num <= _I32_MAX:
        raise ValueError(f"index_num must be in 2..2**31-1 (entry 0 is reserved), not {index_num}")
