"""SEND_MESSAGE and SEND_BATCH on the leader (RocketMQ's SendMessageProcessor): each
message is checked (size, format, topic) and prepared (a delay becomes a delivery time:
``DeferredService.prepare``) before any of a batch is proposed; the ``WritePath`` then
packs it into entries and answers with the apply outcome (``answer``)::

    SEND_MESSAGE   SendMessageRequest (one encoded message) -> WriteResponse
    SEND_BATCH     SendBatchRequest (encoded messages)      -> SendBatchResponse (a row each)

(their layouts: ``protocol.send``)

``OUTCOME_CODE`` maps an apply outcome to the response code every processor answers with.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from broker.entry_batch import MessageTooLarge
from broker.state_machine import Applied, Outcome
from protocol.message_format import MessageFormatError, decode_message, encode_message
from protocol.names import validate_topic
from protocol.remoting import Frame, FrameError, ResponseCode
from protocol.send import SendBatchRequest, SendBatchResponse, SendMessageRequest, SendRow, WriteResponse

if TYPE_CHECKING:
    from broker.server import BrokerServer

__all__ = ["OUTCOME_CODE", "SendProcessor", "answer", "written"]

OUTCOME_CODE = {
    Outcome.STORED: ResponseCode.SUCCESS,
    Outcome.DUPLICATE: ResponseCode.SUCCESS,
    Outcome.DONE: ResponseCode.SUCCESS,
    Outcome.TOPIC_NOT_EXIST: ResponseCode.TOPIC_NOT_EXIST,
    Outcome.NO_PERMISSION: ResponseCode.NO_PERMISSION,
    Outcome.INVALID: ResponseCode.INVALID_ARGUMENT,
    Outcome.SEQUENCE_GAP: ResponseCode.SEQUENCE_GAP,
    Outcome.LOCKED: ResponseCode.NO_PERMISSION,
    Outcome.ABANDONED: ResponseCode.SYSTEM_BUSY,  # not stored; a retry may succeed
    Outcome.FRAGMENT: ResponseCode.SYSTEM_ERROR,  # never a caller's outcome
}


def answer(frame: Frame, applied: Applied) -> Frame:
    """The response to one record's apply outcome: a WriteResponse, or the error's remark."""
    code = OUTCOME_CODE[applied.outcome]
    if code != ResponseCode.SUCCESS:
        return frame.response(code, remark=applied.reason)
    return written(applied).reply(frame)


def written(applied: Applied) -> WriteResponse:
    """Where a successfully applied record went."""
    return WriteResponse(queue_id=applied.queue_id, queue_offset=applied.queue_offset,
                         position=applied.position, duplicate=applied.outcome == Outcome.DUPLICATE)


class SendProcessor:
    def __init__(self, server: BrokerServer) -> None:
        self._server = server

    def _check_message(self, record: bytes, checked_topics: set[str] | None = None) -> bytes:
        """The record as it will be stored (delays become a delivery time); raises for bad ones.
        Topics in ``checked_topics`` (a batch's, checked once) are not checked again."""
        if len(record) > self._server.max_message_bytes:
            raise MessageTooLarge(f"message of {len(record)} bytes exceeds this broker's "
                                  f"{self._server.max_message_bytes}-byte limit (max_message_bytes)")
        try:
            m = decode_message(record)
        except MessageFormatError as e:
            raise FrameError(ResponseCode.INVALID_ARGUMENT, str(e)) from None
        if checked_topics is None or m.topic not in checked_topics:
            validate_topic(m.topic, system=False)
            if m.topic not in self._server.machine.topics:
                raise FrameError(ResponseCode.TOPIC_NOT_EXIST,
                                 f"topic {m.topic!r} does not exist; create it first (auto-create is off)")
            if checked_topics is not None:
                checked_topics.add(m.topic)
        if not m.properties:
            return record
        prepared = self._server.deferred.prepare(m)
        return record if prepared is m else encode_message(prepared)

    async def send(self, frame: Frame) -> Frame:
        """SEND_MESSAGE: one encoded message."""
        self._server.require_leader()
        record = self._check_message(SendMessageRequest.from_frame(frame).message)
        (applied,) = await self._timed_send([record])
        return answer(frame, applied)

    async def _timed_send(self, records: list[bytes]) -> list[Applied]:
        started = asyncio.get_running_loop().time()
        outcomes = await self._server.write.send(records)
        self._server.metrics.commit_latency.observe(asyncio.get_running_loop().time() - started)
        self._server.metrics.sent.inc(sum(a.outcome == Outcome.STORED for a in outcomes))
        return outcomes

    async def send_batch(self, frame: Frame) -> Frame:
        """SEND_BATCH: encoded messages, answered row by row."""
        self._server.require_leader()
        checked: set[str] = set()
        # all checked before anything is proposed
        records = [self._check_message(r, checked) for r in SendBatchRequest.from_frame(frame).messages]
        outcomes = await self._timed_send(records)
        rows = [SendRow(OUTCOME_CODE[a.outcome], a.queue_id, a.queue_offset, a.reason, a.position)
                for a in outcomes]
        return SendBatchResponse(rows=rows).reply(frame)
