"""What users send and receive, and how it maps to the broker's stored message.

Bodies larger than ``COMPRESS_OVER`` bytes are zlib-compressed by the producer
(flag bit ``FLAG_COMPRESSED``) and decompressed transparently on receipt.
"""

from __future__ import annotations

import enum
import os
import socket
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from client.queues import MessageQueue
from protocol.message_format import MessageRecord, decode_record, pack_message

__all__ = [
    "COMPRESS_OVER",
    "FLAG_COMPRESSED",
    "ConsumeStatus",
    "Message",
    "ReceivedMessage",
    "SendResult",
    "SendStatus",
    "decode_received",
    "encode_for_send",
    "received",
]

COMPRESS_OVER = 4 * 1024
FLAG_COMPRESSED = 1
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


@dataclass(frozen=True, slots=True)
class SendResult:
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


@dataclass(frozen=True, slots=True)
class ReceivedMessage:
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


def encode_for_send(m: Message, queue_id: int, msg_id: bytes, born_ms: int,
                    producer_id: str | None = None, sequence: int | None = None) -> bytes:
    """The stored form of ``m`` (``protocol.message_format``), bodies over ``COMPRESS_OVER``
    compressed."""
    body, flag = m.body, 0
    if len(body) > COMPRESS_OVER:
        packed = zlib.compress(body, 1)
        if len(packed) < len(body):
            body, flag = packed, FLAG_COMPRESSED
    return pack_message(msg_id, m.topic, queue_id, flag, m.tags or None, m.keys, m.wire_properties(),
                        born_ms, _HOST, producer_id, sequence, 0, body)


def decode_received(data: bytes, queue: MessageQueue, queue_offset: int, position: int,
                    store_ms: int) -> ReceivedMessage:
    """The message in the stored bytes ``data``; MessageFormatError if they are not one."""
    return received(decode_record(data), queue, queue_offset, position, store_ms)


def received(s: MessageRecord, queue: MessageQueue, queue_offset: int, position: int,
             store_ms: int) -> ReceivedMessage:
    """The stored message ``s`` as its consumer sees it (the body inflated)."""
    body = zlib.decompress(s.body) if s.flag & FLAG_COMPRESSED else s.body
    if queue.queue_id != s.queue_id:  # a query knows the group, the stored bytes the queue
        queue = MessageQueue(queue.topic, queue.group, s.queue_id)
    # a retried message shows its original topic (it arrives through %RETRY%group)
    return ReceivedMessage(s.properties.get("RETRY_TOPIC", s.topic), body, s.tags, s.keys, s.properties,
                           s.msg_id.hex(), queue, queue_offset, position, store_ms, s.born_ts_ms,
                           s.born_host, s.reconsume)


def new_msg_id() -> bytes:
    return os.urandom(16)
