"""The POP processor (issue 29) through its ``BrokerContext`` alone: a memory log, the apply
step, the write path, a leader clock the test moves (no server, no socket). Receive, ack,
invisibility ends, change of invisibility, nack after the group's backoff, max deliveries ->
%DLQ%group, the long poll."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pytest

from broker.processors import pop as pop_module
from broker.processors.pop import PopProcessor
from broker.state.machine import BrokerStateMachine
from broker.store.fragments import MessageGone
from client.backoff import Deadline
from dledger.applier import Applier
from dledger.errors import NotLeader
from dledger.log import Log
from protocol.deferred import SendBackRequest, SendBackResponse
from protocol.message_format import Message, encode_message
from protocol.pop import (
    AckRequest,
    ChangeInvisibleRequest,
    GroupConfigRequest,
    NackRequest,
    NackResponse,
    PopRequest,
    PopResponse,
)
from protocol.record_batch import MessageRecord
from protocol.remoting import Frame, ResponseCode
from protocol.send import WriteResponse
from tests.support.memory_broker import T0, Clock, MemoryBroker, memory_broker


@dataclass(frozen=True)
class Popped:
    queue_id: int
    offset: int
    delivery: int
    message: MessageRecord


class Harness:
    def __init__(self, processor: PopProcessor, context: MemoryBroker, clock: Clock) -> None:
        self.processor, self.context, self.clock = processor, context, clock
        self._opaque = 0

    def _next(self) -> int:
        self._opaque += 1
        return self._opaque

    async def call(self, handler: Callable[[Frame], Awaitable[Frame]], request: object) -> Frame:
        return await handler(request.to_frame(self._next()))  # type: ignore[attr-defined]

    async def send(self, topic: str, queue_id: int, *bodies: bytes) -> None:
        await self.context.write.send([encode_message(Message(topic, b, queue_id)) for b in bodies])

    async def pop(self, most: int = 16, invisible_ms: int = 30_000, wait_ms: int = 0,
                  group: str = "workers") -> list[Popped]:
        frame = await self.call(self.processor.pop, PopRequest(group=group, topic="jobs", max_msgs=most,
                                                                invisible_ms=invisible_ms, wait_ms=wait_ms))
        assert frame.code == ResponseCode.SUCCESS, frame.remark
        out = []
        for record in PopResponse.from_frame(frame).records or ():
            messages = record.row.messages()
            for offset, delivery in ((c.offset, c.delivery) for c in record.claimed):
                out.append(Popped(record.queue_id, offset, delivery, messages[offset - record.row.offset]))
        return out

    async def receipt(self, handler: Callable[[Frame], Awaitable[Frame]], m: Popped, cls: type = AckRequest,
                      **extra: int) -> Frame:
        return await self.call(handler, cls(group="workers", topic="jobs", queue_id=m.queue_id,
                                            offset=m.offset, delivery=m.delivery, **extra))


def _run(one_node_broker: tuple[Log, BrokerStateMachine, Applier],
         scenario: Callable[[Harness], Awaitable[None]]) -> None:
    async def main() -> None:
        async with memory_broker(one_node_broker) as context:
            processor = PopProcessor(context, context.signal)
            harness = Harness(processor, context, context.clock)
            await context.create_topic("jobs", 2)
            await scenario(harness)

    asyncio.run(asyncio.wait_for(main(), 60))


def test_consumers_share_the_queues_and_an_acked_message_never_comes_back(
        one_node_broker: tuple[Log, BrokerStateMachine, Applier]) -> None:
    async def scenario(h: Harness) -> None:
        await h.send("jobs", 0, b"a0", b"a1", b"a2")
        await h.send("jobs", 1, b"b0", b"b1", b"b2")
        first = await h.pop(most=4)
        second = await h.pop(most=16)
        assert len(first) == 4 and len(second) == 2
        bodies = sorted(m.message.body for m in first + second)
        assert bodies == [b"a0", b"a1", b"a2", b"b0", b"b1", b"b2"]  # each to one consumer only
        assert {m.queue_id for m in first} == {0, 1} and {m.delivery for m in first + second} == {1}
        assert await h.pop() == []  # all invisible
        for m in first + second:
            done = await h.receipt(h.processor.ack, m)
            assert done.code == ResponseCode.SUCCESS and not WriteResponse.from_frame(done).duplicate
        again = await h.receipt(h.processor.ack, first[0])
        assert again.code == ResponseCode.SUCCESS and WriteResponse.from_frame(again).duplicate
        h.clock.now_ms += 3_600_000
        assert await h.pop() == []  # acked: never delivered again

    _run(one_node_broker, scenario)


def test_a_message_not_acked_comes_back_after_its_invisibility_and_the_old_receipt_is_stale(
        one_node_broker: tuple[Log, BrokerStateMachine, Applier]) -> None:
    async def scenario(h: Harness) -> None:
        await h.send("jobs", 0, b"x")
        (held,) = await h.pop(invisible_ms=10_000)
        h.clock.now_ms += 9_000
        assert await h.pop() == []
        h.clock.now_ms += 1_000
        (back,) = await h.pop(invisible_ms=10_000)
        assert (back.message.body, back.delivery) == (b"x", 2)
        stale = await h.receipt(h.processor.ack, held)
        assert stale.code == ResponseCode.INVALID_ARGUMENT and "stale" in (stale.remark or "")
        # change_invisible_duration extends the lease: not back at the first deadline
        longer = await h.receipt(h.processor.change_invisible, back, ChangeInvisibleRequest,
                                 invisible_ms=60_000)
        assert longer.code == ResponseCode.SUCCESS
        h.clock.now_ms += 30_000
        assert await h.pop() == []
        h.clock.now_ms += 31_000
        (third,) = await h.pop()
        assert third.delivery == 3

    _run(one_node_broker, scenario)


def test_a_nack_follows_the_groups_backoff_and_max_deliveries_dead_letter(
        one_node_broker: tuple[Log, BrokerStateMachine, Applier]) -> None:
    async def scenario(h: Harness) -> None:
        config = GroupConfigRequest(group="workers", backoff_ms=(2_000, 7_000), max_deliveries=3)
        assert (await h.call(h.processor.group_config, config)).code == ResponseCode.SUCCESS
        await h.send("jobs", 1, b"poison")
        for delivery, backoff in ((1, 2_000), (2, 7_000)):
            (m,) = await h.pop()
            assert m.delivery == delivery
            nacked = NackResponse.from_frame(await h.receipt(h.processor.nack, m, NackRequest))
            assert nacked == NackResponse(dead_lettered=False, backoff_ms=backoff)
            h.clock.now_ms += backoff - 1
            assert await h.pop() == []  # still backing off
            h.clock.now_ms += 1
        (last,) = await h.pop()
        assert last.delivery == 3
        gone = NackResponse.from_frame(await h.receipt(h.processor.nack, last, NackRequest))
        assert gone.dead_lettered
        h.clock.now_ms += 3_600_000
        assert await h.pop() == []
        dlq = h.context.machine.queue("%DLQ%workers", 0)
        assert dlq is not None and dlq.max_offset == 1
        assert h.context.machine.pops.in_flight("workers", "jobs") == []

    _run(one_node_broker, scenario)


def test_an_unacked_message_past_max_deliveries_is_dead_lettered_not_delivered(
        one_node_broker: tuple[Log, BrokerStateMachine, Applier]) -> None:
    async def scenario(h: Harness) -> None:
        config = GroupConfigRequest(group="workers", backoff_ms=(1_000,), max_deliveries=2)
        await h.call(h.processor.group_config, config)
        await h.send("jobs", 0, b"stuck")
        for delivery in (1, 2):
            (m,) = await h.pop(invisible_ms=5_000)
            assert m.delivery == delivery
            h.clock.now_ms += 5_000  # the consumer never acks
        assert await h.pop() == []
        dlq = h.context.machine.queue("%DLQ%workers", 0)
        assert dlq is not None and dlq.max_offset == 1

    _run(one_node_broker, scenario)


def test_a_long_poll_returns_a_message_sent_while_it_waits(
        one_node_broker: tuple[Log, BrokerStateMachine, Applier]) -> None:
    async def scenario(h: Harness) -> None:
        waiting = asyncio.ensure_future(h.pop(wait_ms=20_000))
        parked = Deadline(10)
        while h.processor._parked.count == 0:  # found nothing: parked on the topic's queues
            assert not parked.expired() and not waiting.done(), "the POP did not park"
            await asyncio.sleep(0.01)
        await h.send("jobs", 1, b"late")
        (m,) = await asyncio.wait_for(waiting, 20)
        assert m.message.body == b"late"

    _run(one_node_broker, scenario)


def test_a_follower_refuses_a_pop(one_node_broker: tuple[Log, BrokerStateMachine, Applier]) -> None:
    async def scenario(h: Harness) -> None:
        h.context.leading = False
        before = h.context.rlog.committed_index
        try:
            await h.pop()
        except NotLeader:
            pass
        else:
            raise AssertionError("a follower served a POP")
        assert h.context.rlog.committed_index == before

    _run(one_node_broker, scenario)


def test_a_push_consumers_send_back_follows_the_groups_policy(
        one_node_broker: tuple[Log, BrokerStateMachine, Applier]) -> None:
    async def scenario(h: Harness) -> None:
        send_backs = h.context.deferred_requests
        await h.send("jobs", 0, b"retry me")
        position = h.context.machine.queue("jobs", 0).get(0).position  # type: ignore[union-attr]

        async def send_back(group: str) -> SendBackResponse:
            frame = await h.call(send_backs.send_back, SendBackRequest(group=group, position=position,
                                                                      max_reconsume_times=16))
            assert frame.code == ResponseCode.SUCCESS, frame.remark
            return SendBackResponse.from_frame(frame)

        plain = await send_back("plain")  # no policy: the broker's schedule (first step 10 s)
        assert plain.topic == "%RETRY%plain"
        config = GroupConfigRequest(group="tuned", backoff_ms=(3_000,), max_deliveries=2)
        await h.call(h.processor.group_config, config)
        tuned = await send_back("tuned")
        assert (tuned.topic, tuned.reconsume_times) == ("%RETRY%tuned", 1)
        due = sorted(held.due_ms for held in h.context.machine.timers.held())
        assert due == [T0 + 3_000, T0 + 10_000]  # the tuned group's 3 s, the plain group's 10 s
        once = GroupConfigRequest(group="once", backoff_ms=(3_000,), max_deliveries=1)
        await h.call(h.processor.group_config, once)
        assert (await send_back("once")).topic == "%DLQ%once"  # the request said 16; the group says 1

    _run(one_node_broker, scenario)


def test_a_claimed_message_retention_deleted_is_settled_not_left_in_flight(
        one_node_broker: tuple[Log, BrokerStateMachine, Applier], monkeypatch: pytest.MonkeyPatch) -> None:
    def deleted(*_: object) -> bytes:
        raise MessageGone("retention deleted it")

    async def scenario(h: Harness) -> None:
        await h.send("jobs", 0, b"old")
        monkeypatch.setattr(pop_module, "read_message", deleted)
        assert await h.pop() == []
        assert h.context.machine.pops.in_flight("workers", "jobs") == []  # settled, not held
        monkeypatch.undo()
        h.clock.now_ms += 3_600_000
        assert await h.pop() == []  # and never handed out

    _run(one_node_broker, scenario)


def test_an_ordered_group_gets_each_queue_in_order_one_at_a_time(
        one_node_broker: tuple[Log, BrokerStateMachine, Applier]) -> None:
    async def scenario(h: Harness) -> None:
        config = GroupConfigRequest(group="workers", backoff_ms=(1_000,), max_deliveries=9, ordered=True)
        assert (await h.call(h.processor.group_config, config)).code == ResponseCode.SUCCESS
        await h.send("jobs", 0, b"a0", b"a1", b"a2")
        await h.send("jobs", 1, b"b0", b"b1")
        first = await h.pop(most=16)
        assert sorted(m.message.body for m in first) == [b"a0", b"b0"]  # one of each queue
        assert await h.pop() == []  # the next of each waits for its predecessor
        a0 = next(m for m in first if m.queue_id == 0)
        await h.receipt(h.processor.nack, a0, NackRequest)
        h.clock.now_ms += 1_000
        (again,) = await h.pop()
        assert (again.message.body, again.delivery) == (b"a0", 2)  # a nacked one comes back first
        await h.receipt(h.processor.ack, again)
        (a1,) = await h.pop()
        assert a1.message.body == b"a1"

    _run(one_node_broker, scenario)


def test_a_pop_claims_no_more_than_its_answer_can_carry(
        one_node_broker: tuple[Log, BrokerStateMachine, Applier], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pop_module, "POP_BODY_BYTES", 600)  # two records of ~300 B, not three

    async def scenario(h: Harness) -> None:
        for i in range(3):  # three records (one message each), each about 300 B
            await h.send("jobs", 0, bytes([65 + i]) * 200)
        first = await h.pop(most=16)
        assert [m.message.body[:1] for m in first] == [b"A", b"B"]
        (last,) = await h.pop(most=16)
        assert last.message.body[:1] == b"C"  # left unclaimed, so the next POP got it

    _run(one_node_broker, scenario)


def test_an_ack_wakes_a_pop_parked_on_an_ordered_queue(
        one_node_broker: tuple[Log, BrokerStateMachine, Applier], monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing grows and no deadline passes: only the ack can wake the parked POP (its own
    look-again is set beyond the test's deadline)."""
    monkeypatch.setattr(pop_module, "_LOOK_AGAIN_S", 60.0)

    async def scenario(h: Harness) -> None:
        config = GroupConfigRequest(group="workers", backoff_ms=(1_000,), max_deliveries=9, ordered=True)
        await h.call(h.processor.group_config, config)
        await h.send("jobs", 0, b"first", b"second")
        (first,) = await h.pop(invisible_ms=60_000)
        waiting = asyncio.ensure_future(h.pop(wait_ms=30_000))
        parked = Deadline(10)
        while h.processor._parked.count == 0:
            assert not parked.expired() and not waiting.done(), "the POP did not park"
            await asyncio.sleep(0.01)
        await h.receipt(h.processor.ack, first)
        (second,) = await asyncio.wait_for(waiting, 10)
        assert second.message.body == b"second"

    _run(one_node_broker, scenario)


def test_the_processors_per_group_maps_hold_only_groups_being_served(
        one_node_broker: tuple[Log, BrokerStateMachine, Applier]) -> None:
    """Group names are the client's: a map entry per (group, topic) ever popped grew without a
    bound (guarantee 5). The claim locks and wake-up events are dropped once nobody uses them."""
    async def scenario(h: Harness) -> None:
        await h.send("jobs", 0, b"a0")
        for i in range(50):
            await h.pop(group=f"g{i}")
        waiting = asyncio.ensure_future(h.pop(wait_ms=300, group="quiet"))
        await asyncio.wait_for(waiting, 10)
        assert h.processor._claiming == {} and h.processor._changed == {}

    _run(one_node_broker, scenario)
