"""One read raced over a group's replicas: how a consumer leaves a stalled replica (issue 35).

    the replicas, best first ──▶ the first is asked
        it answers            ──▶ that answer (every replica serves committed entries
                                  only, so any replica's answer is right)
        it fails (retriable)  ──▶ the next is asked at once
        it is overdue         ──▶ it is reported stalled (``on_stalled``: the caller reads it
                                  last for a while) and the next is asked at once; the
                                  overdue read still races, the first answer wins and the
                                  reads still running are cancelled

Overdue: unanswered ``READ_GRACE_S`` past the time the replica may rightly hold the read
(``hold_s``: a pull's long poll, 0 for a quick read), or -- while it holds a long poll
longer than that -- silent to a liveness check: ``ReplicaLiveness`` asks it a cheap
question (GET_ROUTE) ``READ_GRACE_S`` after the read was sent and every ``CHECK_EVERY_S``
after, and no answer within ``READ_GRACE_S`` means stalled. So a 15 s long poll on a
SIGSTOPped follower is left after about a second, not 15.5 s. A replica that is only slow
loses nothing but the race. For the client's event loop only.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from client.errors import ClientError, ConnectionLostError, RequestTimeoutError, RouteNotFoundError
from protocol.remoting import Frame
from protocol.topic import GetRouteRequest

__all__ = ["CHECK_EVERY_S", "READ_GRACE_S", "ReplicaLiveness", "race_read"]

log = logging.getLogger("client")

#: A read unanswered this long past the time its replica may rightly hold it (a pull's
#: long poll) is overdue: serving one takes milliseconds, so the replica is stalled or
#: cut off. About an election timeout (dledger ``election_timeout_ms`` = 300-800 ms).
READ_GRACE_S = 0.5
#: While a replica holds a long poll, it is checked this often (after READ_GRACE_S first).
CHECK_EVERY_S = 1.0

Call = Callable[[str, GetRouteRequest, float], Awaitable[Frame]]


class ReplicaLiveness:
    """Whether a replica answers at all: GET_ROUTE of a topic within ``READ_GRACE_S`` (any
    answer counts, a refusal too). One check per replica at a time; its answer is reused
    for half of ``CHECK_EVERY_S`` by every read waiting on that replica. ``call(address,
    request, timeout)`` sends one request (the connection pool's ``call``)."""

    def __init__(self, call: Call) -> None:
        self._call = call
        self._running: dict[str, asyncio.Future[bool]] = {}
        self._answered: dict[str, tuple[float, bool]] = {}  # address -> (at, alive)

    async def alive(self, address: str, topic: str) -> bool:
        shared = self._answered.get(address)
        if shared is not None and time.monotonic() - shared[0] < CHECK_EVERY_S / 2:
            return shared[1]
        running = self._running.get(address)
        if running is None:
            running = self._running[address] = asyncio.ensure_future(self._check(address, topic))
            running.add_done_callback(lambda _: self._running.pop(address, None))
        answer = await asyncio.shield(running)
        self._answered[address] = (time.monotonic(), answer)
        return answer

    async def _check(self, address: str, topic: str) -> bool:
        try:
            async with asyncio.timeout(READ_GRACE_S):  # connecting too: a stalled replica accepts nothing
                await self._call(address, GetRouteRequest(topic=topic), READ_GRACE_S)
        except (ClientError, TimeoutError):
            return False
        return True


async def race_read(addresses: Sequence[str], ask: Callable[[str], Awaitable[Frame]], *,
                    hold_s: float | None, on_stalled: Callable[[str], None],
                    alive: Callable[[str], Awaitable[bool]] | None = None) -> tuple[str, Frame]:
    """(the replica that answered first, its answer) of ``ask(address)`` over ``addresses``
    in order (module docstring). ``hold_s`` None: one replica after another, each for as
    long as ``ask`` waits (no race). ``alive``: the liveness check of long polls (None:
    none). Raises a non-retriable error at once, the last retriable one when every replica
    failed."""
    overdue_s = math.inf if hold_s is None else hold_s + READ_GRACE_S
    checking = alive is not None and hold_s is not None and hold_s > READ_GRACE_S
    racing: dict[asyncio.Future[Frame], str] = {}
    asked: list[str] = []
    last: ClientError | None = None
    newest_at = check_at = math.inf
    check: asyncio.Future[bool] | None = None
    move_on = True  # ask the next replica now
    try:
        while True:
            if move_on and len(asked) < len(addresses):
                if check is not None:
                    check.cancel()
                    check = None
                asked.append(addresses[len(asked)])
                newest_at = time.monotonic()
                check_at = newest_at + READ_GRACE_S if checking else math.inf
                read = asyncio.ensure_future(ask(asked[-1]))
                read.add_done_callback(_outcome_seen)  # a read left racing may end in an error
                racing[read] = asked[-1]
            elif not racing:
                raise last or RouteNotFoundError("no replica to read from is known")
            move_on = False
            more = len(asked) < len(addresses)
            wake = min(newest_at + overdue_s, check_at if check is None else math.inf) if more else math.inf
            waiting: set[asyncio.Future[Any]] = {*racing, *([check] if check is not None else [])}
            timeout = None if wake == math.inf else max(0.0, wake - time.monotonic())
            done, _ = await asyncio.wait(waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            for future in done:
                address = racing.pop(future, None)
                if address is None:
                    continue  # the liveness check: below
                try:
                    return address, future.result()
                except ClientError as e:
                    if not e.retriable:
                        raise
                    last, move_on = e, True
                    if isinstance(e, RequestTimeoutError | ConnectionLostError):
                        on_stalled(address)
            silent = False
            if check is not None and check.done():
                silent = not check.result()
                check, check_at = None, time.monotonic() + CHECK_EVERY_S
            if move_on or not more:
                continue
            if silent or time.monotonic() >= newest_at + overdue_s:
                on_stalled(asked[-1])
                log.info("%s holds a read past its time (%s); %s asked too", asked[-1],
                         "no answer to a liveness check" if silent else f"{overdue_s:.1f} s",
                         addresses[len(asked)])
                move_on = True
            elif check is None and alive is not None and time.monotonic() >= check_at:
                check = asyncio.ensure_future(alive(asked[-1]))
    finally:
        for future in racing:
            future.cancel()
        if check is not None:
            check.cancel()


def _outcome_seen(read: asyncio.Future[Frame]) -> None:
    """Marks a read's error as looked at: a read given up while racing is not a loose end."""
    if not read.cancelled():
        read.exception()
