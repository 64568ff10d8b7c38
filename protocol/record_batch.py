"""A message record: 1..N messages of one (topic, queue), as the producer sends them and as
the CommitLog stores them -- the unit the broker checks, stores, indexes and ships.

Every message the broker stores is in a record (a single send is a record of one). The
fixed header and the per-message arrays are what the broker reads; it never decodes the
message section (bodies), which may be compressed as one block. Big-endian::

    offset size
       0    1  kind = 2             RECORD_KIND (record kinds 1..19: message format versions)
       1    1  flags                bits 0-1: codec of the message section (0 none, 1 zstd,
                                    2 lz4); bit 2 SPECIAL: a message has a property the broker
                                    acts on (delay, transaction, its own "__" ones)
       2    2  count u16            messages, 1..65535
       4    4  queue id i32
       8    8  base sequence i64    idempotent producer: message i has base + i; -1 none
      16    8  base born ms i64     the producer's clock; message i adds its born delta
      24    2  topic length u16
      26    2  producer id length u16   0: none
      28    2  born host length u16
      30    2  reserved, 0
      32    4  key table length u32     0: no message has keys
      36    4  section length u32       as stored (compressed or not)
      40    4  section raw length u32   before compression (= section length, codec 0)
      44       topic, producer id, born host     utf-8
               tag hashes           count x i64  (protocol.tags; 0: no tag)
               message ids          count x 16 bytes
               key table            msgpack [[key, ...], ...]: one list per message
               message section      msgpack [[born delta, flag, tags, properties,
                                              reconsume, body], ...]: one array per message

A message's CommitLog position is its record's position plus its index in the record (a
record holds more bytes than messages, so these never reach the next record): a consumer,
a send-back or a query names one message by it, and finds its record and index back.

Pure: ``encode_record`` (client, leader), ``read_header`` (broker: header and arrays,
never the section), ``check_messages`` (the leader, once per record it accepts: the
section decodes as consumers decode it, the arrays agree with it), ``decode_messages``
(consumers: every message), ``record_properties`` (SQL92 filters: properties only).
Anything malformed raises ``MessageFormatError``. The message section's rows, decoders and
block codecs are ``protocol.record_section``.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import msgspec

from protocol.record_section import (
    MAX_BASE_BORN_MS,
    PROPERTIES_ROWS,
    ROW_TUPLES,
    ROWS,
    MessageFormatError,
    SectionRow,
    checked_rows,
    compress,
    decode_rows,
    inflate,
)
from protocol.tags import tag_hash

__all__ = [
    "CODECS",
    "FLAG_SPECIAL",
    "HEADER",
    "HEADER_SIZE",
    "RECORD_KIND",
    "SPECIAL_PROPERTIES",
    "MessageFormatError",
    "MessageRecord",
    "RecordColumns",
    "RecordHeader",
    "check_messages",
    "decode_messages",
    "encode_record",
    "is_special",
    "read_header",
    "record_columns",
    "record_count",
    "record_properties",
]

RECORD_KIND = 2
HEADER = struct.Struct(">BBHiqqHHHHIII")
HEADER_SIZE = 44
assert HEADER.size == HEADER_SIZE
FLAG_SPECIAL = 0x04
_CODEC_MASK = 0x03
CODECS = {None: 0, "zstd": 1, "lz4": 2}
_CODEC_NAMES = {v: k for k, v in CODECS.items()}
#: Properties the broker acts on or sets itself (broker.deferred): a message carrying one is
#: SPECIAL (RETRY_TOPIC: the broker's retry copies; a client may not set it).
SPECIAL_PROPERTIES = frozenset({"DELAY", "TIMER_DELIVER_MS", "TRAN_MSG", "RETRY_TOPIC"})
_MAX_COUNT = 0xFFFF
_MAX_RAW = 256 * 1024 * 1024  # a section never inflates past this (decompression bombs)
_TAGS = struct.Struct(">q")

#: One message as ``encode_record`` takes it: (msg id, born ms, flag, tags, keys,
#: properties, reconsume, body).
Entry = tuple[bytes, int, int, "str | None", Sequence[str], Mapping[str, str], int, bytes]


class MessageRecord(msgspec.Struct, frozen=True, gc=False):
    """One message of a record, decoded: what consumers, queries and Spark read."""

    msg_id: bytes
    topic: str
    queue_id: int
    flag: int
    tags: str | None
    keys: tuple[str, ...]
    properties: dict[str, str]
    born_ts_ms: int
    born_host: str
    producer_id: str | None
    sequence: int | None
    reconsume: int
    body: bytes


_KEYS = msgspec.msgpack.Decoder(list[tuple[str, ...]])
_tag_hashes: dict[str | None, bytes] = {}
_local = threading.local()


def is_special(properties: Mapping[str, str]) -> bool:
    """Whether the broker must act on these properties (hold, transact; see the flags)."""
    return any(k in SPECIAL_PROPERTIES or k.startswith("__") for k in properties)


def _packer() -> Callable[[Any], bytes]:
    pack: Callable[[Any], bytes] | None = getattr(_local, "pack", None)
    if pack is None:
        pack = _local.pack = msgpack.Packer(use_bin_type=True).pack
    return pack


def _tag_bytes(tags: str | None) -> bytes:
    found = _tag_hashes.get(tags)
    if found is None:
        found = _TAGS.pack(tag_hash(tags))
        if len(_tag_hashes) < 65536:
            _tag_hashes[tags] = found
    return found


def encode_record(topic: str, queue_id: int, messages: Sequence[Entry], *, producer_id: str | None = None,
                  base_sequence: int = -1, born_host: str = "", compression: str | None = None) -> bytes:
    """The record of ``messages`` (each an ``Entry``). ``base_sequence`` >= 0 with a
    ``producer_id``: message i carries sequence base + i. ``compression``: None, "zstd" or
    "lz4" (the section, when that makes it smaller). Raises ValueError for bad arguments,
    TypeError for a value msgpack cannot pack."""
    count = len(messages)
    if not 0 < count <= _MAX_COUNT:
        raise ValueError(f"a record holds 1..{_MAX_COUNT} messages, not {count}")
    if (producer_id is None) != (base_sequence < 0):
        raise ValueError("producer_id and base_sequence come together")
    base_born = messages[0][1]
    pack = _packer()
    flags = 0
    rows, tag_parts, keys, any_keys = [], [], [], False
    for msg_id, born, flag, tags, mkeys, props, reconsume, body in messages:
        if len(msg_id) != 16:
            raise ValueError("a message id is 16 bytes")
        if props and is_special(props):
            flags |= FLAG_SPECIAL
        rows.append((born - base_born, flag, tags or None, props, reconsume, body))
        tag_parts.append(_tag_bytes(tags or None))
        keys.append(mkeys)
        any_keys = any_keys or bool(mkeys)
    raw = pack(rows)
    section = raw
    codec = CODECS.get(compression, -1)
    if codec < 0:
        raise ValueError(f"compression must be None, 'zstd' or 'lz4', not {compression!r}")
    if codec:
        packed = compress(codec, raw)
        if len(packed) < len(raw):
            section, flags = packed, flags | codec
    key_table = pack([list(k) for k in keys]) if any_keys else b""
    t, p, h = topic.encode(), (producer_id or "").encode(), born_host.encode()
    header = HEADER.pack(RECORD_KIND, flags, count, queue_id, base_sequence, base_born, len(t), len(p),
                         len(h), 0, len(key_table), len(section), len(raw))
    return b"".join((header, t, p, h, *tag_parts, *(m[0] for m in messages), key_table, section))


@dataclass(frozen=True, slots=True)
class RecordHeader:
    """What the broker reads of a record (``read_header``); offsets are into the record."""

    flags: int
    count: int
    queue_id: int
    base_sequence: int
    base_born_ms: int
    topic: str
    producer_id: str | None
    born_host: str
    tags_at: int
    ids_at: int
    keys_at: int
    section_at: int
    raw_length: int

    @property
    def special(self) -> bool:
        return bool(self.flags & FLAG_SPECIAL)

    @property
    def codec(self) -> int:
        return self.flags & _CODEC_MASK

    def tag_hashes(self, record: bytes) -> list[int]:
        return [h for (h,) in _TAGS.iter_unpack(record[self.tags_at:self.ids_at])]

    def msg_ids(self, record: bytes) -> list[bytes]:
        return [record[i:i + 16] for i in range(self.ids_at, self.keys_at, 16)]

    def keys(self, record: bytes) -> list[tuple[str, ...]]:
        """Each message's keys ([] for every message when the table is empty)."""
        if self.keys_at == self.section_at:
            return [()] * self.count
        try:
            keys = _KEYS.decode(record[self.keys_at:self.section_at])
        except Exception as e:
            raise MessageFormatError(f"malformed key table: {e}") from None
        if len(keys) != self.count:
            raise MessageFormatError(f"the key table has {len(keys)} rows for {self.count} messages")
        return keys


def read_header(record: bytes | memoryview) -> RecordHeader:
    """The header of ``record``, its sizes checked against its length; MessageFormatError
    if it is not a record."""
    if len(record) < HEADER_SIZE:
        raise MessageFormatError(f"a record has at least {HEADER_SIZE} bytes, not {len(record)}")
    (kind, flags, count, queue_id, base_seq, born, tlen, plen, hlen, _, klen, slen,
     raw) = HEADER.unpack_from(record)
    if kind != RECORD_KIND:
        raise MessageFormatError(f"not a message record of format {RECORD_KIND} (kind {kind}): "
                                 "records of an older format are not read")
    if flags & ~(_CODEC_MASK | FLAG_SPECIAL) or (flags & _CODEC_MASK) not in _CODEC_NAMES:
        raise MessageFormatError(f"unknown record flags {flags:#x}")
    if count == 0:
        raise MessageFormatError("a record holds at least one message")
    if (base_seq < 0) != (plen == 0) or base_seq < -1:
        raise MessageFormatError("malformed record: producer id and base sequence come together")
    tags_at = HEADER_SIZE + tlen + plen + hlen
    ids_at = tags_at + 8 * count
    keys_at = ids_at + 16 * count
    section_at = keys_at + klen
    if section_at + slen != len(record) or slen == 0:
        raise MessageFormatError(f"malformed record: {len(record)} bytes, its sizes say "
                                 f"{section_at + slen}")
    if not (flags & _CODEC_MASK or raw == slen) or raw > _MAX_RAW:
        raise MessageFormatError(f"malformed record: section of {slen} bytes, {raw} raw")
    try:
        data = bytes(record[HEADER_SIZE:tags_at])
        topic = data[:tlen].decode()
        producer = data[tlen:tlen + plen].decode() if plen else None
        host = data[tlen + plen:].decode()
    except UnicodeDecodeError as e:
        raise MessageFormatError(f"malformed record: {e}") from None
    return RecordHeader(flags, count, queue_id, base_seq, born, topic, producer, host, tags_at, ids_at,
                        keys_at, section_at, raw)


def record_count(record: bytes) -> int:
    """How many messages ``record`` holds (from its header alone; 0 if it is too short)."""
    return HEADER.unpack_from(record)[2] if len(record) >= HEADER_SIZE else 0


def check_messages(record: bytes, header: RecordHeader | None = None) -> RecordHeader:
    """``record``'s header, once its messages are known to read as every consumer reads them
    (the leader's check of a record before storing it; the apply step then trusts its header):
    the section decodes (decompressed first) to one row per message of the right types, born
    times in range (``MAX_BASE_BORN_MS``, ``MAX_BORN_DELTA_MS``), the key table decodes, and
    each tag hash is that of its message's tags, and a record not marked SPECIAL has no
    message with a special property. Bodies are not copied. MessageFormatError naming the
    message and field otherwise."""
    h = header or read_header(record)
    if not -MAX_BASE_BORN_MS <= h.base_born_ms <= MAX_BASE_BORN_MS:
        raise MessageFormatError(f"born time {h.base_born_ms} ms is out of range "
                                 f"(within {MAX_BASE_BORN_MS} ms of the epoch)")
    rows = checked_rows(_section(record, h), h.count)
    if not h.special:  # the flag routes a record through the broker's checks of such properties
        for i, row in enumerate(rows):
            if row[3] and is_special(row[3]):
                name = next(k for k in row[3] if k in SPECIAL_PROPERTIES or k.startswith("__"))
                raise MessageFormatError(f"message {i}: property {name!r} is one the broker acts on, but the "
                                         "record is not marked SPECIAL (encode_record marks it)")
    h.keys(record)
    if record[h.tags_at:h.ids_at] != b"".join([_tag_bytes(r[2]) for r in rows]):
        i = next(i for i, (got,) in enumerate(_TAGS.iter_unpack(record[h.tags_at:h.ids_at]))
                 if got != tag_hash(rows[i][2]))
        raise MessageFormatError(f"message {i}: its tag hash is not that of its tags {rows[i][2]!r}")
    return h


def decode_messages(record: bytes, header: RecordHeader | None = None) -> list[MessageRecord]:
    """Every message of ``record``, in order; MessageFormatError if it is not a record."""
    h = header or read_header(record)
    rows: list[SectionRow] = decode_rows(ROWS, _section(record, h), h.count)
    keys = h.keys(record)
    ids = h.msg_ids(record)
    topic, qid, producer, host, born = h.topic, h.queue_id, h.producer_id, h.born_host, h.base_born_ms
    seq = h.base_sequence
    return [MessageRecord(ids[i], topic, qid, r.flag, r.tags, keys[i], r.properties, born + r.born_delta,
                          host, producer, None if seq < 0 else seq + i, r.reconsume, r.body)
            for i, r in enumerate(rows)]


@dataclass(frozen=True, slots=True)
class RecordColumns:
    """A record's messages column by column (``record_columns``): each a tuple of ``count``;
    born times as the record's base plus a delta each, ids as the record's block of
    ``count`` x 16 bytes -- so that a columnar reader does the arithmetic and the hex
    in bulk (``born_ms``, ``msg_ids_hex``: the per-message forms)."""

    born_base_ms: int
    born_deltas: tuple[int, ...]
    flags: tuple[int, ...]
    tags: tuple[str | None, ...]
    properties: tuple[dict[str, str], ...]
    reconsumes: tuple[int, ...]
    bodies: tuple[bytes, ...]
    keys: list[tuple[str, ...]]
    msg_ids: bytes

    @property
    def born_ms(self) -> tuple[int, ...]:
        base = self.born_base_ms
        return tuple(base + d for d in self.born_deltas)

    @property
    def msg_ids_hex(self) -> list[str]:
        ids = self.msg_ids.hex()
        return [ids[i:i + 32] for i in range(0, len(ids), 32)]


def record_columns(record: bytes, header: RecordHeader | None = None) -> RecordColumns:
    """Every message of ``record`` as columns, without an object per message (what a columnar
    reader such as Spark wants); MessageFormatError if it is not a record."""
    h = header or read_header(record)
    rows = decode_rows(ROW_TUPLES, _section(record, h), h.count)
    deltas, flags, tags, props, reconsumes, bodies = zip(*rows, strict=True)
    return RecordColumns(h.base_born_ms, deltas, flags, tags, props, reconsumes, bodies, h.keys(record),
                         record[h.ids_at:h.keys_at])


def record_properties(record: bytes, header: RecordHeader | None = None) -> list[dict[str, str]]:
    """Each message's properties, bodies not copied (what an SQL92 filter reads)."""
    h = header or read_header(record)
    return [r.properties for r in decode_rows(PROPERTIES_ROWS, _section(record, h), h.count)]


def _section(record: bytes | memoryview, h: RecordHeader) -> bytes | memoryview:
    """The message section, inflated if compressed (a view of ``record`` if not: no copy)."""
    return inflate(memoryview(record)[h.section_at:], h.codec, h.raw_length)
