"""The payload of a DATA entry: a batch of messages stamped by the leader.

One Raft entry carries many messages (group commit: one fsync, one round of
replication for the whole batch). The leader packs them and stamps the batch
with its store time, so every replica derives the same queue offsets and
timestamps from the entry alone (a deterministic apply).

Layout (msgpack array)::

    [ version = 2, store_timestamp_ms, [ record_bytes, ... ] ]

``record_bytes`` are the batch's records, opaque here: message records
(``protocol.record_batch``), admin commands, or a fragment (``broker.store.commands`` tells
them apart by their first byte). Version 2: the records of messages are batches;
entries of version 1 are not read (a store of that format is refused at start).

A packed entry never exceeds ``MAX_ENTRY_BYTES`` (which keeps pysyncobj
away from its broken chunked transmission); a single record that cannot fit raises
``MessageTooLarge``. A message larger than ``max_message_bytes()`` is not packed:
the WritePath splits it into a chain of fragments (``broker.store.fragments``), each
packed alone in its own entry with this same layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import msgpack

from dledger.config import MAX_ENTRY_BYTES

__all__ = [
    "EntryBatch",
    "MessageTooLarge",
    "locate_messages",
    "max_message_bytes",
    "pack_entries",
    "read_records",
    "read_stamp",
    "unpack_entry",
]

VERSION = 2
_OVERHEAD = 16  # outer array 1, version 1, uint64 timestamp 9, inner array header <= 5


class MessageTooLarge(ValueError):
    """A message that does not fit in one entry on its own."""


@dataclass(frozen=True, slots=True)
class EntryBatch:
    store_timestamp_ms: int
    messages: tuple[bytes, ...]


def max_message_bytes(limit: int = MAX_ENTRY_BYTES) -> int:
    """The largest message that fits alone in one entry."""
    return limit - _OVERHEAD - (3 if limit < 65536 else 5)


def _encoded_size(message: bytes) -> int:
    n = len(message)
    return n + (2 if n < 256 else 3 if n < 65536 else 5)


def pack_entries(messages: Sequence[bytes], store_timestamp_ms: int,
                 limit: int = MAX_ENTRY_BYTES) -> list[bytes]:
    """Pack ``messages`` in order into as few entry payloads as fit under ``limit``."""
    payloads: list[bytes] = []
    current: list[bytes] = []
    size = _OVERHEAD
    for message in messages:
        need = _encoded_size(message)
        if need + _OVERHEAD > limit:
            raise MessageTooLarge(
                f"message of {len(message)} bytes exceeds the {max_message_bytes(limit)}-byte "
                "entry limit")
        if current and size + need > limit:
            payloads.append(_pack(store_timestamp_ms, current))
            current, size = [], _OVERHEAD
        current.append(message)
        size += need
    if current:
        payloads.append(_pack(store_timestamp_ms, current))
    return payloads


def _pack(store_timestamp_ms: int, messages: list[bytes]) -> bytes:
    payload = msgpack.packb([VERSION, store_timestamp_ms, messages], use_bin_type=True)
    assert len(payload) <= MAX_ENTRY_BYTES
    return payload


def unpack_entry(payload: bytes) -> EntryBatch:
    """Decode a DATA entry's payload; ValueError if it is not a batch of this version."""
    try:
        version, stamp, messages = msgpack.unpackb(payload, use_list=False, raw=False)
    except Exception as e:
        raise ValueError(f"not an entry batch: {e}") from None
    if version != VERSION or not isinstance(stamp, int) or not all(
            isinstance(m, bytes) for m in messages):
        raise ValueError(f"not an entry batch of version {VERSION}")
    return EntryBatch(stamp, tuple(messages))


def locate_messages(payload: bytes) -> tuple[int, list[tuple[int, int]]]:
    """The store time and the (offset, length) of each message's bytes inside ``payload``.

    A message's CommitLog position is its entry's body position plus its offset,
    so the ConsumeQueue can point straight at its bytes. ValueError if malformed.
    """
    stamp, records = read_records(payload)
    return stamp, [(offset, len(record)) for offset, record in records]


def read_records(payload: bytes) -> tuple[int, list[tuple[int, bytes]]]:
    """The store time and each record with its offset inside ``payload`` (one pass,
    one copy of each record). ValueError if malformed."""
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=len(payload) + 1)
    unpacker.feed(payload)
    try:
        if unpacker.read_array_header() != 3 or unpacker.unpack() != VERSION:
            raise ValueError(f"not an entry batch of version {VERSION}")
        stamp = unpacker.unpack()
        count = unpacker.read_array_header()
        records = []
        unpack, tell = unpacker.unpack, unpacker.tell
        for _ in range(count):
            record = unpack()
            if type(record) is not bytes:
                raise ValueError("entry batch holds a non-binary message")
            records.append((tell() - len(record), record))
    except (msgpack.OutOfData, msgpack.UnpackException, msgpack.ExtraData) as e:
        raise ValueError(f"not an entry batch: {e!r}") from None
    if not isinstance(stamp, int) or unpacker.tell() != len(payload):
        raise ValueError(f"not an entry batch of version {VERSION}")
    return stamp, records


def read_stamp(prefix: bytes) -> int:
    """The store time from the first bytes of a payload (16 are always enough)."""
    unpacker = msgpack.Unpacker()
    unpacker.feed(prefix)
    try:
        unpacker.read_array_header()
        unpacker.unpack()
        stamp = unpacker.unpack()
    except (msgpack.OutOfData, msgpack.UnpackException) as e:
        raise ValueError(f"not an entry batch: {e!r}") from None
    if not isinstance(stamp, int):
        raise ValueError("not an entry batch")
    return stamp
