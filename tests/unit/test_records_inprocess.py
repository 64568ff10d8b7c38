"""Records of many messages through a one-node broker in process: one row per message in the
send answer, resends answered with the original offsets, pulls that start inside a record,
tag and SQL92 filters that never decode bodies on the broker, queries by key and id, a
send-back of one message of a record, and a SPECIAL record split by the leader."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from client.message import received_all
from client.queues import MessageQueue
from protocol.message_format import decode_message
from protocol.pull import PullResponse
from protocol.record_batch import encode_record, read_header
from protocol.remoting import Frame, RequestCode, ResponseCode
from protocol.tags import tag_hash
from tests.support.broker_client import FrameClient
from tests.unit.test_broker_server import run

Q = MessageQueue("orders", "g", 0)


def record(first: int, count: int, *, producer: str | None = None, base: int = -1,
           tags: tuple[str | None, ...] = ("a",), props: dict[str, str] | None = None) -> bytes:
    entries = [(i.to_bytes(16, "big"), 1_000 + i, 0, tags[i % len(tags)], (f"k{i}",),
                dict(props or {}, n=str(i)), 0, b"m%d" % i) for i in range(first, first + count)]
    return encode_record("orders", 0, entries, producer_id=producer, base_sequence=base, born_host="h")


async def send(c: FrameClient, *records: bytes) -> list[list[Any]]:
    r = await c.call(RequestCode.SEND_BATCH, body=msgpack.packb(list(records)))
    assert r.code == ResponseCode.SUCCESS, r.remark
    rows: list[list[Any]] = msgpack.unpackb(r.body)
    return rows


async def pull(c: FrameClient, offset: int, **ext: Any) -> tuple[Frame, list[Any]]:
    r = await c.call(RequestCode.PULL_MESSAGE, {"topic": "orders", "queueId": 0, "offset": offset, **ext})
    if r.code != ResponseCode.SUCCESS:
        return r, []
    page = PullResponse.from_frame(r)
    got = [m for row in page.rows or () for m in received_all(row.record, Q, row.offset, row.position,
                                                               row.store_ms, offset, row.selected)]
    return r, got


@pytest.mark.sockets
def test_records_of_many_end_to_end(one_node_broker) -> None:  # type: ignore[no-untyped-def]
    async def scenario(c: FrameClient) -> None:
        r = await c.call(RequestCode.CREATE_TOPIC, {"topic": "orders", "queues": 1})
        assert r.code == ResponseCode.SUCCESS, r.remark
        rows = await send(c, record(0, 5, producer="p", base=0), record(5, 3, producer="p", base=5,
                                                                        tags=("b", "c", None)))
        assert [row[:3] for row in rows] == [[0, 0, i] for i in range(8)]  # a row per message
        positions = [row[4] for row in rows]
        assert positions[1:5] == [positions[0] + i for i in range(1, 5)]
        # the same records resent: every message answered with its original offset, nothing stored
        again = await send(c, record(0, 5, producer="p", base=0), record(5, 3, producer="p", base=5,
                                                                         tags=("b", "c", None)))
        assert [row[2] for row in again] == list(range(8)) and all("already" in row[3] for row in again)
        overlap = await send(c, record(3, 4, producer="p", base=3))
        assert overlap[0][0] == ResponseCode.INVALID_ARGUMENT and "whole record" in overlap[0][3]
        # a pull inside a record: the client keeps the messages from the offset asked for
        r, got = await pull(c, 3, maxMsgs=2)
        assert [m.queue_offset for m in got] == [3, 4]  # the page ends with the record
        assert r.ext["nextOffset"] == 5 and [m.body for m in got] == [b"m3", b"m4"]
        assert [m.commit_log_offset for m in got] == positions[3:5]
        # tag filter: records chosen by their tag summary and tag-hash array
        r, got = await pull(c, 0, tagHashes=[tag_hash("c")])
        assert [m.tags for m in got if m.tags == "c"] == ["c"] and r.ext["nextOffset"] == 8
        assert {m.queue_offset for m in got} <= {5, 6, 7}  # the first record has no "c"
        # SQL92: properties only, the matching messages listed
        r, got = await pull(c, 0, sql="n = '2' OR n = '6'")
        assert [m.queue_offset for m in got] == [2, 6]
        # query by key and by id: the message found as a record of one
        r = await c.call(RequestCode.QUERY_MESSAGE, {"key": "k6"})
        ((position, _, data),) = msgpack.unpackb(r.body)
        assert position == positions[6] and decode_message(data).body == b"m6"
        r = await c.call(RequestCode.VIEW_MESSAGE_BY_ID, {"msgId": (2).to_bytes(16, "big").hex()})
        assert decode_message(msgpack.unpackb(r.body)[0][2]).body == b"m2"
        # a send-back names one message of a record by its position
        r = await c.call(RequestCode.CONSUMER_SEND_MSG_BACK, {"group": "g", "position": positions[6],
                                                             "maxReconsumeTimes": 0})
        assert r.code == ResponseCode.SUCCESS and r.ext["topic"] == "%DLQ%g", r.remark
        r = await c.call(RequestCode.PULL_MESSAGE, {"topic": "%DLQ%g", "queueId": 0, "offset": 0})
        (row,) = PullResponse.from_frame(r).rows or ()
        assert decode_message(row.record).body == b"m6"

    run(one_node_broker, scenario)


@pytest.mark.sockets
def test_a_special_record_is_split_into_records_of_one(one_node_broker) -> None:  # type: ignore[no-untyped-def]
    async def scenario(c: FrameClient) -> None:
        await c.call(RequestCode.CREATE_TOPIC, {"topic": "orders", "queues": 1})
        mixed = record(0, 3, producer="p", base=0, props={"DELAY": "1"})
        assert read_header(mixed).special
        rows = await send(c, mixed, record(3, 2, producer="p", base=3))
        assert [row[2] for row in rows] == [-1, -1, -1, 0, 1]  # held (delayed), then stored
        assert all(row[0] == ResponseCode.SUCCESS for row in rows)
        r = await c.call(RequestCode.SEND_MESSAGE, body=record(10, 2))
        assert r.code == ResponseCode.INVALID_ARGUMENT and "record of one" in r.remark

    run(one_node_broker, scenario)


@pytest.mark.sockets
def test_a_stripe_ships_only_the_records_that_start_in_it(one_node_broker) -> None:  # type: ignore[no-untyped-def]
    async def rows(c: FrameClient, offset: int, max_msgs: int, **ext: Any) -> tuple[list[int], int]:
        r = await c.call(RequestCode.PULL_MESSAGE, {"topic": "orders", "queueId": 0, "offset": offset,
                                                    "maxMsgs": max_msgs, **ext})
        assert r.code == ResponseCode.SUCCESS, r.remark
        page = PullResponse.from_frame(r)
        return [row.offset for row in page.rows or ()], page.next_offset

    async def scenario(c: FrameClient) -> None:
        await c.call(RequestCode.CREATE_TOPIC, {"topic": "orders", "queues": 1})
        await send(c, record(0, 5), record(5, 3), record(8, 4))  # records [0, 5) [5, 8) [8, 12)
        assert await rows(c, 3, 4) == ([0, 5], 8)  # an ordinary pull: the record holding 3 first
        assert await rows(c, 3, 4, stripe=True) == ([5], 8)  # [3, 7): only the record starting at 5
        assert await rows(c, 1, 3, stripe=True) == ([], 5)  # [1, 4): none starts there
        assert await rows(c, 5, 4, stripe=True) == ([5, 8], 12)
        assert await rows(c, 7, 6, stripe=True) == ([8], 12)
        # a pipelined read: the pull at the cursor, then stripes -- each record exactly once
        shipped = [b for o in (0, 4, 8) for b in (await rows(c, o, 4, stripe=o > 0))[0]]
        assert shipped == [0, 5, 8]
        # a filtered pull is never a stripe (it reads until it finds matches)
        assert (await rows(c, 3, 4, stripe=True, tagHashes=[tag_hash("a")]))[0] == [0, 5]

    run(one_node_broker, scenario)


def test_a_record_split_for_a_small_page_makes_only_the_messages_asked_for() -> None:
    rec = record(0, 10, tags=("a", "b"))
    first_two = received_all(rec, Q, 100, 5_000, 7, 103, None, 2)
    assert [(m.queue_offset, m.body) for m in first_two] == [(103, b"m3"), (104, b"m4")]
    chosen = received_all(rec, Q, 100, 5_000, 7, 103, [1, 4, 6, 8], 2)
    assert [m.queue_offset for m in chosen] == [104, 106]
    assert len(received_all(rec, Q, 100, 5_000, 7, 0)) == 10  # no limit: all
