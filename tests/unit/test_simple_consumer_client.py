"""``AsyncSimpleConsumer`` over a scripted core (no broker, no socket): a topic spread over
two broker groups, one of which fails -- the other's messages are still returned (their
claims are not wasted); when every one fails, the error is raised."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from client.aio.simple_consumer import AsyncSimpleConsumer
from client.errors import BrokerError
from client.queues import MessageQueue
from protocol.pop import Claim, PoppedRecord, PopRequest, PopResponse
from protocol.pull import PullRow
from protocol.record_batch import encode_record
from protocol.remoting import Frame, RequestCode, ResponseCode


class _Route:
    def queues(self, perm: int) -> list[MessageQueue]:
        return [MessageQueue("jobs", "b1", 0), MessageQueue("jobs", "b2", 0)]


class _Routes:
    async def route(self, topic: str) -> _Route:
        return _Route()


class _Core:
    """Answers POPs per broker group: b2 with one message, b1 (unless ``healthy``) with an error."""

    request_timeout = 5.0

    def __init__(self, failing: set[str]) -> None:
        self.routes, self.failing, self.asked = _Routes(), failing, []

    async def leader_request(self, group: str, request: PopRequest, **_: Any) -> Frame:
        self.asked.append(group)
        if group in self.failing:
            raise BrokerError(ResponseCode.SYSTEM_BUSY, f"{group} is busy")
        record = encode_record("jobs", 0, [(b"\x01" * 16, 0, 0, None, (), {}, 0, b"work")])
        popped = PoppedRecord(0, PullRow(7, 4096, 0, record), (Claim(7, 1),))
        return PopResponse(records=(popped,)).reply(Frame.request(RequestCode.POP_MESSAGE, 1))

    async def close(self) -> None:
        pass


def _receive(core: _Core) -> list[Any]:
    async def main() -> list[Any]:
        consumer = AsyncSimpleConsumer(group="g", topic="jobs", core=core)  # type: ignore[arg-type]
        return await consumer.receive(max_messages=4)
    return asyncio.run(main())


def test_a_failing_broker_group_does_not_cost_the_others_messages() -> None:
    core = _Core({"b1"})
    (m,) = _receive(core)
    assert sorted(core.asked) == ["b1", "b2"]
    assert (m.body, m.receipt.broker_group, m.receipt.offset, m.delivery) == (b"work", "b2", 7, 1)


def test_when_every_broker_group_fails_the_error_is_raised() -> None:
    with pytest.raises(BrokerError, match="busy"):
        _receive(_Core({"b1", "b2"}))
