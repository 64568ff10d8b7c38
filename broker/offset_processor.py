"""Consumer offsets and orderly-consumption locks (RocketMQ's ConsumerManageProcessor and
lockBatchMQ): COMMIT_OFFSET and LOCK/UNLOCK_BATCH_MQ through the log on the leader, so a
new leader knows every offset and lock; QUERY_OFFSET from any replica.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgpack

from broker.commands import CommitOffset, LockQueue, encode_admin
from broker.send_processor import answer
from broker.state_machine import Outcome
from protocol.names import validate_group, validate_topic
from protocol.remoting import Frame, FrameError, RequestCode, ResponseCode, ext_int, ext_str

if TYPE_CHECKING:
    from broker.server import BrokerServer

__all__ = ["OffsetProcessor"]



class OffsetProcessor:
    def __init__(self, server: BrokerServer) -> None:
        self._server = server

    async def commit_offset(self, frame: Frame) -> Frame:
        self._server.require_leader()
        cmd = CommitOffset(validate_group(ext_str(frame, "group")),
                           validate_topic(ext_str(frame, "topic"), system=True),
                           ext_int(frame, "queueId", minimum=0), ext_int(frame, "offset", minimum=0))
        (applied,) = await self._server.write.send([encode_admin(cmd)])
        return answer(frame, applied)

    async def lock_queues(self, frame: Frame) -> Frame:
        """LOCK_BATCH_MQ / UNLOCK_BATCH_MQ: ext group, clientId, topic, queues (ids); the body
        of the answer is the msgpack list of the queue ids this client now holds (lock) or
        gave back (unlock). Decided by the apply step, so a new leader knows every lock."""
        self._server.require_leader()
        group = validate_group(ext_str(frame, "group"))
        topic = validate_topic(ext_str(frame, "topic"), system=True)
        client_id = ext_str(frame, "clientId")
        queues = frame.ext.get("queues")
        if not client_id or not isinstance(queues, list | tuple) or not queues or not all(
                type(q) is int and 0 <= q < 1024 for q in queues):
            raise FrameError(ResponseCode.INVALID_ARGUMENT,
                             "clientId and queues (a non-empty list of queue ids) are required")
        lock = frame.code == RequestCode.LOCK_BATCH_MQ
        outcomes = await self._server.write.send([encode_admin(LockQueue(group, client_id, topic, q, lock))
                                          for q in dict.fromkeys(queues)])
        held = [a.queue_id for a in outcomes if a.outcome == Outcome.DONE]
        return frame.response(ResponseCode.SUCCESS, body=msgpack.packb(held))

    async def query_offset(self, frame: Frame) -> Frame:
        offset = self._server.machine.committed_offset(ext_str(frame, "group"), ext_str(frame, "topic"),
                                               ext_int(frame, "queueId", minimum=0))
        return frame.response(ResponseCode.SUCCESS, ext={"offset": -1 if offset is None else offset})
