"""A load generator for a LocalGroup: unique payloads to the leader, outcomes in a History.

Runs an asyncio loop in a background thread with ``workers`` concurrent
proposers. Each payload is used once: after an unknown outcome the worker moves
on to a new payload (no blind retries), so any duplicate in the log is a bug.
"""

from __future__ import annotations

import asyncio
import threading
import time

import aiohttp

from raftmq.local_group import LocalGroup
from tests.support.history import History

__all__ = ["LogLoad"]

RETRY_PAUSE_S = 0.05  # back-off after a refused proposal (not synchronisation)


class LogLoad:
    def __init__(self, group: LocalGroup, history: History, *, workers: int = 16,
                 payload_bytes: int = 200, prefix: str = "p", limit: int | None = None) -> None:
        self.group = group
        self.history = history
        self.workers = workers
        self.payload_bytes = payload_bytes
        self.prefix = prefix
        self.limit = limit
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="log-load", daemon=True)
        self._leader_http: str | None = None
        self._by_address = {n.raft: n.http for n in group.nodes.values()}
        self.errors: dict[str, int] = {}

    def start(self) -> LogLoad:
        self._thread.start()
        return self

    def __enter__(self) -> LogLoad:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError("load generator did not stop")

    def wait_acked(self, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.history.acked_count < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {self.history.acked_count} of {n} acked after "
                                   f"{timeout}s; errors {self.errors}")
            if not self._thread.is_alive():
                raise RuntimeError("load generator died")
            self._stop.wait(0.05)

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        timeout = aiohttp.ClientTimeout(total=15)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            await asyncio.gather(*(self._worker(session, w) for w in range(self.workers)))

    def _count(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1

    def _next_target(self) -> str:
        if self._leader_http:
            return self._leader_http
        alive = [n.http for n in self.group.nodes.values() if n.alive]
        return alive[int(time.monotonic() * 10) % len(alive)] if alive else ""

    async def _worker(self, session: aiohttp.ClientSession, w: int) -> None:
        seq = 0
        while not self._stop.is_set():
            if self.limit is not None and self.history.acked_count >= self.limit:
                return
            payload = f"{self.prefix}-{w}-{seq}-".encode().ljust(self.payload_bytes, b".")
            seq += 1
            target = self._next_target()
            if not target:
                await asyncio.sleep(RETRY_PAUSE_S)
                continue
            await self._propose(session, target, payload)

    async def _propose(self, session: aiohttp.ClientSession, target: str, payload: bytes) -> None:
        try:
            async with session.post(f"http://{target}/propose", data=payload) as resp:
                body = await resp.json(content_type=None)
                status = resp.status
        except aiohttp.ClientConnectorError:
            self.history.fail(payload)  # never reached the node
            self._leader_http = None
            self._count("connect")
            await asyncio.sleep(RETRY_PAUSE_S)
            return
        except (TimeoutError, aiohttp.ClientError):
            self.history.maybe(payload)
            self._leader_http = None
            self._count("io")
            return
        if status == 200:
            self.history.ok(payload, body["index"])
            self._leader_http = target
            return
        if status == 409:
            self.history.maybe(payload)
            self._count("unknown")
        else:
            self.history.fail(payload)
            self._count(str(status))
        hint = body.get("leader_address") if status == 421 else None
        self._leader_http = self._by_address.get(hint) if hint else None
        await asyncio.sleep(RETRY_PAUSE_S)
