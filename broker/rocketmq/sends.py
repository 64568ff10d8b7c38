"""SEND_MESSAGE, SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE (RocketMQ's SendMessageProcessor) at
the edge: the header and body become RaftMQ messages (``broker.rocketmq.translate``) sent
through the broker's SEND_MESSAGE (one) or SEND_BATCH (one record of the batch's messages,
or a record of one per message when one is delayed or transactional, handled as on the
native port); the answer's
``SendMessageResponseHeader`` names the stored message by ``offsetMsgId`` (this broker and
the message's RaftMQ position) and its queue offset. A batch's ``msgId`` lists every
message's id, comma separated, and ``queueOffset`` is its first message's.

The queue is the one the client chose (``queueId``: its ``MessageQueueSelector``); a delay
level is the ``DELAY`` property, read by RaftMQ under RocketMQ's name.
"""

from __future__ import annotations

from broker.rocketmq.answers import refused
from broker.rocketmq.client_link import RocketClient
from broker.rocketmq.edge import Edge
from broker.rocketmq.translate import batch_messages, native_message, send_properties
from protocol.message_format import Message, encode_message
from protocol.record_batch import encode_record, is_special
from protocol.remoting import ResponseCode as Native
from protocol.rocketmq.codes import RequestCode, ResponseCode
from protocol.rocketmq.frame import RemotingFrame
from protocol.rocketmq.headers import SendMessageResponseHeader, reply, send_header
from protocol.rocketmq.message import MessageFormatError, decode_batch, message_id
from protocol.send import SendBatchRequest, SendBatchResponse, SendMessageRequest, WriteResponse

__all__ = ["MAX_RECORD_MESSAGES", "REGION", "SendHandlers", "batch_records"]

#: a record holds at most this many messages (its count is a u16)
MAX_RECORD_MESSAGES = 65_535

#: the ``MSG_REGION`` a send's answer names (RocketMQ's default region)
REGION = "DefaultRegion"


def batch_records(messages: list[Message]) -> tuple[bytes, ...]:
    """One record for the batch (its messages share topic and queue), or a record of one per
    message when one of them has a property the broker acts on (a delay, a transaction)."""
    if any(is_special(m.properties) for m in messages) or len(messages) > MAX_RECORD_MESSAGES:
        return tuple(encode_message(m) for m in messages)
    first = messages[0]
    entries = [(m.msg_id, m.born_ts_ms, m.flag, m.tags, m.keys, m.properties, m.reconsume, m.body)
               for m in messages]
    return (encode_record(first.topic, first.queue_id, entries, born_host=first.born_host),)


class SendHandlers:
    def __init__(self, edge: Edge) -> None:
        self._edge = edge

    async def send(self, conn: RocketClient, frame: RemotingFrame) -> RemotingFrame:
        h = send_header(frame)
        m = native_message(h.topic, h.queue_id, frame.body, send_properties(h.properties), flag=h.flag,
                           born_ms=h.born_timestamp, born_host=conn.remote, reconsume=h.reconsume_times or 0)
        answer = await self._edge.call(SendMessageRequest(message=encode_message(m)))
        if answer.code != Native.SUCCESS:
            return refused(frame, answer, send=True)
        written = WriteResponse.from_frame(answer)
        return self._answer(frame, [written.position], written.queue_id, written.queue_offset)

    async def send_batch(self, conn: RocketClient, frame: RemotingFrame) -> RemotingFrame:
        h = send_header(frame, RequestCode.SEND_BATCH_MESSAGE)
        try:
            batch = decode_batch(frame.body)
        except MessageFormatError as e:
            return frame.response(ResponseCode.MESSAGE_ILLEGAL, remark=f"RaftMQ: {e}")
        if not batch:
            return frame.response(ResponseCode.MESSAGE_ILLEGAL, remark="RaftMQ: an empty batch")
        messages = batch_messages(h.topic, h.queue_id, batch, born_ms=h.born_timestamp, born_host=conn.remote)
        answer = await self._edge.call(SendBatchRequest(records=batch_records(messages)))
        if answer.code != Native.SUCCESS:
            return refused(frame, answer, send=True)
        rows = SendBatchResponse.from_frame(answer).rows
        bad = next((r for r in rows if r.code != Native.SUCCESS), None)
        if bad is not None:  # the first refused message says why (those before it are stored)
            return refused(frame, answer, send=True, code=bad.code, remark=bad.reason)
        return self._answer(frame, [r.position for r in rows], rows[0].queue_id, rows[0].queue_offset)

    def _answer(self, frame: RemotingFrame, positions: list[int], queue_id: int,
                queue_offset: int) -> RemotingFrame:
        host = self._edge.store_host()
        ids = ",".join(message_id(host, p) for p in positions if p >= 0)
        header = SendMessageResponseHeader(msg_id=ids, queue_id=queue_id, queue_offset=queue_offset,
                                           trace_on=True, msg_region=REGION)
        return reply(frame, ResponseCode.SUCCESS, header)
