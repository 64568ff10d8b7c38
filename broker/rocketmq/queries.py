"""Reads by id and key, and topic creation, at the edge (RocketMQ's QueryMessageProcessor and
an AdminBrokerProcessor code):

    VIEW_MESSAGE_BY_ID    the header's ``offset`` is the CommitLog offset of the message id
                          this broker handed out (its RaftMQ position): the message there,
                          as a stored message (the same position on every replica)
    QUERY_MESSAGE         by key -> QUERY_MESSAGE; by unique key (ext ``_UNIQUE_KEY_QUERY``:
                          the client's UNIQ_KEY, RaftMQ's message id when it is 32 hex
                          digits) -> VIEW_MESSAGE_BY_ID, else QUERY_MESSAGE by it as a key
                          (``broker.rocketmq.translate``); the header's topic only
    UPDATE_AND_CREATE_TOPIC -> CREATE_TOPIC with ``writeQueueNums`` queues and ``perm``
                          (mqadmin updateTopic); a topic that exists is left as it is

A message found by id or key carries its queue offset: RaftMQ's index maps ids and keys to
positions, and the queue's ConsumeQueue maps the position back (-1 once trimmed).
"""

from __future__ import annotations

import time

from broker.rocketmq.answers import refused
from broker.rocketmq.client_link import RocketClient
from broker.rocketmq.edge import Edge
from broker.rocketmq.translate import UNIQ_KEY, is_message_id, rocket_properties, stored_message
from broker.security.authorizer import Need
from protocol.acl import Action, ResourceType
from protocol.message_format import MessageFormatError, decode_record
from protocol.query import QueryMessageRequest, QueryResponse, ViewMessageRequest
from protocol.remoting import FrameError
from protocol.remoting import ResponseCode as Native
from protocol.rocketmq.codes import ResponseCode
from protocol.rocketmq.frame import RemotingFrame
from protocol.rocketmq.headers import (
    CreateTopicRequestHeader,
    HeaderError,
    QueryMessageRequestHeader,
    QueryMessageResponseHeader,
    ViewMessageRequestHeader,
    reply,
)
from protocol.rocketmq.message import encode_stored
from protocol.topic import CreateTopicRequest

__all__ = ["QueryHandlers"]

class QueryHandlers:
    def __init__(self, edge: Edge) -> None:
        self._edge = edge

    async def view_by_id(self, conn: RocketClient, frame: RemotingFrame) -> RemotingFrame:
        position = ViewMessageRequestHeader.of(frame).offset
        self._edge.require(Need(ResourceType.CLUSTER, "", (Action.GET,)), frame.code)  # as VIEW_MESSAGE_BY_ID
        why = self._edge.broker.unhealthy()
        if why is not None:
            return frame.response(ResponseCode.SYSTEM_BUSY,
                                  remark=f"RaftMQ: this replica does not serve: {why}")
        try:
            m, store_ms = self._edge.broker.queries.message_at(position)
        except FrameError as e:
            return frame.response(ResponseCode.SYSTEM_ERROR, remark=f"RaftMQ: {e.message}")
        offset = self._edge.broker.queries.queue_offset_of(m.topic, m.queue_id, position)
        body = encode_stored(stored_message(m, queue_offset=offset, position=position, store_ms=store_ms,
                                            store_host=self._edge.store_host()))
        return reply(frame, ResponseCode.SUCCESS, body=body)

    async def query(self, conn: RocketClient, frame: RemotingFrame) -> RemotingFrame:
        h = QueryMessageRequestHeader.of(frame)
        if h.unique_key_query and is_message_id(h.key):
            answer = await self._edge.call(ViewMessageRequest(msg_id=h.key.lower()))
        else:
            answer = await self._edge.call(QueryMessageRequest(key=h.key, begin_ms=h.begin_timestamp,
                                                               end_ms=h.end_timestamp,
                                                               max_results=min(max(h.max_num, 1), 256)))
        if answer.code != Native.SUCCESS:
            return refused(frame, answer)
        host = self._edge.store_host()
        found = []
        for row in QueryResponse.from_frame(answer).rows:
            try:
                m = decode_record(row.message)
            except MessageFormatError:
                continue
            if m.topic == h.topic and (not h.unique_key_query or rocket_properties(m).get(UNIQ_KEY) == h.key):
                offset = self._edge.broker.queries.queue_offset_of(m.topic, m.queue_id, row.position)
                found.append(encode_stored(stored_message(m, queue_offset=offset, position=row.position,
                                                          store_ms=row.store_ms, store_host=host)))
        if not found:
            return frame.response(ResponseCode.QUERY_NOT_FOUND, remark=f"RaftMQ: no message for {h.key!r}")
        header = QueryMessageResponseHeader(index_last_update_timestamp=int(time.time() * 1000),
                                            index_last_update_phyoffset=0)
        return reply(frame, ResponseCode.SUCCESS, header, b"".join(found))

    async def create_topic(self, conn: RocketClient, frame: RemotingFrame) -> RemotingFrame:
        try:
            h = CreateTopicRequestHeader.of(frame)
        except HeaderError as e:
            return frame.response(ResponseCode.SYSTEM_ERROR, remark=f"RaftMQ: {e}")
        perm = h.perm if h.perm in (2, 4, 6) else 6
        create = CreateTopicRequest(topic=h.topic, queues=min(max(h.write_queue_nums, 1), 1024),
                                    perm=perm)  # type: ignore[arg-type]
        answer = await self._edge.call(create)
        if answer.code != Native.SUCCESS:
            return refused(frame, answer)
        return frame.response(ResponseCode.SUCCESS)
