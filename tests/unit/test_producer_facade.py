"""The single-message paths: the blocking producer's sends from many threads share records
and keep each key's order, without a coroutine or a cross-thread future per message; the
asyncio ``send_async``/``send_oneway`` settle through callbacks; an unordered single send
that fails retriably is retried on another group."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from client.aio.producer import AsyncProducer
from client.aio.routes import GroupRoute, TopicRoute
from client.backoff import Deadline
from client.errors import ClientClosedError, NoLeaderError
from client.message import Message, SendResult
from client.sync import Producer
from protocol.record_batch import decode_messages
from protocol.remoting import Frame, ResponseCode
from protocol.send import SendBatchRequest
from tests.support.scripted_core import FakeCore, until


def test_blocking_sends_from_many_threads_share_records_in_each_keys_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    core = FakeCore(queues=4)
    p = Producer(core=core, linger_ms=5)  # type: ignore[arg-type]
    p.send(Message("t", b"warm-up"), shard_key="w")  # the route is known from here on

    def no_future_per_message(*args: Any) -> Any:
        raise AssertionError("a single send made a coroutine and a cross-thread future")

    monkeypatch.setattr(asyncio, "run_coroutine_threadsafe", no_future_per_message)
    results: dict[int, list[SendResult]] = {}
    start = threading.Barrier(64)

    def worker(n: int) -> None:
        start.wait(10)
        results[n] = [p.send(Message("t", b"%d:%d" % (n, i)), shard_key=f"k{n % 8}") for i in range(20)]

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    monkeypatch.undo()
    p.shutdown()
    assert sorted(results) == list(range(64)) and all(len(r) == 20 for r in results.values())
    requests = core.bodies[1:]
    assert sum(len(b) for b in requests) == 64 * 20
    assert len(requests) < 64 * 20 / 4  # the threads' messages shared requests
    by_queue: dict[int, list[bytes]] = {}
    for request in requests:
        for record in request:
            (m,) = decode_messages(record)
            by_queue.setdefault(m.queue_id, []).append(m.body)
    for n in range(64):  # a thread's messages are stored in its send order
        (queue,) = {r.queue.queue_id for r in results[n]}
        mine = [b for b in by_queue[queue] if b.startswith(b"%d:" % n)]
        assert mine == [b"%d:%d" % (n, i) for i in range(20)]
        assert [r.queue_offset for r in results[n]] == sorted(r.queue_offset for r in results[n])


def test_blocking_send_async_and_oneway_call_back_on_the_loop_and_errors_reach_the_caller() -> None:
    core = FakeCore()
    p = Producer(core=core)  # type: ignore[arg-type]
    done = threading.Event()
    got: list[tuple[SendResult | None, BaseException | None]] = []

    def callback(result: SendResult | None, error: BaseException | None) -> None:
        got.append((result, error))
        if len(got) == 100:
            done.set()

    for i in range(100):
        p.send_async(Message("t", b"a%d" % i), callback, shard_key="k")
    p.send_oneway(Message("t", b"oneway"), shard_key="k")
    assert done.wait(10)
    with pytest.raises(TypeError):
        p.send(Message("t", "not bytes"), shard_key="k")  # type: ignore[arg-type]
    p.shutdown()
    with pytest.raises(ClientClosedError):
        p.send(Message("t", b"late"), shard_key="k")
    assert [e for _, e in got] == [None] * 100
    assert [r.queue_offset for r, _ in got] == list(range(100))  # type: ignore[union-attr]
    assert [m.body for b in core.bodies for r in b for m in decode_messages(r)][-1] == b"oneway"


class TwoGroupsCore(FakeCore):
    """Group g1 has no leader (a retriable refusal); g2 stores."""

    def __init__(self) -> None:
        super().__init__()
        route = TopicRoute("t", [GroupRoute("g1", 1, 6, "a:1", {"n1": "a:1"}),
                                 GroupRoute("g2", 1, 6, "b:1", {"n1": "b:1"})])
        self.routes._route = route
        self.groups: list[str] = []

    async def leader_request(self, group: str, request: SendBatchRequest, *, deadline: Deadline,
                             topic: str | None = None) -> Frame:
        self.groups.append(group)
        if group == "g1":
            raise NoLeaderError(ResponseCode.NO_LEADER, "electing")
        return await super().leader_request(group, request, deadline=deadline, topic=topic)


def test_an_unordered_single_send_that_fails_retriably_goes_to_another_group() -> None:
    async def main() -> None:
        core = TwoGroupsCore()
        p = AsyncProducer(core=core, retries=2)  # type: ignore[arg-type]
        p._rr = iter(range(0, 100, 2))  # type: ignore[assignment]  # g1 first
        called: list[tuple[SendResult | None, BaseException | None]] = []
        result = await p.send_async(Message("t", b"x"), lambda r, e: called.append((r, e)))
        assert result.queue.group == "g2" and core.groups == ["g1", "g2"]
        assert called == [(result, None)]
        await p.shutdown()

    asyncio.run(main())


def test_unordered_single_messages_stick_to_a_queue_until_a_request_of_it_is_sent() -> None:
    async def main() -> None:
        core = FakeCore(queues=4)
        p = AsyncProducer(core=core)  # type: ignore[arg-type]
        got: list[SendResult | None] = []
        await p.send(Message("t", b"warm-up"))  # the route is known; one request sent
        p.enqueue_many([(Message("t", b"a%d" % i), None, lambda r, e: got.append(r)) for i in range(20)])
        p.enqueue_many([(Message("t", b"b%d" % i), None, lambda r, e: got.append(r)) for i in range(20)])
        await p.shutdown()
        assert [len(b) for b in core.bodies] == [1, 20, 20]  # one request each, not 20 queues' worth
        queues = [{decode_messages(r)[0].queue_id for r in b} for b in core.bodies]
        assert all(len(q) == 1 for q in queues) and len(set.union(*queues)) == 3  # then the next queue

    asyncio.run(main())


def test_unordered_single_sends_one_at_a_time_spread_over_the_queues() -> None:
    """A caller awaiting each send (a request each) sees its messages spread round robin,
    as before the accumulator: consumers of every queue get some (tests/cluster's
    rebalance test)."""
    async def main() -> None:
        core = FakeCore(queues=4)
        p = AsyncProducer(core=core)  # type: ignore[arg-type]
        results = [await p.send(Message("t", b"m%d" % i)) for i in range(12)]
        await p.shutdown()
        assert sorted({r.queue.queue_id for r in results}) == [0, 1, 2, 3]

    asyncio.run(main())


class _RefreshingRoutes:
    """A route that is stale until a fetch the test releases (``answer``) brings it back."""

    def __init__(self, route: TopicRoute) -> None:
        self._route, self.known, self.answer = route, False, asyncio.Event()
        self._lock = asyncio.Lock()  # one fetch at a time, as client.aio.routes.RouteBook

    def fresh(self, topic: str) -> TopicRoute | None:
        return self._route if self.known else None

    async def route(self, topic: str, refresh: bool = False) -> TopicRoute:
        if self.known:
            return self._route
        async with self._lock:
            await self.answer.wait()
            self.known = True
            return self._route


def test_one_keys_messages_keep_their_order_across_a_route_refresh() -> None:
    """Guarantee 2: messages of one shard key sent while the topic's route is being fetched
    again, and one sent just as its answer lands (a drain of the blocking client's inbox),
    are stored in send order."""
    async def main() -> None:
        core = FakeCore(queues=2)
        routes = _RefreshingRoutes(core.routes._route)
        core.routes = routes  # type: ignore[assignment]
        p = AsyncProducer(core=core)  # type: ignore[arg-type]
        loop = asyncio.get_running_loop()
        outcomes: list[tuple[SendResult | None, BaseException | None]] = []
        p.enqueue(Message("t", b"m0"), "K", lambda r, e: outcomes.append((r, e)))
        p.enqueue(Message("t", b"m1"), "K", lambda r, e: outcomes.append((r, e)))
        await asyncio.sleep(0)  # both wait for the route

        def answer_then_send() -> None:
            routes.answer.set()
            # queued behind the route's answer, ahead of the tasks it wakes
            loop.call_soon(lambda: p.enqueue(Message("t", b"m2"), "K", lambda r, e: outcomes.append((r, e))))

        loop.call_soon(answer_then_send)
        await until(lambda: len(outcomes) == 3)
        await p.shutdown()
        assert all(e is None for _, e in outcomes), outcomes
        stored = [decode_messages(r)[0].body for b in core.bodies for r in b]
        assert stored == [b"m0", b"m1", b"m2"]

    asyncio.run(main())


def test_a_blocking_send_racing_shutdown_fails_as_closed_at_once() -> None:
    from collections import deque

    p = Producer(core=FakeCore(queues=4))  # type: ignore[arg-type]

    class ShutDownFirst(deque):  # type: ignore[type-arg]
        def append(self, item: Any) -> None:  # the shutdown ends between the send's check and this
            p.shutdown()
            super().append(item)

    p._inbox = ShutDownFirst()
    started = time.monotonic()
    with pytest.raises(ClientClosedError, match="shut down"):
        p.send(Message("t", b"late"))
    assert time.monotonic() - started < 5, "the send waited for its timeout"
    assert not p._inbox


def test_sends_not_answered_hold_at_most_buffer_bytes_then_asyncio_fails_and_blocking_waits() -> None:
    from client.errors import BufferFullError

    async def asyncio_api() -> None:
        core = FakeCore(gated=True)
        p = AsyncProducer(core=core, buffer_bytes=1000)  # type: ignore[arg-type]
        futures = [p.send_async(Message("t", b"x" * 160), lambda r, e: None)  # 200 each as counted
                   for _ in range(5)]
        assert p.buffer.held == 1000
        with pytest.raises(BufferFullError, match="buffer_bytes=1000"):
            p.send_async(Message("t", b"one more"), lambda r, e: None)
        core.gate.set()  # type: ignore[union-attr]
        await asyncio.wait_for(asyncio.gather(*futures), 5)
        assert p.buffer.held == 0
        await asyncio.wait_for(p.send_async(Message("t", b"room again"), lambda r, e: None), 5)
        await p.shutdown(1)

    asyncio.run(asyncio_api())

    core = FakeCore(gated=True)
    p = Producer(core=core, buffer_bytes=1000, max_block_s=0.3)  # type: ignore[arg-type]
    try:
        for _ in range(5):
            p.send_oneway(Message("t", b"x" * 160))
        deadline = time.monotonic() + 5  # posted: the loop takes them into the buffer at its next turn
        while p._p.buffer.held < 1000:
            assert time.monotonic() < deadline, "the posted sends never reached the buffer"
            time.sleep(0.001)
        started = time.monotonic()
        with pytest.raises(BufferFullError, match=r"no room in the producer's buffer for 0\.3 s"):
            p.send_oneway(Message("t", b"blocked"))
        assert time.monotonic() - started >= 0.3
        unblocked = threading.Event()

        def late_sender() -> None:
            p.send_oneway(Message("t", b"waits for room"))
            unblocked.set()

        threading.Thread(target=late_sender, daemon=True).start()
        assert not unblocked.wait(0.1), "a send went on while the buffer was full"
        p._loop.loop.call_soon_threadsafe(core.gate.set)  # type: ignore[union-attr]
        assert unblocked.wait(5), "the waiting send did not go on once answers freed room"
    finally:
        p._loop.loop.call_soon_threadsafe(core.gate.set)  # type: ignore[union-attr]
        p.shutdown()


def test_a_send_from_a_callback_into_a_full_buffer_fails_at_once_instead_of_blocking_the_loop() -> None:
    from client.errors import BufferFullError

    core = FakeCore(gated=True)
    p = Producer(core=core, buffer_bytes=200, max_block_s=30)  # type: ignore[arg-type]
    outcome: list[BaseException | None] = []
    done = threading.Event()
    try:
        def chained(result: SendResult | None, error: BaseException | None) -> None:
            try:  # on the producer's loop; the first send still holds the buffer
                p.send_oneway(Message("t", b"from a callback"))
                outcome.append(None)
            except BaseException as e:
                outcome.append(e)
            done.set()

        p.send_oneway(Message("t", b"x" * 160))  # fills it (200 as the queue counts it)
        deadline = time.monotonic() + 5
        while not p._p.buffer.full:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        p._loop.loop.call_soon_threadsafe(chained, None, None)
        assert done.wait(5), "a send from the loop waited for room only the loop can make"
        assert isinstance(outcome[0], BufferFullError), outcome
    finally:
        p._loop.loop.call_soon_threadsafe(core.gate.set)  # type: ignore[union-attr]
        p.shutdown()


def test_a_blocking_send_from_a_callback_says_why_it_cannot_wait_instead_of_timing_out() -> None:
    from client.errors import ClientError

    p = Producer(core=FakeCore())  # type: ignore[arg-type]
    outcome: list[BaseException | None] = []
    done = threading.Event()

    def on_loop() -> None:
        try:
            p.send(Message("t", b"from the loop"))
            outcome.append(None)
        except BaseException as e:
            outcome.append(e)
        done.set()

    try:
        p._loop.loop.call_soon_threadsafe(on_loop)
        assert done.wait(5), "the send waited for its own loop"
        assert isinstance(outcome[0], ClientError) and "use send_async" in str(outcome[0]), outcome
    finally:
        p.shutdown()


def test_the_buffer_holds_a_send_through_its_retries_and_a_bad_item_fails_alone() -> None:
    from client.errors import NoLeaderError as _NoLeader

    async def main() -> None:
        core = FakeCore()
        core.script = [[ResponseCode.NO_LEADER]]  # the first attempt fails retriably
        p = AsyncProducer(core=core, buffer_bytes=1 << 20)  # type: ignore[arg-type]
        held_at_retry: list[int] = []
        retry = p.retry_elsewhere

        def watching(*args: Any) -> None:
            held_at_retry.append(p.buffer.held)
            retry(*args)

        p.retry_elsewhere = watching  # type: ignore[method-assign]
        got: list[Any] = []
        done = asyncio.Event()

        def callback(result: SendResult | None, error: BaseException | None) -> None:
            got.append(result or error)
            if len(got) == 2:
                done.set()

        p.enqueue_many([("not a message", None, callback), (Message("t", b"x" * 160), None, callback)])  # type: ignore[list-item]
        await asyncio.wait_for(done.wait(), 5)
        assert isinstance(got[0], AttributeError) and isinstance(got[1], SendResult), got
        assert held_at_retry == [200], "a send being retried was not held in the buffer"
        assert p.buffer.held == 0 and not isinstance(got[1], _NoLeader)
        await p.shutdown(1)

    asyncio.run(main())


def test_shutdown_fails_sends_still_waiting_for_a_route_and_frees_their_buffer() -> None:
    class NoRouteYet(FakeCore):
        def __init__(self) -> None:
            super().__init__()
            never = asyncio.Event()

            class Routes:
                def fresh(self, topic: str) -> None:
                    return None

                async def route(self, topic: str, refresh: bool = False) -> TopicRoute:
                    await never.wait()
                    raise AssertionError("unreachable")

            self.routes = Routes()  # type: ignore[assignment]

    async def main() -> None:
        p = AsyncProducer(core=NoRouteYet())  # type: ignore[arg-type]
        got: list[BaseException | None] = []
        p.send_async(Message("t", b"waits for its route"), lambda r, e: got.append(e))
        await asyncio.sleep(0)
        assert p.buffer.held > 0 and not got
        await p.shutdown(0.1)
        assert isinstance(got[0], ClientClosedError) and "route" in str(got[0]), got
        assert p.buffer.held == 0 and p.buffer.closed

    asyncio.run(main())
