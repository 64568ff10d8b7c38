"""The producer's send path: ``encode_batch`` makes the record whose messages decode to
what the client means to send, and ``send_batch`` keeps its order, outcomes, deadlines
and cancellation against a scripted broker."""

from __future__ import annotations

import asyncio
import os
import random
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from client.aio.producer import AsyncProducer
from client.aio.routes import GroupRoute, TopicRoute
from client.backoff import Deadline
from client.errors import TopicNotExistError
from client.message import _HOST, Message, SendResult, encode_batch
from protocol.message_format import Message as StoredMessage
from protocol.message_format import message_of
from protocol.record_batch import decode_messages, read_header
from protocol.remoting import Frame, ResponseCode
from protocol.send import SendBatchRequest
from tests.support.scripted_core import FakeCore, until

# -- encode_batch: what the client means to send ---------------------------------------

_rnd = random.Random(7)

MESSAGES = [
    Message("t", b""),
    Message("t", b"plain"),
    Message("t", b"x" * 256, tags="paid"),
    Message("t", b"x", tags=""),  # an empty tag is sent as none
    Message("t", b"k", keys=("order-1", "customer-9")),
    Message("t", b"k", keys=["a list", "of keys"]),
    Message("t", b"p", properties={"a": "1", "b": "two", "ünï": "cödé"}),
    Message("t", b"d", properties={"a": "1"}, delay_level=3),
    Message("t", b"d", deliver_at_ms=1_700_000_000_123),
    Message("t", b"d", properties={"DELAY": "9"}, delay_level=2, deliver_at_ms=5),
    Message("t", bytearray(b"a bytearray body")),
    Message("t", _rnd.randbytes(200_000), keys=("large",)),
    Message("t", "ünïcode body".encode(), tags="t|u", keys=("k",) * 20,
            properties={str(i): "v" * i for i in range(40)}),
]


def _meant(m: Message, queue_id: int, msg_id: bytes, born_ms: int, producer_id: str | None,
           sequence: int | None) -> StoredMessage:
    return StoredMessage(m.topic, bytes(m.body), queue_id, m.tags or None, tuple(m.keys), m.wire_properties(),
                         msg_id, 0, born_ms, _HOST, producer_id, sequence)


@pytest.mark.parametrize(("producer_id", "base"),
                         [(None, -1), ("group/0a1b2c3d4e5f.0", 0), ("p.7", 128),
                          ("p." + "e" * 300, 2**32 + 5)])
def test_encode_batch_holds_what_the_client_means_to_send(producer_id: str | None, base: int) -> None:
    ids = [os.urandom(16) for _ in MESSAGES]
    for queue_id, born_ms in ((0, 0), (7, 1_700_000_000_000), (1023, 2**40)):
        record = encode_batch(MESSAGES, queue_id, ids, born_ms, producer_id, base)
        got = [message_of(r) for r in decode_messages(record)]
        assert got == [_meant(m, queue_id, ids[i], born_ms, producer_id, None if base < 0 else base + i)
                       for i, m in enumerate(MESSAGES)]
        assert read_header(record).special  # a delay in the batch: the leader splits it


def test_encode_batch_is_the_same_on_every_thread() -> None:
    ms = [Message("t", b"body", tags="a", keys=("k",), properties={"x": "y"})] * 3
    expected = encode_batch(ms, 1, [b"\x01" * 16] * 3, 5, "p.0", 3)
    encode_batch([Message("t", _rnd.randbytes(60_000))], 1, [b"\x02" * 16], 5)
    got: list[bytes] = []
    threads = [threading.Thread(
        target=lambda: got.append(encode_batch(ms, 1, [b"\x01" * 16] * 3, 5, "p.0", 3))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [expected] * 4 and not read_header(expected).special


def test_an_unpackable_message_leaves_the_packer_usable() -> None:
    with pytest.raises(TypeError):
        encode_batch([Message("t", b"x", properties={"a": {1}})], 0, [b"\x00" * 16], 0)  # type: ignore[dict-item]
    record = encode_batch([Message("t", b"fine")], 0, [b"\x00" * 16], 0)
    assert decode_messages(record)[0].body == b"fine"


# -- send_batch against a scripted broker ---------------------------------------------


def run_producer(scenario: Callable[[FakeCore, AsyncProducer], Awaitable[None]], core: FakeCore | None = None,
                 **options: Any) -> None:
    """Run ``scenario`` on a new loop with an ``AsyncProducer(**options)`` over ``core`` (a
    ``FakeCore()`` when not given); the producer is shut down after, also when it fails."""
    scripted = FakeCore() if core is None else core

    async def main() -> None:
        p = AsyncProducer(core=scripted, **options)  # type: ignore[arg-type]
        try:
            await scenario(scripted, p)
        finally:
            await p.shutdown()

    asyncio.run(main())


async def held_in_flight(core: FakeCore, p: AsyncProducer, body: bytes = b"a") -> asyncio.Task[SendResult]:
    """A send of ``body`` to key "k" whose request ``core`` has taken and holds (made ``gated``):
    with ``max_in_flight=1`` the sends after it wait in the queue."""
    task = asyncio.create_task(p.send(Message("t", body), shard_key="k"))
    await until(lambda: len(core.bodies) == 1)
    return task


def _queued(p: AsyncProducer) -> int:
    """Messages waiting in the producer's queue senders (not yet taken into a request)."""
    return sum(len(s._pending) for s in p._senders.values())


def _seqs(records: list[bytes]) -> list[tuple[str | None, int | None, bytes]]:
    return [(s.producer_id, s.sequence, s.body) for r in records for s in decode_messages(r)]


def test_send_batch_results_are_in_order_with_distinct_ids_and_positions() -> None:
    async def scenario(core: FakeCore, p: AsyncProducer) -> None:
        first = await p.send_batch([Message("t", b"m%d" % i) for i in range(300)], shard_key="k")
        second = await p.send_batch([Message("t", b"n%d" % i) for i in range(5)])
        assert [r.queue_offset for r in first + second] == list(range(305))
        assert [r.position for r in first + second] == [1000 + i for i in range(305)]
        assert len({r.msg_id for r in first + second}) == 305
        assert all(not r.duplicate and r.queue.group == "g1" for r in first + second)
        # one request for the call (≤ BATCH_MAX_MESSAGES), one producer id, sequences without a gap
        assert [len(b) for b in core.bodies] == [300, 5]
        sent = [s for b in core.bodies for s in _seqs(b)]
        assert [s[1] for s in sent] == list(range(305))
        assert {s[0] for s in sent} == {p._base + ".0"}
        assert [s[2] for s in sent[:300]] == [b"m%d" % i for i in range(300)]
        (stored,) = decode_messages(core.bodies[0][0])
        assert stored.msg_id.hex() == first[0].msg_id

    run_producer(scenario, send_timeout=5)


def test_a_message_changed_after_send_batch_is_sent_as_it_was() -> None:
    async def scenario(core: FakeCore, p: AsyncProducer) -> None:
        blocker = await held_in_flight(core, p, b"first")  # the next send waits in the queue
        m = Message("t", b"before", keys=["k1"], properties={"a": "1"})
        task = asyncio.create_task(p.send(m, shard_key="k"))
        await until(lambda: _queued(p) == 1)
        m.body, m.tags = b"after", "changed"
        m.properties["a"] = "2"  # type: ignore[index]
        m.keys.append("k2")  # type: ignore[attr-defined]
        core.gate.set()  # type: ignore[union-attr]
        await asyncio.gather(blocker, task)
        (stored,) = decode_messages(core.bodies[1][0])
        assert (stored.body, stored.tags, stored.keys, stored.properties) == (b"before", None, ("k1",),
                                                                             {"a": "1"})

    run_producer(scenario, FakeCore(gated=True), max_in_flight=1)


def test_a_refused_message_fails_its_call_after_the_rest_of_it_is_stored() -> None:
    gap = ResponseCode.SEQUENCE_GAP
    core = FakeCore()
    core.script = [[0, ResponseCode.TOPIC_NOT_EXIST, gap, gap]]

    async def scenario(core: FakeCore, p: AsyncProducer) -> None:
        with pytest.raises(TopicNotExistError):
            await p.send_batch([Message("t", b"m%d" % i) for i in range(4)], shard_key="k")
        # the two refused only as gaps were resent in a new epoch before the call ended
        assert [_seqs(b) for b in core.bodies] == [
            [(p._base + ".0", i, b"m%d" % i) for i in range(4)],
            [(p._base + ".1", 0, b"m2"), (p._base + ".1", 1, b"m3")]]
        assert core.offsets == {0: 3}
        assert [r.queue_offset for r in await p.send_batch([Message("t", b"x")], shard_key="k")] == [3]

    run_producer(scenario, core)


def test_a_batch_uses_the_earliest_deadline_of_the_calls_in_it() -> None:
    async def scenario(core: FakeCore, p: AsyncProducer) -> None:
        first = await held_in_flight(core, p)
        late = asyncio.create_task(p.send_batch([Message("t", b"b")] * 3, shard_key="k"))
        await until(lambda: _queued(p) == 3)
        p.send_timeout = 2
        soon = asyncio.create_task(p.send_batch([Message("t", b"c")] * 2, shard_key="k"))
        await until(lambda: _queued(p) == 5)
        core.gate.set()  # type: ignore[union-attr]
        await asyncio.gather(first, late, soon)
        assert [len(b) for b in core.bodies] == [1, 5]
        assert 25 < core.deadlines[0].remaining() <= 30
        assert 0 < core.deadlines[1].remaining() <= 2

    run_producer(scenario, FakeCore(gated=True), send_timeout=30, max_in_flight=1)


def test_a_cancelled_call_drops_its_unsent_messages_without_a_gap() -> None:
    async def scenario(core: FakeCore, p: AsyncProducer) -> None:
        first = await held_in_flight(core, p)
        dropped = asyncio.create_task(p.send_batch([Message("t", b"gone")] * 3, shard_key="k"))
        await until(lambda: _queued(p) == 3)
        dropped.cancel()
        kept = asyncio.create_task(p.send_batch([Message("t", b"kept")] * 2, shard_key="k"))
        await until(lambda: _queued(p) == 5)
        core.gate.set()  # type: ignore[union-attr]
        assert (await first).queue_offset == 0
        assert [r.queue_offset for r in await kept] == [1, 2]
        with pytest.raises(asyncio.CancelledError):
            await dropped
        assert _seqs(core.bodies[1]) == [(p._base + ".0", 1, b"kept"), (p._base + ".0", 2, b"kept")]

    run_producer(scenario, FakeCore(gated=True), max_in_flight=1)


def test_route_queues_are_a_fresh_list_each_time() -> None:
    route = TopicRoute("t", [GroupRoute("g2", 2, 6, None), GroupRoute("g1", 3, 2, None),
                             GroupRoute("g3", 1, 4, None)])
    writable = route.queues(2)
    assert [(q.group, q.queue_id) for q in writable] == [("g1", 0), ("g1", 1), ("g1", 2), ("g2", 0),
                                                         ("g2", 1)]
    writable.clear()
    assert len(route.queues(2)) == 5
    assert [q.group for q in route.queues(4)] == ["g2", "g2", "g3"]
    assert len(route.queues()) == 6


def test_a_message_that_cannot_be_encoded_is_refused_and_its_queue_keeps_sending() -> None:
    async def scenario(core: FakeCore, p: AsyncProducer) -> None:
        for bad in (Message("t", b"x", properties={"a": {1}}),  # type: ignore[dict-item]
                    Message("t", b"x", keys="order-1"), Message("t", b"x", tags=7)):  # type: ignore[arg-type]
            with pytest.raises(TypeError):
                await p.send(bad, shard_key="k")
        sent = await p.send_batch([Message("t", b"ok")] * 2, shard_key="k")
        assert [r.queue_offset for r in sent] == [0, 1]
        assert [s[1] for b in core.bodies for s in _seqs(b)] == [0, 1]  # nothing was taken: no gap

    run_producer(scenario)


def test_an_unordered_send_with_retries_ends_within_its_send_timeout() -> None:
    """Every attempt gets a share of ``send_timeout``: a hung group costs the call at most
    ``send_timeout``, not ``(retries + 1) x send_timeout``."""
    from client.errors import RequestTimeoutError

    class HungCore(FakeCore):
        async def leader_request(self, group: str, request: SendBatchRequest, *, deadline: Deadline,
                                 topic: str | None = None) -> Frame:
            self.deadlines.append(deadline)
            await asyncio.sleep(deadline.remaining())  # no answer: the request runs out its deadline
            raise RequestTimeoutError("no answer in time")

    async def scenario(core: FakeCore, p: AsyncProducer) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(RequestTimeoutError):
            await p.send(Message("t", b"x"))
        assert loop.time() - started < 0.9
        assert len(core.deadlines) == 3  # every attempt was made

    run_producer(scenario, HungCore(), send_timeout=0.6, retries=2)
