"""A broker's registrar against an in-process name server: 20,000 topics with 127-character
names go in pages under the request limit, later changes as small deltas, and a restarted
name server gets the whole table again (issue 15, row 3)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from broker.namesrv.route_table import RouteTable
from broker.namesrv.server import MAX_REQUEST_BYTES, make_app
from broker.registrar import Registrar
from broker.security.registration_auth import RegistrationVerifier, registration_key
from broker.state.machine import TopicConfig
from raftmq.local_group import free_port

#: these tests open IP sockets (a real port, the Raft transport or a client connection)
pytestmark = pytest.mark.sockets

SECRET = "group secret"


@dataclass
class FakeConfig:
    group: str = "g1"
    node: str = "n1"
    secret: str | None = SECRET


@dataclass(frozen=True)
class FakeStatus:
    """The fields of ``dledger.log_status.Status`` a registrar reads."""

    role: str
    term: int
    member: bool


@dataclass
class FakeLog:
    config: FakeConfig = field(default_factory=FakeConfig)
    member: bool = True

    def status(self) -> FakeStatus:
        return FakeStatus("leader", 3, self.member)

    def members(self) -> dict[str, object]:
        return {"n1": object()}


@dataclass
class FakeMachine:
    topics: dict[str, TopicConfig] = field(default_factory=dict)


class NameServer:
    """An in-process name server that records the size of every request body."""

    def __init__(self) -> None:
        self.port = free_port()
        self.sizes: list[int] = []
        self.table = RouteTable()
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        self.table = RouteTable()  # a restart: nothing held

        @web.middleware
        async def measure(request: web.Request, handler: Callable[[web.Request], Awaitable[Any]]) -> Any:
            self.sizes.append(len(await request.read()))
            return await handler(request)

        app = make_app(self.table, RegistrationVerifier({"g1": registration_key(SECRET, "g1")}))
        app.middlewares.append(measure)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


def long_names(n: int, start: int = 0) -> list[str]:
    return [f"t{i:06d}-".ljust(127, "x") for i in range(start, start + n)]


def test_20000_topics_register_in_pages_then_as_deltas_and_again_after_a_restart() -> None:
    async def main() -> None:
        ns = NameServer()
        await ns.start()
        machine = FakeMachine({t: TopicConfig(8, 6) for t in long_names(20_000)})
        registrar = Registrar(FakeLog(), machine, "127.0.0.1:10911", [ns.address], register_every_s=0)
        try:
            async with aiohttp.ClientSession() as session:
                await registrar.register_once(session)
                assert len(ns.table.topics_of("g1", "n1")) == 20_000
                assert len(ns.sizes) > 1 and max(ns.sizes) < MAX_REQUEST_BYTES, ns.sizes
                assert ns.table.route(long_names(1, 19_999)[0]).groups[0].leader == "127.0.0.1:10911"

                ns.sizes.clear()
                machine.topics = dict(machine.topics)
                del machine.topics[long_names(1)[0]]
                machine.topics["new"] = TopicConfig(2, 6)
                await registrar.register_once(session)
                assert len(ns.sizes) == 1 and ns.sizes[0] < 1024  # one small delta
                held = ns.table.topics_of("g1", "n1")
                assert "new" in held and long_names(1)[0] not in held and len(held) == 20_000

                ns.sizes.clear()
                await registrar.register_once(session)  # a renewal: nothing changed
                assert len(ns.sizes) == 1 and ns.sizes[0] < 1024

                await ns.stop()
                await ns.start()  # lost everything: the renewal gets 409, the whole table follows
                await registrar.register_once(session)
                want = {t: (c.queues, c.perm) for t, c in machine.topics.items()}
                assert ns.table.topics_of("g1", "n1") == want
        finally:
            await ns.stop()

    asyncio.run(main())


def test_a_learner_does_not_register() -> None:
    async def main() -> None:
        ns = NameServer()
        await ns.start()
        rlog = FakeLog(member=False)
        registrar = Registrar(rlog, FakeMachine({"t": TopicConfig(1, 6)}), "127.0.0.1:1", [ns.address])
        try:
            async with aiohttp.ClientSession() as session:
                await registrar.register_once(session)
                assert ns.sizes == []
                rlog.member = True  # made a member by `raftmq replica add`
                await registrar.register_once(session)
                assert ns.table.route("t").groups[0].replicas == {"n1": "127.0.0.1:1"}
        finally:
            await ns.stop()

    asyncio.run(main())
