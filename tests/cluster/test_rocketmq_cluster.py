"""RocketMQ's protocol, spoken through protocol/rocketmq, against a real 3-node group and its
name server (separate processes, stopped by PID): the route names the leader as master,
sends to it are acknowledged with ids a follower resolves, a follower serves pulls and
offsets as a slave and refuses writes with SERVICE_NOT_AVAILABLE naming the leader, and
after the leader's kill -9 the route names a new master that takes sends while every
acknowledged message is still there."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from protocol.rocketmq import fastjson
from protocol.rocketmq.codes import PullSysFlag, RequestCode, ResponseCode
from protocol.rocketmq.frame import RemotingFrame, decode_frame, read_length
from protocol.rocketmq.headers import (
    GetRouteInfoRequestHeader,
    Header,
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    QueryConsumerOffsetRequestHeader,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
    UpdateConsumerOffsetRequestHeader,
    ViewMessageRequestHeader,
    v2_ext,
)
from protocol.rocketmq.message import StoredMessage, decode_message_id, decode_stored
from raftmq.local_group import LocalGroup
from raftmq.local_namesrv import configure_namesrv, namesrv_argv
from tests.support.procs import ManagedProcess, free_ports, wait_until

pytestmark = [pytest.mark.cluster]

TOPIC = "rocket-orders"
QUEUE = 1


def ask(address: str, code: int, header: Header | dict[str, str] | None = None, body: bytes = b"",
        timeout: float = 10.0) -> RemotingFrame:
    """One request on a fresh connection, as a 4.9.7 client sends it (version 407)."""
    ext = header.to_ext()[0] if isinstance(header, Header) else header
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(RemotingFrame(code, 1, 0, None, ext, body, version=407).encode())
        length = read_length(_read(s, 4), 16 << 20)
        return decode_frame(_read(s, length))


def _read(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed before the answer was whole")
        out += chunk
    return out


def send(address: str, body: bytes, key: str) -> RemotingFrame:
    header = SendMessageRequestHeader(producer_group="pg", topic=TOPIC, default_topic="TBW102",
                                      default_topic_queue_nums=4, queue_id=QUEUE, sys_flag=0,
                                      born_timestamp=1_700_000_000_000, flag=0,
                                      properties=f"KEYS\x01{key}\x02WAIT\x01true")
    return ask(address, RequestCode.SEND_MESSAGE_V2, v2_ext(header)[0], body)


def pull(address: str, offset: int) -> tuple[RemotingFrame, list[StoredMessage]]:
    flags = int(PullSysFlag.SUSPEND | PullSysFlag.SUBSCRIPTION)
    header = PullMessageRequestHeader(consumer_group="cg", topic=TOPIC, queue_id=QUEUE, queue_offset=offset,
                                      max_msg_nums=64, sys_flag=flags,
                                      commit_offset=0, suspend_timeout_millis=1000, sub_version=0,
                                      subscription="*", expression_type="TAG")  # as a pull consumer
    answer = ask(address, RequestCode.PULL_MESSAGE, header)
    return answer, decode_stored(answer.body) if answer.code == ResponseCode.SUCCESS else []


def pull_all(address: str, want: int) -> list[StoredMessage]:
    got: list[StoredMessage] = []

    def more() -> bool:
        answer, messages = pull(address, len(got))
        if answer.code == ResponseCode.SUCCESS:
            got.extend(messages)
        return len(got) >= want

    wait_until(more, 30, what=f"{want} messages from {address}")
    return got


def route(namesrv: str) -> dict[str, Any] | None:
    answer = ask(namesrv, RequestCode.GET_ROUTEINFO_BY_TOPIC, GetRouteInfoRequestHeader(topic=TOPIC))
    return fastjson.loads(answer.body) if answer.code == ResponseCode.SUCCESS else None


def brokers(namesrv: str) -> dict[str, str]:
    found = route(namesrv)
    return {} if found is None else found["brokerDatas"][0]["brokerAddrs"]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[str, LocalGroup]]:
    (port,) = free_ports(1)
    namesrv = f"127.0.0.1:{port}"
    group = LocalGroup(tmp_path / "g1", 3, module="broker", group="g1",
                       broker={"namesrv": [namesrv], "index_slots": 64, "index_entries": 1024})
    process = ManagedProcess(namesrv_argv(configure_namesrv(tmp_path, namesrv, [group])),
                             tmp_path / "namesrv.log")
    try:
        wait_until(lambda: _answers(namesrv), 15, what="the name server")
        group.start()
        yield namesrv, group
    finally:
        group.stop()
        process.stop()


def _answers(address: str) -> bool:
    try:
        return ask(address, RequestCode.GET_BROKER_CLUSTER_INFO, timeout=2).code == ResponseCode.SUCCESS
    except OSError:
        return False


def test_a_rocketmq_client_sends_pulls_and_fails_over(cluster: tuple[str, LocalGroup]) -> None:
    namesrv, group = cluster
    leader = group.wait_leader(timeout=30)
    master = group.nodes[leader].http
    created = ask(master, RequestCode.UPDATE_AND_CREATE_TOPIC, {
        "topic": TOPIC, "defaultTopic": "TBW102", "readQueueNums": "4", "writeQueueNums": "4", "perm": "6",
        "topicFilterType": "SINGLE_TAG", "order": "false"})
    assert created.code == ResponseCode.SUCCESS, created.remark
    addrs = wait_until(lambda: (b := brokers(namesrv)) and len(b) == 3 and b.get("0") == master and b,
                       30, what="a route naming the leader as master and two slaves")
    follower = addrs["1"]

    sent = {}
    for i in range(5):
        answer = send(master, f"m{i}".encode(), f"k{i}")
        assert answer.code == ResponseCode.SUCCESS, answer.remark
        header = SendMessageResponseHeader.of(answer)
        assert header.queue_id == QUEUE and header.queue_offset == i
        sent[f"m{i}".encode()] = decode_message_id(header.msg_id)
    assert {host for host, _ in sent.values()} == {tuple_of(master)}

    refused = send(follower, b"x", "kx")  # a slave takes no writes; the remark names the master
    assert refused.code == ResponseCode.SERVICE_NOT_AVAILABLE and master in (refused.remark or "")

    from_slave = pull_all(follower, 5)  # a follower serves committed messages as a slave
    assert [m.body for m in from_slave] == [f"m{i}".encode() for i in range(5)]
    assert [m.queue_offset for m in from_slave] == list(range(5))
    assert [m.commit_log_offset for m in from_slave] == [sent[m.body][1] for m in from_slave]
    viewed = ask(follower, RequestCode.VIEW_MESSAGE_BY_ID, ViewMessageRequestHeader(offset=sent[b"m3"][1]))
    assert viewed.code == ResponseCode.SUCCESS and decode_stored(viewed.body)[0].body == b"m3"

    commit = UpdateConsumerOffsetRequestHeader(consumer_group="cg", topic=TOPIC, queue_id=QUEUE,
                                               commit_offset=3)
    assert ask(master, RequestCode.UPDATE_CONSUMER_OFFSET, commit).code == ResponseCode.SUCCESS
    query = QueryConsumerOffsetRequestHeader(consumer_group="cg", topic=TOPIC, queue_id=QUEUE)
    wait_until(lambda: ask(follower, RequestCode.QUERY_CONSUMER_OFFSET, query).ext == {"offset": "3"},
               15, what="the committed offset on a follower")

    group.kill(leader)  # kill -9
    new = wait_until(lambda: (b := brokers(namesrv)).get("0") not in (None, master) and b["0"],
                     60, what="a route naming a new master")
    with pytest.raises(OSError):
        send(master, b"late", "kl")  # the old master is gone: the client's retry goes by the route
    answer = wait_until(lambda: (a := send(new, b"m5", "k5")).code == ResponseCode.SUCCESS and a, 30,
                        what="a send to the new master")
    assert SendMessageResponseHeader.of(answer).queue_offset == 5
    after = pull_all(new, 6)
    assert [m.body for m in after] == [f"m{i}".encode() for i in range(6)]  # nothing acknowledged lost
    _, empty = pull(new, 6)
    assert empty == []
    assert PullMessageResponseHeader.of(pull(new, 6)[0]).next_begin_offset == 6


def tuple_of(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)
