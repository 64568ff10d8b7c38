"""Redeliveries and transactions on the leader: CONSUMER_SEND_MSG_BACK (a retry copy in
%RETRY%group on the retry schedule, or %DLQ%group past maxReconsumeTimes) and
END_TRANSACTION (commit or roll back a half message); the held copies are released by
``broker.deferred.service``. (The layouts: ``protocol.deferred``.)
"""

from __future__ import annotations

import asyncio
import time

import msgspec

from broker.clients.retry_topics import RetryQuotaExceeded
from broker.processors.base import Processor
from broker.processors.outcomes import OUTCOME_CODE, written
from broker.security.access_control import current_user
from broker.store.consume_queue import OffsetOutOfRange
from broker.store.fragments import MessageGone, read_message_at
from protocol.deferred import EndTransactionRequest, EndTransactionResponse, SendBackRequest, SendBackResponse
from protocol.message_format import MessageFormatError, encode_message, message_at
from protocol.names import validate_group
from protocol.remoting import Frame, FrameError, ResponseCode

__all__ = ["APPLY_WAIT_S", "DeferredProcessor"]

#: How long a leader that has not applied every committed entry yet (elected a moment ago)
#: waits for its apply step before judging a send-back; then SYSTEM_BUSY (the client retries).
APPLY_WAIT_S = 3.0


class DeferredProcessor(Processor):

    async def send_back(self, frame: Frame) -> Frame:
        """A consumer could not consume the message at ``position``: store a retry copy in
        %RETRY%group (delayed by the retry schedule) or, past ``maxReconsumeTimes``, in
        %DLQ%group -- a group with a retry policy (``raftmq group config``): delayed by its
        backoff, dead-lettered after its max deliveries (the request's max is ignored). Only a
        message a consumer can pull: one in its topic's consume queue (not held -- delayed, a
        transaction half -- nor of a deleted topic)."""
        self._server.require_leader()
        req = SendBackRequest.from_frame(frame)
        group, position, max_times = validate_group(req.group), req.position, req.max_reconsume_times
        try:
            record, at = read_message_at(self._server.rlog.reader, position)
            stored = message_at(record, position - at)
        except (MessageGone, MessageFormatError, ValueError) as e:
            raise FrameError(ResponseCode.INVALID_ARGUMENT,
                             f"no message at position {position}: {e}") from None
        if not self._in_its_queue(stored.topic, stored.queue_id, at) and \
                not await self._in_its_queue_once_applied(stored.topic, stored.queue_id, at):
            raise FrameError(ResponseCode.INVALID_ARGUMENT,
                             f"no message a consumer can pull at position {position}: it is held "
                             "(delayed, or a transaction half) or its topic was deleted")
        policy = self._server.machine.pops.explicit_policy(group)  # raftmq group config
        if policy is not None:  # its max counts deliveries; reconsume times count redeliveries
            max_times = policy.max_deliveries - 1
        copy = self._server.deferred.retry_copy(stored, group, max_times, position,
                                                () if policy is None else policy.backoff_ms)
        if copy.topic not in self._server.machine.topics:  # made on first use: the user's quota
            try:
                self._server.retry_quota.take(current_user(), [copy.topic])
            except RetryQuotaExceeded as e:
                raise FrameError(ResponseCode.NO_PERMISSION, str(e)) from None
        (applied,) = await self._server.write.send([encode_message(copy)])
        code = OUTCOME_CODE[applied.outcome]
        if code != ResponseCode.SUCCESS:
            return frame.response(code, remark=applied.reason)
        return SendBackResponse(**msgspec.structs.asdict(written(applied)), topic=copy.topic,
                                reconsume_times=copy.reconsume).reply(frame)

    async def _in_its_queue_once_applied(self, topic: str, queue_id: int, record_at: int) -> bool:
        """``_in_its_queue`` once this leader applied what was committed when asked and the
        message's own entry: a leader
        elected a moment ago may not have applied the message's queue unit yet (judging it
        then would refuse a message a consumer did pull). Raises SYSTEM_BUSY past
        ``APPLY_WAIT_S``."""
        held = self._server.rlog.reader.entry_containing(record_at)
        # what was committed when asked, and at least the message's own entry: a new leader's
        # commit index lags until an entry of its own term commits
        target = max(self._server.rlog.committed_index, held[0] if held is not None else 0)
        deadline = time.monotonic() + APPLY_WAIT_S
        while self._server.machine.applied_index() < target:
            if time.monotonic() >= deadline:
                raise FrameError(ResponseCode.SYSTEM_BUSY,
                                 f"this leader is still applying the log (applied "
                                 f"{self._server.machine.applied_index()} of {target}); retry")
            await asyncio.sleep(0.01)
        return self._in_its_queue(topic, queue_id, record_at)

    def _in_its_queue(self, topic: str, queue_id: int, record_at: int) -> bool:
        """Whether the record at ``record_at`` is a unit of ``topic``'s queue ``queue_id``."""
        cq = self._server.machine.queue(topic, queue_id) if topic in self._server.machine.topics else None
        if cq is None:
            return False
        try:
            return cq.get(cq.offset_for_position(record_at)).position == record_at
        except OffsetOutOfRange:  # past the end, or trimmed meanwhile
            return False

    async def end_transaction(self, frame: Frame) -> Frame:
        """Commit (make the half message visible in its topic) or roll back a transaction."""
        self._server.require_leader()
        req = EndTransactionRequest.from_frame(frame)
        outcome = await self._server.deferred.end_transaction(req.position, req.commit)
        return EndTransactionResponse(outcome=outcome).reply(frame)
