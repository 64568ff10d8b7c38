"""The ConsumeQueue's on-disk layout (version 2, RocketMQ 5's BatchConsumeQueue): one
40-byte unit per record, in files of ``units_per_file`` units named by the queue offset of
their first unit.

A queue (one topic, one queue id) lists its records (``protocol.record_batch``) in order;
each unit says where the record is in the CommitLog, which queue offsets its messages have
(``base offset`` .. ``base offset + count - 1``: queue offsets stay per message), when it
was stored, and a summary of its messages' tags for the broker's tag filter::

    ┌──────────────────────┬─────────────┬───────────┬──────────┬──────────┐
    │ CommitLog position   │ record size │ count u16 │ tag kind │ reserved │
    │ i64                  │ i32         │           │ u8       │ u8 = 0   │
    ├──────────────────────┼─────────────┴───────────┴──────────┴──────────┤
    │ base queue offset i64│ store time ms i64  │ tag summary i64          │   big-endian, 40 bytes
    └──────────────────────┴────────────────────┴──────────────────────────┘

Tag summary: kind 0 (``TAG_ONE``): every message of the record has this tag hash
(``protocol.tags``; 0: no tag); kind 1 (``TAG_BLOOM``): a 64-bit Bloom filter of the
messages' tag hashes, 3 bits each (``bloom_bits``). A pull wanting hashes W keeps a unit
when ``summary_may_match`` says so, then checks the record's tag-hash array.

Units are stored ``units_per_file`` to a file; a file is named by the base offset of its
first unit, 20 digits (an empty queue's one file by the offset its first unit will have:
0, or N for a queue restored from a snapshot at the peers' numbering). Files are
contiguous: a file's name is the offset after the last message of the file before::

    consumequeue/<topic directory>/<queue_id>/      (here 2 units a file)
      00000000000000000000   [0..63][64..127]      full
      00000000000000000128   [128..191][192]       full
      00000000000000000193   [193..256]            last: extended unit by unit
                                        ▲ max_offset = 257

A count of 0 is never written, so trailing all-zero units are not units (a crash can
leave a file extended with zeros: ``used_units``).

The topic directory is the topic's name when it has at most ``TOPIC_DIR_MAX``
characters (every user topic); a longer one (``%RETRY%`` or ``%DLQ%`` and a group name
of up to 255 characters) is its first 100 characters, ``~`` and the first 16 hex digits
of the SHA-256 of the whole name (``topic_directory``).

Everything here is pure; ``broker/store/consume_queue.py`` keeps the files.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from dledger.storage.numbered_files import number_name

__all__ = [
    "DEFAULT_UNITS_PER_FILE",
    "TAG_BLOOM",
    "TAG_ONE",
    "TOPIC_DIR_MAX",
    "UNIT",
    "UNIT_SIZE",
    "CqUnit",
    "bloom_bits",
    "cq_file_name",
    "encode_units",
    "summary_may_match",
    "tag_summary",
    "topic_directory",
    "used_units",
]

UNIT = struct.Struct(">qiHBBqqq")
UNIT_SIZE = 40
assert UNIT.size == UNIT_SIZE
DEFAULT_UNITS_PER_FILE = 300_000
TAG_ONE = 0
TAG_BLOOM = 1

#: Topic names longer than this get a hashed directory name (file names hold 255 bytes).
TOPIC_DIR_MAX = 200
_I32_MAX = (1 << 31) - 1
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1
_BLOOM_SIGN = 1 << 63


@dataclass(frozen=True, slots=True)
class CqUnit:
    """One record in a queue: its bytes are CommitLog[position : position + size]; its
    messages have queue offsets ``base`` .. ``base + count - 1``."""

    position: int
    size: int
    count: int
    tag_kind: int
    base: int
    store_ms: int
    tag: int

    @property
    def end(self) -> int:
        """The queue offset after the record's last message."""
        return self.base + self.count

    def astuple(self) -> tuple[int, int, int, int, int, int, int]:
        return (self.position, self.size, self.count, self.tag_kind, self.base, self.store_ms, self.tag)


def bloom_bits(tag_hash: int) -> int:
    """The 3 bits of ``tag_hash`` in a tag summary's Bloom filter (an unsigned mask)."""
    h = tag_hash & 0xFFFFFFFFFFFFFFFF
    return (1 << (h & 63)) | (1 << ((h >> 6) & 63)) | (1 << ((h >> 12) & 63))


def tag_summary(hashes: Iterable[int]) -> tuple[int, int]:
    """(kind, value) summarising a record's tag hashes (the layout above)."""
    distinct = set(hashes)
    if len(distinct) == 1:
        return TAG_ONE, distinct.pop()
    mask = 0
    for h in distinct:
        mask |= bloom_bits(h)
    return TAG_BLOOM, mask - (1 << 64) if mask & _BLOOM_SIGN else mask


def summary_may_match(kind: int, value: int, wanted: frozenset[int], wanted_bits: Sequence[int]) -> bool:
    """Whether a record with this summary may hold a message with a tag hash of ``wanted``
    (``wanted_bits``: their ``bloom_bits``); never False for one that does."""
    if kind == TAG_ONE:
        return value in wanted
    mask = value & 0xFFFFFFFFFFFFFFFF
    return any(mask & bits == bits for bits in wanted_bits)


def topic_directory(topic: str) -> str:
    """The directory name of ``topic``'s queues under ``consumequeue/`` (see the layout)."""
    if len(topic) <= TOPIC_DIR_MAX:
        return topic
    return f"{topic[:100]}~{hashlib.sha256(topic.encode()).hexdigest()[:16]}"


cq_file_name = number_name
"""The name of the file whose first unit has the given base offset: 20 digits."""


def encode_units(units: Sequence[tuple[int, int, int, int, int, int, int]]) -> bytes:
    """The bytes of consecutive units, each (position, size, count, tag kind, base, store
    ms, tag). Raises ValueError, before encoding any, for a field out of its range or a
    base that does not follow the unit before."""
    pack = UNIT.pack
    out = []
    expected = None
    for position, size, count, kind, base, store_ms, tag in units:
        if not 0 <= position <= _I64_MAX:
            raise ValueError(f"CommitLog position {position} is not in 0..2**63-1")
        if not 0 < size <= _I32_MAX:
            raise ValueError(f"record size {size} is not in 1..2**31-1")
        if not 0 < count <= 0xFFFF:
            raise ValueError(f"message count {count} is not in 1..65535")
        if kind not in (TAG_ONE, TAG_BLOOM) or not _I64_MIN <= tag <= _I64_MAX:
            raise ValueError(f"tag summary ({kind}, {tag}) is not one")
        if expected is not None and base != expected:
            raise ValueError(f"base offset {base} does not follow the unit before (ends at {expected})")
        expected = base + count
        out.append(pack(position, size, count, kind, 0, base, store_ms, tag))
    return b"".join(out)


def used_units(data: bytes) -> int:
    """How many leading units of ``data`` (whole units) to keep: up to the last with a count."""
    for i in range(len(data) // UNIT_SIZE - 1, -1, -1):
        if UNIT.unpack_from(data, i * UNIT_SIZE)[2] > 0:
            return i + 1
    return 0
