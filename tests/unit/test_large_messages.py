"""Messages larger than one Raft entry, through a one-node broker's processors in memory (no
server, no socket: ``tests/support/memory_broker.py``): chained over entries, pulled and
queried back byte for byte, pages within their size budget, the size limit refusing a
message before anything is proposed, an idempotent retry stored once."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

import pytest

from broker.processors.pull import PULL_BODY_BYTES
from broker.state.machine import BrokerStateMachine
from broker.store.entry_batch import MessageTooLarge
from dledger.applier import Applier
from dledger.log import Log
from protocol.message_format import MAX_MESSAGE_BYTES, Message, decode_message, encode_message
from protocol.pull import PullRequest, PullResponse, PullRow
from protocol.query import QueryMessageRequest, QueryResponse, ViewMessageRequest
from protocol.remoting import DEFAULT_MAX_FRAME, ResponseCode
from protocol.send import SendBatchRequest, SendBatchResponse, SendMessageRequest, WriteResponse
from tests.support.memory_broker import MemoryBroker, memory_broker

Parts = tuple[Log, BrokerStateMachine, Applier]
_rnd = random.Random(42)


def run(parts: Parts, scenario: Callable[[MemoryBroker], Awaitable[None]],
        max_message_bytes: int = MAX_MESSAGE_BYTES) -> None:
    async def main() -> None:
        async with memory_broker(parts, max_message_bytes=max_message_bytes) as broker:
            await scenario(broker)

    asyncio.run(asyncio.wait_for(main(), 120))


def sized(topic: str, size: int, queue: int = 0, **kw: object) -> bytes:
    """An encoded message of exactly ``size`` bytes (random body, so slices differ)."""
    head = len(encode_message(Message(topic, bytes(1 << 16), queue, **kw))) - (1 << 16)  # type: ignore[arg-type]
    assert size - head >= 1 << 16, "the size arithmetic assumes a bin32 body"
    data = encode_message(Message(topic, _rnd.randbytes(size - head), queue, **kw))  # type: ignore[arg-type]
    assert len(data) == size
    return data


async def send(b: MemoryBroker, data: bytes) -> WriteResponse:
    answer = await b.call(b.sends.send, SendMessageRequest(message=data))
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    return WriteResponse.from_frame(answer)


async def pull(b: MemoryBroker, topic: str, queue: int, offset: int,
               max_msgs: int = 32) -> tuple[list[PullRow], int]:
    answer = await b.call(b.pulls.pull, PullRequest(topic=topic, queue_id=queue, offset=offset,
                                                    max_msgs=max_msgs))
    assert answer.code == ResponseCode.SUCCESS, (answer.code, answer.remark)
    assert len(answer.encode()) <= DEFAULT_MAX_FRAME  # what clients accept by default
    page = PullResponse.from_frame(answer)
    return list(page.rows or ()), page.next_offset


async def nothing_in(b: MemoryBroker, topic: str) -> bool:
    answer = await b.call(b.pulls.pull, PullRequest(topic=topic, queue_id=0, offset=0))
    return answer.code == ResponseCode.PULL_NOT_FOUND


def test_4_mib_and_200_kib_messages_round_trip(one_node_broker: Parts) -> None:
    async def scenario(b: MemoryBroker) -> None:
        await b.create_topic("big", 2)
        largest = sized("big", MAX_MESSAGE_BYTES, 0, keys=("largest",), tags="L")
        medium = sized("big", 200 * 1024, 1, keys=("medium",))
        small = encode_message(Message("big", b"tiny", 0, keys=("small",)))
        for data, queue in ((largest, 0), (medium, 1), (small, 0)):
            assert (await send(b, data)).queue_id == queue
        rows, next_offset = await pull(b, "big", 0, 0)
        assert [row.record for row in rows] == [largest] and next_offset == 1  # alone: the size budget
        rows, next_offset = await pull(b, "big", 0, 1)
        assert [row.record for row in rows] == [small] and next_offset == 2
        rows, _ = await pull(b, "big", 1, 0)
        assert [row.record for row in rows] == [medium]
        for data, key in ((largest, "largest"), (medium, "medium"), (small, "small")):
            (row,) = QueryResponse.from_frame(await b.call(b.queries.query_by_key,
                                                           QueryMessageRequest(key=key))).rows
            assert row.message == data and row.store_ms > 0
            msg_id = decode_message(data).msg_id.hex()
            by_id = await b.call(b.queries.view_by_id, ViewMessageRequest(msg_id=msg_id))
            assert QueryResponse.from_frame(by_id).rows[0].message == data

    run(one_node_broker, scenario)


def test_a_batch_of_small_and_large_messages_keeps_queue_order(one_node_broker: Parts) -> None:
    async def scenario(b: MemoryBroker) -> None:
        await b.create_topic("mix", 2)
        batch = []
        for i, size in enumerate([0, 1_500_000, 0, 70_000, 0, 1_200_000, 0, 900_000, 0]):
            queue = 0 if size else i % 4 // 2
            batch.append(sized("mix", size, queue) if size else
                         encode_message(Message("mix", f"s{i}".encode(), queue)))
        answer = await b.call(b.sends.send_batch, SendBatchRequest(records=tuple(batch)))
        rows = SendBatchResponse.from_frame(answer).rows
        assert all(row.code == ResponseCode.SUCCESS for row in rows)
        for queue in (0, 1):
            sent = [m for m in batch if decode_message(m).queue_id == queue]
            assert [row.queue_offset for row, m in zip(rows, batch, strict=True)
                    if decode_message(m).queue_id == queue] == list(range(len(sent)))
            got: list[bytes] = []
            offset = 0
            while offset < len(sent):
                page, offset = await pull(b, "mix", queue, offset)
                assert sum(len(row.record) for row in page) <= PULL_BODY_BYTES
                got += [row.record for row in page]
            assert got == sent  # byte-identical, in send order

    run(one_node_broker, scenario)


def test_a_pull_stops_at_its_size_budget(one_node_broker: Parts) -> None:
    async def scenario(b: MemoryBroker) -> None:
        await b.create_topic("p", 1)
        sent = [sized("p", 1_500_000) for _ in range(3)]
        for data in sent:
            await send(b, data)
        page, next_offset = await pull(b, "p", 0, 0)
        assert [row.record for row in page] == sent[:2] and next_offset == 2
        page, next_offset = await pull(b, "p", 0, 2)
        assert [row.record for row in page] == sent[2:] and next_offset == 3

    run(one_node_broker, scenario)


def test_a_message_over_a_configured_limit_is_refused_and_nothing_stored(one_node_broker: Parts) -> None:
    rlog = one_node_broker[0]

    async def scenario(b: MemoryBroker) -> None:
        await b.create_topic("t", 1)
        committed = rlog.committed_index
        with pytest.raises(MessageTooLarge) as refused:
            await b.call(b.sends.send, SendMessageRequest(message=sized("t", 100_001)))
        assert "100001 bytes exceeds" in str(refused.value) and "100000-byte limit" in str(refused.value)
        # in a batch: the whole batch is refused before anything is proposed
        with pytest.raises(MessageTooLarge, match="100001 bytes"):
            await b.call(b.sends.send_batch, SendBatchRequest(records=(
                encode_message(Message("t", b"ok")), sized("t", 100_001))))
        assert rlog.committed_index == committed  # nothing was proposed
        assert await nothing_in(b, "t")
        await send(b, sized("t", 100_000))  # at the limit: chained

    run(one_node_broker, scenario, max_message_bytes=100_000)


def test_the_default_limit_refuses_4_mib_plus_one(one_node_broker: Parts) -> None:
    async def scenario(b: MemoryBroker) -> None:
        await b.create_topic("t", 1)
        with pytest.raises(MessageTooLarge) as refused:
            await b.call(b.sends.send, SendMessageRequest(message=sized("t", MAX_MESSAGE_BYTES + 1)))
        assert f"{MAX_MESSAGE_BYTES + 1} bytes exceeds" in str(refused.value)
        assert f"{MAX_MESSAGE_BYTES}-byte limit" in str(refused.value)
        assert await nothing_in(b, "t")

    run(one_node_broker, scenario)


def test_the_retry_of_a_large_idempotent_message_is_not_stored_twice(one_node_broker: Parts) -> None:
    async def scenario(b: MemoryBroker) -> None:
        await b.create_topic("t", 1)
        data = sized("t", 300_000, producer_id="p-1", sequence=0)
        first = await send(b, data)
        retry = await send(b, data)
        assert (first.duplicate, retry.duplicate) == (False, True)
        assert retry.queue_offset == first.queue_offset == 0
        rows, next_offset = await pull(b, "t", 0, 0)
        assert [row.record for row in rows] == [data] and next_offset == 1

    run(one_node_broker, scenario)
