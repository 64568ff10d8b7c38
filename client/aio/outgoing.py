"""What the producer does to each message it accepts, before any queue sees it: checked
(types, the size limit), copied (later changes by the caller do not reach what is sent),
and sized as a record will hold it (what the accumulator counts against ``batch_bytes``).

Pure; any thread.
"""

from __future__ import annotations

from client.errors import MessageTooLargeError
from client.message import Message
from protocol.remoting import ResponseCode

__all__ = ["check_message", "frozen", "record_size"]

_ENVELOPE = 128  # the encoded message's fixed fields, generously (ids, times, host, sequence)
_PER_MESSAGE = 40  # a message's bytes in a record besides body, tags, keys and properties
_BODY_TYPES = (bytes, bytearray, memoryview)


def check_message(m: Message, max_message_bytes: int) -> int:
    """``record_size(m)``, computed on the way; raises TypeError for a field of the wrong
    type, MessageTooLargeError for a message whose encoding would exceed
    ``max_message_bytes`` (the topic is checked elsewhere)."""
    if not isinstance(m.body, _BODY_TYPES):
        raise TypeError(f"a message body must be bytes, not {type(m.body).__name__}")
    if not (m.tags is None or isinstance(m.tags, str)):
        raise TypeError(f"tags must be a string, not {type(m.tags).__name__}")
    size = _ENVELOPE + len(m.topic) + len(m.tags or "")
    if m.keys:
        if isinstance(m.keys, str) or not all(isinstance(k, str) for k in m.keys):
            raise TypeError("keys must be a sequence of strings, e.g. keys=['order-42']")
        size += sum(len(k) + 2 for k in m.keys)
    if m.properties:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in m.properties.items()):
            raise TypeError("properties must map strings to strings")
        size += sum(len(k) + len(v) + 4 for k, v in m.properties.items())
    size += len(m.body)  # the broker limits the record: a message this large is one alone
    if size > max_message_bytes:
        raise MessageTooLargeError(
            ResponseCode.MESSAGE_TOO_LARGE,
            f"message of about {size} bytes (encoded) exceeds max_message_bytes="
            f"{max_message_bytes}; split it or store the payload elsewhere")
    return size - _ENVELOPE - len(m.topic) + _PER_MESSAGE


def frozen(m: Message) -> Message:
    """A copy the caller's later changes do not reach."""
    return Message(m.topic, bytes(m.body), m.tags, tuple(m.keys), dict(m.properties), m.delay_level,
                   m.deliver_at_ms)


def record_size(m: Message) -> int:
    """About the bytes of ``m`` in a record."""
    size = _PER_MESSAGE + len(m.body) + len(m.tags or "")
    if m.keys:
        size += sum(len(k) + 2 for k in m.keys)
    if m.properties:
        size += sum(len(k) + len(v) + 4 for k, v in m.properties.items())
    return size
