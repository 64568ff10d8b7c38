"""The ConsumeQueue's on-disk layout: 20-byte units in files of ``units_per_file``.

A queue (one topic, one queue id) is an array of fixed 20-byte units, one per message,
addressed by the message's queue offset (0, 1, 2, ...). A unit says where the message's
bytes are in the CommitLog and carries the hash of its tag for the broker's tag filter
(as RocketMQ's ConsumeQueue)::

    ┌──────────────────────────┬──────────────────┬───────────────────┐
    │ CommitLog position (i64) │ message size i32 │ tag hash (i64)    │   big-endian, 20 bytes
    └──────────────────────────┴──────────────────┴───────────────────┘

The units are stored in files of ``units_per_file`` units, each named by the queue
offset of its first unit, 20 digits, zero-padded (here 4 units a file); file boundaries
are multiples of ``units_per_file``::

    consumequeue/<topic directory>/<queue_id>/
      00000000000000000000   [u0][u1][u2][u3]     full
      00000000000000000004   [u4][u5][u6][u7]     full
      00000000000000000008   [u8][u9]             last: extended unit by unit
                                     ▲ max_offset = 10

Files are never preallocated: a file's length is 20 x its units. A queue that begins at
offset N (a replica restored from a snapshot starts at the peers' numbering) has a first
file named N, which ends at the next multiple of ``units_per_file``::

      00000000000000000006   [u6][u7]             first, starts at 6: holds 6..7
      00000000000000000008   [u8][u9]             aligned from here on

A size of 0 is never written, so trailing all-zero units are not units (a crash can
leave a file extended with zeros: ``used_units``).

The topic directory is the topic's name when it has at most ``TOPIC_DIR_MAX``
characters (every user topic); a longer one (``%RETRY%`` or ``%DLQ%`` and a group name
of up to 255 characters: more than a file name may hold) is its first 100 characters,
``~`` (which no name contains) and the first 16 hex digits of the SHA-256 of the whole
name (``topic_directory``).

Everything here is pure; ``broker/consume_queue.py`` keeps the files.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from dledger.numbered_files import number_name

__all__ = [
    "DEFAULT_UNITS_PER_FILE",
    "TOPIC_DIR_MAX",
    "UNIT",
    "UNIT_SIZE",
    "CqUnit",
    "cq_file_name",
    "encode_units",
    "topic_directory",
    "used_units",
]

UNIT = struct.Struct(">qiq")
UNIT_SIZE = 20
assert UNIT.size == UNIT_SIZE
DEFAULT_UNITS_PER_FILE = 300_000

#: Topic names longer than this get a hashed directory name (file names hold 255 bytes).
TOPIC_DIR_MAX = 200
_I32_MAX = (1 << 31) - 1
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class CqUnit:
    """One message in a queue: its bytes are CommitLog[position : position + size]."""

    position: int
    size: int
    tag_hash: int


def topic_directory(topic: str) -> str:
    """The directory name of ``topic``'s queues under ``consumequeue/`` (see the layout)."""
    if len(topic) <= TOPIC_DIR_MAX:
        return topic
    return f"{topic[:100]}~{hashlib.sha256(topic.encode()).hexdigest()[:16]}"


cq_file_name = number_name
"""The name of the file whose first unit has the given queue offset: 20 digits."""


def encode_units(units: Sequence[tuple[int, int, int]]) -> bytes:
    """The bytes of consecutive units, each (position, size, tag hash).

    Raises ValueError, before encoding any, if a position is not in 0..2**63-1, a size
    not in 1..2**31-1 or a tag hash not a signed 64-bit integer.
    """
    for position, size, tag in units:
        if not 0 <= position <= _I64_MAX:
            raise ValueError(f"CommitLog position {position} is not in 0..2**63-1")
        if not 0 < size <= _I32_MAX:
            raise ValueError(f"message size {size} is not in 1..2**31-1")
        if not _I64_MIN <= tag <= _I64_MAX:
            raise ValueError(f"tag hash {tag} is not a signed 64-bit integer")
    pack = UNIT.pack
    return b"".join([pack(*u) for u in units])


def used_units(data: bytes) -> int:
    """How many leading units of ``data`` (whole units) to keep: up to the last with a size."""
    for i in range(len(data) // UNIT_SIZE - 1, -1, -1):
        if UNIT.unpack_from(data, i * UNIT_SIZE)[1] > 0:
            return i + 1
    return 0
