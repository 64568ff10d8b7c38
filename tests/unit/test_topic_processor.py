"""The topic processor through its ``BrokerContext`` alone (no server, no socket): a
memory log, the apply step and the write path (``tests/support/memory_broker.py``) -- the
shape every processor test takes (issue 26, pattern 19: RocketMQ's processors tested by
``processRequest`` on a mocked store)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from broker.processors.topic import TopicProcessor
from broker.state.machine import BrokerStateMachine
from dledger.applier import Applier
from dledger.errors import NotLeader
from dledger.log import Log
from protocol.remoting import FrameError, ResponseCode
from protocol.topic import (
    CreateTopicRequest,
    DeleteTopicRequest,
    GetRouteRequest,
    GetTopicsRequest,
    RouteResponse,
    TopicQueues,
    TopicsResponse,
)
from tests.support.memory_broker import MemoryBroker, memory_broker


def _run(one_node_broker: tuple[Log, BrokerStateMachine, Applier],
         scenario: Callable[[TopicProcessor, MemoryBroker], Awaitable[None]], leading: bool = True) -> None:
    async def main() -> None:
        async with memory_broker(one_node_broker) as broker:
            broker.leading = leading
            await scenario(TopicProcessor(broker), broker)

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_topic_is_created_through_the_log_and_listed_and_routed(
        one_node_broker: tuple[Log, BrokerStateMachine, Applier]) -> None:
    async def scenario(processor: TopicProcessor, context: MemoryBroker) -> None:
        before = context.rlog.committed_index
        created = await processor.create_topic(CreateTopicRequest(topic="orders", queues=3).to_frame(1))
        assert created.code == ResponseCode.SUCCESS and created.opaque == 1
        assert context.rlog.committed_index > before  # through the log, not around it
        listed = TopicsResponse.from_frame(await processor.topics(GetTopicsRequest().to_frame(2)))
        assert listed.topics == {"orders": TopicQueues(3, 6)}
        route = RouteResponse.from_frame(await processor.route(GetRouteRequest(topic="orders").to_frame(3)))
        (group,) = route.route.groups
        assert (group.queues, group.leader, group.replicas) == (3, "127.0.0.1:9876", {"n1": "127.0.0.1:9876"})
        deleted = await processor.delete_topic(DeleteTopicRequest(topic="orders").to_frame(4))
        assert deleted.code == ResponseCode.SUCCESS
        with pytest.raises(FrameError) as gone:
            await processor.route(GetRouteRequest(topic="orders").to_frame(5))
        assert gone.value.code == ResponseCode.TOPIC_NOT_EXIST

    _run(one_node_broker, scenario)


def test_a_follower_refuses_a_create_before_reading_it(
        one_node_broker: tuple[Log, BrokerStateMachine, Applier]) -> None:
    async def scenario(processor: TopicProcessor, context: MemoryBroker) -> None:
        before = context.rlog.committed_index
        with pytest.raises(NotLeader):
            await processor.create_topic(CreateTopicRequest(topic="orders").to_frame(1))
        assert context.rlog.committed_index == before and "orders" not in context.machine.topics

    _run(one_node_broker, scenario, leading=False)
