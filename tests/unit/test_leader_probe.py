"""The client's own failure detector (issue 35, ``client/aio/leader_probe.py``): a write
left unanswered by a silent leader is resent to the leader the other replicas name at the
newest term, without waiting for any attempt timeout; a slow leader the others still
follow keeps the write.

The pool is scripted: the old leader never answers (no timeout of its own either), so a
client that waits for its attempt timeout would wait for the whole request timeout (an
hour here); the test's liveness bound (30 s) fails it."""

from __future__ import annotations

import asyncio

import pytest

from client.aio.core import ClientCore
from client.aio.pull_consumer import commit_offset
from client.aio.queue_locks import lock_queues
from client.backoff import Deadline
from client.queues import MessageQueue
from protocol.offset import CommitOffsetRequest, LockQueuesRequest, LockQueuesResponse, UnlockQueuesRequest
from protocol.remoting import Frame
from protocol.topic import GetRouteRequest, GroupRouteData, RouteResponse, TopicRouteData
from protocol.wire import EmptyResponse, Request

OLD, NEW, THIRD = "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"
LIVENESS_S = 30.0


class ScriptedPool:
    """``silent`` never answer writes; the others answer SUCCESS; every replica answers
    GET_ROUTE with ``named`` (leader address, term) for it."""

    def __init__(self, silent: set[str], named: dict[str, tuple[str | None, int]],
                 answers_after: dict[str, asyncio.Event] | None = None) -> None:
        self.silent = silent
        self.named = named
        self.answers_after = answers_after or {}
        self.writes: list[str] = []
        self.requests: list[Request] = []
        self.cancelled: list[str] = []
        self.probes: list[str] = []

    async def request(self, address: str, request: Request, timeout: float = 10.0,
                      ok: tuple[int, ...] = (0,)) -> Frame:
        self.writes.append(address)
        self.requests.append(request)
        frame = request.to_frame(len(self.writes))
        try:
            if address in self.silent:
                await asyncio.Event().wait()  # forever: only a cancel ends it
            if address in self.answers_after:
                await self.answers_after[address].wait()
        except asyncio.CancelledError:
            self.cancelled.append(address)
            raise
        if isinstance(request, LockQueuesRequest):  # unlock too: every queue asked for is granted
            return LockQueuesResponse(queue_ids=request.queues).reply(frame)
        return EmptyResponse().reply(frame)

    async def call(self, address: str, request: Request, timeout: float = 10.0) -> Frame:
        assert isinstance(request, GetRouteRequest)
        self.probes.append(address)
        leader, term = self.named[address]
        group = GroupRouteData(group="g1", queues=1, perm=6, term=term, leader=leader,
                               replicas={"n1": OLD, "n2": NEW, "n3": THIRD})
        return RouteResponse(route=TopicRouteData(request.topic, (group,))).reply(request.to_frame(1))

    async def close(self) -> None:
        pass


def _core(pool: ScriptedPool) -> ClientCore:
    core = ClientCore(servers=[OLD, NEW, THIRD], request_timeout=3600.0)
    core.pool = pool  # type: ignore[assignment]
    core.routes.register_group("g1", [OLD, NEW, THIRD])
    core.routes.set_leader("g1", OLD)
    return core


def _write() -> Request:
    return GetRouteRequest(topic="t")  # any request: the scripted pool answers every write


def test_a_silent_leaders_write_is_resent_to_the_leader_the_others_name() -> None:
    async def run() -> None:
        pool = ScriptedPool({OLD}, {NEW: (NEW, 8), THIRD: (NEW, 8)})
        core = _core(pool)
        async with asyncio.timeout(LIVENESS_S):
            reply = await core.leader_request("g1", _write(), deadline=Deadline(3600.0), topic="t")
        assert reply.code == 0
        assert pool.writes == [OLD, NEW]  # abandoned at the silent leader, resent once
        assert pool.cancelled == [OLD]
        assert sorted(set(pool.probes)) == [NEW, THIRD]  # the others asked, never the silent one
        assert core.routes.leader("g1") == NEW

    asyncio.run(run())


def test_a_stale_answer_loses_to_the_newest_term() -> None:
    """THIRD has not heard of the election yet (names the silent OLD at term 7); NEW's
    answer at term 8 wins."""
    async def run() -> None:
        pool = ScriptedPool({OLD}, {NEW: (NEW, 8), THIRD: (OLD, 7)})
        core = _core(pool)
        async with asyncio.timeout(LIVENESS_S):
            await core.leader_request("g1", _write(), deadline=Deadline(3600.0), topic="t")
        assert pool.writes == [OLD, NEW]

    asyncio.run(run())


@pytest.mark.parametrize("named", [(OLD, 7), (None, 7)], ids=["others_follow_it", "others_know_none"])
def test_a_slow_leader_keeps_its_write_while_no_newer_leader_is_named(named: tuple[str | None, int]) -> None:
    """The others still follow the slow leader (or know no leader yet): the write stays
    where it is, probed again and again, and is answered there."""
    async def run() -> None:
        slow = asyncio.Event()
        pool = ScriptedPool(set(), {NEW: named, THIRD: named}, answers_after={OLD: slow})
        core = _core(pool)
        write = asyncio.ensure_future(core.leader_request("g1", _write(), deadline=Deadline(3600.0),
                                                          topic="t"))
        async with asyncio.timeout(LIVENESS_S):
            while len(pool.probes) < 4:  # two probes of both others at least
                await asyncio.sleep(0.01)
            slow.set()
            reply = await write
        assert reply.code == 0
        assert pool.writes == [OLD] and pool.cancelled == []

    asyncio.run(run())


@pytest.mark.parametrize("take", [True, False], ids=["lock", "unlock"])
def test_an_orderly_consumers_lock_at_a_silent_leader_goes_to_the_leader_the_others_name(take: bool) -> None:
    """LOCK_BATCH_MQ / UNLOCK_BATCH_MQ are writes to the leader: probed like any other
    (issue 35), so a stalled leader costs a probe, not the locks' 3 s deadline -- held, not
    undecided."""
    async def run() -> None:
        pool = ScriptedPool({OLD}, {NEW: (NEW, 8), THIRD: (NEW, 8)})
        core = _core(pool)
        queues = [MessageQueue("t", "g1", 0), MessageQueue("t", "g1", 1)]
        async with asyncio.timeout(2.5):  # within the locks' own 3 s deadline
            held, undecided = await lock_queues(core, "cg", "me", queues, take=take)
        assert held == set(queues) and undecided == set()
        assert pool.writes == [OLD, NEW]
        kind = LockQueuesRequest if take else UnlockQueuesRequest
        assert all(type(r) is kind for r in pool.requests)

    asyncio.run(run())


def test_an_offset_commit_at_a_silent_leader_goes_to_the_leader_the_others_name() -> None:
    async def run() -> None:
        pool = ScriptedPool({OLD}, {NEW: (NEW, 8), THIRD: (NEW, 8)})
        core = _core(pool)
        async with asyncio.timeout(LIVENESS_S):
            await commit_offset(core, "cg", MessageQueue("t", "g1", 0), 17, timeout=3600.0)
        assert pool.writes == [OLD, NEW]
        assert all(isinstance(r, CommitOffsetRequest) and r.offset == 17 for r in pool.requests)

    asyncio.run(run())
