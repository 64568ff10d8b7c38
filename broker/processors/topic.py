"""Topics (RocketMQ's AdminBrokerProcessor, the topic half): CREATE_TOPIC and DELETE_TOPIC
through the log on the leader; GET_TOPICS and GET_ROUTE (this group's part of a topic's
route, in the name server's shape) from any replica's applied state (the layouts:
``protocol.topic``).
"""

from __future__ import annotations

from broker.processors.base import Processor
from broker.store.commands import CreateTopic, DeleteTopic, Perm
from protocol.names import DLQ_PREFIX, RETRY_PREFIX, validate_topic
from protocol.remoting import Frame, FrameError, ResponseCode
from protocol.topic import (
    CreateTopicRequest,
    DeleteTopicRequest,
    GetRouteRequest,
    GroupRouteData,
    RouteResponse,
    TopicQueues,
    TopicRouteData,
    TopicsResponse,
)

__all__ = ["TopicProcessor"]



class TopicProcessor(Processor):

    async def create_topic(self, frame: Frame) -> Frame:
        self._server.require_leader()
        req = CreateTopicRequest.from_frame(frame)
        topic = validate_topic(req.topic)
        return await self._through_log(frame, CreateTopic(topic, req.queues, Perm(req.perm)))

    async def delete_topic(self, frame: Frame) -> Frame:
        """Delete a topic: its queues and consumer offsets go; its messages stay in the
        CommitLog until retention removes their segments. A group's ``%RETRY%``/``%DLQ%``
        topic may be deleted too (``update`` on the group); other reserved names not."""
        self._server.require_leader()
        name = DeleteTopicRequest.from_frame(frame).topic
        topic = validate_topic(name, system=name.startswith((RETRY_PREFIX, DLQ_PREFIX)))
        return await self._through_log(frame, DeleteTopic(topic))

    async def topics(self, frame: Frame) -> Frame:
        topics = {t: TopicQueues(c.queues, c.perm) for t, c in sorted(self._server.machine.topics.items())}
        return TopicsResponse(topics=topics).reply(frame)

    async def route(self, frame: Frame) -> Frame:
        """This group's part of a topic's route, in the name server's shape."""
        topic = GetRouteRequest.from_frame(frame).topic
        config = self._server.machine.topics.get(topic)
        if config is None:
            raise FrameError(ResponseCode.TOPIC_NOT_EXIST, f"topic {topic!r} does not exist")
        status = self._server.rlog.status()
        leader = self._server.rlog.leader
        group = GroupRouteData(group=self._server.rlog.config.group, queues=config.queues,
                               perm=int(config.perm), term=status.term,
                               leader=self._server.addresses.get(leader) if leader else None,
                               replicas=dict(sorted(self._server.addresses.items())))
        return RouteResponse(route=TopicRouteData(topic, (group,))).reply(frame)
