"""The name server's RocketMQ codes from its route table (no sockets), and the first-byte
choice of protocol on a shared port (a fake transport)."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from broker.namesrv import server as namesrv_server
from broker.namesrv.route_table import Registration, RouteTable
from broker.rocketmq.namesrv_front import NameServerFrontEnd
from common.protocol_sniffer import ProtocolSniffer
from protocol.rocketmq import fastjson
from protocol.rocketmq.codes import RequestCode, ResponseCode
from protocol.rocketmq.frame import RemotingFrame
from protocol.rocketmq.headers import GetRouteInfoRequestHeader


def table() -> RouteTable:
    t = RouteTable()
    topics = {"orders": (8, 6), "payments": (4, 6)}
    t.register(Registration("g1", "n1", "follower", "127.0.0.1:10911", topics, term=2))
    t.register(Registration("g1", "n2", "leader", "127.0.0.1:10921", topics, term=2))
    t.register(Registration("g1", "n3", "follower", "127.0.0.1:10931", topics, term=2))
    t.register(Registration("g2", "m1", "follower", "127.0.0.1:11911", {"orders": (2, 6)}, term=5))
    return t


def ask(front: NameServerFrontEnd, code: int, ext: dict[str, str] | None = None,
        version: int = 0) -> RemotingFrame:
    frame = RemotingFrame(code, 5, 0, None, ext, b"", version=version)
    return asyncio.run(front.serve(None, frame))  # type: ignore[arg-type]


def route_ext(topic: str) -> dict[str, str]:
    return GetRouteInfoRequestHeader(topic=topic).to_ext()[0]


def test_a_route_names_each_group_as_a_broker_with_its_leader_as_master() -> None:
    front = NameServerFrontEnd(table())
    old = ask(front, RequestCode.GET_ROUTEINFO_BY_TOPIC, route_ext("orders"), version=317)
    assert old.code == ResponseCode.SUCCESS and old.opaque == 5 and old.is_response
    assert b'"brokerAddrs":{0:"127.0.0.1:10921",1:"127.0.0.1:10911",2:"127.0.0.1:10931"}' in old.body
    new = ask(front, RequestCode.GET_ROUTEINFO_BY_TOPIC, route_ext("orders"), version=407)
    route = fastjson.loads(new.body)  # standard JSON for 4.9.4+
    assert fastjson.loads(new.body.decode()) == route and b'"0":"127.0.0.1:10921"' in new.body
    by_name = {b["brokerName"]: b["brokerAddrs"] for b in route["brokerDatas"]}
    assert by_name == {"g1": {"0": "127.0.0.1:10921", "1": "127.0.0.1:10911", "2": "127.0.0.1:10931"},
                       "g2": {"1": "127.0.0.1:11911"}}  # g2 knows no leader: no master until it elects one
    assert {(q["brokerName"], q["writeQueueNums"], q["perm"]) for q in route["queueDatas"]} == {
        ("g1", 8, 6), ("g2", 2, 6)}
    missing = ask(front, RequestCode.GET_ROUTEINFO_BY_TOPIC, route_ext("nope"))
    assert missing.code == ResponseCode.TOPIC_NOT_EXIST and "nope" in (missing.remark or "")


def test_cluster_info_topic_lists_and_what_is_not_served() -> None:
    front = NameServerFrontEnd(table())
    info = fastjson.loads(ask(front, RequestCode.GET_BROKER_CLUSTER_INFO).body)
    assert info["clusterAddrTable"] == {"DefaultCluster": ["g1", "g2"]}
    assert info["brokerAddrTable"]["g1"]["brokerAddrs"]["0"] == "127.0.0.1:10921"
    topics = fastjson.loads(ask(front, RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER).body)
    assert sorted(topics["topicList"]) == ["orders", "payments"]
    register = ask(front, RequestCode.REGISTER_BROKER)
    assert register.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert "REGISTER_BROKER (103)" in (register.remark or "")
    assert ask(front, RequestCode.GET_KV_CONFIG).code == ResponseCode.QUERY_NOT_FOUND
    bad = ask(front, RequestCode.GET_ROUTEINFO_BY_TOPIC, {})
    assert bad.code == ResponseCode.SYSTEM_ERROR and "topic" in (bad.remark or "")


class Recorder(asyncio.Protocol):
    def __init__(self) -> None:
        self.made: Any = None
        self.data = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.made = transport

    def data_received(self, data: bytes) -> None:
        self.data += data


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.closed = False

    def close(self) -> None:
        self.closed = True


def sniff(first: bytes, timeout_s: float = 30.0) -> tuple[Recorder, Recorder, FakeTransport]:
    http, rocket, transport = Recorder(), Recorder(), FakeTransport()

    async def main() -> None:
        sniffer = ProtocolSniffer(lambda: http, lambda: rocket, first_byte_timeout_s=timeout_s)
        sniffer.connection_made(transport)
        if first:
            sniffer.data_received(first)
            sniffer.data_received(b"more")
        else:  # nothing said: closed once the timer fires
            deadline = asyncio.get_running_loop().time() + 5
            while not transport.closed:
                assert asyncio.get_running_loop().time() < deadline, "a silent connection stayed open"
                await asyncio.sleep(0.005)
        sniffer.connection_lost(None)

    asyncio.run(main())
    return http, rocket, transport


def test_the_first_byte_chooses_the_protocol() -> None:
    http, rocket, transport = sniff(b"\x00\x00\x01\x00rest")
    assert rocket.made is transport and rocket.data == b"\x00\x00\x01\x00restmore" and http.made is None
    http, rocket, transport = sniff(b"GET /healthz HTTP/1.1\r\n")
    assert http.made is transport and http.data.startswith(b"GET /healthz") and rocket.made is None
    http, rocket, transport = sniff(b"\x16\x03\x01")  # a TLS hello on a plain port: HTTP answers it
    assert http.made is transport and rocket.made is None
    http, rocket, transport = sniff(b"", timeout_s=0.01)
    assert transport.closed and http.made is None and rocket.made is None


def test_off_loopback_the_shared_port_follows_the_exposure_rule(capsys) -> None:  # type: ignore[no-untyped-def]
    """RocketMQ's codes have no port of their own: a name server that may not listen where
    other hosts reach it without TLS serves neither protocol (nothing is bound: the unit
    tests' socket guard would fail the test)."""
    args = argparse.Namespace(config=None, listen="0.0.0.0:19876", insecure=False, log_level="ERROR")
    assert namesrv_server.run(args) == 2
    assert "error:" in capsys.readouterr().err
