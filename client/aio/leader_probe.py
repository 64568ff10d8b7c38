"""The client's own failure detector: who leads a group now, asked of its other replicas.

A write that has waited about an election timeout (``PROBE_AFTER_S``) without an answer
may be waiting on a leader that is gone, cut off or stalled. ``LeaderProbe.newer_leader``
then asks every other replica of the group at once for a topic's route (GET_ROUTE: each
answers with the leader it follows and its term) and returns the leader the answer of
the highest term names, if that is not the replica being waited on. The caller resends
there (every write is safe to repeat: ``client.aio.core``). One probe per group runs at
a time; requests waiting on the same group share it and its answer for ``SHARED_S``.

A stale answer (a replica that has not heard of the newest leader) can only name an
older leader, at a term no higher than the newest answer's; a redirect from a replica
that does not lead costs one NOT_LEADER round trip back. Nothing here decides what is
committed: it only picks where to send next.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

from client.errors import ClientError
from protocol.remoting import Frame, FrameError, ResponseCode
from protocol.topic import GetRouteRequest, RouteResponse

__all__ = ["PROBE_AFTER_S", "PROBE_EVERY_S", "LeaderProbe"]

#: A write unanswered this long has the other replicas asked who leads: about the
#: election timeout's lower bound (dledger ``election_timeout_ms`` = 300-800 ms). A
#: commit takes milliseconds; a write waiting this long waits on a leader in trouble.
PROBE_AFTER_S = 0.3
#: Asked again this often while the write still waits and no newer leader was named.
PROBE_EVERY_S = 0.15
#: One probe's answers are shared by the requests that ask within this long.
SHARED_S = 0.1

Call = Callable[[str, GetRouteRequest, float], Awaitable[Frame]]


class LeaderProbe:
    """Asks a group's replicas who leads; ``call(address, request, timeout)`` sends one
    request (the connection pool's ``call``), ``dial`` maps an address a broker gives to
    the one to connect to. For the client's event loop only."""

    def __init__(self, call: Call, dial: Callable[[str], str]) -> None:
        self._call = call
        self._dial = dial
        self._running: dict[str, asyncio.Future[tuple[str | None, int]]] = {}
        self._answered: dict[str, tuple[float, str | None, int]] = {}  # group -> (at, leader, term)

    async def newer_leader(self, group: str, topic: str, replicas: list[str], waiting_on: str,
                           timeout: float) -> str | None:
        """The leader named by the highest-term answer of ``replicas`` other than
        ``waiting_on``, if it is another replica; None when none names one, all name
        ``waiting_on`` or none answers within ``timeout``."""
        others = [a for a in replicas if a != waiting_on]
        if not others:
            return None
        shared = self._answered.get(group)
        if shared is not None and time.monotonic() - shared[0] < SHARED_S:
            leader = shared[1]
        else:
            running = self._running.get(group)
            if running is None:
                running = self._running[group] = asyncio.ensure_future(self._ask(others, topic, timeout))
                running.add_done_callback(lambda _: self._running.pop(group, None))
            leader, term = await asyncio.shield(running)
            self._answered[group] = (time.monotonic(), leader, term)
        return leader if leader is not None and leader != waiting_on else None

    async def _ask(self, addresses: list[str], topic: str, timeout: float) -> tuple[str | None, int]:
        """(leader, term) of the highest-term answer naming a leader; (None, -1) if none."""
        best: tuple[str | None, int] = (None, -1)
        calls = [asyncio.ensure_future(self._route_of(a, topic, timeout)) for a in addresses]
        try:
            for done in asyncio.as_completed(calls):
                with contextlib.suppress(ClientError, FrameError, TimeoutError):
                    leader, term = await done
                    if leader is not None and term > best[1]:
                        best = (self._dial(leader), term)
        finally:
            for c in calls:
                c.cancel()
        return best

    async def _route_of(self, address: str, topic: str, timeout: float) -> tuple[str | None, int]:
        async with asyncio.timeout(timeout):  # connecting too: a hung replica answers nothing
            reply = await self._call(address, GetRouteRequest(topic=topic), timeout)
        if reply.code != ResponseCode.SUCCESS:
            return None, -1
        group = RouteResponse.from_frame(reply).route.groups[0]
        return group.leader, group.term if group.term is not None else -1
