"""Name server: registration, expiry after 120 s, routes spanning groups."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from broker.namesrv import EXPIRY_S, Registration, RouteTable, make_app
from client.aio.connection import ConnectionPool
from client.aio.routes import RouteBook
from raftmq.local_group import free_port


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def reg(group: str, node: str, role: str, topics: dict[str, tuple[int, int]]) -> Registration:
    return Registration(group, node, role, f"{group}-{node}:1", topics)


def test_route_spans_groups_and_names_leaders() -> None:
    table = RouteTable(Clock())
    for g in ("g1", "g2"):
        table.register(reg(g, "n1", "leader", {"orders": (8, 6)}))
        table.register(reg(g, "n2", "follower", {"orders": (8, 6)}))
    table.register(reg("g3", "n1", "leader", {"other": (4, 6)}))
    route = table.route("orders")
    assert [(g.group, g.queues, g.leader) for g in route.groups] == [
        ("g1", 8, "g1-n1:1"), ("g2", 8, "g2-n1:1")]
    assert route.groups[0].replicas == {"n1": "g1-n1:1", "n2": "g1-n2:1"}
    assert table.route("missing").groups == ()


def test_the_leader_with_the_highest_term_wins() -> None:
    table = RouteTable(Clock())
    table.register(Registration("g1", "n1", "leader", "old:1", {"t": (1, 6)}, term=3))
    table.register(Registration("g1", "n2", "leader", "new:1", {"t": (1, 6)}, term=4))
    assert table.route("t").groups[0].leader == "new:1"


def test_registrations_expire_unless_renewed() -> None:
    clock = Clock()
    table = RouteTable(clock)
    table.register(reg("g1", "n1", "leader", {"t": (1, 6)}))
    table.register(reg("g1", "n2", "follower", {"t": (1, 6)}))
    clock.now += EXPIRY_S - 1
    table.register(reg("g1", "n2", "leader", {"t": (1, 6)}))  # n2 renewed (and now leads)
    clock.now += 2
    assert [r.node for r in table.live()] == ["n2"]
    assert table.route("t").groups[0].leader == "g1-n2:1"


def test_http_api() -> None:
    async def main() -> None:
        runner = web.AppRunner(make_app(RouteTable()))
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        base = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as s:
            body = {"group": "g1", "node": "n1", "role": "leader", "address": "127.0.0.1:1",
                    "topics": {"orders": [8, 6]}}
            async with s.post(f"{base}/register", json=body) as r:
                assert r.status == 200
            async with s.post(f"{base}/register", json={"group": "g1"}) as r:
                assert r.status == 400 and "non-empty strings" in (await r.json())["error"]
            async with s.get(f"{base}/route/orders") as r:
                assert (await r.json())["groups"][0]["leader"] == "127.0.0.1:1"
            async with s.get(f"{base}/route/nope") as r:
                assert r.status == 404
        await runner.cleanup()

    asyncio.run(main())


# Topic names the rules allow whose text reads as percent escapes in a URL ("%ac", "%1f",
# "%20"): a route lookup must ask the name server for exactly this topic (issue 12: the
# retry topic of a group named "acc-retry-g" was looked up as "%RETRY\xacc-retry-g").
TRICKY_TOPICS = ["%RETRY%acc-retry-g", "%RETRY%acc-g", "%RETRY%ab", "%RETRY%1f", "%RETRY%orders-consumer",
                 "%RETRY%a_b", "%RETRY%" + "c-" * 127 + "c", "%DLQ%de-ad", "a%20b", "a%2Fb", "x|y",
                 "%25", "%"]


@pytest.mark.parametrize("topic", TRICKY_TOPICS)
def test_the_client_looks_up_exactly_the_topic_it_names(topic: str) -> None:
    async def main() -> None:
        runner = web.AppRunner(make_app(RouteTable()))
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        pool = ConnectionPool()
        try:
            async with aiohttp.ClientSession() as s:
                body = {"group": "g1", "node": "n1", "role": "leader", "address": "127.0.0.1:1",
                        "topics": {topic: [1, 6]}}
                async with s.post(f"http://127.0.0.1:{port}/register", json=body) as r:
                    assert r.status == 200
            route = await RouteBook(pool, namesrv=[f"127.0.0.1:{port}"]).route(topic)
            assert route.topic == topic and [g.queues for g in route.groups] == [1]
        finally:
            await pool.close()
            await runner.cleanup()

    asyncio.run(main())
