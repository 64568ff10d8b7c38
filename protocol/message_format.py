"""A message as the producer sends it and as it is stored inside an entry batch.

One message is one msgpack array; its bytes are stored verbatim in the entry, so
the ConsumeQueue can point at them with a CommitLog (position, size) pair and a
consumer's pull is a read of exactly those bytes::

    [ version = 1,
      msg_id        bin(16)      unique id chosen by the producer (RocketMQ's UNIQ_KEY)
      topic         str
      queue_id      int
      flag          int
      tags          str | nil
      keys          [str]
      properties    {str: str}
      born_ts_ms    int          the producer's clock
      born_host     str
      producer_id   str | nil    idempotent producer: who
      sequence      int | nil    idempotent producer: per-queue sequence number
      reconsume     int          times re-delivered through the retry topic
      body          bin ]

A message larger than one Raft entry can hold is stored as a chain of fragments
(``broker.fragments``); its bytes are the same, only spread over consecutive
entries. The broker accepts encoded messages up to ``MAX_MESSAGE_BYTES``
(configurable per broker, ``[broker] max_message_bytes``).

What the broker assigns at apply time -- queue offset, store time (the
leader's, from the batch), CommitLog position -- is not written into these
bytes; it comes from the ConsumeQueue unit and the entry.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

__all__ = [
    "MAX_MESSAGE_BYTES",
    "Message",
    "MessageFormatError",
    "decode_message",
    "encode_message",
    "new_msg_id",
    "pack_message",
    "peek_msg_id",
]

VERSION = 1
_FIELDS = 14
#: The largest encoded message a broker accepts by default (4 MiB).
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
_PEEK = 32  # array header 1-3, version 1, bin(16) header 2 + 16


class MessageFormatError(ValueError):
    """Bytes that are not a version-1 message."""


def new_msg_id() -> bytes:
    """A fresh 16-byte message id (random; unique for all practical purposes)."""
    return os.urandom(16)


@dataclass(slots=True)
class Message:
    """Treat as immutable (not frozen only because a frozen dataclass is ~5x slower to
    build, and the apply step decodes every message)."""

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
    return pack_message(m.msg_id, m.topic, m.queue_id, m.flag, m.tags, m.keys, m.properties,
                        m.born_ts_ms, m.born_host, m.producer_id, m.sequence, m.reconsume, m.body)


#: Messages up to this size are packed by a per-thread Packer (``packb`` makes a new one per
#: call, which costs more than packing a small message); a Packer keeps its largest buffer,
#: so larger ones are packed by ``packb``.
_REUSED_PACKER_MAX = 64 * 1024
_packers = threading.local()


def pack_message(msg_id: bytes, topic: str, queue_id: int, flag: int, tags: str | None,
                 keys: Sequence[str], properties: Mapping[str, str], born_ts_ms: int, born_host: str,
                 producer_id: str | None, sequence: int | None, reconsume: int,
                 body: bytes | bytearray | memoryview) -> bytes:
    """The encoded message of these fields (``encode_message`` without building a Message;
    the client's producer encodes every message it sends with it). Raises TypeError for a
    value msgpack cannot pack."""
    row = [VERSION, msg_id, topic, queue_id, flag, tags, list(keys), properties, born_ts_ms,
           born_host, producer_id, sequence, reconsume, body]
    if len(body) > _REUSED_PACKER_MAX:
        packed: bytes = msgpack.packb(row, use_bin_type=True)
        return packed
    pack: Callable[[Any], bytes] | None = getattr(_packers, "pack", None)
    if pack is None:
        pack = _packers.pack = msgpack.Packer(use_bin_type=True).pack
    return pack(row)


def decode_message(data: bytes | memoryview) -> Message:
    """Decode one message; raises MessageFormatError for anything else."""
    try:
        row = msgpack.unpackb(data, use_list=False, raw=False, strict_map_key=True)
    except Exception as e:
        raise MessageFormatError(f"not a message: {e}") from None
    if not isinstance(row, tuple) or len(row) != _FIELDS or row[0] != VERSION:
        raise MessageFormatError("not a version-1 message")
    (_, msg_id, topic, queue_id, flag, tags, keys, props, born, host, pid, seq, reconsume,
     body) = row
    # exact type checks (bool is not an int here); the common case costs one expression
    if not (type(msg_id) is bytes and len(msg_id) == 16 and type(topic) is str and type(host) is str
            and type(queue_id) is int and type(flag) is int and type(born) is int
            and type(reconsume) is int and (tags is None or type(tags) is str)
            and type(keys) is tuple and type(props) is dict and type(body) is bytes
            and ((pid is None and seq is None) or (type(pid) is str and type(seq) is int))):
        _explain(row)
    if keys and not all(type(k) is str for k in keys):
        raise MessageFormatError("malformed message: keys are strings")
    if props and not all(type(k) is str and type(v) is str for k, v in props.items()):
        raise MessageFormatError("malformed message: properties map strings to strings")
    return Message(topic, body, queue_id, tags, keys, props, msg_id, flag, born, host, pid, seq,
                   reconsume)


def _explain(row: tuple[Any, ...]) -> None:
    """Raise MessageFormatError naming the first field of ``row`` that is wrong."""
    (_, msg_id, topic, queue_id, flag, tags, keys, props, born, host, pid, seq, reconsume,
     body) = row
    _check(type(msg_id) is bytes and len(msg_id) == 16, "msg_id must be 16 bytes")
    _check(type(topic) is str and type(host) is str, "topic and born_host are strings")
    _check(all(type(v) is int for v in (queue_id, flag, born, reconsume)),
           "queue_id, flag, born_ts_ms and reconsume are integers")
    _check(tags is None or type(tags) is str, "tags is a string or nil")
    _check(type(keys) is tuple, "keys are strings")
    _check(type(props) is dict, "properties map strings to strings")
    _check((pid is None) == (seq is None), "producer_id and sequence come together")
    _check(pid is None or (type(pid) is str and type(seq) is int),
           "producer_id is a string and sequence an integer")
    _check(type(body) is bytes, "body is bytes")
    raise AssertionError("_explain called for a valid message")


def peek_msg_id(data: bytes) -> bytes | None:
    """The message id from the first bytes of an encoded message, without decoding the
    rest (a large body is not copied); None if the bytes do not start like a message."""
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(data[:_PEEK])
    try:
        if unpacker.read_array_header() != _FIELDS or unpacker.unpack() != VERSION:
            return None
        msg_id = unpacker.unpack()
    except Exception:
        return None
    return msg_id if isinstance(msg_id, bytes) and len(msg_id) == 16 else None


def _check(ok: Any, what: str) -> None:
    if not ok:
        raise MessageFormatError(f"malformed message: {what}")
