"""Clients and redeliveries at the edge (RocketMQ's ClientManageProcessor, the send-back of
its SendMessageProcessor, EndTransactionProcessor):

    HEART_BEAT                 -> HEARTBEAT: the consumer groups' topics (RaftMQ creates
                                  ``%RETRY%group`` as RocketMQ does) and a producer group
                                  (not RocketMQ's CLIENT_INNER_PRODUCER); each group's filter
                                  remembered for its pulls (``Edge.subscribed``)
    CHECK_CLIENT_CONFIG        a SQL92 filter compiles (RaftMQ's SQL92), else SUBSCRIPTION_PARSE_FAILED
    UNREGISTER_CLIENT          -> UNREGISTER_CLIENT (the consumer group's, this connection's)
    GET_CONSUMER_LIST_BY_GROUP -> GET_CONSUMER_LIST; none: SYSTEM_ERROR, as RocketMQ answers
    CONSUMER_SEND_MSG_BACK     -> CONSUMER_SEND_MSG_BACK by position (the header's ``offset``,
                                  the CommitLog offset of the message's id); delay level -1
                                  dead-letters at once; the retry schedule is RaftMQ's
    END_TRANSACTION            -> END_TRANSACTION of the half at ``commitLogOffset``
                                  (commit 8, rollback 12; 0 "unknown" leaves it to the check)
"""

from __future__ import annotations

from broker.rocketmq.answers import refused
from broker.rocketmq.client_link import RocketClient
from broker.rocketmq.edge import Edge
from protocol.consumer import ConsumerListRequest, ConsumerListResponse, HeartbeatRequest, UnregisterRequest
from protocol.deferred import DEFAULT_MAX_RECONSUME, EndTransactionRequest, SendBackRequest
from protocol.remoting import ResponseCode as Native
from protocol.rocketmq.bodies import BodyError, consumer_list, decode_check_client, decode_heartbeat
from protocol.rocketmq.codes import ResponseCode
from protocol.rocketmq.frame import RemotingFrame
from protocol.rocketmq.headers import (
    ConsumerSendMsgBackRequestHeader,
    EndTransactionRequestHeader,
    GetConsumerListByGroupRequestHeader,
    UnregisterClientRequestHeader,
    reply,
)
from protocol.sql_filter import FilterSyntaxError, compile_filter

__all__ = ["INNER_PRODUCER", "ClientHandlers"]

INNER_PRODUCER = "CLIENT_INNER_PRODUCER"
_COMMIT, _ROLLBACK = 8, 12


class ClientHandlers:
    def __init__(self, edge: Edge) -> None:
        self._edge = edge

    async def heartbeat(self, conn: RocketClient, frame: RemotingFrame) -> RemotingFrame:
        try:
            beat = decode_heartbeat(frame.body)
        except BodyError as e:
            return frame.response(ResponseCode.SYSTEM_ERROR, remark=f"RaftMQ: {e}")
        subscriptions = {c.group: tuple(s.topic for s in c.subscriptions) for c in beat.consumers}
        producer = next((g for g in beat.producer_groups if g != INNER_PRODUCER), None)
        request = HeartbeatRequest(client_id=beat.client_id, producer_group=producer,
                                   subscriptions=subscriptions or None)
        answer = await self._edge.call(request)
        if answer.code != Native.SUCCESS:
            return refused(frame, answer)
        conn.heard(request)
        for c in beat.consumers:
            for s in c.subscriptions:
                self._edge.subscribed(c.group, s.topic, (s.expression_type, s.expression))
        return frame.response(ResponseCode.SUCCESS)

    async def check_client(self, conn: RocketClient, frame: RemotingFrame) -> RemotingFrame:
        """CHECK_CLIENT_CONFIG: a consumer's SQL92 filter compiles (a TAG one always does)."""
        try:
            sub = decode_check_client(frame.body)
        except BodyError as e:
            return frame.response(ResponseCode.SYSTEM_ERROR, remark=f"RaftMQ: {e}")
        if sub is not None and sub.expression_type.upper() == "SQL92":
            try:
                compile_filter(sub.expression)
            except FilterSyntaxError as e:
                return frame.response(ResponseCode.SUBSCRIPTION_PARSE_FAILED, remark=f"RaftMQ: {e}")
        return frame.response(ResponseCode.SUCCESS)

    async def unregister(self, conn: RocketClient, frame: RemotingFrame) -> RemotingFrame:
        h = UnregisterClientRequestHeader.of(frame)
        if h.consumer_group:
            answer = await self._edge.call(UnregisterRequest(client_id=h.client_id, group=h.consumer_group))
            if answer.code != Native.SUCCESS:
                return refused(frame, answer)
        return frame.response(ResponseCode.SUCCESS)

    async def consumer_list(self, conn: RocketClient, frame: RemotingFrame) -> RemotingFrame:
        group = GetConsumerListByGroupRequestHeader.of(frame).consumer_group
        answer = await self._edge.call(ConsumerListRequest(group=group))
        if answer.code != Native.SUCCESS:
            return refused(frame, answer)
        ids = ConsumerListResponse.from_frame(answer).client_ids
        if not ids:
            return frame.response(ResponseCode.SYSTEM_ERROR, remark=f"RaftMQ: no consumer of group {group!r}")
        return reply(frame, ResponseCode.SUCCESS, body=consumer_list(ids))

    async def send_back(self, conn: RocketClient, frame: RemotingFrame) -> RemotingFrame:
        h = ConsumerSendMsgBackRequestHeader.of(frame)
        times = 0 if h.delay_level < 0 else (h.max_reconsume_times if h.max_reconsume_times is not None
                                             else DEFAULT_MAX_RECONSUME)
        answer = await self._edge.call(SendBackRequest(group=h.group, position=max(h.offset, 0),
                                                       max_reconsume_times=min(max(times, 0), 10_000)))
        if answer.code != Native.SUCCESS:
            return refused(frame, answer)
        return frame.response(ResponseCode.SUCCESS)

    async def end_transaction(self, conn: RocketClient, frame: RemotingFrame) -> RemotingFrame:
        h = EndTransactionRequestHeader.of(frame)
        if h.commit_or_rollback not in (_COMMIT, _ROLLBACK):
            return frame.response(ResponseCode.SUCCESS)  # unknown: the broker's check asks again
        answer = await self._edge.call(EndTransactionRequest(position=max(h.commit_log_offset, 0),
                                                             commit=h.commit_or_rollback == _COMMIT))
        if answer.code != Native.SUCCESS:
            return refused(frame, answer)
        return frame.response(ResponseCode.SUCCESS)
