"""Offsets and queue locks at the edge (RocketMQ's ConsumerManageProcessor and the offset
requests of its AdminBrokerProcessor):

    QUERY_CONSUMER_OFFSET        -> QUERY_OFFSET; none committed: 0 while the queue still holds
                                    its first message (RocketMQ answers 0 while that message is
                                    in memory), else QUERY_NOT_FOUND (the client then starts
                                    where its ConsumeFromWhere says)
    UPDATE_CONSUMER_OFFSET       -> COMMIT_OFFSET (through the log, on the leader)
    GET_MAX_OFFSET, GET_MIN_OFFSET, SEARCH_OFFSET_BY_TIMESTAMP -> SEARCH_OFFSET
    LOCK_BATCH_MQ, UNLOCK_BATCH_MQ -> LOCK/UNLOCK_BATCH_MQ per topic (through the log); the
                                    answer lists the queues this client holds
"""

from __future__ import annotations

from collections import defaultdict

from broker.rocketmq.answers import refused
from broker.rocketmq.client_link import RocketClient
from broker.rocketmq.edge import Edge
from protocol.offset import (
    CommitOffsetRequest,
    LockQueuesRequest,
    LockQueuesResponse,
    QueryOffsetRequest,
    QueryOffsetResponse,
    UnlockQueuesRequest,
)
from protocol.query import SearchOffsetRequest, SearchOffsetResponse
from protocol.remoting import ResponseCode as Native
from protocol.rocketmq.bodies import BodyError, MessageQueue, decode_lock_batch, lock_batch_response
from protocol.rocketmq.codes import RequestCode, ResponseCode
from protocol.rocketmq.frame import RemotingFrame
from protocol.rocketmq.headers import (
    GetMaxOffsetRequestHeader,
    OffsetResponseHeader,
    QueryConsumerOffsetRequestHeader,
    SearchOffsetRequestHeader,
    UpdateConsumerOffsetRequestHeader,
    reply,
)

__all__ = ["OffsetHandlers"]


def _offset(frame: RemotingFrame, offset: int) -> RemotingFrame:
    return reply(frame, ResponseCode.SUCCESS, OffsetResponseHeader(offset=offset))


class OffsetHandlers:
    def __init__(self, edge: Edge) -> None:
        self._edge = edge

    async def query_consumer_offset(self, conn: RocketClient, frame: RemotingFrame) -> RemotingFrame:
        h = QueryConsumerOffsetRequestHeader.of(frame)
        answer = await self._edge.call(QueryOffsetRequest(group=h.consumer_group, topic=h.topic,
                                                          queue_id=h.queue_id))
        if answer.code != Native.SUCCESS:
            return refused(frame, answer)
        offset = QueryOffsetResponse.from_frame(answer).offset
        if offset < 0 and await self._starts_at_zero(h.topic, h.queue_id):
            offset = 0  # RocketMQ's answer while the queue still holds its first message
        if offset < 0:
            return frame.response(ResponseCode.QUERY_NOT_FOUND,
                                  remark=f"RaftMQ: group {h.consumer_group!r} has no offset for this queue")
        return _offset(frame, offset)

    async def _starts_at_zero(self, topic: str, queue_id: int) -> bool:
        answer = await self._edge.call(SearchOffsetRequest(topic=topic, queue_id=queue_id))
        return answer.code == Native.SUCCESS and SearchOffsetResponse.from_frame(answer).min_offset == 0

    async def update_consumer_offset(self, conn: RocketClient, frame: RemotingFrame) -> RemotingFrame:
        h = UpdateConsumerOffsetRequestHeader.of(frame)
        commit = CommitOffsetRequest(group=h.consumer_group, topic=h.topic, queue_id=h.queue_id,
                                     offset=max(h.commit_offset, 0))
        answer = await self._edge.call(commit)
        if answer.code != Native.SUCCESS:
            return refused(frame, answer)
        return frame.response(ResponseCode.SUCCESS)

    async def queue_offset(self, conn: RocketClient, frame: RemotingFrame) -> RemotingFrame:
        """GET_MAX_OFFSET, GET_MIN_OFFSET and SEARCH_OFFSET_BY_TIMESTAMP."""
        timestamp = None
        if frame.code == RequestCode.SEARCH_OFFSET_BY_TIMESTAMP:
            s = SearchOffsetRequestHeader.of(frame)
            topic, queue_id, timestamp = s.topic, s.queue_id, max(s.timestamp, 0)
        else:
            g = GetMaxOffsetRequestHeader.of(frame)
            topic, queue_id = g.topic, g.queue_id
        search = SearchOffsetRequest(topic=topic, queue_id=queue_id, timestamp=timestamp)
        answer = await self._edge.call(search)
        if answer.code != Native.SUCCESS:
            return refused(frame, answer)
        found = SearchOffsetResponse.from_frame(answer)
        if frame.code == RequestCode.GET_MAX_OFFSET:
            return _offset(frame, found.max_offset)
        if frame.code == RequestCode.GET_MIN_OFFSET:
            return _offset(frame, found.min_offset)
        return _offset(frame, found.offset if found.offset is not None else found.max_offset)

    async def lock_batch(self, conn: RocketClient, frame: RemotingFrame) -> RemotingFrame:
        """LOCK_BATCH_MQ and UNLOCK_BATCH_MQ."""
        try:
            req = decode_lock_batch(frame.body)
        except BodyError as e:
            return frame.response(ResponseCode.SYSTEM_ERROR, remark=f"RaftMQ: {e}")
        by_topic: dict[str, list[MessageQueue]] = defaultdict(list)
        for q in req.queues:
            by_topic[q.topic].append(q)
        kind = LockQueuesRequest if frame.code == RequestCode.LOCK_BATCH_MQ else UnlockQueuesRequest
        held: list[MessageQueue] = []
        for topic, queues in sorted(by_topic.items()):
            answer = await self._edge.call(kind(group=req.group, client_id=req.client_id, topic=topic,
                                                queues=tuple(sorted({q.queue_id for q in queues}))))
            if answer.code != Native.SUCCESS:
                return refused(frame, answer)
            ids = set(LockQueuesResponse.from_frame(answer).queue_ids)
            held += [q for q in queues if q.queue_id in ids]
        if frame.code == RequestCode.UNLOCK_BATCH_MQ:
            return frame.response(ResponseCode.SUCCESS)
        return reply(frame, ResponseCode.SUCCESS, body=lock_batch_response(held))
