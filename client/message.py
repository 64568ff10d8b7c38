"""What users send and receive, and how they map to the broker's records
(``protocol.record_batch``): ``encode_batch`` makes the record of a batch of messages to
one queue (optionally compressed as one block: zstd or lz4), ``received_all`` turns a
pulled record back into ReceivedMessages.
"""

from __future__ import annotations

import enum
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import msgspec

from client.queues import MessageQueue
from protocol.record_batch import MessageRecord, encode_record, read_header, record_columns

__all__ = [
    "ConsumeStatus",
    "Message",
    "ReceivedMessage",
    "SendResult",
    "SendStatus",
    "encode_batch",
    "received",
    "received_all",
]

_HOST = socket.gethostname()


@dataclass(slots=True)
class Message:
    """A message to send. ``keys`` are indexed (query by key); ``tags`` filter consumers.

    ``delay_level`` (1..18 by default: 1s 5s 10s 30s 1m ... 2h) or ``deliver_at_ms`` (an
    absolute time at most 3 days ahead) hold the message on the broker until then.
    """

    topic: str
    body: bytes
    tags: str | None = None
    keys: Sequence[str] = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    delay_level: int | None = None
    deliver_at_ms: int | None = None

    def wire_properties(self) -> dict[str, str]:
        props = dict(self.properties)
        if self.delay_level is not None:
            props["DELAY"] = str(self.delay_level)
        if self.deliver_at_ms is not None:
            props["TIMER_DELIVER_MS"] = str(self.deliver_at_ms)
        return props


class SendStatus(enum.Enum):
    SEND_OK = "SEND_OK"


class SendResult(msgspec.Struct, frozen=True):
    """Where a sent message was stored (a frozen msgspec Struct: cheap to build for every
    message of a batch)."""

    status: SendStatus
    msg_id: str
    queue: MessageQueue
    queue_offset: int        # -1 for a held message (delayed, a transaction half): set at delivery
    duplicate: bool = False  # an idempotent retry found the message already stored
    position: int = -1       # its CommitLog position (a transaction's half is named by it)

    @property
    def queue_id(self) -> int:
        return self.queue.queue_id


class ConsumeStatus(enum.Enum):
    SUCCESS = "SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"
    SUSPEND = "SUSPEND"  # orderly: stop this queue for a while, then retry the same message


class ReceivedMessage(msgspec.Struct, frozen=True):
    """A message as its consumer gets it (a frozen msgspec Struct: cheap to build for every
    message of a page; compared and hashed by value, like the dataclass it was)."""

    topic: str
    body: bytes
    tags: str | None
    keys: tuple[str, ...]
    properties: Mapping[str, str]
    msg_id: str
    queue: MessageQueue
    queue_offset: int
    commit_log_offset: int
    store_timestamp: int
    born_timestamp: int
    born_host: str
    reconsume_times: int

    @property
    def queue_id(self) -> int:
        return self.queue.queue_id


def encode_batch(messages: Sequence[Message], queue_id: int, msg_ids: Sequence[bytes], born_ms: int,
                 producer_id: str | None = None, base_sequence: int = -1,
                 compression: str | None = None) -> bytes:
    """The record of ``messages`` (one topic) for queue ``queue_id``: message i gets id
    ``msg_ids[i]`` and, with a ``producer_id``, sequence ``base_sequence + i``."""
    entries = [(msg_ids[i], born_ms, 0, m.tags or None, m.keys,
                m.properties if type(m.properties) is dict and m.delay_level is None
                and m.deliver_at_ms is None else m.wire_properties(), 0, m.body)
               for i, m in enumerate(messages)]
    return encode_record(messages[0].topic, queue_id, entries, producer_id=producer_id,
                         base_sequence=base_sequence, born_host=_HOST, compression=compression)


def received(s: MessageRecord, queue: MessageQueue, queue_offset: int, position: int,
             store_ms: int) -> ReceivedMessage:
    """The stored message ``s`` as its consumer sees it."""
    if queue.queue_id != s.queue_id:  # a query knows the group, the stored bytes the queue
        queue = MessageQueue(queue.topic, queue.group, s.queue_id)
    # a retried message shows its original topic (it arrives through %RETRY%group)
    return ReceivedMessage(s.properties.get("RETRY_TOPIC", s.topic), s.body, s.tags, s.keys, s.properties,
                           s.msg_id.hex(), queue, queue_offset, position, store_ms, s.born_ts_ms,
                           s.born_host, s.reconsume)


def received_all(record: bytes, queue: MessageQueue, base_offset: int, position: int, store_ms: int,
                 from_offset: int = 0, selected: Sequence[int] | None = None,
                 limit: int | None = None) -> list[ReceivedMessage]:
    """The messages of a pulled ``record`` (its first at queue offset ``base_offset`` and
    CommitLog ``position``) from queue offset ``from_offset`` on, only those ``selected``
    (indexes) if given, the first ``limit`` of them if given. MessageFormatError if the bytes
    are not a record."""
    h = read_header(record)
    c = record_columns(record, h)
    if queue.queue_id != h.queue_id:
        queue = MessageQueue(queue.topic, queue.group, h.queue_id)
    indexes = range(max(0, from_offset - base_offset), h.count) if selected is None else \
        [i for i in selected if base_offset + i >= from_offset]
    if limit is not None:
        indexes = indexes[:limit]
    topic, host, props = h.topic, h.born_host, c.properties
    ids, born = c.msg_ids_hex, c.born_ms  # properties that build their column: once, not per message
    return [ReceivedMessage(props[i].get("RETRY_TOPIC", topic) if props[i] else topic, c.bodies[i], c.tags[i],
                            c.keys[i], props[i], ids[i], queue, base_offset + i, position + i,
                            store_ms, born[i], host, c.reconsumes[i])
            for i in indexes]


def new_msg_id() -> bytes:
    return os.urandom(16)
