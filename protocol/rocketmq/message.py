"""RocketMQ's message encodings: the stored message a PULL, QUERY_MESSAGE and
VIEW_MESSAGE_BY_ID body carries (``MessageDecoder.encode``/``decode``), the message batch
of SEND_BATCH_MESSAGE (``MessageDecoder.encodeMessages``), the properties string and the
message id. Big-endian throughout.

Stored message (``MessageExt``), IPv4 hosts (an IPv6 host, flagged in SYSFLAG, is 16+4)::

    +-----------+-------+---------+---------+------+-------------+----------------+
    | TOTALSIZE | MAGIC | BODYCRC | QUEUEID | FLAG | QUEUEOFFSET | PHYSICALOFFSET |
    | i32       | i32   | i32     | i32     | i32  | i64         | i64            |
    +-----------+-------+---------+---------+------+-------------+----------------+
    | SYSFLAG | BORNTIMESTAMP | BORNHOST    | STORETIMESTAMP | STOREHOST   |
    | i32     | i64           | 4 IP + i32  | i64            | 4 IP + i32  |
    +---------+---------------+-------------+----------------+-------------+
    | RECONSUMETIMES | PREPARED TX OFFSET | BODY           | TOPIC         | PROPERTIES     |
    | i32            | i64                | i32 len + data | u8 len + data | i16 len + data |
    +----------------+--------------------+----------------+---------------+----------------+
    MAGIC = 0xDAA320A7; BODYCRC = CRC32(body) & 0x7FFFFFFF; BODY zlib when SYSFLAG bit 0

One message of a batch body (messages back to back)::

    +-----------+-----------+---------+------+----------------+----------------+
    | TOTALSIZE | MAGIC = 0 | CRC = 0 | FLAG | BODY           | PROPERTIES     |
    | i32       | i32       | i32     | i32  | i32 len + data | i16 len + data |
    +-----------+-----------+---------+------+----------------+----------------+

Properties: ``name \\x01 value`` pairs joined by ``\\x02`` (no trailing separator since 4.9.x;
a trailing one is accepted), in the Java ``HashMap``'s iteration order.

Message id (``offsetMsgId``): the store host (4-byte IP, i32 port) and an i64 CommitLog
offset as 32 upper-case hex digits; RaftMQ puts a message's position there, so
VIEW_MESSAGE_BY_ID on that host finds it.
"""

from __future__ import annotations

import functools
import ipaddress
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from protocol.rocketmq import fastjson
from protocol.rocketmq.codes import MessageSysFlag

__all__ = [
    "MAGIC",
    "BatchMessage",
    "MessageFormatError",
    "StoredMessage",
    "body_crc",
    "decode_batch",
    "decode_message_id",
    "decode_stored",
    "encode_batch_message",
    "encode_stored",
    "message_id",
    "parse_properties",
    "properties_string",
]

MAGIC = 0xDAA320A7
NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
_HEAD = struct.Struct(">iIiiiqqiq")  # TOTALSIZE .. BORNTIMESTAMP
_TAIL = struct.Struct(">iq")  # RECONSUMETIMES, PREPARED TX OFFSET
_BATCH_HEAD = struct.Struct(">iiii")
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_HOST = struct.Struct(">4si")


class MessageFormatError(ValueError):
    """Bytes that are not a message of the layout they claim."""


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """One ``MessageExt`` as a pull answers it. Hosts are ``(ip, port)``."""

    topic: str
    body: bytes
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    born_timestamp: int
    born_host: tuple[str, int]
    store_timestamp: int
    store_host: tuple[str, int]
    properties: Mapping[str, str] = field(default_factory=dict)
    flag: int = 0
    sys_flag: int = 0
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    body_crc: int | None = None  # None: computed


@dataclass(frozen=True, slots=True)
class BatchMessage:
    flag: int
    body: bytes
    properties: dict[str, str]


def body_crc(body: bytes) -> int:
    return zlib.crc32(body) & 0x7FFFFFFF


def properties_string(properties: Mapping[str, str]) -> str:
    """The properties as ``messageProperties2String`` writes a HashMap put in this order."""
    keys = [str(k) for k in fastjson.java_order(list(properties))]
    return PROPERTY_SEPARATOR.join(f"{k}{NAME_VALUE_SEPARATOR}{properties[k]}" for k in keys)


def parse_properties(text: str) -> dict[str, str]:
    """``string2messageProperties``: pairs without a separator are skipped."""
    out: dict[str, str] = {}
    for pair in text.split(PROPERTY_SEPARATOR):
        name, sep, value = pair.partition(NAME_VALUE_SEPARATOR)
        if sep:
            out[name] = value
    return out


@functools.lru_cache(maxsize=1024)
def _host(host: tuple[str, int]) -> bytes:
    ip = ipaddress.ip_address(host[0])
    if ip.version != 4:
        raise ValueError(f"only IPv4 hosts are encoded, got {host[0]}")
    return _HOST.pack(ip.packed, host[1])


def encode_stored(m: StoredMessage) -> bytes:
    topic = m.topic.encode("utf-8")
    props = properties_string(m.properties).encode("utf-8")
    if len(topic) > 127 or len(props) > 32767:
        raise ValueError("a topic over 127 bytes or properties over 32767 bytes cannot be encoded")
    crc = body_crc(m.body) if m.body_crc is None else m.body_crc
    size = _HEAD.size + 8 + 8 + 8 + _TAIL.size + 4 + len(m.body) + 1 + len(topic) + 2 + len(props)
    return b"".join([
        _HEAD.pack(size, MAGIC, crc, m.queue_id, m.flag, m.queue_offset, m.commit_log_offset,
                   m.sys_flag, m.born_timestamp),
        _host(m.born_host), struct.pack(">q", m.store_timestamp), _host(m.store_host),
        _TAIL.pack(m.reconsume_times, m.prepared_transaction_offset),
        _I32.pack(len(m.body)), m.body, bytes([len(topic)]), topic, _I16.pack(len(props)), props])


def decode_stored(data: bytes) -> list[StoredMessage]:
    """Every stored message of ``data`` (a pull body); MessageFormatError if malformed."""
    try:
        return _decode_stored(data)
    except (struct.error, IndexError, ValueError, zlib.error) as e:
        if isinstance(e, MessageFormatError):
            raise
        raise MessageFormatError(f"malformed stored message: {e}") from None


def _decode_stored(data: bytes) -> list[StoredMessage]:
    out: list[StoredMessage] = []
    at = 0
    view = memoryview(data)
    while at < len(data):
        if at + _HEAD.size > len(data):
            raise MessageFormatError("a stored message ends inside its fixed fields")
        size, magic, crc, qid, flag, qoff, phys, sysflag, born = _HEAD.unpack_from(data, at)
        if magic != MAGIC or size < _HEAD.size or at + size > len(data):
            raise MessageFormatError(f"no stored message at byte {at} (magic {magic:#x}, size {size})")
        end = at + size
        p = at + _HEAD.size
        born_host, p = _read_host(data, p, sysflag & MessageSysFlag.BORNHOST_V6)
        (stored,) = struct.unpack_from(">q", data, p)
        store_host, p = _read_host(data, p + 8, sysflag & MessageSysFlag.STOREHOST_V6)
        reconsume, prepared = _TAIL.unpack_from(data, p)
        p += _TAIL.size
        (blen,) = _I32.unpack_from(data, p)
        body = bytes(view[p + 4:p + 4 + blen])
        p += 4 + blen
        if sysflag & MessageSysFlag.COMPRESSED:
            body = zlib.decompress(body)
        tlen = data[p]
        topic = bytes(view[p + 1:p + 1 + tlen]).decode("utf-8")
        p += 1 + tlen
        (plen,) = _I16.unpack_from(data, p)
        props = parse_properties(bytes(view[p + 2:p + 2 + plen]).decode("utf-8"))
        if p + 2 + plen != end:
            raise MessageFormatError(f"stored message at byte {at}: fields end at {p + 2 + plen}, "
                                     f"its size says {end}")
        out.append(StoredMessage(topic, body, qid, qoff, phys, born, born_host, stored, store_host,
                                 props, flag, sysflag, reconsume, prepared, crc))
        at = end
    return out


def _read_host(data: bytes, at: int, v6: int) -> tuple[tuple[str, int], int]:
    width = 16 if v6 else 4
    ip = ipaddress.ip_address(bytes(data[at:at + width]))
    (port,) = _I32.unpack_from(data, at + width)
    return (str(ip), port), at + width + 4


def encode_batch_message(m: BatchMessage) -> bytes:
    props = properties_string(m.properties).encode("utf-8")
    size = _BATCH_HEAD.size + 4 + len(m.body) + 2 + len(props)
    return b"".join([_BATCH_HEAD.pack(size, 0, 0, m.flag), _I32.pack(len(m.body)), m.body,
                     _I16.pack(len(props)), props])


def decode_batch(data: bytes, max_messages: int = 100_000) -> list[BatchMessage]:
    """The messages of a SEND_BATCH_MESSAGE body; MessageFormatError if malformed."""
    out: list[BatchMessage] = []
    at = 0
    try:
        while at < len(data):
            at = _read_batch_message(data, at, out, max_messages)
    except (struct.error, UnicodeDecodeError) as e:
        raise MessageFormatError(f"malformed batch message: {e}") from None
    return out


def _read_batch_message(data: bytes, at: int, out: list[BatchMessage], max_messages: int) -> int:
    if len(out) >= max_messages:
        raise MessageFormatError(f"a batch holds more than {max_messages} messages")
    if at + _BATCH_HEAD.size + 4 > len(data):
        raise MessageFormatError(f"batch message at byte {at} ends inside its fixed fields")
    size, _magic, _crc, flag = _BATCH_HEAD.unpack_from(data, at)
    end: int = at + size
    (blen,) = _I32.unpack_from(data, at + _BATCH_HEAD.size)
    p = at + _BATCH_HEAD.size + 4
    if size < _BATCH_HEAD.size + 6 or end > len(data) or blen < 0 or p + blen + 2 > end:
        raise MessageFormatError(f"batch message at byte {at}: size {size} or body length {blen} "
                                 "does not fit")
    body = bytes(data[p:p + blen])
    plen: int = _I16.unpack_from(data, p + blen)[0]
    q = p + blen + 2
    if plen < 0 or q + plen != end:
        raise MessageFormatError(f"batch message at byte {at}: properties do not end at its size")
    out.append(BatchMessage(flag, body, parse_properties(bytes(data[q:q + plen]).decode("utf-8"))))
    return end


def message_id(store_host: tuple[str, int], offset: int) -> str:
    """``createMessageId``: host and offset as 32 hex digits (IPv4)."""
    return (_host(store_host) + struct.pack(">q", offset)).hex().upper()


def decode_message_id(msg_id: str) -> tuple[tuple[str, int], int]:
    """``decodeMessageId``: (store host, offset); ValueError when it is not one."""
    raw = bytes.fromhex(msg_id)
    if len(raw) != 16:
        raise ValueError(f"a message id is 32 hex digits (IPv4), got {len(msg_id)}")
    ip, port = _HOST.unpack_from(raw)
    (offset,) = struct.unpack_from(">q", raw, 8)
    return (str(ipaddress.ip_address(ip)), port), offset
