"""Every bad request gets an answer (issue 15, row 10).

On the WebSocket: a malformed frame whose opaque can be read is answered MALFORMED_FRAME on
the same opaque (the connection stays); one that cannot be answered (garbage, empty, an
unreadable head, a malformed oneway or response) closes the connection with a WebSocket
close code and a reason -- never silence until the client's own timeout. On HTTP (the
broker's admin API, the members API, the name server): a bad body or query gets a 4xx with
a JSON error, never a 500.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import pytest
from aiohttp import WSMsgType, web

from broker.namesrv.route_table import RouteTable
from broker.namesrv.server import make_app
from broker.remoting.client_limits import ClientLimits
from protocol.remoting import Frame, RequestCode, ResponseCode, decode_frame
from raftmq.local_group import free_port
from tests.support.inprocess_broker import serving_broker

ANSWER_WITHIN_S = 3.0


def raw_frame(*fields: Any) -> bytes:
    return msgpack.packb(list(fields), use_bin_type=True)


def items(*fields: Any) -> bytes:
    """msgpack items one after the other, with no array header."""
    return b"".join(msgpack.packb(f, use_bin_type=True) for f in fields)


HEARTBEAT = Frame.request(RequestCode.HEARTBEAT, 41).encode()

#: (what, bytes): each readable enough to be answered on its opaque
ANSWERABLE = [
    ("trailing garbage", HEARTBEAT + b"\xc1"),
    ("truncated body", Frame.request(RequestCode.SEND_MESSAGE, 41, body=b"x" * 100).encode()[:-10]),
    ("wrong version", raw_frame(2, int(RequestCode.HEARTBEAT), 41, 0, "", {}, b"")),
    ("2**32-item frame array", b"\xdd\xff\xff\xff\xff" + items(1, 30, 41, 0)),
    ("2**32-entry ext map", b"\x97" + items(1, 30, 41, 0, "") + b"\xdf\xff\xff\xff\xff"),
    ("ext of the wrong type", raw_frame(1, 30, 41, 0, "", [1, 2], b"")),
    ("nested ext value", raw_frame(1, 30, 41, 0, "", {"a": {"b": 1}}, b"")),
    ("six fields", raw_frame(1, 30, 41, 0, "", {})),
]

#: (what, bytes): nothing in them says whom to answer
UNANSWERABLE = [
    ("garbage", b"\xc1\xc1\xc1\xc1"),
    ("empty", b""),
    ("not an array", msgpack.packb({"opaque": 41})),
    ("opaque not an int", raw_frame(1, 30, "41", 0, "", {}, b"")),
    ("malformed oneway", raw_frame(1, 30, 41, 2, "", [1], b"")),
    ("truncated head", HEARTBEAT[:3]),
    ("2**32-item array, nothing else", b"\xdd\xff\xff\xff\xff"),
]


async def answer_or_close(ws: aiohttp.ClientWebSocketResponse, data: bytes) -> tuple[str, Any, Any]:
    """("answer", Frame, None) or ("closed", close code, reason), or ("silence", ...) when
    neither came within ANSWER_WITHIN_S."""
    await ws.send_bytes(data)
    try:
        msg = await ws.receive(timeout=ANSWER_WITHIN_S)
    except TimeoutError:
        return "silence", None, None
    if msg.type == WSMsgType.BINARY:
        return "answer", decode_frame(msg.data), None
    if msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED):
        return "closed", ws.close_code if msg.data is None else msg.data, msg.extra
    return str(msg.type), msg.data, None


def run(tmp_path: Path, scenario: Callable[[str], Awaitable[None]]) -> None:
    async def main() -> None:
        async with serving_broker(tmp_path) as (_server, address):
            await scenario(address)

    asyncio.run(main())


def run_on_ws(tmp_path: Path, scenario: Callable[[aiohttp.ClientWebSocketResponse], Awaitable[None]]) -> None:
    """``run`` with a WebSocket open to the broker: the ``scenario`` gets it."""
    async def on_ws(address: str) -> None:
        async with aiohttp.ClientSession() as http, http.ws_connect(f"http://{address}/ws") as ws:
            await scenario(ws)

    run(tmp_path, on_ws)


async def answer_to(ws: aiohttp.ClientWebSocketResponse, data: bytes, what: str) -> Frame:
    """The frame the broker answered ``data`` with; fails naming ``what`` if it closed the
    connection or said nothing instead."""
    kind, frame, _ = await answer_or_close(ws, data)
    assert kind == "answer", f"{what}: {kind} {frame}"
    return frame


async def close_after(ws: aiohttp.ClientWebSocketResponse, data: bytes, what: str) -> tuple[int, str]:
    """The close code and reason the broker closed the connection with after ``data``; fails
    naming ``what`` if it answered or said nothing instead."""
    kind, code, reason = await answer_or_close(ws, data)
    assert kind == "closed", f"{what}: {kind} {code}"
    return code, reason


async def assert_still_answered(ws: aiohttp.ClientWebSocketResponse, opaque: int) -> None:
    """The connection stayed: a HEARTBEAT on ``opaque`` is answered SUCCESS on it."""
    heartbeat = Frame.request(RequestCode.HEARTBEAT, opaque).encode()
    frame = await answer_to(ws, heartbeat, "the connection should stay")
    assert frame.code == ResponseCode.SUCCESS and frame.opaque == opaque, frame


@pytest.mark.parametrize(("what", "data"), ANSWERABLE, ids=[w for w, _ in ANSWERABLE])
def test_a_malformed_frame_with_a_readable_opaque_is_answered(tmp_path: Path, what: str,
                                                              data: bytes) -> None:
    async def scenario(ws: aiohttp.ClientWebSocketResponse) -> None:
        frame = await answer_to(ws, data, what)
        assert frame.code == ResponseCode.MALFORMED_FRAME and frame.opaque == 41, (what, frame)
        assert frame.remark.startswith("malformed frame"), frame.remark
        await assert_still_answered(ws, 42)

    run_on_ws(tmp_path, scenario)


@pytest.mark.parametrize(("what", "data"), UNANSWERABLE, ids=[w for w, _ in UNANSWERABLE])
def test_an_unreadable_frame_closes_the_connection_with_a_reason(tmp_path: Path, what: str,
                                                                data: bytes) -> None:
    async def scenario(ws: aiohttp.ClientWebSocketResponse) -> None:
        code, reason = await close_after(ws, data, what)
        assert code == aiohttp.WSCloseCode.INVALID_TEXT, (what, code, reason)
        assert reason and "malformed frame" in reason, (what, reason)

    run_on_ws(tmp_path, scenario)


# -- HTTP ---------------------------------------------------------------------------

DEEP_JSON = b"[" * 100_000 + b"]" * 100_000
HUGE_NUMBER = b'{"topic": "t1", "queues": 1e400}'

BROKER_HTTP = [
    ("POST", "/admin/topics", HUGE_NUMBER),
    ("POST", "/admin/topics", DEEP_JSON),
    ("POST", "/admin/topics", b'{"topic": "t1", "queues": 1000000000}'),
    ("POST", "/admin/topics", b'{"topic": "t1", "queues": -1}'),
    ("POST", "/admin/topics", b'{"topic": ["t1"]}'),
    ("POST", "/admin/topics", b'[1, 2]'),
    ("POST", "/admin/topics", b'"t1"'),
    ("POST", "/admin/topics", b'\xff\xfe'),
    ("POST", "/admin/leader/transfer", DEEP_JSON),
    ("POST", "/admin/leader/transfer", b'{"to": 1e400}'),
    ("POST", "/admin/leader/transfer", b'{"to": "nobody"}'),
    ("POST", "/admin/members", DEEP_JSON),
    ("POST", "/admin/members", b'{"op": "add", "name": "n9", "raft": "x", "client": "y"}'),
    ("POST", "/admin/members", b'{"op": ["add"]}'),
    ("POST", "/admin/members", b'[]'),
    ("GET", "/admin/messages?msgId=zz", b""),
    ("GET", "/admin/messages?key=" + "k" * 5000, b""),
    ("GET", "/admin/messages", b""),
    ("GET", "/no/such/path", b""),
    ("DELETE", "/admin/topics", b""),
]

NAMESRV_HTTP = [
    ("POST", "/register", DEEP_JSON),
    ("POST", "/register", b'{"group": "g1", "node": "n1", "role": "leader", "address": "a:1", '
                          b'"term": 1e400}'),
    ("POST", "/register", b'{"group": "g1", "node": "n1", "role": "leader", "address": "a:1", '
                          b'"topics": {"kind": "full", "version": "v", "pages": 1e400}}'),
    ("POST", "/register", b"\x00" * 10),
    ("GET", "/route/" + "t" * 5000, b""),
    ("GET", "/nothing", b""),
]


async def check_json_4xx(http: aiohttp.ClientSession, base: str, method: str, path: str,
                         body: bytes) -> None:
    async with http.request(method, base + path, data=body) as resp:
        text = await resp.text()
        assert 400 <= resp.status < 500, f"{method} {path[:60]} {body[:40]!r}: {resp.status} {text[:300]}"
        assert resp.content_type == "application/json", (method, path[:60], resp.content_type, text[:200])
        doc = json.loads(text)
        assert isinstance(doc, dict), doc
        assert "Traceback" not in text


def test_the_broker_http_answers_bad_input_with_a_json_4xx(tmp_path: Path) -> None:
    async def scenario(address: str) -> None:
        async with aiohttp.ClientSession() as http:
            for method, path, body in BROKER_HTTP:
                await check_json_4xx(http, f"http://{address}", method, path, body)
            async with http.get(f"http://{address}/admin/topics") as resp:  # nothing was created
                assert resp.status == 200 and await resp.json() == {}

    run(tmp_path, scenario)


def test_the_name_server_answers_bad_input_with_a_json_4xx() -> None:
    async def main() -> None:
        runner = web.AppRunner(make_app(RouteTable()))
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            async with aiohttp.ClientSession() as http:
                for method, path, body in NAMESRV_HTTP:
                    await check_json_4xx(http, f"http://127.0.0.1:{port}", method, path, body)
        finally:
            await runner.cleanup()

    asyncio.run(main())


# -- the client ------------------------------------------------------------------------

def test_the_client_error_says_why_the_broker_closed_or_refused_the_connection(tmp_path: Path) -> None:
    from client.aio.connection import ConnectionPool
    from client.errors import ConnectionLostError
    from protocol.pull import PullRequest
    from protocol.topic import CreateTopicRequest

    async def main() -> None:
        async with serving_broker(tmp_path, limits=ClientLimits(max_connections_per_address=1)) as (
                _server, address):
            pool, other = ConnectionPool(), ConnectionPool()
            try:
                conn = await pool.get(address)
                await conn.request(CreateTopicRequest(topic="t", queues=1))
                parked = asyncio.create_task(conn.call(PullRequest(topic="t", queue_id=0, offset=0,
                                                                   suspend_ms=20_000), timeout=30))
                await asyncio.sleep(0.2)
                with pytest.raises(ConnectionLostError, match=r"too many connections from 127\.0\.0\.1"):
                    await other.get(address)  # the second from this address
                await conn._ws.send_bytes(b"\xc1")  # garbage on the wire: the broker closes
                with pytest.raises(ConnectionLostError, match="closed by the broker: 1007 malformed frame"):
                    await asyncio.wait_for(parked, 5)
            finally:
                await pool.close()
                await other.close()

    asyncio.run(main())


def test_a_failing_oneway_request_is_dropped_quietly(tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    """A oneway request whose handler refuses it has nobody to answer: found by the fuzzing,
    building the error answer raised in a task nobody awaited (a traceback in the log)."""
    async def scenario(ws: aiohttp.ClientWebSocketResponse) -> None:
        bad = Frame.request(RequestCode.SEND_MESSAGE, 43, body=b"\x00garbage", oneway=True).encode()
        kind, frame, _ = await answer_or_close(ws, bad)
        assert kind == "silence", (kind, frame)
        await assert_still_answered(ws, 44)

    with caplog.at_level(logging.ERROR):
        run_on_ws(tmp_path, scenario)
        gc.collect()  # an unawaited task's exception is reported when it is collected
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
