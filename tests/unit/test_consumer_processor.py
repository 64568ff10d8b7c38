"""The consumer processor (HEARTBEAT, UNREGISTER_CLIENT, GET_CONSUMER_LIST and the
NOTIFY_CONSUMER_IDS_CHANGED notices) through its ``BrokerContext`` alone -- no server, no
socket: a connection is any object the frame is handled for (``CONNECTION``), here a
``ForeignClient`` that keeps the notices it is sent. Memberships per connection, a notice to
every member when a group changes, an unregister only of what that connection registered,
and a clustering group's retry topic created through the log at its first heartbeat."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from broker.processors.consumer import ConsumerProcessor
from broker.processors.context import CONNECTION
from broker.state.machine import BrokerStateMachine
from dledger.applier import Applier
from dledger.log import Log
from protocol.consumer import (
    ConsumerListRequest,
    ConsumerListResponse,
    HeartbeatRequest,
    NotifyConsumersChanged,
    UnregisterRequest,
)
from protocol.remoting import Frame, FrameError, RequestCode, ResponseCode
from tests.support.memory_broker import MemoryBroker, memory_broker

Parts = tuple[Log, BrokerStateMachine, Applier]


@dataclass(eq=False)
class Connection:
    """A client connection as the registry sees it (a ``ForeignClient``): the notices it got."""

    name: str
    notices: list[Frame] = field(default_factory=list)
    closed: bool = False

    async def deliver(self, frame: Frame) -> None:
        self.notices.append(frame)

    def groups_told(self) -> list[str]:
        assert all(n.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED and n.is_oneway for n in self.notices)
        told = [NotifyConsumersChanged.from_frame(n).group for n in self.notices]
        self.notices.clear()
        return told


def run(parts: Parts, scenario: Callable[[MemoryBroker, ConsumerProcessor], Awaitable[None]]) -> None:
    async def main() -> None:
        async with memory_broker(parts) as broker:
            await broker.create_topic("orders", 1)
            await scenario(broker, ConsumerProcessor(broker))

    asyncio.run(asyncio.wait_for(main(), 60))


async def on(conn: Connection, b: MemoryBroker, handler: Callable[[Frame], Awaitable[Frame]],
             request: object) -> Frame:
    """``handler``'s answer to ``request`` arriving on ``conn``."""
    token = CONNECTION.set(conn)  # type: ignore[arg-type]  # a ForeignClient, as RocketMQ's connections are
    try:
        return await b.call(handler, request)
    finally:
        CONNECTION.reset(token)


async def members(b: MemoryBroker, p: ConsumerProcessor, group: str) -> tuple[str, ...]:
    answer = await b.call(p.consumer_list, ConsumerListRequest(group=group))
    return ConsumerListResponse.from_frame(answer).client_ids


def test_members_are_per_connection_and_every_member_hears_of_a_change(one_node_broker: Parts) -> None:
    async def scenario(b: MemoryBroker, p: ConsumerProcessor) -> None:
        a, other = Connection("a"), Connection("b")
        for conn in (a, other):
            answer = await on(conn, b, p.heartbeat, HeartbeatRequest(client_id=conn.name,
                                                                     subscriptions={"billing": ("orders",)}))
            assert answer.code == ResponseCode.SUCCESS, answer.remark
        assert await members(b, p, "billing") == ("a", "b")
        assert (a.groups_told(), other.groups_told()) == (["billing", "billing"], ["billing"])
        await on(a, b, p.heartbeat, HeartbeatRequest(client_id="a", subscriptions={"billing": ("orders",)}))
        assert a.groups_told() == [] and other.groups_told() == []  # a renewal changes nothing
        await on(a, b, p.unregister, UnregisterRequest(client_id="b", group="billing"))  # not a's to drop
        assert await members(b, p, "billing") == ("a", "b")
        await on(other, b, p.unregister, UnregisterRequest(client_id="b", group="billing"))
        assert await members(b, p, "billing") == ("a",) and a.groups_told() == ["billing"]

    run(one_node_broker, scenario)


def test_a_clustering_groups_retry_topic_is_created_through_the_log_at_its_first_heartbeat(
        one_node_broker: Parts) -> None:
    async def scenario(b: MemoryBroker, p: ConsumerProcessor) -> None:
        before = b.rlog.committed_index
        subscriptions = {"billing": ("orders", "%RETRY%billing")}
        first = HeartbeatRequest(client_id="a", subscriptions=subscriptions)
        await on(Connection("a"), b, p.heartbeat, first)
        assert "%RETRY%billing" in b.machine.topics and b.rlog.committed_index > before
        after = b.rlog.committed_index
        second = HeartbeatRequest(client_id="b", subscriptions=subscriptions)
        await on(Connection("b"), b, p.heartbeat, second)
        assert b.rlog.committed_index == after  # made once

    run(one_node_broker, scenario)


def test_a_consumer_heartbeat_without_a_client_id_is_refused(one_node_broker: Parts) -> None:
    async def scenario(b: MemoryBroker, p: ConsumerProcessor) -> None:
        with pytest.raises(FrameError) as refused:
            await on(Connection("x"), b, p.heartbeat,
                     HeartbeatRequest(subscriptions={"billing": ("orders",)}))
        assert refused.value.code == ResponseCode.INVALID_ARGUMENT and "clientId" in str(refused.value)
        assert await members(b, p, "billing") == ()

    run(one_node_broker, scenario)
