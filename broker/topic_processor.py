"""Topics (RocketMQ's AdminBrokerProcessor, the topic half): CREATE_TOPIC and DELETE_TOPIC
through the log on the leader; GET_TOPICS and GET_ROUTE (this group's part of a topic's
route, in the name server's shape) from any replica's applied state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgpack

from broker.commands import CreateTopic, DeleteTopic, Perm, encode_admin
from broker.send_processor import answer
from protocol.names import validate_topic
from protocol.remoting import Frame, FrameError, ResponseCode, ext_int, ext_str

if TYPE_CHECKING:
    from broker.server import BrokerServer

__all__ = ["TopicProcessor"]



class TopicProcessor:
    def __init__(self, server: BrokerServer) -> None:
        self._server = server

    async def create_topic(self, frame: Frame) -> Frame:
        self._server.require_leader()
        topic = validate_topic(ext_str(frame, "topic"))
        queues = ext_int(frame, "queues", 8, minimum=1, maximum=1024)
        perm = ext_int(frame, "perm", int(Perm.READ_WRITE))
        if perm not in (2, 4, 6):
            raise FrameError(ResponseCode.INVALID_ARGUMENT, "perm must be 2 (write), 4 (read) or 6")
        (applied,) = await self._server.write.send([encode_admin(CreateTopic(topic, queues, Perm(perm)))])
        return answer(frame, applied)

    async def delete_topic(self, frame: Frame) -> Frame:
        """Delete a topic: its queues and consumer offsets go; its messages stay in the
        CommitLog until retention removes their segments."""
        self._server.require_leader()
        topic = validate_topic(ext_str(frame, "topic"))
        (applied,) = await self._server.write.send([encode_admin(DeleteTopic(topic))])
        return answer(frame, applied)

    async def topics(self, frame: Frame) -> Frame:
        topics = {t: [c.queues, c.perm] for t, c in sorted(self._server.machine.topics.items())}
        return frame.response(ResponseCode.SUCCESS, body=msgpack.packb(topics))

    async def route(self, frame: Frame) -> Frame:
        """This group's part of a topic's route, in the name server's shape."""
        topic = ext_str(frame, "topic")
        config = self._server.machine.topics.get(topic)
        if config is None:
            raise FrameError(ResponseCode.TOPIC_NOT_EXIST, f"topic {topic!r} does not exist")
        status = self._server.rlog.status()
        leader = self._server.rlog.leader
        doc = {"topic": topic, "groups": [{
            "group": self._server.rlog.config.group, "queues": config.queues, "perm": int(config.perm),
            "term": status["term"], "leader": self._server.addresses.get(leader) if leader else None,
            "replicas": dict(sorted(self._server.addresses.items()))}]}
        return frame.response(ResponseCode.SUCCESS, body=msgpack.packb(doc))
