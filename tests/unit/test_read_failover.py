"""Reads leave a stalled replica by themselves (issue 35, ``ClientCore.read_request``): a
pull unanswered past its long poll plus ``READ_GRACE_S`` is overdue, the next replica is
asked at once (the overdue pull still racing: the first answer wins), and the stalled one
is read last for a while. Offset and membership reads of the orderly consumer's restart
(``committed_offset``, ``queue_offsets``) do the same with no long poll.

The pool is scripted: a ``silent`` replica never answers (no timeout of its own either:
the core's request timeout is an hour), so a client that waits for an attempt timeout
fails the test's liveness bound (``LIVENESS_S``) instead of finishing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from client.aio.core import READ_GRACE_S, ClientCore
from client.aio.pull_consumer import committed_offset, fetch
from client.aio.push_consumer import AsyncPushConsumer
from client.queues import MessageQueue
from protocol.offset import QueryOffsetRequest, QueryOffsetResponse
from protocol.pull import PullRequest, PullResponse
from protocol.remoting import Frame, ResponseCode
from protocol.topic import GetRouteRequest
from protocol.wire import EmptyResponse, Request

LEADER, F1, F2 = "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"
QUEUE = MessageQueue("t", "g1", 0)
LIVENESS_S = 10.0


class ScriptedReads:
    """``silent`` replicas never answer; ``slow`` ones answer when their event is set; the
    others answer at once: a pull with PULL_NOT_FOUND at its offset, an offset query with
    ``offset``. Every request's replica is recorded in order, and every cancel."""

    def __init__(self, silent: set[str], slow: dict[str, asyncio.Event] | None = None,
                 offset: int = 42) -> None:
        self.silent = silent
        self.slow = slow or {}
        self.offset = offset
        self.asked: list[str] = []
        self.cancelled: list[str] = []
        self.checked: list[str] = []  # liveness checks (GET_ROUTE), by replica

    async def request(self, address: str, request: Request, timeout: float = 10.0,
                      ok: tuple[int, ...] = (0,)) -> Frame:
        self.asked.append(address)
        frame = request.to_frame(len(self.asked))
        try:
            if address in self.silent:
                await asyncio.Event().wait()  # forever: only a cancel ends it
            if address in self.slow:
                await self.slow[address].wait()
        except asyncio.CancelledError:
            self.cancelled.append(address)
            raise
        if isinstance(request, PullRequest):
            return PullResponse(next_offset=request.offset).reply(frame, ResponseCode.PULL_NOT_FOUND)
        assert isinstance(request, QueryOffsetRequest)
        return QueryOffsetResponse(offset=self.offset).reply(frame)

    async def call(self, address: str, request: Request, timeout: float = 10.0) -> Frame:
        """A liveness check (GET_ROUTE), a heartbeat, an unregistration: a silent replica
        never answers them either."""
        if isinstance(request, GetRouteRequest):
            self.checked.append(address)
        if address in self.silent:
            await asyncio.Event().wait()
        return EmptyResponse().reply(request.to_frame(1))

    async def close(self) -> None:
        pass


def _core(pool: ScriptedReads) -> ClientCore:
    core = ClientCore(servers=[LEADER, F1, F2], request_timeout=3600.0)
    core.pool = pool  # type: ignore[assignment]
    core.routes.register_group("g1", [LEADER, F1, F2])
    core.routes.set_leader("g1", LEADER)
    core.routes.topic_of = lambda group: "t"  # type: ignore[method-assign]  # what checks ask about
    return core


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.01)


def _first_follower(core: ClientCore) -> str:
    return core.read_replicas("g1", "follower", str(QUEUE))[0]


def test_a_pull_from_a_stalled_follower_moves_to_the_other_after_its_long_poll_and_a_grace() -> None:
    async def run() -> None:
        probe = _core(ScriptedReads(set()))
        stalled = _first_follower(probe)
        other = F2 if stalled == F1 else F1
        pool = ScriptedReads({stalled})
        core = _core(pool)
        began = time.monotonic()
        async with asyncio.timeout(LIVENESS_S):
            result = await fetch(core, QUEUE, 7, suspend_s=0.2)
        took = time.monotonic() - began
        print(f"pull answered {took:.2f} s after it was sent (long poll 0.2 s)")
        assert result.next_offset == 7
        assert pool.asked == [stalled, other]
        assert took >= 0.2 + READ_GRACE_S * 0.9  # it waited its long poll and the grace first
        async with asyncio.timeout(LIVENESS_S):  # the overdue pull is given up once the other answered
            await _until(lambda: pool.cancelled == [stalled])
        # the stalled replica is read last now: the next pull goes to the other at once
        async with asyncio.timeout(LIVENESS_S):
            await fetch(core, QUEUE, 7, suspend_s=0.2)
        assert pool.asked == [stalled, other, other]

    asyncio.run(run())


def test_a_long_poll_on_a_stalled_follower_is_left_when_it_does_not_answer_a_liveness_check() -> None:
    """The push consumer's default long poll is 15 s (an hour here): a stalled follower is
    found silent by a liveness check READ_GRACE_S after the pull was sent, and the pull
    goes to the other follower then, not after the long poll."""
    async def run() -> None:
        stalled = _first_follower(_core(ScriptedReads(set())))
        other = F2 if stalled == F1 else F1
        pool = ScriptedReads({stalled})
        core = _core(pool)
        began = time.monotonic()
        async with asyncio.timeout(LIVENESS_S):
            await fetch(core, QUEUE, 7, suspend_s=3600.0)
        took = time.monotonic() - began
        print(f"a 3600 s long poll on a stalled follower left after {took:.2f} s")
        assert pool.asked == [stalled, other]
        assert pool.checked == [stalled]

    asyncio.run(run())


def test_a_follower_holding_a_long_poll_that_answers_its_liveness_checks_keeps_the_pull() -> None:
    async def run() -> None:
        holder = _first_follower(_core(ScriptedReads(set())))
        answer = asyncio.Event()
        pool = ScriptedReads(set(), slow={holder: answer})
        core = _core(pool)
        pull = asyncio.ensure_future(fetch(core, QUEUE, 7, suspend_s=3600.0))
        async with asyncio.timeout(LIVENESS_S):
            await _until(lambda: len(pool.checked) >= 2)  # checked twice, alive each time
            answer.set()
            await pull
        assert pool.asked == [holder]
        assert set(pool.checked) == {holder}

    asyncio.run(run())


def test_an_overdue_pull_still_races_and_a_late_answer_from_it_wins() -> None:
    """A replica only slow (answering after its grace) is not lost: its pull stays in the
    race with the next replica's, and the first answer is taken."""
    async def run() -> None:
        stalled = _first_follower(_core(ScriptedReads(set())))
        other = F2 if stalled == F1 else F1
        late, never = asyncio.Event(), asyncio.Event()
        pool = ScriptedReads(set(), slow={stalled: late, other: never})
        core = _core(pool)
        pull = asyncio.ensure_future(fetch(core, QUEUE, 7, suspend_s=0.0))
        async with asyncio.timeout(LIVENESS_S):
            while len(pool.asked) < 2:
                await asyncio.sleep(0.01)
            late.set()
            await pull
            await _until(lambda: pool.cancelled == [other])
        assert pool.asked == [stalled, other]

    asyncio.run(run())


def test_with_every_follower_stalled_a_follower_read_goes_to_the_leader() -> None:
    """Every replica serves committed entries only: when no follower answers, the leader's
    answer is as good, and better than none."""
    async def run() -> None:
        pool = ScriptedReads({F1, F2})
        core = _core(pool)
        async with asyncio.timeout(LIVENESS_S):
            await fetch(core, QUEUE, 7, suspend_s=0.0)
        assert pool.asked[-1] == LEADER
        assert sorted(pool.asked[:2]) == [F1, F2]

    asyncio.run(run())


def test_a_committed_offset_read_from_a_stalled_leader_is_answered_by_a_follower() -> None:
    """The orderly consumer's start reads the group's offset from the leader: a stalled one
    costs a grace, not the request timeout."""
    async def run() -> None:
        pool = ScriptedReads({LEADER}, offset=42)
        core = _core(pool)
        async with asyncio.timeout(LIVENESS_S):
            assert await committed_offset(core, "cg", QUEUE) == 42
        assert pool.asked[0] == LEADER and len(pool.asked) == 2

    asyncio.run(run())


def test_a_read_given_no_hold_waits_its_whole_timeout_at_each_replica_in_turn() -> None:
    """Admin reads (queries by key may take long) keep the old rule: no race, one replica
    after another, each for the whole timeout."""
    async def run() -> None:
        slow = asyncio.Event()
        pool = ScriptedReads(set(), slow={LEADER: slow})
        core = _core(pool)
        read = asyncio.ensure_future(core.read_request(
            "g1", QueryOffsetRequest(group="cg", topic="t", queue_id=0), read_from="leader"))
        async with asyncio.timeout(LIVENESS_S):
            await asyncio.sleep(3 * READ_GRACE_S)
            assert pool.asked == [LEADER]
            slow.set()
            await read
        assert pool.asked == [LEADER]

    asyncio.run(run())


class _Route:
    """The shape ``AsyncPushConsumer`` reads of a route: groups with their addresses."""

    def __init__(self, *addresses: str) -> None:
        self.groups = [type("G", (), {"group": "g1", "addresses": list(addresses)})()]


@pytest.mark.parametrize("silent", [1, 2])
def test_heartbeats_and_unregistering_wait_for_a_majority_of_replicas_not_a_stalled_one(silent: int) -> None:
    """A consumer's start and shutdown send to every replica at once and go on once a
    majority answered: one stalled replica costs nothing; with two, READ_GRACE_S."""
    async def run() -> None:
        pool = ScriptedReads({F1, F2} if silent == 2 else {F1})
        consumer = AsyncPushConsumer(servers=[LEADER, F1, F2], group="cg", topic="t")
        consumer.core.pool = pool  # type: ignore[assignment]

        async def route(topic: str, refresh: bool = False) -> _Route:
            return _Route(LEADER, F1, F2)

        consumer.core.routes.route = route  # type: ignore[method-assign]
        for step in (consumer._heartbeat_once, consumer._unregister):
            began = time.monotonic()
            async with asyncio.timeout(LIVENESS_S):
                await step()
            took = time.monotonic() - began
            # the mechanism, not a speed: with a majority answering it returns before the grace
            # could have run out; without one it waits the grace (the upper bound is LIVENESS_S)
            if silent == 1:
                assert took < READ_GRACE_S * 0.9, f"{step.__name__} waited {took:.2f}s for a stalled replica"
            else:
                assert took >= READ_GRACE_S * 0.9, f"{step.__name__} gave up after {took:.2f}s"
        for call in list(consumer._stragglers):
            call.cancel()
        consumer._pool.shutdown(wait=False)

    asyncio.run(run())
