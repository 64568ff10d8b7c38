"""console.web without a cluster: the page and its assets are served from the package,
a session cookie is set, and bad requests get 400 with a message the page shows."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from client.credentials import Credentials
from client.errors import AuthFailedError
from console.gateway import ClusterGateway
from console.sessions import ABSOLUTE_S, IDLE_S, Sessions
from console.web import _COOKIE, Console, _replica_row, last_verify
from protocol.login_throttle import USER_FREE
from protocol.remoting import ResponseCode


@pytest.mark.sockets
def test_page_assets_session_and_bad_requests() -> None:
    async def main() -> None:
        console = Console(["127.0.0.1:1"], sample_interval_s=60)  # no cluster there
        async with TestClient(TestServer(console.app())) as client:
            page = await client.get("/")
            assert page.status == 200 and "RaftMQ console" in await page.text()
            assert "raftmq_console" in page.cookies
            for asset in ("app.js", "charts.js", "style.css"):
                assert (await client.get(f"/static/{asset}")).status == 200
            csrf = {"X-CSRF-Token": (await (await client.get("/api/whoami")).json())["csrf"]}
            missing = await client.post("/api/topics", json={"queues": 4}, headers=csrf)
            assert missing.status == 400 and (await missing.json()) == {"error": "missing topic"}
            not_json = await client.post("/api/group/reset", data=b"{",
                                         headers={**csrf, "Content-Type": "application/json"})
            assert (await not_json.json()) == {"error": "the body must be JSON"}
            plain = await client.post("/api/group/reset", data=b"{}", headers=csrf)
            assert plain.status == 415
            forged = await client.post("/api/topics", json={"topic": "t"})
            assert forged.status == 403 and "CSRF" in (await forged.json())["error"]
            no_topic = await client.get("/api/messages")
            assert no_topic.status == 400 and "topic" in (await no_topic.json())["error"]
            down = await client.get("/api/cluster")
            assert down.status == 400 and "no name server answers" in (await down.json())["error"]

    asyncio.run(main())


def test_a_replica_row_carries_the_disk_full_flag() -> None:
    status = {"role": "follower", "term": 3, "commit_index": 9, "last_index": 9, "started_at": 0.0,
              "disk": {"free_bytes": 0, "commitlog_bytes": 4096, "full": True}}
    row = _replica_row("n2", "127.0.0.1:1", status, now=10.0)
    assert row["disk_full"] is True and row["free_bytes"] == 0
    roomy = _replica_row("n2", "127.0.0.1:1", {**status, "disk": {"free_bytes": 1}}, 10.0)
    assert roomy["disk_full"] is False


def test_a_groups_last_comparison_is_the_newest_its_replicas_show() -> None:
    older = {"index": 40, "at_ms": 1_000, "outcome": "equal", "compared": ["n1", "n2", "n3"],
             "not_compared": [], "mismatches": 0}
    newer = {**older, "index": 57, "at_ms": 2_000, "outcome": "incomplete", "not_compared": ["n3"]}
    statuses = [{"role": "follower", "last_verify": older}, None, {"role": "leader", "last_verify": newer},
                {"role": "follower", "last_verify": None}]
    assert last_verify(statuses) == newer
    assert last_verify([None, {"role": "leader"}]) is None


class _Gateway:
    def __init__(self, password: str) -> None:
        self.password = password

    async def verify(self) -> None:
        if self.password != "right":
            raise AuthFailedError(ResponseCode.AUTH_FAILED, "wrong user name or password", "broker")

    async def close(self) -> None:
        pass


class _OfflineConsole(Console):
    def gateway_for(self, credentials: Credentials | None) -> Any:
        return _Gateway(credentials.password if credentials else "")


@pytest.mark.sockets
def test_sign_in_guesses_are_delayed_per_user_and_source() -> None:
    """Issue 25, row 7: the console's own throttle (its clients' addresses, which the brokers
    never see: they count the console as one source)."""
    async def main() -> None:
        console = _OfflineConsole(["127.0.0.1:1"], sample_interval_s=60)
        async with TestClient(TestServer(console.app())) as client:
            csrf = {"X-CSRF-Token": (await (await client.get("/api/whoami")).json())["csrf"]}
            for i in range(USER_FREE):
                wrong = await client.post("/api/login", json={"user": "ops", "password": f"g{i}"},
                                          headers=csrf)
                assert wrong.status == 401
            right = await client.post("/api/login", json={"user": "ops", "password": "right"}, headers=csrf)
            assert right.status == 429, "the right password was checked at once after the free guesses"
            assert "too many failed sign-ins for user 'ops'" in (await right.json())["error"]
            assert int(right.headers["Retry-After"]) >= 1
            other = await client.post("/api/login", json={"user": "dev", "password": "right"}, headers=csrf)
            assert other.status == 200

    asyncio.run(main())


def test_the_group_page_gathers_in_flight_messages_from_every_broker_group() -> None:
    """``ClusterGateway.in_flight``: each broker group's ``/admin/groups/{g}/in-flight`` merged,
    earliest deadline first, named by broker group (the page's "In flight" table)."""
    def doc(count: int, max_deliveries: int, row: dict[str, Any]) -> dict[str, Any]:
        policy = {"retry_ms": [1000], "max_deliveries": max_deliveries, "ordered": False, "set": True}
        return {"count": count, "policy": policy, "in_flight": [row]}

    docs = {"b1": doc(3, 4, {"topic": "jobs", "queue": 0, "offset": 7, "deadline_ms": 900, "delivery": 2}),
            "b2": doc(1, 16, {"topic": "jobs", "queue": 1, "offset": 3, "deadline_ms": 500, "delivery": 1})}

    class Gateway(ClusterGateway):
        async def replicas(self) -> dict[str, dict[str, str]]:
            return {"b1": {}, "b2": {}}

        async def on_any_replica(self, group: str, path: str, **query: str) -> Any:
            assert path == "/admin/groups/workers/in-flight"
            return docs[group]

    async def main() -> dict[str, Any]:
        gateway = Gateway(["127.0.0.1:1"])
        try:
            return await gateway.in_flight("workers")
        finally:
            await gateway.close()

    got = asyncio.run(main())
    assert got["count"] == 4 and set(got["policies"]) == {"b1", "b2"}
    assert [(r["group"], r["offset"]) for r in got["rows"]] == [("b2", 3), ("b1", 7)]


@pytest.mark.sockets
def test_sign_ins_in_parallel_have_at_most_the_free_allowance_verified() -> None:
    """Issue 25, row 7 (second pass, G1): the sign-in checked the throttle, then awaited the
    cluster's verdict, and only then counted a failure: sign-ins sent together were all
    verified. Each one in flight now counts until its verdict."""
    verified: list[str] = []
    release = asyncio.Event()

    class Gateway(_Gateway):
        async def verify(self) -> None:
            verified.append(self.password)
            await release.wait()
            await super().verify()

    class SlowConsole(Console):
        def gateway_for(self, credentials: Credentials | None) -> Any:
            return Gateway(credentials.password if credentials else "")

    async def main() -> list[int]:
        console = SlowConsole(["127.0.0.1:1"], sample_interval_s=60)
        async with TestClient(TestServer(console.app())) as client:
            csrf = {"X-CSRF-Token": (await (await client.get("/api/whoami")).json())["csrf"]}

            async def sign_in(i: int) -> int:
                async with client.post("/api/login", json={"user": "ops", "password": f"g{i}"},
                                       headers=csrf) as resp:
                    return resp.status

            tries = [asyncio.create_task(sign_in(i)) for i in range(USER_FREE + 10)]
            deadline = asyncio.get_running_loop().time() + 10
            while sum(t.done() for t in tries) < 10 and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.01)  # poll until the throttled ones are answered
            release.set()
            return list(await asyncio.wait_for(asyncio.gather(*tries), 10))

    statuses = asyncio.run(main())
    assert len(verified) <= USER_FREE, f"{len(verified)} sign-ins verified in parallel"
    assert statuses.count(429) >= 10 and statuses.count(401) == len(verified), statuses


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _cookie(response: Any) -> str:
    return str(response.cookies[_COOKIE].value)


async def _whoami(client: TestClient, sid: str) -> tuple[str | None, Any]:
    """Who the session ``sid`` is signed in as (None: anonymous), and the answer."""
    client.session.cookie_jar.clear()
    answer = await client.get("/api/whoami", headers={"Cookie": f"{_COOKIE}={sid}"})
    assert answer.status == 200
    return (await answer.json())["user"], answer


async def _sign_in(client: TestClient) -> tuple[str, str]:
    """(the anonymous session's id, the signed-in session's id) of a sign-in as ``ops``."""
    first = await client.get("/api/whoami")
    csrf = (await first.json())["csrf"]
    login = await client.post("/api/login", json={"user": "ops", "password": "right"},
                              headers={"X-CSRF-Token": csrf})
    assert login.status == 200, await login.text()
    return _cookie(first), _cookie(login)


@pytest.mark.sockets
def test_sign_in_gives_a_new_session_id_and_the_old_one_names_nothing() -> None:
    """Second pass (G7): no session fixation -- a page that planted the pre-login cookie
    gains nothing when the operator signs in."""
    async def main() -> None:
        console = _OfflineConsole(["127.0.0.1:1"], sample_interval_s=60)
        async with TestClient(TestServer(console.app(), host="127.0.0.1")) as client:
            old, new = await _sign_in(client)
            assert new != old
            user, answer = await _whoami(client, old)
            assert user is None and _COOKIE in answer.cookies, "the pre-login id still names a session"
            assert _cookie(answer) not in (old, new)  # a fresh anonymous one
            assert (await _whoami(client, new))[0] == "ops"

    asyncio.run(main())


@pytest.mark.sockets
def test_a_session_ends_after_its_idle_time_and_its_absolute_lifetime() -> None:
    async def main() -> None:
        clock = _Clock()
        console = _OfflineConsole(["127.0.0.1:1"], sample_interval_s=60)
        console.sessions = Sessions(clock=clock)
        async with TestClient(TestServer(console.app(), host="127.0.0.1")) as client:
            _, idle = await _sign_in(client)
            clock.now += IDLE_S - 1
            assert (await _whoami(client, idle))[0] == "ops"  # used: its idle time starts again
            clock.now += IDLE_S + 1
            assert (await _whoami(client, idle))[0] is None
            client.session.cookie_jar.clear()
            _, busy = await _sign_in(client)
            started = clock.now
            while clock.now - started < ABSOLUTE_S - IDLE_S / 2:
                clock.now += IDLE_S / 2
                assert (await _whoami(client, busy))[0] == "ops"
            clock.now += IDLE_S / 2 + 1  # never idle, but older than the absolute lifetime
            assert (await _whoami(client, busy))[0] is None

    asyncio.run(main())


@pytest.mark.sockets
def test_a_foreign_host_is_refused_and_sign_in_only_answers_the_api_to_signed_in_sessions() -> None:
    async def main() -> None:
        console = _OfflineConsole(["127.0.0.1:1"], sample_interval_s=60, sign_in_only=True)
        async with TestClient(TestServer(console.app(), host="127.0.0.1")) as client:
            rebound = await client.get("/api/whoami", headers={"Host": "evil.example"})
            assert rebound.status == 403 and "evil.example" in (await rebound.json())["error"]
            for path in ("/api/overview", "/api/topics", "/api/cluster"):
                anonymous = await client.get(path)
                assert anonymous.status == 401 and (await anonymous.json())["login"] is True, path
            assert (await client.get("/api/whoami")).status == 200  # the page may ask who it is
            assert (await client.get("/")).status == 200
            client.session.cookie_jar.clear()
            _, sid = await _sign_in(client)
            client.session.cookie_jar.clear()
            signed_in = await client.get("/api/overview", headers={"Cookie": f"{_COOKIE}={sid}"})
            assert signed_in.status == 200, await signed_in.text()

    asyncio.run(main())
