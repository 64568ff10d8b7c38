"""The query processor (QUERY_MESSAGE, VIEW_MESSAGE_BY_ID, SEARCH_OFFSET, RESET_OFFSET, and
the reads by position the RocketMQ front end makes) through its ``BrokerContext`` alone --
the memory log, the apply step, a leader clock the test moves; no server, no socket: keys
and ids found within a time range, offsets by store time, a reset read back, and positions
retention deleted answered QUERY_NOT_FOUND."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from broker.state.machine import BrokerStateMachine
from dledger.applier import Applier
from dledger.config import MAX_ENTRY_BYTES
from dledger.errors import NotLeader
from dledger.local_log import LocalLog
from dledger.log import Log
from protocol.message_format import Message, decode_message, encode_message
from protocol.offset import QueryOffsetRequest, QueryOffsetResponse
from protocol.query import (
    QueryMessageRequest,
    QueryResponse,
    ResetOffsetRequest,
    ResetOffsetResponse,
    SearchOffsetRequest,
    SearchOffsetResponse,
    ViewMessageRequest,
)
from protocol.remoting import FrameError, ResponseCode
from tests.support.memory_broker import T0, MemoryBroker, run_on_topic

Parts = tuple[Log, BrokerStateMachine, Applier]
CUT = T0 + 1_000  # the early messages are stored at T0, the late ones at CUT


def run(parts: Parts, scenario: Callable[[MemoryBroker], Awaitable[None]]) -> None:
    run_on_topic(parts, "q", 2, scenario)


async def store(b: MemoryBroker) -> tuple[list[Message], list[Message], list[int]]:
    """Six early messages (keys order-0..5, queues alternating) at T0, four late ones (key
    ``late``) at CUT; the early ones' positions."""
    early = [Message("q", f"e{i}".encode(), i % 2, keys=(f"order-{i}",)) for i in range(6)]
    stored = await b.write.send([encode_message(m) for m in early])
    b.clock.now_ms = CUT
    late = [Message("q", f"l{i}".encode(), i % 2, keys=("late",)) for i in range(4)]
    await b.write.send([encode_message(m) for m in late])
    return early, late, [a.position for a in stored]


async def found(b: MemoryBroker, key: str, **fields: int) -> list[tuple[int, int, Message]]:
    answer = await b.call(b.queries.query_by_key, QueryMessageRequest(key=key, **fields))
    if answer.code == ResponseCode.QUERY_NOT_FOUND:
        return []
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    rows = QueryResponse.from_frame(answer).rows
    return [(r.position, r.store_ms, decode_message(r.message)) for r in rows]


def test_keys_and_ids_are_found_within_their_time_range(one_node_broker: Parts) -> None:
    async def scenario(b: MemoryBroker) -> None:
        early, late, positions = await store(b)
        assert await found(b, "order-4") == [(positions[4], T0, early[4])]
        assert await found(b, "order-4", begin_ms=CUT) == []  # stored before the range
        # within the second the IndexFile keeps times to, the message's own store time decides
        assert await found(b, "order-4", begin_ms=T0 + 1) == []
        assert await found(b, "order-4", end_ms=T0) == [(positions[4], T0, early[4])]
        assert sorted(m.body for _, stamp, m in await found(b, "late", max_results=10)) == sorted(
            m.body for m in late)
        assert {stamp for _, stamp, _ in await found(b, "late", max_results=10)} == {CUT}
        assert len(await found(b, "late", max_results=2)) == 2
        assert await found(b, "nope") == []
        by_id = await b.call(b.queries.view_by_id, ViewMessageRequest(msg_id=early[2].msg_id.hex()))
        (row,) = QueryResponse.from_frame(by_id).rows
        assert (decode_message(row.message), row.position) == (early[2], positions[2])
        assert b.queries.queue_offset_of("q", 0, positions[2]) == 1  # early[2] is queue 0's second
        assert b.queries.queue_offset_of("q", 1, positions[2]) == -1  # not that queue's

    run(one_node_broker, scenario)


def test_offsets_are_searched_and_reset_by_store_time(one_node_broker: Parts) -> None:
    async def scenario(b: MemoryBroker) -> None:
        await store(b)
        search = SearchOffsetResponse.from_frame(await b.call(
            b.queries.search_offset, SearchOffsetRequest(topic="q", queue_id=1, timestamp=CUT)))
        assert (search.min_offset, search.max_offset, search.offset) == (0, 5, 3)
        plain = SearchOffsetResponse.from_frame(await b.call(
            b.queries.search_offset, SearchOffsetRequest(topic="q", queue_id=0)))
        assert (plain.min_offset, plain.max_offset, plain.offset) == (0, 5, None)
        with pytest.raises(FrameError) as unknown:
            await b.call(b.queries.search_offset, SearchOffsetRequest(topic="nope", queue_id=0))
        assert unknown.value.code == ResponseCode.TOPIC_NOT_EXIST

        reset = await b.call(b.queries.reset_offset, ResetOffsetRequest(group="g", topic="q", timestamp=CUT))
        assert ResetOffsetResponse.from_frame(reset).offsets == {0: 3, 1: 3}
        for queue in (0, 1):
            answer = await b.call(b.offsets.query_offset,
                                  QueryOffsetRequest(group="g", topic="q", queue_id=queue))
            assert QueryOffsetResponse.from_frame(answer).offset == 3  # through the log, read back
        b.leading = False
        with pytest.raises(NotLeader):
            await b.call(b.queries.reset_offset, ResetOffsetRequest(group="g", topic="q", timestamp=T0))

    run(one_node_broker, scenario)


def test_a_position_retention_deleted_is_not_found_and_the_min_offset_moves(
        small_segment_broker: tuple[LocalLog, BrokerStateMachine, Applier]) -> None:
    rlog = small_segment_broker[0]

    async def scenario(b: MemoryBroker) -> None:
        sent = [Message("q", bytes(MAX_ENTRY_BYTES // 2), 0, keys=(f"k{i}",)) for i in range(30)]
        positions = [(await b.write.send([encode_message(m)]))[0].position for m in sent]
        middle = rlog.reader.entry_containing(rlog.reader.write_position // 2)
        assert middle is not None and rlog.commitlog.delete_before(middle[0]) > 0
        with pytest.raises(FrameError) as gone:
            b.queries.message_at(positions[0])
        assert gone.value.code == ResponseCode.QUERY_NOT_FOUND and "not retained" in str(gone.value)
        assert b.queries.message_at(positions[-1])[0] == sent[-1]
        assert b.queries.store_time(positions[-1]) == T0 and b.queries.store_time(positions[0]) == -1
        search = SearchOffsetResponse.from_frame(await b.call(
            b.queries.search_offset, SearchOffsetRequest(topic="q", queue_id=0)))
        first_kept = next(i for i, p in enumerate(positions) if p >= rlog.reader.start_position)
        assert (search.min_offset, search.max_offset) == (first_kept, 30) and first_kept > 0

    run(small_segment_broker, scenario)  # type: ignore[arg-type]


def test_a_message_not_applied_yet_is_not_found_by_its_position(one_node_broker: Parts) -> None:
    """VIEW_MESSAGE_BY_ID (RocketMQ's msgId names a CommitLog position) read any record the log
    held, applied or not -- a replica could serve a message not committed, or one later cut."""
    async def scenario(b: MemoryBroker) -> None:
        _, _, positions = await store(b)
        assert b.queries.message_at(positions[0])[0].body == b"e0"
        applied = b.machine.applied_index
        b.machine.applied_index = lambda: 0  # type: ignore[method-assign]
        try:
            with pytest.raises(FrameError) as unapplied:
                b.queries.message_at(positions[0])
            assert unapplied.value.code == ResponseCode.QUERY_NOT_FOUND
        finally:
            b.machine.applied_index = applied  # type: ignore[method-assign]

    run(one_node_broker, scenario)
