"""Messages larger than one Raft entry, through the broker server on a one-node group."""

from __future__ import annotations

import random

import msgpack
import pytest

from broker.processors.pull import PULL_BODY_BYTES
from protocol.message_format import MAX_MESSAGE_BYTES, Message, decode_message, encode_message
from protocol.remoting import DEFAULT_MAX_FRAME, RequestCode, ResponseCode
from tests.support.broker_client import FrameClient
from tests.unit.test_broker_server import run

#: these tests open IP sockets (a real port, the Raft transport or a client connection)
pytestmark = pytest.mark.sockets

_rnd = random.Random(42)


def sized(topic: str, size: int, queue: int = 0, **kw: object) -> bytes:
    """An encoded message of exactly ``size`` bytes (random body, so slices differ)."""
    head = len(encode_message(Message(topic, bytes(1 << 16), queue, **kw))) - (1 << 16)  # type: ignore[arg-type]
    assert size - head >= 1 << 16, "the size arithmetic assumes a bin32 body"
    data = encode_message(Message(topic, _rnd.randbytes(size - head), queue, **kw))  # type: ignore[arg-type]
    assert len(data) == size
    return data


async def pull(c: FrameClient, topic: str, queue: int, offset: int, max_msgs: int = 32) -> tuple[list, int]:  # type: ignore[type-arg]
    r = await c.call(RequestCode.PULL_MESSAGE, {"topic": topic, "queueId": queue, "offset": offset,
                                                "maxMsgs": max_msgs})
    assert r.code == ResponseCode.SUCCESS, (r.code, r.remark)
    assert len(r.encode()) <= DEFAULT_MAX_FRAME  # what clients accept by default
    return msgpack.unpackb(r.body), r.ext["nextOffset"]


def test_4_mib_and_200_kib_messages_round_trip(one_node_broker) -> None:  # type: ignore[no-untyped-def]
    async def scenario(c: FrameClient) -> None:
        assert (await c.call(RequestCode.CREATE_TOPIC, {"topic": "big", "queues": 2})).code == 0
        largest = sized("big", MAX_MESSAGE_BYTES, 0, keys=("largest",), tags="L")
        medium = sized("big", 200 * 1024, 1, keys=("medium",))
        small = encode_message(Message("big", b"tiny", 0, keys=("small",)))
        for data, queue in ((largest, 0), (medium, 1), (small, 0)):
            r = await c.call(RequestCode.SEND_MESSAGE, body=data)
            assert (r.code, r.ext["queueId"]) == (ResponseCode.SUCCESS, queue), r.remark
        rows, next_offset = await pull(c, "big", 0, 0)
        assert [row[3] for row in rows] == [largest] and next_offset == 1  # alone: the size budget
        rows, next_offset = await pull(c, "big", 0, 1)
        assert [row[3] for row in rows] == [small] and next_offset == 2
        rows, _ = await pull(c, "big", 1, 0)
        assert [row[3] for row in rows] == [medium]
        for data, key in ((largest, "largest"), (medium, "medium"), (small, "small")):
            r = await c.call(RequestCode.QUERY_MESSAGE, {"key": key})
            ((_, stamp, found),) = msgpack.unpackb(r.body)
            assert found == data and stamp > 0
            r = await c.call(RequestCode.VIEW_MESSAGE_BY_ID, {"msgId": decode_message(data).msg_id.hex()})
            assert msgpack.unpackb(r.body)[0][2] == data

    run(one_node_broker, scenario)


def test_a_batch_of_small_and_large_messages_keeps_queue_order(one_node_broker) -> None:  # type: ignore[no-untyped-def]
    async def scenario(c: FrameClient) -> None:
        assert (await c.call(RequestCode.CREATE_TOPIC, {"topic": "mix", "queues": 2})).code == 0
        batch = []
        for i, size in enumerate([0, 1_500_000, 0, 70_000, 0, 1_200_000, 0, 900_000, 0]):
            queue = 0 if size else i % 4 // 2
            batch.append(sized("mix", size, queue) if size else
                         encode_message(Message("mix", f"s{i}".encode(), queue)))
        r = await c.call(RequestCode.SEND_BATCH, body=msgpack.packb(batch))
        assert r.code == ResponseCode.SUCCESS, r.remark
        rows = msgpack.unpackb(r.body)
        assert all(row[0] == ResponseCode.SUCCESS for row in rows)
        for queue in (0, 1):
            sent = [m for m in batch if decode_message(m).queue_id == queue]
            assert [row[2] for row, m in zip(rows, batch, strict=True)
                    if decode_message(m).queue_id == queue] == list(range(len(sent)))
            got, offset = [], 0
            while offset < len(sent):
                page, offset = await pull(c, "mix", queue, offset)
                assert sum(len(row[3]) for row in page) <= PULL_BODY_BYTES
                got += [row[3] for row in page]
            assert got == sent  # byte-identical, in send order

    run(one_node_broker, scenario)


def test_a_pull_stops_at_its_size_budget(one_node_broker) -> None:  # type: ignore[no-untyped-def]
    async def scenario(c: FrameClient) -> None:
        assert (await c.call(RequestCode.CREATE_TOPIC, {"topic": "p", "queues": 1})).code == 0
        sent = [sized("p", 1_500_000) for _ in range(3)]
        for data in sent:
            assert (await c.call(RequestCode.SEND_MESSAGE, body=data)).code == ResponseCode.SUCCESS
        page, next_offset = await pull(c, "p", 0, 0)
        assert [row[3] for row in page] == sent[:2] and next_offset == 2
        page, next_offset = await pull(c, "p", 0, 2)
        assert [row[3] for row in page] == sent[2:] and next_offset == 3

    run(one_node_broker, scenario)


def test_a_message_over_a_configured_limit_is_refused_and_nothing_stored(one_node_broker) -> None:  # type: ignore[no-untyped-def]
    rlog = one_node_broker[0]

    async def scenario(c: FrameClient) -> None:
        assert (await c.call(RequestCode.CREATE_TOPIC, {"topic": "t"})).code == 0
        committed = rlog.committed_index
        r = await c.call(RequestCode.SEND_MESSAGE, body=sized("t", 100_001))
        assert r.code == ResponseCode.MESSAGE_TOO_LARGE
        assert "100001 bytes exceeds" in r.remark and "100000-byte limit" in r.remark, r.remark
        # in a batch: the whole batch is refused before anything is proposed
        r = await c.call(RequestCode.SEND_BATCH, body=msgpack.packb(
            [encode_message(Message("t", b"ok")), sized("t", 100_001)]))
        assert r.code == ResponseCode.MESSAGE_TOO_LARGE and "100001 bytes" in r.remark, r.remark
        assert rlog.committed_index == committed  # nothing was proposed
        r = await c.call(RequestCode.PULL_MESSAGE, {"topic": "t", "queueId": 0, "offset": 0})
        assert r.code == ResponseCode.PULL_NOT_FOUND
        r = await c.call(RequestCode.SEND_MESSAGE, body=sized("t", 100_000))  # at the limit: chained
        assert r.code == ResponseCode.SUCCESS, r.remark

    run(one_node_broker, scenario, max_message_bytes=100_000)


def test_the_default_limit_refuses_4_mib_plus_one(one_node_broker) -> None:  # type: ignore[no-untyped-def]
    async def scenario(c: FrameClient) -> None:
        assert (await c.call(RequestCode.CREATE_TOPIC, {"topic": "t"})).code == 0
        r = await c.call(RequestCode.SEND_MESSAGE, body=sized("t", MAX_MESSAGE_BYTES + 1))
        assert r.code == ResponseCode.MESSAGE_TOO_LARGE
        assert f"{MAX_MESSAGE_BYTES + 1} bytes exceeds" in r.remark
        assert f"{MAX_MESSAGE_BYTES}-byte limit" in r.remark
        r = await c.call(RequestCode.PULL_MESSAGE, {"topic": "t", "queueId": 0, "offset": 0})
        assert r.code == ResponseCode.PULL_NOT_FOUND

    run(one_node_broker, scenario)


def test_the_retry_of_a_large_idempotent_message_is_not_stored_twice(one_node_broker) -> None:  # type: ignore[no-untyped-def]
    async def scenario(c: FrameClient) -> None:
        assert (await c.call(RequestCode.CREATE_TOPIC, {"topic": "t"})).code == 0
        data = sized("t", 300_000, producer_id="p-1", sequence=0)
        first = await c.call(RequestCode.SEND_MESSAGE, body=data)
        retry = await c.call(RequestCode.SEND_MESSAGE, body=data)
        assert (first.code, first.ext["duplicate"]) == (ResponseCode.SUCCESS, False)
        assert (retry.code, retry.ext["duplicate"]) == (ResponseCode.SUCCESS, True)
        assert retry.ext["queueOffset"] == first.ext["queueOffset"] == 0
        rows, next_offset = await pull(c, "t", 0, 0)
        assert [row[3] for row in rows] == [data] and next_offset == 1

    run(one_node_broker, scenario)
