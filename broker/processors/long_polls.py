"""Parked long polls: a PULL_MESSAGE with nothing to return waits for *its* queue, within caps.

Before (issue 15, row 7) every parked pull waited on one event set for every applied entry,
so 3,000 parked pulls woke 3,000 times per entry (send p99 22 ms -> 2.1 s). Now::

    apply thread: QueueFiles.write_appends ─▶ BrokerStateMachine.on_queues_grown({(topic, qid)})
        ─▶ AppliedSignal.notify(keys)  (call_soon_threadsafe)
        ─▶ loop: only the pulls parked on those keys wake

``ParkedPulls`` counts the parked pulls per connection and in all; a pull that would go
over either cap is answered at once with SYSTEM_BUSY (retriable: the client backs off)
instead of parking. A pull with something to return never parks and is never refused.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Collection, Hashable, Iterator
from typing import Any

from protocol.remoting import FrameError, ResponseCode

__all__ = ["MAX_PARKED_PER_CONNECTION", "MAX_PARKED_TOTAL", "AppliedSignal", "ParkedPulls", "QueueKey"]

#: A push consumer parks one pull per queue it owns: 1024 queues on one connection is a lot.
MAX_PARKED_PER_CONNECTION = 1024
MAX_PARKED_TOTAL = 16384

QueueKey = tuple[str, int]  # (topic, queue id)


class AppliedSignal:
    """Wakes the pulls parked on a queue when the apply step appended to it.

    ``notify`` may be called from any thread (the apply thread); ``wait`` only on ``loop``.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._parked: dict[QueueKey, set[asyncio.Future[None]]] = {}

    def notify(self, queues: Collection[QueueKey]) -> None:
        """``queues`` got new units (any thread; the collection is copied here)."""
        if not queues:
            return
        keys = tuple(queues)
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting
            self._loop.call_soon_threadsafe(self._wake, keys)

    def _wake(self, keys: tuple[QueueKey, ...]) -> None:
        for key in keys:
            for waiter in self._parked.pop(key, ()):
                if not waiter.done():
                    waiter.set_result(None)

    async def wait(self, queue: QueueKey, timeout: float) -> None:
        """Return when ``queue`` grew or after ``timeout`` seconds. The waiter is registered
        before this coroutine first yields, so a caller that checked the queue's end and
        then awaits this misses no append made after the check."""
        waiter = self._loop.create_future()
        parked = self._parked.setdefault(queue, set())
        parked.add(waiter)
        try:
            await asyncio.wait_for(waiter, timeout)
        except TimeoutError:
            pass
        finally:
            parked.discard(waiter)
            if not parked and self._parked.get(queue) is parked:
                del self._parked[queue]

    def parked(self) -> int:
        """How many waiters are registered (for tests and metrics)."""
        return sum(len(s) for s in self._parked.values())


class ParkedPulls:
    """Counts of parked pulls per connection, per user (ACLs on: a quarter of the total, so
    one user cannot take them all -- issue 25, row 9) and in all (event loop only)."""

    def __init__(self, per_connection: int = MAX_PARKED_PER_CONNECTION,
                 total: int = MAX_PARKED_TOTAL) -> None:
        if per_connection < 1 or total < 1:
            raise ValueError("the parked-pull caps must be positive")
        self.per_connection = per_connection
        self.total = total
        self.per_user = max(1, total // 4)
        self._by_connection: dict[Hashable, int] = {}
        self._by_user: dict[str, int] = {}
        self.count = 0

    @contextlib.contextmanager
    def slot(self, connection: Hashable, user: str | None = None) -> Iterator[None]:
        """Hold one parked pull for ``connection`` (of ``user``) while the block runs; over a
        cap, raises FrameError SYSTEM_BUSY (before the block) saying which."""
        held = self._by_connection.get(connection, 0)
        if held >= self.per_connection:
            raise _busy(f"{held} pulls are parked on this connection already (at most "
                        f"{self.per_connection}); retry after one returns")
        by_user = self._by_user.get(user, 0) if user is not None else 0
        if user is not None and by_user >= self.per_user:
            raise _busy(f"{by_user} pulls are parked by user {user!r} already (at most {self.per_user}, "
                        "a quarter of the broker's); retry after one returns")
        if self.count >= self.total:
            raise _busy(f"{self.count} pulls are parked on this broker already (at most "
                        f"{self.total}); retry shortly")
        self._by_connection[connection] = held + 1
        if user is not None:
            self._by_user[user] = by_user + 1
        self.count += 1
        try:
            yield
        finally:
            self.count -= 1
            _release(self._by_connection, connection)
            if user is not None:
                _release(self._by_user, user)


def _release(counts: dict[Any, int], key: Hashable) -> None:
    left = counts[key] - 1
    if left:
        counts[key] = left
    else:
        del counts[key]


def _busy(why: str) -> FrameError:
    return FrameError(ResponseCode.SYSTEM_BUSY, why)
