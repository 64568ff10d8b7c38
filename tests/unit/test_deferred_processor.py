"""The deferred processor (CONSUMER_SEND_MSG_BACK, END_TRANSACTION) through its
``BrokerContext`` alone -- the memory log, the apply step, the write path, the deferred
service and a leader clock the test moves; no server, no socket: a send-back's retry copy is
held on the retry schedule, stored once when the send-back is retried, and dead-lettered past
its max; only a message a consumer can pull is sent back; a transaction's half shows in its
queue once committed, never once rolled back."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from broker.state.machine import BrokerStateMachine
from dledger.applier import Applier
from dledger.errors import NotLeader
from dledger.log import Log
from protocol.deferred import EndTransactionRequest, EndTransactionResponse, SendBackRequest, SendBackResponse
from protocol.message_format import Message, decode_message, encode_message
from protocol.pull import PullRequest, PullResponse
from protocol.remoting import FrameError, ResponseCode
from protocol.send import SendMessageRequest, WriteResponse
from tests.support.memory_broker import T0, MemoryBroker, run_on_topic

Parts = tuple[Log, BrokerStateMachine, Applier]


def run(parts: Parts, scenario: Callable[[MemoryBroker], Awaitable[None]]) -> None:
    run_on_topic(parts, "orders", 1, scenario)


async def send(b: MemoryBroker, m: Message) -> WriteResponse:
    answer = await b.call(b.sends.send, SendMessageRequest(message=encode_message(m)))
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    return WriteResponse.from_frame(answer)


async def bodies(b: MemoryBroker, topic: str) -> list[bytes]:
    answer = await b.call(b.pulls.pull, PullRequest(topic=topic, queue_id=0, offset=0))
    if answer.code == ResponseCode.PULL_NOT_FOUND:
        return []
    return [decode_message(row.record).body for row in PullResponse.from_frame(answer).rows or ()]


async def send_back(b: MemoryBroker, position: int, max_times: int = 16) -> SendBackResponse:
    answer = await b.call(b.deferred_requests.send_back,
                          SendBackRequest(group="billing", position=position, max_reconsume_times=max_times))
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    return SendBackResponse.from_frame(answer)


def test_a_sent_back_message_is_held_on_the_retry_schedule_then_dead_lettered(one_node_broker: Parts) -> None:
    async def scenario(b: MemoryBroker) -> None:
        stored = await send(b, Message("orders", b"hard", 0))
        retry = await send_back(b, stored.position)
        assert (retry.topic, retry.reconsume_times, retry.queue_offset) == ("%RETRY%billing", 1, -1)
        (held,) = b.machine.timers.held()
        assert held.due_ms == T0 + 10_000  # the first step of the retry schedule
        assert await bodies(b, "%RETRY%billing") == []  # held, not in the retry queue yet
        again = await send_back(b, stored.position)  # a retried send-back: stored once
        assert again.duplicate and len(b.machine.timers.held()) == 1
        poison = await send(b, Message("orders", b"poison", 0))
        dead = await send_back(b, poison.position, max_times=0)
        assert (dead.topic, dead.queue_offset, dead.duplicate) == ("%DLQ%billing", 0, False)
        assert await bodies(b, "%DLQ%billing") == [b"poison"]

    run(one_node_broker, scenario)


def test_only_a_message_a_consumer_can_pull_is_sent_back(one_node_broker: Parts) -> None:
    async def scenario(b: MemoryBroker) -> None:
        delayed = await send(b, Message("orders", b"later", 0, properties={"DELAY": "1"}))
        stored = await send(b, Message("orders", b"now", 0))
        before = b.rlog.committed_index
        for position, named in ((delayed.position, "held"), (stored.position + 7, "no message")):
            with pytest.raises(FrameError) as refused:
                await b.call(b.deferred_requests.send_back,
                             SendBackRequest(group="billing", position=position))
            assert refused.value.code == ResponseCode.INVALID_ARGUMENT and named in str(refused.value)
        assert b.rlog.committed_index == before
        b.leading = False
        with pytest.raises(NotLeader):
            await send_back(b, stored.position)

    run(one_node_broker, scenario)


def test_a_committed_half_shows_in_its_queue_and_a_rolled_back_one_never(one_node_broker: Parts) -> None:
    async def scenario(b: MemoryBroker) -> None:
        def half(body: bytes) -> Message:
            return Message("orders", body, 0, properties={"TRAN_MSG": "true", "PGROUP": "pg"})

        kept, dropped = await send(b, half(b"kept")), await send(b, half(b"dropped"))
        assert await bodies(b, "orders") == [] and len(b.machine.halves.held()) == 2

        async def end(position: int, commit: bool) -> str:
            answer = await b.call(b.deferred_requests.end_transaction,
                                  EndTransactionRequest(position=position, commit=commit))
            return EndTransactionResponse.from_frame(answer).outcome

        assert await end(kept.position, True) == "stored"
        assert await end(dropped.position, False) == "done"
        assert await bodies(b, "orders") == [b"kept"] and b.machine.halves.held() == []
        assert await end(kept.position, False) == "already resolved"  # a late check-back answer
        assert await bodies(b, "orders") == [b"kept"]

    run(one_node_broker, scenario)


def test_a_new_leader_still_applying_waits_before_judging_a_send_back(
        one_node_broker: Parts, monkeypatch: pytest.MonkeyPatch) -> None:
    """A leader elected a moment ago may not have applied every committed entry: the sent-back
    message's queue unit is not there yet. It was refused INVALID_ARGUMENT ('no message a
    consumer can pull'), and the consumer retried it locally -- the message came back with its
    reconsume count unchanged (tests/cluster/test_retry_cluster.py's leader kill, 1 run in 3).
    The leader now waits (bounded) until it applied what was committed, then judges; past the
    bound it answers SYSTEM_BUSY, which the client retries."""
    from broker.processors import deferred as deferred_module

    async def scenario(b: MemoryBroker) -> None:
        stored = await send(b, Message("orders", b"hard", 0))
        machine, lagging = b.machine, [True]
        real_queue, real_applied = machine.queue, machine.applied_index
        machine.queue = lambda topic, qid: None if lagging[0] else real_queue(topic, qid)  # type: ignore[method-assign]
        machine.applied_index = lambda: 0 if lagging[0] else real_applied()  # type: ignore[method-assign]
        # a new leader's commit index can even be below the message's entry (it lags until an
        # entry of its own term commits): the wait must reach the message's entry too
        real_committed = type(b.rlog).committed_index
        monkeypatch.setattr(type(b.rlog), "committed_index", property(
            lambda log: 0 if lagging[0] else real_committed.fget(log)))  # type: ignore[attr-defined]
        asyncio.get_running_loop().call_later(0.2, lagging.__setitem__, 0, False)
        retry = await send_back(b, stored.position)
        assert retry.topic == "%RETRY%billing" and retry.reconsume_times == 1
        lagging[0] = True  # a leader that does not catch up within the bound: busy, not refused
        monkeypatch.setattr(deferred_module, "APPLY_WAIT_S", 0.2)
        with pytest.raises(FrameError) as busy:
            await b.call(b.deferred_requests.send_back,
                         SendBackRequest(group="billing", position=stored.position))
        assert busy.value.code == ResponseCode.SYSTEM_BUSY, busy.value

    run(one_node_broker, scenario)
