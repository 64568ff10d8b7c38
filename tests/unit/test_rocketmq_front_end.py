"""The RocketMQ front end (broker/rocketmq) over a broker on the memory log, no sockets:
RocketMQ frames -- some the real 4.9.7 client classes wrote (tests/compat/golden) -- in,
RocketMQ answers out, served by the broker's own processors."""

from __future__ import annotations

import asyncio
import json
import threading
import zlib
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from broker.config import read_broker_section
from broker.node import rocket_front_end
from broker.remoting.server import AppliedSignal, BrokerServer
from broker.rocketmq import offsets as offsets_module
from broker.rocketmq.front_end import RocketFrontEnd
from broker.state.machine import BrokerStateMachine
from broker.store.inflation import MAX_INFLATED_PER_PULL
from dledger.applier import Applier
from dledger.errors import NotLeader
from dledger.log import Log
from protocol import record_section
from protocol.deferred import CheckTransactionRequest
from protocol.message_format import Message, encode_message
from protocol.record_batch import encode_record
from protocol.remoting import ResponseCode as Native
from protocol.rocketmq import bodies
from protocol.rocketmq.codes import MessageSysFlag, PullSysFlag, RequestCode, ResponseCode, SerializeType
from protocol.rocketmq.frame import RemotingFrame, decode_frame
from protocol.rocketmq.headers import (
    CheckTransactionStateRequestHeader,
    GetMaxOffsetRequestHeader,
    Header,
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    QueryConsumerOffsetRequestHeader,
    QueryMessageRequestHeader,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
    UpdateConsumerOffsetRequestHeader,
    ViewMessageRequestHeader,
)
from protocol.rocketmq.message import (
    BatchMessage,
    StoredMessage,
    decode_message_id,
    decode_stored,
    encode_batch_message,
    message_id,
)
from protocol.send import SendBatchRequest

GOLDEN = Path(__file__).resolve().parents[1] / "compat" / "golden" / "encoded"
STORE_HOST = "127.0.0.1:10911"
UNIQ = "0A0B0C0D00002A9F0000000000000001"


class FakeConnection:
    """A connection's side the front end uses: its address, and what the broker sends it."""

    def __init__(self, remote: str = "127.0.0.1:50123") -> None:
        self.remote = remote
        self.closed = False
        self.sent: list[RemotingFrame] = []

    async def request(self, frame: RemotingFrame, timeout_s: float) -> RemotingFrame | None:
        self.sent.append(frame)
        return None


def golden_frame(name: str) -> RemotingFrame:
    return decode_frame(bytes.fromhex((GOLDEN / f"{name}.hex").read_text().strip())[4:])


class Rocket:
    """Requests to a front end, as a RocketMQ client would send them."""

    def __init__(self, front: RocketFrontEnd, conn: FakeConnection | None = None,
                 sign: Callable[[dict[str, str], bytes], dict[str, str]] | None = None) -> None:
        """``sign``: the ext a request goes with, given its own and its body (AclClientRPCHook's)."""
        self.front = front
        self.conn = conn or FakeConnection()
        self._sign = sign
        self._opaque = 0

    async def ask(self, code: int, header: Header | dict[str, str] | None = None, body: bytes = b"",
                  kind: SerializeType = SerializeType.JSON) -> RemotingFrame:
        self._opaque += 1
        opaque = self._opaque
        ext = header.to_ext()[0] if isinstance(header, Header) else header
        if self._sign is not None:
            ext = self._sign(dict(ext or {}), body)
        frame = RemotingFrame(code, opaque, 0, None, ext, body, serialize_type=kind)
        reply = await self.front.serve(self.conn, frame)  # type: ignore[arg-type]
        assert reply.opaque == opaque and reply.is_response
        return decode_frame(reply.encode()[4:])  # and it encodes as a frame

    async def create_topic(self, topic: str, queues: int = 4) -> None:
        reply = await self.ask(RequestCode.UPDATE_AND_CREATE_TOPIC, {
            "topic": topic, "defaultTopic": "TBW102", "readQueueNums": str(queues),
            "writeQueueNums": str(queues), "perm": "6", "topicFilterType": "SINGLE_TAG", "order": "false"})
        assert reply.code == ResponseCode.SUCCESS, reply.remark

    async def send(self, topic: str, queue_id: int, body: bytes, properties: str = "") -> RemotingFrame:
        header = SendMessageRequestHeader(producer_group="pg", topic=topic, default_topic="TBW102",
                                          default_topic_queue_nums=4, queue_id=queue_id, sys_flag=0,
                                          born_timestamp=1_700_000_000_000, flag=0, properties=properties)
        return await self.ask(RequestCode.SEND_MESSAGE, header, body)

    async def pull(self, topic: str, queue_id: int, offset: int, *, group: str = "billing",
                   suspend_ms: int = 0,
                   subscription: str | None = "*") -> tuple[RemotingFrame, list[StoredMessage]]:
        flags = (PullSysFlag.SUSPEND if suspend_ms else 0) | (PullSysFlag.SUBSCRIPTION if subscription else 0)
        header = PullMessageRequestHeader(consumer_group=group, topic=topic, queue_id=queue_id,
                                          queue_offset=offset, max_msg_nums=32, sys_flag=int(flags),
                                          commit_offset=0, suspend_timeout_millis=suspend_ms, sub_version=0,
                                          subscription=subscription, expression_type="TAG")
        reply = await self.ask(RequestCode.PULL_MESSAGE, header)
        return reply, decode_stored(reply.body) if reply.code == ResponseCode.SUCCESS else []


def run(one_node_broker: tuple[Log, BrokerStateMachine, Applier],
        scenario: Callable[[Rocket, BrokerServer], Awaitable[None]], **server_kw: object) -> None:
    rlog, machine, applier = one_node_broker

    async def main() -> None:
        server = BrokerServer(rlog, machine, applier, AppliedSignal(asyncio.get_running_loop()),
                              lambda _n: STORE_HOST, addresses={"n1": STORE_HOST}, **server_kw)  # type: ignore[arg-type]
        await scenario(Rocket(RocketFrontEnd(server, STORE_HOST)), server)

    asyncio.run(asyncio.wait_for(main(), 60))


def props(**kv: str) -> str:
    return "\x02".join(f"{k}\x01{v}" for k, v in kv.items())


def test_a_send_is_pulled_viewed_by_id_and_found_by_key(one_node_broker) -> None:  # type: ignore[no-untyped-def]
    async def scenario(r: Rocket, _server: BrokerServer) -> None:
        await r.create_topic("orders", 8)
        for kind in SerializeType:  # the Java client's own SEND_MESSAGE_V2 frame, in both serializations
            golden = golden_frame(f"send_v2_{kind.name.lower()}")
            reply = await r.front.serve(r.conn, golden)  # type: ignore[arg-type]
            assert reply.code == ResponseCode.SUCCESS, reply.remark
            assert reply.serialize_type == kind  # answered as asked
        properties = props(TAGS="paid", KEYS="order-7 order-8", UNIQ_KEY=UNIQ, region="eu")
        sent = await r.send("orders", 3, b"paid: 42", properties)
        assert sent.code == ResponseCode.SUCCESS, sent.remark
        header = SendMessageResponseHeader.from_ext(sent.ext)
        assert (header.queue_id, header.queue_offset) == (3, 2)
        host, position = decode_message_id(header.msg_id)
        assert host == ("127.0.0.1", 10911)

        reply, messages = await r.pull("orders", 3, 0)
        assert reply.code == ResponseCode.SUCCESS, reply.remark
        assert [m.body for m in messages] == [b"hello", b"hello", b"paid: 42"]
        assert [m.queue_offset for m in messages] == [0, 1, 2]
        last = messages[-1]
        assert last.commit_log_offset == position and last.store_host == host
        assert last.properties["TAGS"] == "paid" and last.properties["KEYS"] == "order-7 order-8"
        assert last.properties["UNIQ_KEY"] == UNIQ and last.properties["region"] == "eu"
        assert last.born_host == ("127.0.0.1", 50123) and last.store_timestamp > 0
        assert PullMessageResponseHeader.from_ext(reply.ext).next_begin_offset == 3

        viewed = await r.ask(RequestCode.VIEW_MESSAGE_BY_ID, ViewMessageRequestHeader(offset=position))
        assert viewed.code == ResponseCode.SUCCESS, viewed.remark
        assert decode_stored(viewed.body)[0].body == b"paid: 42"
        assert decode_stored(viewed.body)[0].queue_offset == 2  # mqadmin prints it
        by_key = await r.ask(RequestCode.QUERY_MESSAGE, QueryMessageRequestHeader(
            topic="orders", key="order-8", max_num=32, begin_timestamp=0, end_timestamp=2**62))
        assert by_key.code == ResponseCode.SUCCESS, by_key.remark
        found = [(m.body, m.queue_id, m.queue_offset) for m in decode_stored(by_key.body)]
        assert found == [(b"paid: 42", 3, 2)]
        ext = {**QueryMessageRequestHeader(topic="orders", key=UNIQ, max_num=32, begin_timestamp=0,
                                           end_timestamp=2**62).to_ext()[0], "_UNIQUE_KEY_QUERY": "true"}
        by_uniq = await r.ask(RequestCode.QUERY_MESSAGE, ext)
        assert by_uniq.code == ResponseCode.SUCCESS, by_uniq.remark
        assert decode_stored(by_uniq.body)[0].properties["UNIQ_KEY"] == UNIQ

    run(one_node_broker, scenario)


def test_a_batch_is_stored_in_the_queue_the_client_chose_and_filtered_by_tag(one_node_broker) -> None:  # type: ignore[no-untyped-def]
    async def scenario(r: Rocket, _server: BrokerServer) -> None:
        await r.create_topic("orders")
        batch = b"".join(encode_batch_message(BatchMessage(0, f"m{i}".encode(), {"TAGS": f"t{i % 2}"}))
                         for i in range(4))
        header = SendMessageRequestHeader(producer_group="pg", topic="orders", default_topic="TBW102",
                                          default_topic_queue_nums=4, queue_id=2, sys_flag=0,
                                          born_timestamp=1_700_000_000_000, flag=0, batch=True)
        ext = {letter: header.to_ext()[0][name] for letter, name in
               (("a", "producerGroup"), ("b", "topic"), ("c", "defaultTopic"), ("d", "defaultTopicQueueNums"),
                ("e", "queueId"), ("f", "sysFlag"), ("g", "bornTimestamp"), ("h", "flag"), ("m", "batch"))}
        sent = await r.ask(RequestCode.SEND_BATCH_MESSAGE, ext, batch)
        assert sent.code == ResponseCode.SUCCESS, sent.remark
        ids = SendMessageResponseHeader.from_ext(sent.ext).msg_id.split(",")
        assert len(ids) == 4 and SendMessageResponseHeader.from_ext(sent.ext).queue_id == 2
        _, every = await r.pull("orders", 2, 0)
        assert [m.body for m in every] == [b"m0", b"m1", b"m2", b"m3"]
        assert [decode_message_id(i)[1] for i in ids] == [m.commit_log_offset for m in every]
        # sent without UNIQ_KEY (the Go client's batch): pulled without one, as RocketMQ's broker
        # answers, so a client's msgId (UNIQ_KEY, else offsetMsgId) is the id the send answered
        assert all("UNIQ_KEY" not in m.properties for m in every)
        assert [message_id(m.store_host, m.commit_log_offset) for m in every] == ids
        _, odd = await r.pull("orders", 2, 0, subscription="t1")
        assert [m.body for m in odd] == [b"m1", b"m3"]
        nothing, _ = await r.pull("orders", 2, 0, subscription="none-such")
        assert nothing.code == ResponseCode.PULL_RETRY_IMMEDIATELY
        assert PullMessageResponseHeader.from_ext(nothing.ext).next_begin_offset == 4

    run(one_node_broker, scenario)


def test_a_long_poll_waits_for_the_next_message(one_node_broker) -> None:  # type: ignore[no-untyped-def]
    async def scenario(r: Rocket, server: BrokerServer) -> None:
        await r.create_topic("orders")
        waiting = asyncio.ensure_future(r.pull("orders", 0, 0, suspend_ms=20_000))
        deadline = asyncio.get_running_loop().time() + 10
        while server.signal.parked() == 0:  # the pull is parked on its queue
            assert asyncio.get_running_loop().time() < deadline and not waiting.done()
            await asyncio.sleep(0.01)
        assert (await r.send("orders", 0, b"late")).code == ResponseCode.SUCCESS
        reply, messages = await asyncio.wait_for(waiting, 10)
        assert reply.code == ResponseCode.SUCCESS and [m.body for m in messages] == [b"late"]
        expired, _ = await r.pull("orders", 0, 1, suspend_ms=50)
        assert expired.code == ResponseCode.PULL_NOT_FOUND
        assert PullMessageResponseHeader.from_ext(expired.ext).next_begin_offset == 1

    run(one_node_broker, scenario)


def test_offsets_heartbeats_and_consumer_lists(one_node_broker) -> None:  # type: ignore[no-untyped-def]
    async def scenario(r: Rocket, _server: BrokerServer) -> None:
        await r.create_topic("orders")
        for body in (b"a", b"b", b"c"):
            await r.send("orders", 1, body)
        query = QueryConsumerOffsetRequestHeader(consumer_group="billing", topic="orders", queue_id=1)
        first = await r.ask(RequestCode.QUERY_CONSUMER_OFFSET, query)  # none committed, the queue whole:
        assert first.code == ResponseCode.SUCCESS and first.ext == {"offset": "0"}  # 0, as RocketMQ
        update = UpdateConsumerOffsetRequestHeader(consumer_group="billing", topic="orders", queue_id=1,
                                                   commit_offset=2)
        assert (await r.ask(RequestCode.UPDATE_CONSUMER_OFFSET, update)).code == ResponseCode.SUCCESS
        found = await r.ask(RequestCode.QUERY_CONSUMER_OFFSET, query)
        assert found.code == ResponseCode.SUCCESS and found.ext is not None and found.ext["offset"] == "2"
        bounds = GetMaxOffsetRequestHeader(topic="orders", queue_id=1)
        assert (await r.ask(RequestCode.GET_MAX_OFFSET, bounds)).ext == {"offset": "3"}
        assert (await r.ask(RequestCode.GET_MIN_OFFSET, bounds)).ext == {"offset": "0"}

        body = bytes.fromhex((GOLDEN / "heartbeat.hex").read_text().strip())  # the Java client's
        assert (await r.ask(RequestCode.HEART_BEAT, None, body)).code == ResponseCode.SUCCESS
        members = await r.ask(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "billing"})
        assert members.code == ResponseCode.SUCCESS, members.remark
        assert bodies.fastjson.loads(members.body) == {"consumerIdList": ["127.0.0.1@4242"]}
        # the heartbeat's filter ("paid || created") applies to the group's pulls that carry none
        await r.send("orders", 1, b"paid one", props(TAGS="paid"))
        _, kept = await r.pull("orders", 1, 0, subscription=None)
        assert [m.body for m in kept] == [b"paid one"]
        gone = await r.ask(RequestCode.UNREGISTER_CLIENT,
                           {"clientID": "127.0.0.1@4242", "consumerGroup": "billing"})
        assert gone.code == ResponseCode.SUCCESS
        assert (await r.ask(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "billing"})).code == \
            ResponseCode.SYSTEM_ERROR

    run(one_node_broker, scenario)


def test_unsupported_codes_are_answered_naming_the_code(one_node_broker) -> None:  # type: ignore[no-untyped-def]
    async def scenario(r: Rocket, _server: BrokerServer) -> None:
        reply = await r.ask(RequestCode.GET_ALL_DELAY_OFFSET)
        assert reply.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        assert "GET_ALL_DELAY_OFFSET (45)" in (reply.remark or "")
        unknown = await r.ask(9999)
        assert unknown.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED and "9999" in (unknown.remark or "")
        bad = await r.ask(RequestCode.PULL_MESSAGE, {"topic": "orders"})
        assert bad.code == ResponseCode.SYSTEM_ERROR and "consumerGroup" in (bad.remark or "")

    run(one_node_broker, scenario)


def test_not_leader_becomes_service_not_available_naming_the_leader(one_node_broker) -> None:  # type: ignore[no-untyped-def]
    async def scenario(r: Rocket, server: BrokerServer) -> None:
        await r.create_topic("orders")

        def follower() -> None:
            raise NotLeader("n2", "127.0.0.1:7002")

        server.require_leader = follower  # type: ignore[method-assign]
        server.leader_address = lambda _name: "127.0.0.1:10921"
        reply = await r.send("orders", 0, b"x")
        assert reply.code == ResponseCode.SERVICE_NOT_AVAILABLE  # the producer retries; its route refreshes
        assert "127.0.0.1:10921" in (reply.remark or "")
        _, messages = await r.pull("orders", 0, 0)  # reads go on, as a slave's
        assert messages == []

    run(one_node_broker, scenario)


@pytest.mark.parametrize("code", [RequestCode.SEND_MESSAGE, RequestCode.PULL_MESSAGE, RequestCode.HEART_BEAT,
                                  RequestCode.QUERY_CONSUMER_OFFSET, RequestCode.VIEW_MESSAGE_BY_ID,
                                  RequestCode.UPDATE_AND_CREATE_TOPIC])
def test_with_acls_on_every_unsigned_request_is_refused(one_node_broker, code: RequestCode) -> None:  # type: ignore[no-untyped-def]
    async def scenario(r: Rocket, _server: BrokerServer) -> None:
        golden = golden_frame("send_v1_json")
        reply = await r.ask(code, dict(golden.ext or {}), golden.body)
        assert reply.code == ResponseCode.NO_PERMISSION
        assert "sign requests with an access key" in (reply.remark or "")

    run(one_node_broker, scenario, acl=True)


def test_an_ipv6_clients_unique_key_is_found_and_not_shown_as_a_key(one_node_broker) -> None:  # type: ignore[no-untyped-def]
    long_uniq = "FD00000000000000000000000000000249404E0E2F2A8C84871F0000"  # 28 bytes (captured)

    async def scenario(r: Rocket, _server: BrokerServer) -> None:
        await r.create_topic("orders")
        sent = await r.send("orders", 0, b"v6", props(KEYS="k1", UNIQ_KEY=long_uniq))
        assert sent.code == ResponseCode.SUCCESS, sent.remark
        _, (pulled,) = await r.pull("orders", 0, 0)
        assert pulled.properties["UNIQ_KEY"] == long_uniq and pulled.properties["KEYS"] == "k1"
        query = QueryMessageRequestHeader(topic="orders", key=long_uniq, max_num=32, begin_timestamp=0,
                                          end_timestamp=2**62, unique_key_query=True)
        found = await r.ask(RequestCode.QUERY_MESSAGE, query)
        assert found.code == ResponseCode.SUCCESS, found.remark
        assert [m.body for m in decode_stored(found.body)] == [b"v6"]

    run(one_node_broker, scenario)


def test_mqadmins_topic_status_consumer_progress_and_runtime_info(one_node_broker) -> None:  # type: ignore[no-untyped-def]
    async def scenario(r: Rocket, _server: BrokerServer) -> None:
        await r.create_topic("orders", 2)
        for body in (b"a", b"b"):
            await r.send("orders", 1, body)
        update = UpdateConsumerOffsetRequestHeader(consumer_group="billing", topic="orders", queue_id=1,
                                                   commit_offset=1)
        assert (await r.ask(RequestCode.UPDATE_CONSUMER_OFFSET, update)).code == ResponseCode.SUCCESS
        stats = await r.ask(RequestCode.GET_TOPIC_STATS_INFO, {"topic": "orders"})
        assert stats.code == ResponseCode.SUCCESS, stats.remark
        text = stats.body.decode()
        assert '{"brokerName":"' in text and '"queueId":1,"topic":"orders"}:{"lastUpdateTimestamp":' in text
        assert '"maxOffset":2,"minOffset":0}' in text and '"queueId":0,' in text
        progress = await r.ask(RequestCode.GET_CONSUME_STATS, {"consumerGroup": "billing"})
        assert progress.code == ResponseCode.SUCCESS, progress.remark
        assert '"queueId":1,"topic":"orders"}:{"brokerOffset":2,"consumerOffset":1,"lastTimestamp":' in \
            progress.body.decode()
        info = bodies.fastjson.loads(
            (await r.ask(RequestCode.GET_BROKER_RUNTIME_INFO)).body)["table"]
        assert info["brokerVersionDesc"] == "RaftMQ" and float(info["putTps"].split(" ")[0]) == 0.0
        missing = await r.ask(RequestCode.GET_TOPIC_STATS_INFO, {"topic": "none-such"})
        assert missing.code == ResponseCode.TOPIC_NOT_EXIST

    run(one_node_broker, scenario)


def heartbeat(client_id: str, group: str = "billing", producer: str | None = None) -> bytes:
    consumer = {"groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
                "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET", "unitMode": False,
                "subscriptionDataSet": [{"topic": "orders", "subString": "*", "expressionType": "TAG",
                                         "subVersion": 1, "classFilterMode": False, "tagsSet": [],
                                         "codeSet": []}]}
    doc = {"clientID": client_id, "consumerDataSet": [] if producer else [consumer],
           "producerDataSet": [{"groupName": producer}] if producer else []}
    return json.dumps(doc).encode()


def test_members_hear_when_a_group_changes_and_when_a_member_goes(one_node_broker) -> None:  # type: ignore[no-untyped-def]
    async def scenario(first: Rocket, _server: BrokerServer) -> None:
        await first.create_topic("orders")
        second = Rocket(first.front, FakeConnection("127.0.0.1:50124"))
        def notices() -> list[RemotingFrame]:
            return [f for f in first.conn.sent if f.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED]

        assert (await first.ask(RequestCode.HEART_BEAT, None, heartbeat("c1"))).code == ResponseCode.SUCCESS
        joined = len(notices())
        assert (await second.ask(RequestCode.HEART_BEAT, None, heartbeat("c2"))).code == ResponseCode.SUCCESS
        assert len(notices()) == joined + 1  # c2 joined
        assert notices()[-1].is_oneway and notices()[-1].ext == {"consumerGroup": "billing"}
        first.front.closed(second.conn)  # type: ignore[arg-type]  # the second member's connection closes
        deadline = asyncio.get_running_loop().time() + 10
        while len(notices()) < joined + 2:
            assert asyncio.get_running_loop().time() < deadline, "no notice that a member went"
            await asyncio.sleep(0.01)
        members = await first.ask(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "billing"})
        assert bodies.fastjson.loads(members.body) == {"consumerIdList": ["c1"]}

    run(one_node_broker, scenario)


def test_a_transaction_check_reaches_a_rocketmq_producer_as_check_transaction_state(one_node_broker) -> None:  # type: ignore[no-untyped-def]
    async def scenario(r: Rocket, _server: BrokerServer) -> None:
        await r.create_topic("orders")
        beat = await r.ask(RequestCode.HEART_BEAT, None, heartbeat("p1", producer="pg"))
        assert beat.code == ResponseCode.SUCCESS
        client = r.front.connections[r.conn]  # type: ignore[index]
        half = Message("orders", b"half", 0, "t", ("k",), {"TRAN_MSG": "true", "PGROUP": "pg"},
                       msg_id=bytes.fromhex(UNIQ))
        check = CheckTransactionRequest(position=4242, group="pg", message=encode_message(half))
        await client.deliver(check.to_frame(1, oneway=True))
        (sent,) = r.conn.sent
        assert sent.code == RequestCode.CHECK_TRANSACTION_STATE and sent.is_oneway
        header = CheckTransactionStateRequestHeader.of(sent)
        assert header.commit_log_offset == 4242 and header.transaction_id == UNIQ == header.msg_id
        (stored,) = decode_stored(sent.body)
        assert stored.body == b"half" and stored.properties["PGROUP"] == "pg"
        assert stored.properties["UNIQ_KEY"] == UNIQ and stored.commit_log_offset == 4242

    run(one_node_broker, scenario)


def test_a_transactional_half_is_committed_by_end_transaction_at_its_id(one_node_broker) -> None:  # type: ignore[no-untyped-def]
    async def scenario(r: Rocket, _server: BrokerServer) -> None:
        await r.create_topic("orders")
        ids = {}
        for body in (b"commit me", b"roll me back"):
            half = await r.send("orders", 0, body, props(TRAN_MSG="true", PGROUP="pg", UNIQ_KEY=UNIQ))
            assert half.code == ResponseCode.SUCCESS, half.remark
            ids[body] = SendMessageResponseHeader.of(half).msg_id
        _, nothing = await r.pull("orders", 0, 0)
        assert nothing == []  # halves are held
        for body, commit in ((b"commit me", 8), (b"roll me back", 12)):
            end = await r.ask(RequestCode.END_TRANSACTION, {
                "producerGroup": "pg", "tranStateTableOffset": "0", "commitOrRollback": str(commit),
                "commitLogOffset": str(decode_message_id(ids[body])[1]), "msgId": UNIQ,
                "fromTransactionCheck": "false"})
            assert end.code == ResponseCode.SUCCESS, end.remark
        _, committed = await r.pull("orders", 0, 0)
        assert [m.body for m in committed] == [b"commit me"]

    run(one_node_broker, scenario)


def test_a_body_the_java_client_compressed_is_stored_and_pulled_whole(one_node_broker) -> None:  # type: ignore[no-untyped-def]
    """The Java client deflates bodies over 4 KiB and flags it in sysFlag (COMPRESSED)."""
    body = b"paid order 42; " * 400

    async def scenario(r: Rocket, _server: BrokerServer) -> None:
        await r.create_topic("orders")
        header = SendMessageRequestHeader(producer_group="pg", topic="orders", default_topic="TBW102",
                                          default_topic_queue_nums=4, queue_id=0,
                                          sys_flag=int(MessageSysFlag.COMPRESSED),
                                          born_timestamp=1_700_000_000_000, flag=0, properties="")
        sent = await r.ask(RequestCode.SEND_MESSAGE, header, zlib.compress(body, 5))
        assert sent.code == ResponseCode.SUCCESS, sent.remark
        _, (pulled,) = await r.pull("orders", 0, 0)
        assert pulled.body == body and not pulled.sys_flag & MessageSysFlag.COMPRESSED
        inflated = await r.ask(RequestCode.SEND_MESSAGE, header, zlib.compress(b"\0" * (64 << 20)))
        assert inflated.code == ResponseCode.MESSAGE_ILLEGAL and "inflates" in (inflated.remark or "")
        broken = await r.ask(RequestCode.SEND_MESSAGE, header, b"not deflate")
        assert broken.code == ResponseCode.MESSAGE_ILLEGAL

    run(one_node_broker, scenario)


def test_a_new_group_starts_at_zero_only_while_the_first_message_is_in_memory(
        one_node_broker, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    async def scenario(r: Rocket, _server: BrokerServer) -> None:
        await r.create_topic("orders")
        await r.send("orders", 1, b"a")
        query = QueryConsumerOffsetRequestHeader(consumer_group="fresh", topic="orders", queue_id=1)
        assert (await r.ask(RequestCode.QUERY_CONSUMER_OFFSET, query)).ext == {"offset": "0"}
        monkeypatch.setattr(offsets_module, "IN_MEMORY_RATIO", 0.0)  # as if the message were on disk only
        far = await r.ask(RequestCode.QUERY_CONSUMER_OFFSET, query)
        assert far.code == ResponseCode.QUERY_NOT_FOUND  # the client starts where ConsumeFromWhere says

    run(one_node_broker, scenario)


def test_values_raftmqs_frames_cannot_carry_are_answered_not_raised(one_node_broker) -> None:  # type: ignore[no-untyped-def]
    async def scenario(r: Rocket, _server: BrokerServer) -> None:
        await r.create_topic("orders")
        huge = QueryConsumerOffsetRequestHeader(consumer_group="g", topic="orders", queue_id=2**70)
        reply = await r.ask(RequestCode.QUERY_CONSUMER_OFFSET, huge)
        assert reply.code == ResponseCode.SYSTEM_ERROR and "internal error" not in (reply.remark or "")
        assert "queueId" in (reply.remark or "") or "64" in (reply.remark or ""), reply.remark
        negative = await r.pull("orders", -5, -7)
        assert negative[0].code in (ResponseCode.SYSTEM_ERROR, ResponseCode.PULL_NOT_FOUND)

    run(one_node_broker, scenario)


def test_a_pull_with_no_subscription_known_is_refused_not_served_unfiltered(one_node_broker) -> None:  # type: ignore[no-untyped-def]
    """A push consumer's pull names no filter: the broker takes it from the group's heartbeat.
    With none (the heartbeat went elsewhere, or not yet) RocketMQ's broker answers
    SUBSCRIPTION_NOT_EXIST; serving every message would hand a SQL92 or tag subscriber what it
    did not ask for (seen with the Go client: tests/compat test_go_tag_and_sql92...)."""
    async def scenario(r: Rocket, _server: BrokerServer) -> None:
        await r.create_topic("orders", 4)
        await r.send("orders", 1, b"unwanted", props(TAGS="other"))
        reply, messages = await r.pull("orders", 1, 0, group="newcomers", subscription=None)
        assert reply.code == ResponseCode.SUBSCRIPTION_NOT_EXIST and messages == []
        assert reply.remark is not None and "newcomers" in reply.remark

    run(one_node_broker, scenario)


def test_a_pull_of_compressed_bombs_inflates_a_bounded_amount_off_the_event_loop(
        one_node_broker, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """Issue 25, row 3 (second pass, G3): the front end decoded a native page's records on the
    event loop, up to maxMsgNums of them: records of a few hundred bytes each inflating to
    ~4 MiB made one answer of ~GiB. Now a pull decompresses at most MAX_INFLATED_PER_PULL (the
    native SQL pull's bound), on an inflating thread, and answers the offset it reached."""
    raw = (4 << 20) - 4096
    bombs = 8  # 32 MiB inflated: twice the bound
    record = encode_record("bombs", 0, [(bytes(16), 1_700_000_000_000, 0, None, None, {}, 0,
                                         b"\0" * (raw - 256))], compression="zstd")
    assert len(record) < 2048
    threads: list[str] = []
    decompress = record_section._decompress

    def recorded(codec: int, data: bytes, raw_length: int) -> bytes:
        threads.append(threading.current_thread().name)
        return decompress(codec, data, raw_length)

    async def scenario(r: Rocket, server: BrokerServer) -> None:
        await r.create_topic("bombs", 1)
        for _ in range(bombs):
            sent = await server.handle(SendBatchRequest(records=(record,)).to_frame(1))
            assert sent.code == Native.SUCCESS, sent.remark
        monkeypatch.setattr(record_section, "_decompress", recorded)
        offset, pulls = 0, 0
        while offset < bombs:
            pulls += 1
            assert pulls <= bombs, "the pulls did not get through the queue"
            reply, messages = await r.pull("bombs", 0, offset)
            assert reply.code == ResponseCode.SUCCESS, reply.remark
            size = len(reply.body)
            assert size <= MAX_INFLATED_PER_PULL + raw, f"one answer of {size} bytes"
            assert [m.queue_offset for m in messages] == list(range(offset, offset + len(messages)))
            offset = PullMessageResponseHeader.from_ext(reply.ext).next_begin_offset
            assert offset == messages[-1].queue_offset + 1
        assert pulls >= 2, "one answer held every bomb"
        assert threads and all(name.startswith("inflate") for name in threads), set(threads)

    run(one_node_broker, scenario)


def test_the_rocketmq_port_takes_the_client_ports_configured_deadline_and_idle_limit(
        one_node_broker, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Second pass (G9): broker/node.py built the front end with fixed 30 s / 120 s, whatever
    ``[broker] frame_deadline_s`` and ``idle_timeout_s`` said."""
    toml = tmp_path / "broker.toml"
    toml.write_text('[broker]\nlisten = "127.0.0.1:1"\nframe_deadline_s = 7\nidle_timeout_s = 9\n')
    options = read_broker_section(toml).server_options()

    async def scenario(_r: Rocket, server: BrokerServer) -> None:
        front = rocket_front_end(server, STORE_HOST)
        conn = front.protocol()
        assert (conn.limits.frame_deadline_s, conn.limits.idle_timeout_s) == (7, 9)
        assert conn.limits.max_frame_bytes == server.max_frame_bytes
        assert conn.limits.meter is server.connections

    run(one_node_broker, scenario, **options)
