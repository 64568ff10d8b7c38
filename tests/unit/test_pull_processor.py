"""The pull processor (PULL_MESSAGE) through its dependencies alone -- the memory log, the
apply step, the long-poll signal, no server and no socket: a long poll parked on its queue
until that queue grows; the answers past the end and at it; PULL_OFFSET_MOVED below what
retention kept; tag and SQL92 filters; a replica without a leader says so."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from broker.processors.long_polls import ParkedPulls
from broker.processors.pull import PullProcessor
from broker.state.machine import BrokerStateMachine
from dledger.applier import Applier
from dledger.config import MAX_ENTRY_BYTES
from dledger.local_log import LocalLog
from dledger.log import Log
from protocol.message_format import Message, encode_message
from protocol.pull import PullRequest, PullResponse
from protocol.remoting import Frame, FrameError, ResponseCode
from protocol.tags import tag_hash
from tests.support.memory_broker import MemoryBroker, run_on_topic

Parts = tuple[Log, BrokerStateMachine, Applier]


def run(parts: Parts, scenario: Callable[[MemoryBroker], Awaitable[None]]) -> None:
    run_on_topic(parts, "orders", 2, scenario)


async def send(b: MemoryBroker, queue: int, *bodies: bytes, tags: str | None = None) -> None:
    outcomes = await b.write.send([encode_message(Message("orders", body, queue, tags=tags))
                                   for body in bodies])
    assert all(a.outcome == "stored" for a in outcomes), outcomes


async def pull(b: MemoryBroker, offset: int, queue: int = 0, **fields: object) -> tuple[Frame, PullResponse]:
    answer = await b.call(b.pulls.pull, PullRequest(topic="orders", queue_id=queue, offset=offset,
                                                    **fields))  # type: ignore[arg-type]
    return answer, PullResponse.from_frame(answer)


async def parked(b: MemoryBroker, count: int) -> None:
    deadline = asyncio.get_running_loop().time() + 10
    while b.signal.parked() != count:
        assert asyncio.get_running_loop().time() < deadline, f"{b.signal.parked()} pulls parked, not {count}"
        await asyncio.sleep(0.005)


def test_a_long_poll_waits_for_its_own_queue_to_grow(one_node_broker: Parts) -> None:
    async def scenario(b: MemoryBroker) -> None:
        waiting = asyncio.create_task(pull(b, 0, queue=0, suspend_ms=20_000))
        await parked(b, 1)
        await send(b, 1, b"elsewhere")  # another queue grew: the poll stays parked
        done, _ = await asyncio.wait({waiting}, timeout=0.2)
        assert not done and b.signal.parked() == 1
        await send(b, 0, b"mine")
        answer, page = await asyncio.wait_for(waiting, 10)
        assert answer.code == ResponseCode.SUCCESS and page.next_offset == 1
        assert [m.body for row in page.rows or () for m in row.messages()] == [b"mine"]
        assert b.signal.parked() == 0 and b.metrics.value("pulled_total") == 1

    run(one_node_broker, scenario)


def test_a_connection_over_its_parked_pull_cap_is_told_the_broker_is_busy(one_node_broker: Parts) -> None:
    async def scenario(b: MemoryBroker) -> None:
        capped = PullProcessor(b.machine, b.rlog, b.signal, b.metrics, ParkedPulls(per_connection=1))
        request = PullRequest(topic="orders", queue_id=0, offset=0, suspend_ms=20_000)
        first = asyncio.create_task(b.call(capped.pull, request))
        await parked(b, 1)
        with pytest.raises(FrameError) as busy:
            await b.call(capped.pull, request)
        assert busy.value.code == ResponseCode.SYSTEM_BUSY and "parked on this connection" in str(busy.value)
        await send(b, 0, b"x")
        assert (await asyncio.wait_for(first, 10)).code == ResponseCode.SUCCESS

    run(one_node_broker, scenario)


def test_past_the_end_at_the_end_and_an_unknown_topic(one_node_broker: Parts) -> None:
    async def scenario(b: MemoryBroker) -> None:
        await send(b, 0, b"a", b"b")
        answer, page = await pull(b, 5)
        assert (answer.code, page.next_offset) == (ResponseCode.PULL_OFFSET_MOVED, 2)
        answer, page = await pull(b, 2)
        assert (answer.code, page.next_offset) == (ResponseCode.PULL_NOT_FOUND, 2)
        with pytest.raises(FrameError) as unknown:
            await b.call(b.pulls.pull, PullRequest(topic="nope", queue_id=0, offset=0))
        assert unknown.value.code == ResponseCode.TOPIC_NOT_EXIST

    run(one_node_broker, scenario)


def test_a_pull_below_what_retention_kept_is_moved_to_the_first_message_kept(
        small_segment_broker: tuple[LocalLog, BrokerStateMachine, Applier]) -> None:
    rlog = small_segment_broker[0]

    async def scenario(b: MemoryBroker) -> None:
        body = bytes(MAX_ENTRY_BYTES // 2)  # one entry each: about 8 to a segment
        for _ in range(30):
            await send(b, 0, body)
        assert len(rlog.reader.segments()) >= 3
        middle = rlog.reader.entry_containing(rlog.reader.write_position // 2)
        assert middle is not None
        assert rlog.commitlog.delete_before(middle[0]) > 0  # what retention does to old segments
        answer, moved = await pull(b, 0)
        assert answer.code == ResponseCode.PULL_OFFSET_MOVED
        assert moved.min_offset is not None and moved.next_offset == moved.min_offset > 0
        answer, page = await pull(b, moved.next_offset, max_msgs=1)
        assert answer.code == ResponseCode.SUCCESS
        (kept,) = page.rows or ()
        assert kept.offset == moved.next_offset and kept.position >= rlog.reader.start_position

    run(small_segment_broker, scenario)  # type: ignore[arg-type]


def test_tag_and_sql_filters_pick_the_records_and_messages_asked_for(one_node_broker: Parts) -> None:
    async def scenario(b: MemoryBroker) -> None:
        for i, tag in enumerate(["paid", "created", "paid", None, "paid"]):
            await send(b, 0, f"m{i}".encode(), tags=tag)
        _, page = await pull(b, 0, max_msgs=2, tag_hashes=(tag_hash("paid"),))
        assert [row.offset for row in page.rows or ()] == [0, 2] and page.next_offset == 3
        _, page = await pull(b, 3, max_msgs=2, tag_hashes=(tag_hash("paid"),))
        assert [row.offset for row in page.rows or ()] == [4] and page.next_offset == 5
        await b.write.send([encode_message(Message("orders", b"p", 1, properties={"n": str(i)}))
                            for i in range(4)])
        _, page = await pull(b, 0, queue=1, sql="n = '1' OR n = '3'")
        assert [row.offset for row in page.rows or ()] == [1, 3]
        with pytest.raises(FrameError) as bad:
            await pull(b, 0, sql="n = ")
        assert bad.value.code == ResponseCode.SUBSCRIPTION_INVALID

    run(one_node_broker, scenario)


def test_a_replica_that_knows_no_leader_marks_its_answers(one_node_broker: Parts) -> None:
    async def scenario(b: MemoryBroker) -> None:
        await send(b, 0, b"a")
        _, page = await pull(b, 0)
        assert not page.leaderless
        b.rlog.stand_for_election(False)  # the memory log then knows no leader, at once
        assert b.rlog.leader is None
        _, page = await pull(b, 0)
        assert page.leaderless and [row.offset for row in page.rows or ()] == [0]  # still served

    run(one_node_broker, scenario)
