"""RocketMQ messages <-> RaftMQ messages, at the edge (pure).

A RocketMQ send's header and properties become one RaftMQ ``Message``:

    topic, queueId, flag, bornTimestamp, reconsumeTimes   -> the same fields
    property TAGS                                          -> tags
    property KEYS (space separated)                        -> keys
    property UNIQ_KEY (the client's id: 32 hex digits      -> msg_id (16 bytes), so the id a
    from an IPv4 client)                                      RocketMQ client shows finds the
                                                              message through RaftMQ's index;
    (56 hex digits from an IPv6 one)                       -> kept, and one more key, so the
                                                              index finds it by key
    (none: the Go client's batch)                          -> NO_UNIQ_KEY = "1", so it is
                                                              served without one, as RocketMQ's
                                                              broker serves it: the client's
                                                              msgId is then its offsetMsgId
    other properties (DELAY, TRAN_MSG, PGROUP, WAIT, user) -> properties, as they are (RaftMQ
                                                              reads DELAY, TRAN_MSG and PGROUP
                                                              under RocketMQ's names)
    the connection's address                               -> born_host

and back, a stored RaftMQ message (its queue offset, CommitLog position and store time
from the pull's row) becomes a ``StoredMessage`` whose ``commit_log_offset`` is the
message's RaftMQ position and whose store host is the answering broker, so its
``offsetMsgId`` (``protocol.rocketmq.message.message_id``) names that broker and position.
"""

from __future__ import annotations

import re

from protocol.message_format import Message
from protocol.record_batch import MessageRecord
from protocol.rocketmq.message import BatchMessage, StoredMessage, parse_properties

__all__ = ["KEYS", "NO_UNIQ_KEY", "TAGS", "UNIQ_KEY", "host_port", "is_message_id", "native_message",
           "stored_message"]

TAGS = "TAGS"
KEYS = "KEYS"
UNIQ_KEY = "UNIQ_KEY"
#: a RocketMQ message stored without UNIQ_KEY (a RaftMQ client's messages have none either,
#: but are shown with their RaftMQ message id as UNIQ_KEY); never shown to RocketMQ clients
NO_UNIQ_KEY = "RAFTMQ_NO_UNIQ_KEY"
_HEX32 = re.compile(r"[0-9A-Fa-f]{32}")


def host_port(address: str) -> tuple[str, int]:
    """``"ip:port"`` -> (ip, port); anything unreadable -> ("127.0.0.1", 0)."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if not port.isdigit() or not re.fullmatch(r"\d+\.\d+\.\d+\.\d+", host):
        return ("127.0.0.1", int(port) if port.isdigit() else 0)
    return host, int(port)


def native_message(topic: str, queue_id: int, body: bytes, properties: dict[str, str], *, flag: int,
                   born_ms: int, born_host: str, reconsume: int = 0) -> Message:
    """The RaftMQ message a RocketMQ send stands for (module docstring)."""
    props = dict(properties)
    props.pop(NO_UNIQ_KEY, None)  # RaftMQ's own mark: set below, never taken from a client
    tags = props.pop(TAGS, None) or None
    keys = tuple(k for k in props.pop(KEYS, "").split(" ") if k)
    m = Message(topic, body, queue_id, tags, keys, props, flag=flag, born_ts_ms=born_ms,
                born_host=born_host, reconsume=reconsume)
    uniq = props.get(UNIQ_KEY)
    if uniq is not None and is_message_id(uniq):
        del props[UNIQ_KEY]
        m.msg_id = bytes.fromhex(uniq)
    elif uniq:
        m.keys = (*keys, uniq)
    else:
        props[NO_UNIQ_KEY] = "1"
    return m


def is_message_id(uniq: str) -> bool:
    """Whether a UNIQ_KEY is one RaftMQ keeps as the message id (32 upper-case hex digits)."""
    return bool(_HEX32.fullmatch(uniq)) and uniq == uniq.upper()


def batch_messages(topic: str, queue_id: int, batch: list[BatchMessage], *, born_ms: int,
                   born_host: str) -> list[Message]:
    return [native_message(topic, queue_id, b.body, b.properties, flag=b.flag, born_ms=born_ms,
                           born_host=born_host) for b in batch]


def rocket_properties(m: MessageRecord | Message) -> dict[str, str]:
    """The properties a RocketMQ client reads for ``m`` (TAGS, KEYS, UNIQ_KEY put back; none
    for a RocketMQ message sent without one)."""
    props = dict(m.properties)
    if m.tags:
        props[TAGS] = m.tags
    uniq = None if props.pop(NO_UNIQ_KEY, None) else props.setdefault(UNIQ_KEY, m.msg_id.hex().upper())
    keys = [k for k in m.keys if k != uniq]
    if keys:
        props[KEYS] = " ".join(keys)
    return props


def stored_message(m: MessageRecord | Message, *, queue_offset: int, position: int, store_ms: int,
                   store_host: tuple[str, int]) -> StoredMessage:
    """``m`` as a RocketMQ client reads it from a pull, a query or a view by id."""
    return StoredMessage(topic=m.topic, body=bytes(m.body), queue_id=m.queue_id, queue_offset=queue_offset,
                         commit_log_offset=position, born_timestamp=m.born_ts_ms,
                         born_host=host_port(m.born_host), store_timestamp=store_ms, store_host=store_host,
                         properties=rocket_properties(m), flag=m.flag, reconsume_times=m.reconsume)


def send_properties(text: str | None) -> dict[str, str]:
    return parse_properties(text or "")
