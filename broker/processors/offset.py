"""Consumer offsets and orderly-consumption locks (RocketMQ's ConsumerManageProcessor and
lockBatchMQ): COMMIT_OFFSET and LOCK/UNLOCK_BATCH_MQ through the log on the leader, so a
new leader knows every offset and lock; QUERY_OFFSET from any replica (the layouts:
``protocol.offset``).
"""

from __future__ import annotations

from broker.clients.registry import ClientIdTaken
from broker.processors.base import Processor
from broker.security.access_control import current_user
from broker.state.machine import Outcome
from broker.store.commands import CommitOffset, LockQueue, encode_admin
from protocol.names import validate_group, validate_topic
from protocol.offset import (
    CommitOffsetRequest,
    LockQueuesRequest,
    LockQueuesResponse,
    QueryOffsetRequest,
    QueryOffsetResponse,
    UnlockQueuesRequest,
)
from protocol.remoting import Frame, FrameError, RequestCode, ResponseCode

__all__ = ["OffsetProcessor"]



class OffsetProcessor(Processor):

    async def commit_offset(self, frame: Frame) -> Frame:
        self._server.require_leader()
        req = CommitOffsetRequest.from_frame(frame)
        cmd = CommitOffset(validate_group(req.group), validate_topic(req.topic, system=True), req.queue_id,
                           req.offset)
        return await self._through_log(frame, cmd)

    async def lock_queues(self, frame: Frame) -> Frame:
        """LOCK_BATCH_MQ / UNLOCK_BATCH_MQ: the answer lists the queue ids this client now
        holds (lock) or gave back (unlock). Decided by the apply step, so a new leader knows
        every lock."""
        self._server.require_leader()
        lock = frame.code == RequestCode.LOCK_BATCH_MQ
        req = (LockQueuesRequest if lock else UnlockQueuesRequest).from_frame(frame)
        group = validate_group(req.group)
        topic = validate_topic(req.topic, system=True)
        try:  # (ACLs on) another user's live client: its locks are its own
            self._server.consumers.require_owner(group, req.client_id, current_user())
        except ClientIdTaken as e:
            raise FrameError(ResponseCode.NO_PERMISSION, f"{e}: its locks are its own") from None
        outcomes = await self._server.write.send([
            encode_admin(LockQueue(group, req.client_id, topic, q, lock)) for q in dict.fromkeys(req.queues)])
        held = tuple(a.queue_id for a in outcomes if a.outcome == Outcome.DONE)
        return LockQueuesResponse(queue_ids=held).reply(frame)

    async def query_offset(self, frame: Frame) -> Frame:
        req = QueryOffsetRequest.from_frame(frame)
        offset = self._server.machine.committed_offset(req.group, req.topic, req.queue_id)
        return QueryOffsetResponse(offset=-1 if offset is None else offset).reply(frame)
