"""Records of many messages through a one-node broker's processors, in memory (no server,
no socket: ``tests/support/memory_broker.py``): one row per message in the send answer,
resends answered with the original offsets, pulls that start inside a record, tag and SQL92
filters that never decode bodies on the broker, queries by key and id, a send-back of one
message of a record, and a SPECIAL record split by the leader."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from broker.state.machine import BrokerStateMachine
from client.message import ReceivedMessage, received_all
from client.queues import MessageQueue
from dledger.applier import Applier
from dledger.log import Log
from protocol.deferred import SendBackRequest, SendBackResponse
from protocol.message_format import decode_message
from protocol.pull import PullRequest, PullResponse
from protocol.query import QueryMessageRequest, QueryResponse, ViewMessageRequest
from protocol.record_batch import encode_record, read_header
from protocol.remoting import FrameError, ResponseCode
from protocol.send import SendBatchRequest, SendBatchResponse, SendMessageRequest, SendRow
from protocol.tags import tag_hash
from tests.support.memory_broker import MemoryBroker, run_on_topic

Q = MessageQueue("orders", "g", 0)
Parts = tuple[Log, BrokerStateMachine, Applier]


def run(parts: Parts, scenario: Callable[[MemoryBroker], Awaitable[None]]) -> None:
    run_on_topic(parts, "orders", 1, scenario)


def record(first: int, count: int, *, producer: str | None = None, base: int = -1,
           tags: tuple[str | None, ...] = ("a",), props: dict[str, str] | None = None) -> bytes:
    entries = [(i.to_bytes(16, "big"), 1_000 + i, 0, tags[i % len(tags)], (f"k{i}",),
                dict(props or {}, n=str(i)), 0, b"m%d" % i) for i in range(first, first + count)]
    return encode_record("orders", 0, entries, producer_id=producer, base_sequence=base, born_host="h")


async def send(b: MemoryBroker, *records: bytes) -> list[SendRow]:
    answer = await b.call(b.sends.send_batch, SendBatchRequest(records=records))
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    return list(SendBatchResponse.from_frame(answer).rows)


async def pull(b: MemoryBroker, offset: int, **fields: object) -> tuple[PullResponse, list[ReceivedMessage]]:
    answer = await b.call(b.pulls.pull, PullRequest(topic="orders", queue_id=0, offset=offset,
                                                    **fields))  # type: ignore[arg-type]
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    page = PullResponse.from_frame(answer)
    got = [m for row in page.rows or () for m in received_all(row.record, Q, row.offset, row.position,
                                                               row.store_ms, offset, row.selected)]
    return page, got


def test_records_of_many_end_to_end(one_node_broker: Parts) -> None:
    async def scenario(b: MemoryBroker) -> None:
        rows = await send(b, record(0, 5, producer="p", base=0), record(5, 3, producer="p", base=5,
                                                                        tags=("b", "c", None)))
        assert [(r.code, r.queue_id, r.queue_offset) for r in rows] == [(0, 0, i) for i in range(8)]
        positions = [r.position for r in rows]  # a row per message
        assert positions[1:5] == [positions[0] + i for i in range(1, 5)]
        # the same records resent: every message answered with its original offset, nothing stored
        again = await send(b, record(0, 5, producer="p", base=0), record(5, 3, producer="p", base=5,
                                                                         tags=("b", "c", None)))
        assert [r.queue_offset for r in again] == list(range(8)) and all("already" in r.reason for r in again)
        overlap = await send(b, record(3, 4, producer="p", base=3))
        assert overlap[0].code == ResponseCode.INVALID_ARGUMENT and "whole record" in overlap[0].reason
        # a pull inside a record: the client keeps the messages from the offset asked for
        page, got = await pull(b, 3, max_msgs=2)
        assert [m.queue_offset for m in got] == [3, 4]  # the page ends with the record
        assert page.next_offset == 5 and [m.body for m in got] == [b"m3", b"m4"]
        assert [m.commit_log_offset for m in got] == positions[3:5]
        # tag filter: records chosen by their tag summary and tag-hash array
        page, got = await pull(b, 0, tag_hashes=(tag_hash("c"),))
        assert [m.tags for m in got if m.tags == "c"] == ["c"] and page.next_offset == 8
        assert {m.queue_offset for m in got} <= {5, 6, 7}  # the first record has no "c"
        # SQL92: properties only, the matching messages listed
        page, got = await pull(b, 0, sql="n = '2' OR n = '6'")
        assert [m.queue_offset for m in got] == [2, 6]
        # query by key and by id: the message found as a record of one
        by_key = await b.call(b.queries.query_by_key, QueryMessageRequest(key="k6"))
        (row,) = QueryResponse.from_frame(by_key).rows
        assert row.position == positions[6] and decode_message(row.message).body == b"m6"
        by_id = await b.call(b.queries.view_by_id, ViewMessageRequest(msg_id=(2).to_bytes(16, "big").hex()))
        assert decode_message(QueryResponse.from_frame(by_id).rows[0].message).body == b"m2"
        # a send-back names one message of a record by its position
        back = SendBackResponse.from_frame(await b.call(
            b.deferred_requests.send_back, SendBackRequest(group="g", position=positions[6],
                                                           max_reconsume_times=0)))
        assert back.topic == "%DLQ%g"
        dead = PullResponse.from_frame(await b.call(b.pulls.pull, PullRequest(topic="%DLQ%g", queue_id=0,
                                                                              offset=0)))
        (dead_row,) = dead.rows or ()
        assert decode_message(dead_row.record).body == b"m6"

    run(one_node_broker, scenario)


def test_a_special_record_is_split_into_records_of_one(one_node_broker: Parts) -> None:
    async def scenario(b: MemoryBroker) -> None:
        mixed = record(0, 3, producer="p", base=0, props={"DELAY": "1"})
        assert read_header(mixed).special
        rows = await send(b, mixed, record(3, 2, producer="p", base=3))
        assert [r.queue_offset for r in rows] == [-1, -1, -1, 0, 1]  # held (delayed), then stored
        assert all(r.code == ResponseCode.SUCCESS for r in rows)
        with pytest.raises(FrameError) as refused:
            await b.call(b.sends.send, SendMessageRequest(message=record(10, 2)))
        assert refused.value.code == ResponseCode.INVALID_ARGUMENT and "record of one" in str(refused.value)

    run(one_node_broker, scenario)


def test_a_stripe_ships_only_the_records_that_start_in_it(one_node_broker: Parts) -> None:
    async def rows(b: MemoryBroker, offset: int, max_msgs: int, **fields: object) -> tuple[list[int], int]:
        page, _ = await pull(b, offset, max_msgs=max_msgs, **fields)
        return [row.offset for row in page.rows or ()], page.next_offset

    async def scenario(b: MemoryBroker) -> None:
        await send(b, record(0, 5), record(5, 3), record(8, 4))  # records [0, 5) [5, 8) [8, 12)
        assert await rows(b, 3, 4) == ([0, 5], 8)  # an ordinary pull: the record holding 3 first
        assert await rows(b, 3, 4, stripe=True) == ([5], 8)  # [3, 7): only the record starting at 5
        assert await rows(b, 1, 3, stripe=True) == ([], 5)  # [1, 4): none starts there
        assert await rows(b, 5, 4, stripe=True) == ([5, 8], 12)
        assert await rows(b, 7, 6, stripe=True) == ([8], 12)
        # a pipelined read: the pull at the cursor, then stripes -- each record exactly once
        shipped = [o for cursor in (0, 4, 8) for o in (await rows(b, cursor, 4, stripe=cursor > 0))[0]]
        assert shipped == [0, 5, 8]
        # a filtered pull is never a stripe (it reads until it finds matches)
        assert (await rows(b, 3, 4, stripe=True, tag_hashes=(tag_hash("a"),)))[0] == [0, 5]

    run(one_node_broker, scenario)


def test_a_record_split_for_a_small_page_makes_only_the_messages_asked_for() -> None:
    rec = record(0, 10, tags=("a", "b"))
    first_two = received_all(rec, Q, 100, 5_000, 7, 103, None, 2)
    assert [(m.queue_offset, m.body) for m in first_two] == [(103, b"m3"), (104, b"m4")]
    chosen = received_all(rec, Q, 100, 5_000, 7, 103, [1, 4, 6, 8], 2)
    assert [m.queue_offset for m in chosen] == [104, 106]
    assert len(received_all(rec, Q, 100, 5_000, 7, 0)) == 10  # no limit: all
