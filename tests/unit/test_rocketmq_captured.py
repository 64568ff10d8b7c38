"""The reference captures (tests/compat/golden/captured: the stock 4.9.7 Java client and
mqadmin against the REAL Apache RocketMQ 4.9.7, recorded frame by frame): every frame
decodes and encodes back to its bytes, a send's answer is built as the real broker wrote
it, and the clients' broker requests replayed to the RocketMQ front end over a memory-log
broker get the response codes the real broker gave."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from pathlib import Path

import pytest

from broker.remoting.server import AppliedSignal, BrokerServer
from broker.rocketmq.front_end import RocketFrontEnd
from broker.state.machine import BrokerStateMachine
from dledger.applier import Applier
from dledger.log import Log
from protocol.rocketmq import bodies
from protocol.rocketmq.codes import PullSysFlag, RequestCode, ResponseCode
from protocol.rocketmq.frame import RemotingFrame, decode_frame
from protocol.rocketmq.headers import PullMessageRequestHeader, SendMessageResponseHeader, reply

CAPTURED = Path(__file__).resolve().parents[1] / "compat" / "golden" / "captured"
STORE_HOST = "127.0.0.1:10911"
#: a replayed long poll waits at most this long (the clients asked for 15 s)
LONG_POLL_MS = 1500


@dataclasses.dataclass(frozen=True)
class Line:
    route: str  # ns | broker
    conn: int
    to_server: bool
    raw: bytes

    @property
    def frame(self) -> RemotingFrame:
        return decode_frame(self.raw[4:])


def capture(name: str) -> list[Line]:
    out = []
    for text in (CAPTURED / f"{name}.hex").read_text().splitlines():
        if text and not text.startswith("#"):
            route, conn, direction, data = text.split()
            out.append(Line(route, int(conn), direction == ">", bytes.fromhex(data)))
    return out


CAPTURES = sorted(p.stem for p in CAPTURED.glob("*.hex"))


def test_the_captures_are_there() -> None:
    assert len(CAPTURES) >= 18 and "producer_send_and_batch" in CAPTURES


@pytest.mark.parametrize("name", CAPTURES)
def test_every_captured_frame_decodes_and_encodes_back_to_its_bytes(name: str) -> None:
    for line in capture(name):
        assert line.frame.encode() == line.raw


@pytest.mark.parametrize("name", ["producer_send_and_batch", "producer_send_rocketmq_serialization"])
def test_a_send_answer_is_the_bytes_the_real_broker_wrote(name: str) -> None:
    lines = capture(name)
    requests = {(ln.conn, ln.frame.opaque): ln.frame for ln in lines if ln.route == "broker" and ln.to_server}
    compared = 0
    for ln in lines:
        answer = ln.frame
        request = requests.get((ln.conn, answer.opaque))
        if ln.to_server or request is None or request.code not in (RequestCode.SEND_MESSAGE_V2,
                                                                    RequestCode.SEND_BATCH_MESSAGE):
            continue
        sent = SendMessageResponseHeader.of(answer)
        again = reply(request, ResponseCode.SUCCESS, SendMessageResponseHeader(
            msg_id=sent.msg_id, queue_id=sent.queue_id, queue_offset=sent.queue_offset, trace_on=True,
            msg_region="DefaultRegion"))
        if request.serialize_type == answer.serialize_type and answer.ext_order[0] == "msgId":
            assert again.encode() == ln.raw  # the ROCKETMQ serialization: byte for byte
        else:
            assert decode_frame(again.encode()[4:]) == answer  # JSON: the same frame
        compared += 1
    assert compared == 3


def test_topic_stats_and_consume_stats_bodies_are_the_real_brokers_bytes() -> None:
    """fastjson's objects as map keys (``{{"brokerName":..}:{..}}``), rebuilt from the values."""
    for name, build in (("mqadmin_topicStatus", "topic"), ("mqadmin_consumerProgress", "consume")):
        answer = next(ln.frame for ln in capture(name)
                      if ln.route == "broker" and not ln.to_server and ln.frame.body.startswith(b'{"'))
        text = answer.body.decode()
        rows = []
        entry = r'\{"brokerName":"([^"]+)","queueId":(\d+),"topic":"([^"]+)"\}:\{([^}]*)\}'
        for match in re.finditer(entry, text):
            values = {k: int(v) for k, v in re.findall(r'"(\w+)":(\d+)', match.group(4))}
            queue = bodies.MessageQueue(match.group(3), match.group(1), int(match.group(2)))
            if build == "topic":
                rows.append(bodies.QueueStats(queue, values["minOffset"], values["maxOffset"],
                                              values["lastUpdateTimestamp"]))
            else:
                rows.append(bodies.QueueStats(queue, 0, values["brokerOffset"], values["lastTimestamp"],
                                              values["consumerOffset"]))
        assert len(rows) == 4
        if build == "topic":
            assert bodies.topic_stats(rows) == answer.body
        else:
            tps = float(re.match(r'\{"consumeTps":([0-9.]+),', text).group(1))  # type: ignore[union-attr]
            assert bodies.consume_stats(rows, tps) == answer.body


#: the conversations replayed to the front end (after the ones named first, on the same broker:
#: the push consumer reads what the producer capture sent), and the codes RaftMQ answers
#: otherwise than the real broker did (request code -> (real broker's code, RaftMQ's code))
REPLAYED: dict[str, tuple[tuple[str, ...], dict[int, set[tuple[int, int]]]]] = {
    "producer_send_and_batch": ((), {}),
    "producer_send_rocketmq_serialization": ((), {}),
    # the real broker answered the first pulls SUBSCRIPTION_NOT_LATEST (their subVersion was
    # older than the group's heartbeat); RaftMQ keeps no subscription versions: it serves them
    "push_consumer_pull_and_commit": (("producer_send_and_batch",), {
        RequestCode.PULL_MESSAGE: {(ResponseCode.SUBSCRIPTION_NOT_LATEST, ResponseCode.SUCCESS),
                                   (ResponseCode.SUBSCRIPTION_NOT_LATEST, ResponseCode.PULL_NOT_FOUND)}}),
    "ordered_selector_and_orderly_consumer": ((), {}),
    "tags_filter": ((), {}),
    "sql92_filter": ((), {}),
    "lite_pull_consumer": ((), {}),
    "mqadmin_topicStatus": (("producer_send_and_batch",), {}),
    "mqadmin_consumerProgress": (("producer_send_and_batch", "push_consumer_pull_and_commit"), {
        RequestCode.PULL_MESSAGE: {(ResponseCode.SUBSCRIPTION_NOT_LATEST, ResponseCode.SUCCESS),
                                   (ResponseCode.SUBSCRIPTION_NOT_LATEST, ResponseCode.PULL_NOT_FOUND)}}),
    "mqadmin_clusterList": ((), {}),
    "mqadmin_updateTopic": ((), {}),
}


def replay(one_node_broker: tuple[Log, BrokerStateMachine, Applier],
           names: tuple[str, ...]) -> list[tuple[int, int, int]]:
    """(request code, the real broker's answer code, the front end's) for every broker request
    of the capture that was answered. Requests go in the capture's order, each answered before
    the next, but for pulls: they run alongside what follows (a long poll the real broker held
    until a later send is woken by that send here too), cut to LONG_POLL_MS."""
    rlog, machine, applier = one_node_broker
    out: list[tuple[int, int, int]] = []

    async def main() -> None:
        server = BrokerServer(rlog, machine, applier, AppliedSignal(asyncio.get_running_loop()),
                              lambda _n: STORE_HOST, addresses={"n1": STORE_HOST})
        front = RocketFrontEnd(server, STORE_HOST)
        for name in names:
            await replay_one(front, capture(name))

    async def replay_one(front: RocketFrontEnd, lines: list[Line]) -> None:
        answers = {(ln.conn, ln.frame.opaque): ln.frame.code for ln in lines
                   if ln.route == "broker" and not ln.to_server and ln.frame.is_response}
        pulls: list[tuple[int, int, asyncio.Task[RemotingFrame]]] = []

        class Conn:
            remote = "127.0.0.1:50000"
            closed = False

            async def request(self, frame: RemotingFrame, timeout_s: float) -> None:
                return None

        conns: dict[int, Conn] = {}

        for ln in lines:
            if ln.route != "broker" or not ln.to_server:
                continue
            request = ln.frame
            if request.code == RequestCode.PULL_MESSAGE:
                h = PullMessageRequestHeader.of(request)
                if h.sys_flag & PullSysFlag.SUSPEND:
                    ext = dict(request.ext or {})
                    ext["suspendTimeoutMillis"] = str(min(h.suspend_timeout_millis, LONG_POLL_MS))
                    request = dataclasses.replace(request, ext=ext)
            real = answers.get((ln.conn, request.opaque))
            conn = conns.setdefault(ln.conn, Conn())
            serving = asyncio.ensure_future(front.serve(conn, request))  # type: ignore[arg-type]
            if request.code == RequestCode.PULL_MESSAGE:
                if real is not None:
                    pulls.append((request.code, real, serving))
                continue
            answer = await asyncio.wait_for(serving, 10)
            if real is not None and not request.is_oneway:
                out.append((request.code, real, answer.code))
        for code, real, serving in pulls:
            out.append((code, real, (await asyncio.wait_for(serving, 10)).code))

    asyncio.run(asyncio.wait_for(main(), 120))
    return out


@pytest.mark.parametrize("name", sorted(REPLAYED))
def test_replayed_requests_get_the_real_brokers_answer_codes(one_node_broker, name: str) -> None:  # type: ignore[no-untyped-def]
    before, expected = REPLAYED[name]
    differ: dict[int, set[tuple[int, int]]] = {}
    results = replay(one_node_broker, (*before, name))
    assert len(results) >= 2
    for code, real, ours in results:
        if real != ours:
            differ.setdefault(code, set()).add((real, ours))
    assert differ == expected
