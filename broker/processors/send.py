"""SEND_MESSAGE and SEND_BATCH on the leader (RocketMQ's SendMessageProcessor): each
record (``protocol.record_batch``: 1..N messages of one queue) is checked -- size, header,
topic, and its messages read once as consumers will read them (``check_messages``: bodies
not copied) -- before any record of the request is proposed; a malformed one refuses the
request with INVALID_ARGUMENT naming the message and field (and one whose messages would
inflate past ``max_message_bytes``, or records inflating past ``MAX_INFLATED_PER_REQUEST``
in all, MESSAGE_TOO_LARGE from their headers, before anything is decompressed; compressed
records are read on an inflating thread, ``broker.store.inflation``). Replicas never decode them.
A SPECIAL record (a property the broker acts on: a delay, a transaction) is decoded and
split into records of one, each prepared
(``DeferredService.prepare``: a delay becomes a delivery time). The ``WritePath`` then packs
the records into entries and answers with the apply outcome of each; a record's outcome
answers each of its messages (``rows``)::

    SEND_MESSAGE   SendMessageRequest (a record of one)  -> WriteResponse
    SEND_BATCH     SendBatchRequest (records)            -> SendBatchResponse (a row per message)

(their layouts: ``protocol.send``)

``OUTCOME_CODE`` maps an apply outcome to the response code every processor answers with.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from broker.processors.outcomes import OUTCOME_CODE, answer, written
from broker.security.authorizer import Need
from broker.state.held import Prop
from broker.state.machine import Applied, Outcome
from broker.store.entry_batch import MessageTooLarge
from broker.store.inflation import MAX_INFLATED_PER_REQUEST, inflate
from protocol.acl import Action, ResourceType
from protocol.message_format import Message, encode_message, message_of
from protocol.names import validate_topic
from protocol.record_batch import (
    MessageFormatError,
    RecordHeader,
    check_messages,
    decode_messages,
    read_header,
)
from protocol.remoting import Frame, FrameError, ResponseCode
from protocol.send import SendBatchRequest, SendBatchResponse, SendMessageRequest, SendRow

if TYPE_CHECKING:
    from broker.processors.context import BrokerContext

__all__ = ["OUTCOME_CODE", "SendProcessor", "answer", "written"]

class SendProcessor:
    def __init__(self, server: BrokerContext) -> None:
        self._server = server

    def _header(self, record: bytes, checked_topics: set[str]) -> RecordHeader:
        """``record``'s header once its size, its inflated size and its topic are checked;
        raises for a bad one. Topics in ``checked_topics`` (a request's, checked once) are
        not checked again."""
        if len(record) > self._server.max_message_bytes:
            raise MessageTooLarge(f"record of {len(record)} bytes exceeds this broker's "
                                  f"{self._server.max_message_bytes}-byte limit (max_message_bytes)")
        try:
            h = read_header(record)
        except MessageFormatError as e:
            raise FrameError(ResponseCode.INVALID_ARGUMENT, str(e)) from None
        if h.raw_length > self._server.max_message_bytes:  # before anything is decompressed
            raise MessageTooLarge(f"record of {len(record)} bytes whose messages are {h.raw_length} bytes "
                                  f"decompressed exceeds this broker's {self._server.max_message_bytes}-byte "
                                  "limit (max_message_bytes)")
        if h.topic not in checked_topics:
            validate_topic(h.topic, system=False)
            if h.topic not in self._server.machine.topics:
                raise FrameError(ResponseCode.TOPIC_NOT_EXIST,
                                 f"topic {h.topic!r} does not exist; create it first (auto-create is off)")
            checked_topics.add(h.topic)
        return h

    async def _check_records(self, records: tuple[bytes, ...] | list[bytes],
                             code: int) -> list[tuple[bytes, int]]:
        """The records to store for ``records``, each with its message count (itself, or a
        SPECIAL record's messages as prepared records of one); raises for a bad one, before
        anything is proposed. Compressed records inflate to MAX_INFLATED_PER_REQUEST in all
        (refused from their headers) and are read on an inflating thread."""
        checked: set[str] = set()
        headed = [(record, self._header(record, checked)) for record in records]
        inflated = sum(h.raw_length for _, h in headed if h.codec)
        if inflated > MAX_INFLATED_PER_REQUEST:
            raise MessageTooLarge(
                f"the request's compressed records inflate to {inflated} bytes in all, more than this "
                f"broker reads for one request ({MAX_INFLATED_PER_REQUEST}): send them in several requests")
        read = await inflate(_read_records, headed) if inflated else _read_records(headed)
        out: list[tuple[bytes, int]] = []
        for (record, h), messages in zip(headed, read, strict=True):
            if messages is None:
                out.append((record, h.count))
                continue
            for m in messages:
                group = m.properties.get(Prop.PGROUP)
                if Prop.TRAN in m.properties and group:  # its check-backs go to that group's producers
                    self._server.access.require(Need(ResourceType.GROUP, group, (Action.PUB,)), code)
            out.extend((encode_message(self._server.deferred.prepare(m)), 1) for m in messages)
        return out

    async def send(self, frame: Frame) -> Frame:
        """SEND_MESSAGE: one record of one message."""
        self._server.require_leader()
        records = await self._check_records([SendMessageRequest.from_frame(frame).message], frame.code)
        if len(records) != 1 or records[0][1] != 1:
            raise FrameError(ResponseCode.INVALID_ARGUMENT, "SEND_MESSAGE carries a record of one message; "
                                                            "send more with SEND_BATCH")
        (applied,) = await self._timed_send([records[0][0]])
        return answer(frame, applied)

    async def _timed_send(self, records: list[bytes], counts: list[int] | None = None) -> list[Applied]:
        started = asyncio.get_running_loop().time()
        outcomes = await self._server.write.send(records)
        self._server.metrics.commit_latency.observe(asyncio.get_running_loop().time() - started)
        counts = counts or [1] * len(outcomes)
        self._server.metrics.sent.inc(sum(n for a, n in zip(outcomes, counts, strict=True)
                                          if a.outcome == Outcome.STORED))
        return outcomes

    async def send_batch(self, frame: Frame) -> Frame:
        """SEND_BATCH: records, answered message by message."""
        self._server.require_leader()
        prepared = await self._check_records(SendBatchRequest.from_frame(frame).records, frame.code)
        counts = [n for _, n in prepared]
        outcomes = await self._timed_send([r for r, _ in prepared], counts)
        return SendBatchResponse(rows=rows(outcomes, counts)).reply(frame)


def rows(outcomes: list[Applied], counts: list[int]) -> list[SendRow]:
    """A row per message: a record's outcome for each of its ``count`` messages, the queue
    offsets and positions counted from the record's (-1 stays -1)."""
    out = []
    for a, count in zip(outcomes, counts, strict=True):
        code = OUTCOME_CODE[a.outcome]
        offset, position = a.queue_offset, a.position
        for i in range(count):
            out.append(SendRow(code, a.queue_id, offset + i if offset >= 0 else -1, a.reason,
                               position + i if position >= 0 else -1))
    return out


def _read_records(headed: list[tuple[bytes, RecordHeader]]) -> list[list[Message] | None]:
    """Each record's messages read once as consumers will (``check_messages``: the one
    decode of them anywhere on the broker; replicas trust the header), and a SPECIAL
    record's decoded (None for the others). FrameError INVALID_ARGUMENT for a malformed
    one. Any thread: it only reads its arguments."""
    out: list[list[Message] | None] = []
    for record, h in headed:
        try:
            check_messages(record, h)
            out.append([message_of(r) for r in decode_messages(record, h)] if h.special else None)
        except MessageFormatError as e:
            raise FrameError(ResponseCode.INVALID_ARGUMENT,
                             f"a record for topic {h.topic!r} queue {h.queue_id} is malformed: {e}") from None
    return out
