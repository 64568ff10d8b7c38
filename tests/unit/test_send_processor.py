"""The send processor (SEND_MESSAGE, SEND_BATCH) through its ``BrokerContext`` alone -- the
memory log, the apply step, the write path, no server and no socket: what is stored comes
back from a pull at the offsets and positions the answer named; a resend is answered with
its first offsets and counted once; a request with one bad record stores nothing; a
delayed message is held, not queued."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from broker.state.machine import BrokerStateMachine
from broker.store.entry_batch import MessageTooLarge
from dledger.applier import Applier
from dledger.errors import NotLeader
from dledger.log import Log
from protocol.message_format import Message, decode_message, encode_message
from protocol.pull import PullRequest, PullResponse
from protocol.record_batch import encode_record
from protocol.remoting import FrameError, ResponseCode
from protocol.send import SendBatchRequest, SendBatchResponse, SendMessageRequest, WriteResponse
from tests.support.memory_broker import T0, MemoryBroker, run_on_topic

Parts = tuple[Log, BrokerStateMachine, Applier]


def run(parts: Parts, scenario: Callable[[MemoryBroker], Awaitable[None]]) -> None:
    run_on_topic(parts, "orders", 2, scenario)


def record(first: int, count: int, queue: int = 0, producer: str | None = None, base: int = -1) -> bytes:
    """A record of ``count`` messages m<first>.. of ``orders`` queue ``queue``."""
    entries = [(i.to_bytes(16, "big"), 1_000 + i, 0, "a", (f"k{i}",), {"n": str(i)}, 0, b"m%d" % i)
               for i in range(first, first + count)]
    return encode_record("orders", queue, entries, producer_id=producer, base_sequence=base, born_host="h")


async def send(b: MemoryBroker, m: Message) -> WriteResponse:
    answer = await b.call(b.sends.send, SendMessageRequest(message=encode_message(m)))
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    return WriteResponse.from_frame(answer)


async def pull(b: MemoryBroker, queue: int, offset: int, max_msgs: int = 32) -> PullResponse:
    answer = await b.call(b.pulls.pull, PullRequest(topic="orders", queue_id=queue, offset=offset,
                                                    max_msgs=max_msgs))
    assert answer.code == ResponseCode.SUCCESS, (answer.code, answer.remark)
    return PullResponse.from_frame(answer)


def test_a_sent_message_is_stored_through_the_log_and_pulled_at_the_offset_it_was_given(
        one_node_broker: Parts) -> None:
    async def scenario(b: MemoryBroker) -> None:
        sent = [Message("orders", f"m{i}".encode(), 1, keys=(f"k{i}",)) for i in range(3)]
        before = b.rlog.committed_index
        answers = [await send(b, m) for m in sent]
        assert b.rlog.committed_index > before  # through the log, not around it
        assert [(a.queue_id, a.queue_offset, a.duplicate) for a in answers] == [(1, 0, False), (1, 1, False),
                                                                                (1, 2, False)]
        page = await pull(b, 1, 0)
        assert [decode_message(row.record) for row in page.rows or ()] == sent
        assert [row.offset for row in page.rows or ()] == [0, 1, 2] and page.next_offset == 3
        assert [row.position for row in page.rows or ()] == [a.position for a in answers]
        assert {row.store_ms for row in page.rows or ()} == {T0}  # the leader's clock
        assert (await b.call(b.pulls.pull, PullRequest(topic="orders", queue_id=0, offset=0))).code == \
            ResponseCode.PULL_NOT_FOUND  # the other queue got nothing
        assert b.metrics.value("sent_total") == 3 and b.metrics.value("commit_latency_count") == 3

    run(one_node_broker, scenario)


def test_a_batch_is_answered_message_by_message_and_a_resend_with_its_first_offsets(
        one_node_broker: Parts) -> None:
    async def scenario(b: MemoryBroker) -> None:
        batch = SendBatchRequest(records=(record(0, 5, producer="p", base=0),
                                          record(5, 3, producer="p", base=5)))
        rows = SendBatchResponse.from_frame(await b.call(b.sends.send_batch, batch)).rows
        assert [(r.code, r.queue_id, r.queue_offset) for r in rows] == [(ResponseCode.SUCCESS, 0, i)
                                                                       for i in range(8)]
        positions = [r.position for r in rows]
        assert positions[1:5] == [positions[0] + i for i in range(1, 5)]  # record position + index
        again = SendBatchResponse.from_frame(await b.call(b.sends.send_batch, batch)).rows
        assert [r.queue_offset for r in again] == list(range(8)) and all("already" in r.reason for r in again)
        assert b.metrics.value("sent_total") == 8  # the resend stored nothing
        page = await pull(b, 0, 3, max_msgs=2)  # inside the first record: the record from its base
        (row,) = page.rows or ()
        assert (row.offset, row.position, page.next_offset) == (0, positions[0], 5)
        assert [m.body for m in row.messages()] == [b"m0", b"m1", b"m2", b"m3", b"m4"]

    run(one_node_broker, scenario)


def test_a_request_with_one_bad_record_stores_none_of_it(one_node_broker: Parts) -> None:
    async def scenario(b: MemoryBroker) -> None:
        before = b.rlog.committed_index
        refusals: list[tuple[object, type[Exception], str]] = [
            (SendBatchRequest(records=(record(0, 2), b"\x00garbage")), FrameError, "INVALID_ARGUMENT"),
            (SendBatchRequest(records=(record(0, 2), encode_message(Message("nope", b"x")))), FrameError,
             "TOPIC_NOT_EXIST"),
            (SendMessageRequest(message=record(0, 2)), FrameError, "INVALID_ARGUMENT"),  # not a record of one
            (SendBatchRequest(records=(record(0, 1), encode_message(Message("orders", bytes(2048))))),
             MessageTooLarge, "exceeds"),
        ]
        b.max_message_bytes = 1024
        for request, kind, named in refusals:
            handler = b.sends.send if isinstance(request, SendMessageRequest) else b.sends.send_batch
            with pytest.raises(kind) as refused:
                await b.call(handler, request)
            what = ResponseCode(refused.value.code).name if isinstance(refused.value, FrameError) \
                else str(refused.value)
            assert named in what, (request, what)
        assert b.rlog.committed_index == before  # nothing was proposed
        assert (await b.call(b.pulls.pull, PullRequest(topic="orders", queue_id=0, offset=0))).code == \
            ResponseCode.PULL_NOT_FOUND

    run(one_node_broker, scenario)


def test_a_follower_refuses_a_send_before_reading_it(one_node_broker: Parts) -> None:
    async def scenario(b: MemoryBroker) -> None:
        b.leading = False
        before = b.rlog.committed_index
        with pytest.raises(NotLeader):
            await b.call(b.sends.send, SendMessageRequest(message=b"\x00not even a record"))
        assert b.rlog.committed_index == before

    run(one_node_broker, scenario)


def test_a_delayed_message_is_held_and_its_queue_gets_nothing_yet(one_node_broker: Parts) -> None:
    async def scenario(b: MemoryBroker) -> None:
        answer = await send(b, Message("orders", b"later", 1, properties={"DELAY": "2"}))  # level 2: 5 s
        assert (answer.queue_id, answer.queue_offset) == (1, -1)  # held: no queue offset yet
        (held,) = b.machine.timers.held()
        assert held.due_ms == T0 + 5_000
        assert (await b.call(b.pulls.pull, PullRequest(topic="orders", queue_id=1, offset=0))).code == \
            ResponseCode.PULL_NOT_FOUND

    run(one_node_broker, scenario)
