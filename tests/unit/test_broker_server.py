"""The broker server over a real WebSocket on 127.0.0.1, on a one-node group in process: what
the connection and the server add -- errors answered while the connection survives, HTTP
admin, /status and /metrics, connections' memberships and notices. What the processors do
is tested without a socket (tests/unit/test_*_processor.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgpack
import pytest
import yarl
from prometheus_client.parser import text_string_to_metric_families

from broker.remoting.guarded_site import GuardedSite
from broker.remoting.server import AppliedSignal, BrokerServer
from broker.state.machine import BrokerStateMachine
from dledger.applier import Applier
from dledger.raft.replicated_log import ReplicatedLog
from protocol.message_format import MAX_MESSAGE_BYTES, Message, encode_message
from protocol.remoting import Frame, RequestCode, ResponseCode
from raftmq.local_group import free_port
from tests.support.broker_client import FrameClient
from tests.unit.test_local_log import STATUS_KEYS

#: these tests open IP sockets (a real port, the Raft transport or a client connection)
pytestmark = pytest.mark.sockets


async def serve(parts: tuple[ReplicatedLog, BrokerStateMachine, Applier],
                **server_kw: Any) -> AsyncIterator[FrameClient]:
    rlog, machine, applier = parts
    signal = AppliedSignal(asyncio.get_running_loop())
    server = BrokerServer(rlog, machine, applier, signal, lambda name: None, **server_kw)
    runner = server.runner()
    await runner.setup()
    port = free_port()
    await GuardedSite(runner, "127.0.0.1", port).start()
    async with aiohttp.ClientSession() as session, session.ws_connect(
            f"http://127.0.0.1:{port}/ws", max_msg_size=16 << 20) as ws:
        client = FrameClient(ws)
        client.base_url = yarl.URL(f"http://127.0.0.1:{port}")  # type: ignore[attr-defined]
        yield client
        client.reader.cancel()
    await runner.cleanup()


def run(one_node_broker, scenario, **server_kw) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        async for client in serve(one_node_broker, **server_kw):
            await scenario(client)

    asyncio.run(main())


def test_bad_input_gets_clear_errors_and_the_connection_survives(one_node_broker) -> None:  # type: ignore[no-untyped-def]
    async def scenario(c: FrameClient) -> None:
        r = await c.call(RequestCode.CREATE_TOPIC, {"topic": "bad name"})
        assert r.code == ResponseCode.INVALID_NAME and "position 3" in r.remark
        r = await c.call(RequestCode.SEND_MESSAGE, body=encode_message(Message("nope", b"x")))
        assert r.code == ResponseCode.TOPIC_NOT_EXIST and "auto-create is off" in r.remark
        r = await c.call(RequestCode.SEND_MESSAGE, body=b"\x00garbage")
        assert r.code == ResponseCode.INVALID_ARGUMENT
        r = await c.call(999)
        assert r.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        await c.call(RequestCode.CREATE_TOPIC, {"topic": "big"})
        huge = encode_message(Message("big", b"x" * MAX_MESSAGE_BYTES))
        r = await c.call(RequestCode.SEND_MESSAGE, body=huge)
        assert r.code == ResponseCode.MESSAGE_TOO_LARGE and "limit" in r.remark
        r = await c.call(RequestCode.PULL_MESSAGE, {"topic": "big", "queueId": 0, "offset": 0})
        assert r.code == ResponseCode.PULL_NOT_FOUND  # nothing was stored
        ok_frame = Frame.request(RequestCode.HEARTBEAT, 77).encode()
        r = await c.raw(ok_frame + b"\xc1", opaque=77)  # trailing garbage: a malformed frame
        assert r.code == ResponseCode.MALFORMED_FRAME
        r = await c.call(RequestCode.HEARTBEAT)
        assert r.code == ResponseCode.SUCCESS  # still connected

    run(one_node_broker, scenario)


def test_metrics_and_admin_api(one_node_broker) -> None:  # type: ignore[no-untyped-def]
    async def scenario(c: FrameClient) -> None:
        base = c.base_url
        async with aiohttp.ClientSession() as http:
            async with http.post(base.with_path("/admin/topics"), json={"topic": "adm", "queues": 1}) as r:
                assert r.status == 200, await r.text()
            async with http.post(base.with_path("/admin/topics"), json={"topic": "bad name"}) as r:
                assert r.status == 400 and "position 3" in (await r.json())["message"]
            m = Message("adm", b"hello", 0, keys=("k1",))
            assert (await c.call(RequestCode.SEND_MESSAGE, body=encode_message(m))).code == 0
            await c.call(RequestCode.COMMIT_OFFSET,
                         {"group": "g1", "topic": "adm", "queueId": 0, "offset": 0})
            async with http.get(base.with_path("/admin/topics")) as r:
                assert (await r.json())["adm"] == {"queues": 1, "perm": 6, "min_offsets": [0],
                                                   "max_offsets": [1]}
            async with http.get(base.with_path("/admin/groups")) as r:
                assert (await r.json()) == {"g1": {"members": [], "topics": ["adm"]}}
            async with http.get(base.with_path("/status")) as r:
                status = await r.json()
                assert status["version"] and 0 < time.time() - status["started_at"] < 60
                assert list(status)[:len(STATUS_KEYS)] == STATUS_KEYS  # the log's Status, then the broker's
                assert status["role"] == "leader" and status["applied_index"] == status["commit_index"]
            async with http.get(base.with_path("/admin/groups/g1/offsets")) as r:
                assert (await r.json())["queues"] == [
                    {"topic": "adm", "queue": 0, "committed": 0, "min_offset": 0, "max_offset": 1, "lag": 1}]
            async with http.get(base.with_path("/admin/messages").with_query(key="k1")) as r:
                (found,) = await r.json()
                assert found["msg_id"] == m.msg_id.hex() and found["body_base64"] == "aGVsbG8="
            async with http.get(base.with_path("/metrics")) as r:
                assert r.content_type == "text/plain"
                text = await r.text()
            samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                       for family in text_string_to_metric_families(text) for s in family.samples}
            node = (("group", "g1"), ("node", "n1"))
            assert samples[("raftmq_is_leader", node)] == 1
            assert samples[("raftmq_messages_sent_total", node)] == 1
            assert samples[("raftmq_commit_latency_seconds_count", node)] == 1
            every = (node[0], ("le", "+Inf"), node[1])
            assert samples[("raftmq_commit_latency_seconds_bucket", every)] == 1
            assert samples[("raftmq_consumer_lag", tuple(sorted(
                (*node, ("consumer_group", "g1"), ("topic", "adm"), ("queue", "0")))))] == 1
            assert samples[("raftmq_requests_total", tuple(sorted((*node, ("code", "10")))))] >= 1
            assert samples[("raftmq_leader_changes_total", node)] == 1  # it elected itself
            assert samples[("raftmq_fsync_seconds_count", node)] >= 1  # the send's entry was fsynced
            assert samples[("raftmq_disk_free_bytes", node)] > 0
            assert samples[("raftmq_commitlog_bytes", node)] > 0
            assert samples[("raftmq_build_info", (*node, ("version", status["version"])))] == 1
            assert ("process_start_time_seconds", ()) in samples

    run(one_node_broker, scenario)


def test_consumer_membership_and_route(one_node_broker) -> None:  # type: ignore[no-untyped-def]
    async def scenario(c: FrameClient) -> None:
        r = await c.call(RequestCode.CREATE_TOPIC, {"topic": "orders", "queues": 1})
        assert r.code == ResponseCode.SUCCESS, r.remark
        r = await c.call(RequestCode.GET_ROUTE, {"topic": "orders"})
        route = msgpack.unpackb(r.body)
        assert route["topic"] == "orders" and route["groups"][0]["queues"] == 1
        r = await c.call(RequestCode.GET_ROUTE, {"topic": "nope"})
        assert r.code == ResponseCode.TOPIC_NOT_EXIST

        # membership: two clients on two connections; closing one tells the other
        async with aiohttp.ClientSession() as session:
            other = await FrameClient.connect(session, c.base_url.authority)  # type: ignore[attr-defined]
            for client, cid in ((c, "a"), (other, "b")):
                r = await client.call(RequestCode.HEARTBEAT, {"clientId": cid},
                                      body=msgpack.packb({"billing": ["orders"]}))
                assert r.code == ResponseCode.SUCCESS, r.remark
            r = await c.call(RequestCode.GET_CONSUMER_LIST, {"group": "billing"})
            assert msgpack.unpackb(r.body) == ["a", "b"]
            for _joined in ("a", "b"):  # every member hears of each join, a of its own too
                note = await asyncio.wait_for(c.requests.get(), 5)
                assert note.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED and note.is_oneway
            await other.close()
        note = await asyncio.wait_for(c.requests.get(), 5)  # b's connection closed
        assert note.ext["group"] == "billing"
        r = await c.call(RequestCode.GET_CONSUMER_LIST, {"group": "billing"})
        assert msgpack.unpackb(r.body) == ["a"]
        r = await c.call(RequestCode.HEARTBEAT, {"clientId": "a"}, body=b"\x01")
        assert r.code == ResponseCode.INVALID_ARGUMENT

    run(one_node_broker, scenario)
