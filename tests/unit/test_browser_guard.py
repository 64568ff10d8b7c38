"""common.http_errors' browser guard (issue 25, row 4; second pass, G5): which Origins may
drive an API (``foreign_origin``), which Host names it (``literal_host``), and the
``allowed_origins`` allow-list through the middleware."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from common.http_errors import browser_guard, foreign_origin, literal_host

APP = "http://app.example:3000"
ALLOWED = frozenset({APP})  # as browser_guard normalises the configured list
HOST = "127.0.0.1:10911"


def refused(origin: str | None, *, method: str = "POST", host: str = HOST, scheme: str = "http",
            upgrade: bool = False, allowed: frozenset[str] = ALLOWED) -> str | None:
    headers = {} if origin is None else {"Origin": origin}
    if upgrade:
        headers["Upgrade"] = "websocket"
    return foreign_origin(method, headers, scheme, host, allowed)


def test_an_allowed_origin_passes_whatever_its_case_and_trailing_slash() -> None:
    assert refused(APP) is None
    assert refused("HTTP://App.Example:3000/") is None
    assert refused(APP, upgrade=True, method="GET") is None
    assert refused("http://app.example:3001") == "http://app.example:3001"  # another port: another origin
    assert refused("https://app.example:3000") == "https://app.example:3000"  # another scheme
    assert refused(APP, allowed=frozenset()) == APP  # only when listed


def test_the_apis_own_origin_passes_only_at_an_ip_address_or_localhost() -> None:
    assert refused(f"http://{HOST}") is None
    assert refused("http://localhost:10911", host="localhost:10911") is None
    assert refused("http://[::1]:10911", host="[::1]:10911") is None
    # a DNS name could be rebound to 127.0.0.1 by whoever owns it: its own origin is foreign
    assert refused("http://broker.example:10911", host="broker.example:10911") == "http://broker.example:10911"
    assert refused("https://broker.example:10911", host="broker.example:10911",
                   scheme="https") == "https://broker.example:10911"


def test_null_and_foreign_origins_are_refused_but_reads_and_tools_are_not() -> None:
    assert refused("null") == "null"  # a sandboxed frame, a file:// page
    assert refused("null", upgrade=True, method="GET") == "null"
    assert refused("http://evil.example") == "http://evil.example"
    assert refused("http://evil.example", upgrade=True, method="GET") == "http://evil.example"
    for method in ("GET", "HEAD", "OPTIONS"):
        assert refused("http://evil.example", method=method) is None  # cannot change state
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        assert refused(None, method=method) is None  # tools send no Origin


@pytest.mark.parametrize(("host", "literal"), [
    ("127.0.0.1:10911", True), ("127.0.0.1", True), ("localhost:8080", True), ("LOCALHOST", True),
    ("[::1]:10911", True), ("[::1]", True), ("10.0.0.11:10911", True),
    ("broker.example:10911", False), ("localhost.evil.example", False), ("127.0.0.1.nip.io:80", False),
    ("", False),
])
def test_literal_host(host: str, literal: bool) -> None:
    assert literal_host(host) is literal


@pytest.mark.sockets
def test_the_middleware_takes_the_allow_list_as_configured() -> None:
    async def created(_request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def main() -> None:
        app = web.Application(middlewares=[browser_guard([APP + "/", "HTTPS://Ops.Example"])])
        app.router.add_post("/admin/topics", created)
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            for origin in (APP, "https://ops.example", None):
                headers = {} if origin is None else {"Origin": origin}
                answer = await client.post("/admin/topics", headers=headers)
                assert answer.status == 200, (origin, await answer.text())
            for origin in ("http://evil.example", "null"):
                answer = await client.post("/admin/topics", headers={"Origin": origin})
                assert answer.status == 403 and origin in (await answer.json())["error"]
            rebound = await client.get("/admin/topics", headers={"Host": "rebound.example:80"})
            assert rebound.status == 403 and "rebound.example" in (await rebound.json())["error"]

    asyncio.run(main())
