"""Name server: registration, expiry after 120 s, routes spanning groups, the group's rules
(terms, members), topic changes by version, the HTTP API with signed registrations."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from broker.namesrv.route_table import Refused, Resync, TopicDelta, TopicPage
from broker.namesrv.server import EXPIRY_S, Registration, RouteTable, make_app, run
from broker.security.registration_auth import RegistrationVerifier, registration_key, sign_registration
from client.aio.connection import ConnectionPool
from client.aio.routes import RouteBook
from raftmq.local_group import free_port

KEY = registration_key("the group secret", "g1")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def reg(group: str, node: str, role: str, topics: dict[str, tuple[int, int]], term: int = 1,
        members: tuple[str, ...] | None = None) -> Registration:
    return Registration(group, node, role, f"{group}-{node}:1", topics, term, members)


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
    table.register(reg("g1", "n2", "leader", {"t": (1, 6)}, term=2))  # n2 renewed (and now leads)
    clock.now += 2
    assert [r.node for r in table.live()] == ["n2"]
    assert table.route("t").groups[0].leader == "g1-n2:1"


# -- the group's rules: terms and members ----------------------------------------------
def test_a_leader_claim_below_the_groups_term_is_refused() -> None:
    table = RouteTable(Clock())
    table.register(reg("g1", "n1", "leader", {"t": (1, 6)}, term=7))
    with pytest.raises(Refused, match="term 6 is below the group's term 7"):
        table.register(reg("g1", "n2", "leader", {"t": (1, 6)}, term=6))
    with pytest.raises(Refused, match="which n1 leads"):
        table.register(reg("g1", "n2", "leader", {"t": (1, 6)}, term=7))
    with pytest.raises(Refused, match="registration of g1/n3 at term 5"):  # a cut-off follower
        table.register(reg("g1", "n3", "follower", {"t": (1, 6)}, term=5))
    assert table.route("t").groups[0].leader == "g1-n1:1"
    table.register(reg("g1", "n2", "leader", {"t": (1, 6)}, term=8))  # a new election
    assert table.route("t").groups[0].leader == "g1-n2:1"


def test_a_node_outside_the_members_is_refused_and_membership_changes_are_followed() -> None:
    table = RouteTable(Clock())
    three = ("n1", "n2", "n3")
    for node, role in (("n1", "leader"), ("n2", "follower"), ("n3", "follower")):
        table.register(reg("g1", node, role, {"t": (1, 6)}, term=2, members=three))
    with pytest.raises(Refused, match="evil is not a member of g1"):
        table.register(reg("g1", "evil", "follower", {"t": (1, 6)}, term=2, members=(*three, "evil")))
    with pytest.raises(Refused, match="n4 is not a member"):  # before the leader names it
        table.register(reg("g1", "n4", "follower", {"t": (1, 6)}, term=2, members=(*three, "n4")))
    # raftmq replica add n4: the leader's registration names it, then n4 registers
    table.register(reg("g1", "n1", "leader", {"t": (1, 6)}, term=2, members=(*three, "n4")))
    table.register(reg("g1", "n4", "follower", {"t": (1, 6)}, term=2, members=(*three, "n4")))
    assert set(table.route("t").groups[0].replicas) == {"n1", "n2", "n3", "n4"}
    # raftmq replica remove n3: it leaves the route at once, and may not come back
    table.register(reg("g1", "n1", "leader", {"t": (1, 6)}, term=2, members=("n1", "n2", "n4")))
    assert set(table.route("t").groups[0].replicas) == {"n1", "n2", "n4"}
    with pytest.raises(Refused, match="n3 is not a member"):
        table.register(reg("g1", "n3", "follower", {"t": (1, 6)}, term=2, members=three))
    # a follower's stale view does not overwrite the leader's
    table.register(reg("g1", "n2", "follower", {"t": (1, 6)}, term=2, members=three))
    assert set(table.route("t").groups[0].replicas) == {"n1", "n2", "n4"}


def test_a_new_leader_at_a_higher_term_brings_its_members() -> None:
    table = RouteTable(Clock())
    table.register(reg("g1", "n1", "leader", {"t": (1, 6)}, term=2, members=("n1", "n2", "n3")))
    table.register(reg("g1", "n6", "leader", {"t": (1, 6)}, term=3, members=("n1", "n2", "n6")))
    assert set(table.route("t").groups[0].replicas) == {"n1", "n6"}
    assert table.route("t").groups[0].leader == "g1-n6:1"


# -- topics by version --------------------------------------------------------------------
def test_deltas_apply_only_to_their_base_and_pages_replace_the_table() -> None:
    table = RouteTable(Clock())
    table.register(reg("g1", "n1", "leader", None))  # type: ignore[arg-type]
    assert table.sync_topics("g1", "n1", TopicDelta("", "v1", {"a": (1, 6), "b": (2, 6)})) == "v1"
    assert table.sync_topics("g1", "n1", TopicDelta("v1", "v2", {"c": (3, 6)}, ("a",))) == "v2"
    assert table.topics_of("g1", "n1") == {"b": (2, 6), "c": (3, 6)}
    with pytest.raises(Resync):
        table.sync_topics("g1", "n1", TopicDelta("v1", "v3", {"d": (1, 6)}))
    # a whole table in pages: the old one is served until the last page arrives
    assert table.sync_topics("g1", "n1", TopicPage("w", 0, 2, {"x": (1, 6)})) == "v2"
    assert table.route("c").groups and not table.route("x").groups
    table.sync_topics("g1", "n1", TopicPage("w", 0, 3, {}))
    with pytest.raises(Resync):  # a page missed
        table.sync_topics("g1", "n1", TopicPage("w", 2, 3, {}))
    table.sync_topics("g1", "n1", TopicPage("w", 0, 2, {"x": (1, 6)}))
    assert table.sync_topics("g1", "n1", TopicPage("w", 1, 2, {"y": (4, 6)})) == "w"
    assert table.topics_of("g1", "n1") == {"x": (1, 6), "y": (4, 6)}
    assert table.cluster()["g1"]["n1"] == {"role": "leader", "term": 1, "address": "g1-n1:1", "topics": 2,
                                           "topics_version": "w"}


# -- HTTP ---------------------------------------------------------------------------------
@asynccontextmanager
async def namesrv(verifier: RegistrationVerifier | None) -> AsyncIterator[str]:
    runner = web.AppRunner(make_app(RouteTable(), verifier))
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def body_of(table: dict[str, list[int]], **over: Any) -> bytes:
    """A registration body holding the whole ``table``; ``over`` replaces fields."""
    doc = {"group": "g1", "node": "n1", "role": "leader", "term": 1, "address": "127.0.0.1:1",
           "members": ["n1"], "topics": {"kind": "full", "version": "v1", "page": 0, "pages": 1,
                                         "set": table}}
    return json.dumps({**doc, **over}).encode()


async def post(s: aiohttp.ClientSession, ns: str, body: bytes, headers: dict[str, str]) -> tuple[int, Any]:
    async with s.post(f"http://{ns}/register", data=body, headers=headers) as r:
        return r.status, await r.json()


def run_async(f: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(f())  # type: ignore[arg-type]


@pytest.mark.sockets
def test_http_api() -> None:
    async def main() -> None:
        async with namesrv(RegistrationVerifier({"g1": KEY})) as ns, aiohttp.ClientSession() as s:
            body = body_of({"orders": [8, 6]})
            assert (await post(s, ns, body, sign_registration(KEY, "g1", body)))[0] == 200
            code, answer = await post(s, ns, body, {})
            assert code == 401 and "must be signed" in answer["error"]
            bad = b'{"group": "g1"}'
            code, answer = await post(s, ns, bad, sign_registration(KEY, "g1", bad))
            assert code == 400 and "node" in answer["error"]
            other = body_of({}, group="g2")
            code, answer = await post(s, ns, other, sign_registration(KEY, "g1", other))
            assert code == 403 and "registers group 'g2'" in answer["error"]
            delta = body_of({}, topics={"kind": "delta", "base": "nope", "version": "v9"})
            code, answer = await post(s, ns, delta, sign_registration(KEY, "g1", delta))
            assert code == 409 and answer["resync"] is True
            async with s.get(f"http://{ns}/route/orders") as r:
                assert (await r.json())["groups"][0]["leader"] == "127.0.0.1:1"
            async with s.get(f"http://{ns}/route/nope") as r:
                assert r.status == 404
            async with s.get(f"http://{ns}/healthz") as r:
                assert (r.status, await r.text()) == (200, "ok")
            async with s.post(f"http://{ns}/register", data=b"x" * (2 << 20)) as r:
                assert r.status == 413

    run_async(main)


def test_the_name_server_refuses_to_start_without_groups_unless_insecure(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(config=None, listen="127.0.0.1:1", insecure=False, log_level="INFO")
    assert run(args) == 2
    assert "no groups to serve" in capsys.readouterr().err


def test_the_name_server_refuses_an_address_other_hosts_reach_without_tls(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "namesrv.toml"
    (tmp_path / "g1.key").write_text(KEY.hex())
    config.write_text('[namesrv]\nlisten = "0.0.0.0:1"\n[groups.g1]\nkey_file = "g1.key"\n')
    assert run(argparse.Namespace(config=config, listen=None, insecure=False, log_level="INFO")) == 2
    err = capsys.readouterr().err
    assert "listens on 0.0.0.0:1, which other hosts can reach, without TLS" in err
    assert "[namesrv.tls]" in err and "--insecure" in err


# Topic names the rules allow whose text reads as percent escapes in a URL ("%ac", "%1f",
# "%20"): a route lookup must ask the name server for exactly this topic (issue 12: the
# retry topic of a group named "acc-retry-g" was looked up as "%RETRY\xacc-retry-g").
TRICKY_TOPICS = ["%RETRY%acc-retry-g", "%RETRY%acc-g", "%RETRY%ab", "%RETRY%1f", "%RETRY%orders-consumer",
                 "%RETRY%a_b", "%RETRY%" + "c-" * 127 + "c", "%DLQ%de-ad", "a%20b", "a%2Fb", "x|y",
                 "%25", "%"]


@pytest.mark.parametrize("topic", TRICKY_TOPICS)
@pytest.mark.sockets
def test_the_client_looks_up_exactly_the_topic_it_names(topic: str) -> None:
    async def main() -> None:
        pool = ConnectionPool()
        try:
            async with namesrv(RegistrationVerifier({"g1": KEY})) as ns, aiohttp.ClientSession() as s:
                body = body_of({topic: [1, 6]})
                assert (await post(s, ns, body, sign_registration(KEY, "g1", body)))[0] == 200
                route = await RouteBook(pool, namesrv=[ns]).route(topic)
                assert route.topic == topic and [g.queues for g in route.groups] == [1]
        finally:
            await pool.close()

    run_async(main)


def test_a_stale_route_kept_when_no_name_server_answers_counts_as_fresh_until_a_retry() -> None:
    """Review finding: ``route`` gave back the stale route without marking it, so ``fresh``
    stayed None and the producer's messages waiting for the topic's route were handed back
    to wait again for ever (their send_timeout never ran)."""
    import time as _time

    from client.aio.connection import ConnectionPool
    from client.aio.routes import STALE_RETRY_S, GroupRoute, TopicRoute
    from client.errors import RouteNotFoundError

    async def main() -> None:
        pool = ConnectionPool()
        book = RouteBook(pool, namesrv=["127.0.0.1:1"], refresh_s=30)
        stale = TopicRoute("t", [GroupRoute("g1", 1, 6, "a:1", {"n1": "a:1"})],
                           fetched_at=_time.monotonic() - 60)
        book._routes["t"] = stale
        asked: list[str] = []

        async def down(topic: str) -> TopicRoute:
            asked.append(topic)
            raise RouteNotFoundError("no name server answered")

        book._from_namesrv = down  # type: ignore[method-assign]
        assert book.fresh("t") is None
        assert await book.route("t") is stale and book.fresh("t") is stale
        assert await book.route("t") is stale and asked == ["t"]  # no storm of asks meanwhile
        stale.fetched_at -= STALE_RETRY_S
        assert book.fresh("t") is None  # then asked again
        await pool.close()

    asyncio.run(main())
