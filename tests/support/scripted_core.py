"""A scripted broker behind the producer, for the producer's unit tests: ``FakeCore`` stands
where ``AsyncProducer`` and the blocking ``Producer`` take their core (routes and
``leader_request``) and answers SEND_BATCH as the broker does; ``until`` polls a condition
on the running loop with a deadline."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import msgpack

from client.aio.routes import GroupRoute, TopicRoute
from client.backoff import Deadline
from protocol.message_format import encode_message, message_of
from protocol.record_batch import decode_messages
from protocol.remoting import Frame
from protocol.send import SendBatchRequest

__all__ = ["FakeCore", "until"]


class _Routes:
    """Topic "t" on group g1 with ``queues`` queues, always known."""

    def __init__(self, queues: int) -> None:
        self._route = TopicRoute("t", [GroupRoute("g1", queues, 6, "a:1", {"n1": "a:1"})])

    async def route(self, topic: str, refresh: bool = False) -> TopicRoute:
        return self._route

    def fresh(self, topic: str) -> TopicRoute:
        return self._route


class FakeCore:
    """Answers SEND_BATCH as the broker does (a row per message: code, queue id, offset, reason,
    position), with codes (per message) from ``script`` when given; ``gate`` (set when made
    ``gated``) holds answers back until it is set. ``bodies``: each request's messages as
    records of one; ``deadlines``: each request's deadline."""

    def __init__(self, queues: int = 1, *, gated: bool = False) -> None:
        self.routes = _Routes(queues)
        self.script: list[list[int]] = []
        self.bodies: list[list[bytes]] = []
        self.deadlines: list[Deadline] = []
        self.gate: asyncio.Event | None = asyncio.Event() if gated else None
        self.offsets: dict[int, int] = {}

    async def leader_request(self, group: str, request: SendBatchRequest, *, deadline: Deadline,
                             topic: str | None = None) -> Frame:
        records = [encode_message(message_of(r)) for rec in request.records for r in decode_messages(rec)]
        self.bodies.append(records)
        self.deadlines.append(deadline)
        if self.gate is not None:
            await self.gate.wait()
        codes = self.script.pop(0) if self.script else [0] * len(records)
        rows = []
        for record, c in zip(records, codes, strict=True):
            q = decode_messages(record)[0].queue_id
            offset = self.offsets.get(q, 0)
            if c == 0:
                self.offsets[q] = offset + 1
            rows.append([c, q, offset if c == 0 else -1, "" if c == 0 else "refused", 1000 + offset])
        return Frame(0, 1, 1, "", {}, msgpack.packb(rows))

    async def close(self) -> None:
        pass


async def until(condition: Callable[[], object], timeout: float = 5.0) -> None:
    """Poll ``condition`` on the running loop until it holds; fail after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.001)
