"""One message with every field, and the record of one that stores it.

Messages are stored in records (``protocol.record_batch``): 1..N messages of one queue.
The broker's own copies -- delayed messages released, retries, dead letters, committed
transaction halves -- and every message with a property the broker acts on are records
of one. ``Message`` is such a message with all its fields (``producer_id`` and ``sequence``
come together); ``encode_message`` makes its record of one, ``decode_message`` and
``decode_record`` read one back (MessageFormatError for anything else, a record of more
messages included).

The broker accepts records up to ``MAX_MESSAGE_BYTES`` (configurable per broker,
``[broker] max_message_bytes``); one larger than a Raft entry is stored as a chain of
fragments (``broker.store.fragments``).

What the broker assigns at apply time -- queue offset, store time (the leader's, from
the entry), CommitLog position -- is not written into these bytes; it comes from the
ConsumeQueue unit and the entry.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from protocol.record_batch import (
    HEADER,
    HEADER_SIZE,
    RECORD_KIND,
    MessageFormatError,
    MessageRecord,
    decode_messages,
    encode_record,
    read_header,
)

__all__ = [
    "MAX_MESSAGE_BYTES",
    "Message",
    "MessageFormatError",
    "MessageRecord",
    "decode_message",
    "decode_record",
    "encode_message",
    "message_at",
    "message_of",
    "new_msg_id",
    "peek_msg_id",
    "peek_topic",
]

#: The largest record a broker accepts by default (4 MiB).
MAX_MESSAGE_BYTES = 4 * 1024 * 1024


def new_msg_id() -> bytes:
    """A fresh 16-byte message id (random; unique for all practical purposes)."""
    return os.urandom(16)


@dataclass(slots=True)
class Message:
    """Treat as immutable (not frozen only because a frozen dataclass is ~5x slower to build)."""

    topic: str
    body: bytes
    queue_id: int = 0
    tags: str | None = None
    keys: tuple[str, ...] = ()
    properties: dict[str, str] = field(default_factory=dict)
    msg_id: bytes = field(default_factory=new_msg_id)
    flag: int = 0
    born_ts_ms: int = 0
    born_host: str = ""
    producer_id: str | None = None
    sequence: int | None = None
    reconsume: int = 0


def encode_message(m: Message) -> bytes:
    """The record of one holding ``m``. Raises ValueError for a message id that is not 16
    bytes or a producer id without a sequence, TypeError for a value msgpack cannot pack."""
    if (m.producer_id is None) != (m.sequence is None):
        raise ValueError("producer_id and sequence come together")
    return encode_record(m.topic, m.queue_id, [(m.msg_id, m.born_ts_ms, m.flag, m.tags, m.keys,
                                                m.properties, m.reconsume, bytes(m.body))],
                         producer_id=m.producer_id,
                         base_sequence=-1 if m.sequence is None else m.sequence, born_host=m.born_host)


def decode_record(data: bytes) -> MessageRecord:
    """The message of a record of one; MessageFormatError for anything else."""
    h = read_header(data)
    if h.count != 1:
        raise MessageFormatError(f"a record of {h.count} messages where one was expected")
    return decode_messages(data, h)[0]


def decode_message(data: bytes) -> Message:
    """``decode_record`` as a ``Message``."""
    return message_of(decode_record(data))


def message_at(record: bytes, index: int) -> Message:
    """Message ``index`` of ``record`` (of any count); MessageFormatError if there is none."""
    h = read_header(record)
    if not 0 <= index < h.count:
        raise MessageFormatError(f"no message {index} in a record of {h.count}")
    return message_of(decode_messages(record, h)[index])


def message_of(r: MessageRecord) -> Message:
    """The ``Message`` one decoded message of a record stands for."""
    return Message(r.topic, r.body, r.queue_id, r.tags, r.keys, r.properties, r.msg_id, r.flag,
                   r.born_ts_ms, r.born_host, r.producer_id, r.sequence, r.reconsume)


def peek_msg_id(data: bytes | memoryview) -> bytes | None:
    """The first message id of a record from its first bytes (the header and what precedes
    the ids: nothing else read, a large body not copied); None if they do not start like a
    record."""
    if len(data) < HEADER_SIZE or data[0] != RECORD_KIND:
        return None
    count, tlen, plen, hlen = (HEADER.unpack_from(data)[i] for i in (2, 6, 7, 8))
    at = HEADER_SIZE + tlen + plen + hlen + 8 * count
    found = bytes(data[at:at + 16])
    return found if count and len(found) == 16 else None


def peek_topic(data: bytes | memoryview) -> str | None:
    """The topic of a record from its first bytes (the header and the topic: nothing else
    read; the broker's authorization of a send); None if they do not start like a record."""
    if len(data) < HEADER_SIZE or data[0] != RECORD_KIND:
        return None
    tlen = HEADER.unpack_from(data)[6]
    try:
        topic = bytes(data[HEADER_SIZE:HEADER_SIZE + tlen]).decode()
    except UnicodeDecodeError:
        return None
    return topic if len(topic.encode()) == tlen else None
