"""Reading one client's WebSocket: frames in, answered pings, an idle timeout, and a bound on
the requests it has being served at once.

    ws = open_websocket(max_msg_size)     a WebSocketResponse with autoping off (pings are
                                          answered here, so they count as activity and the
                                          guard sees every frame end) and a short close wait
    reader = FrameReader(ws, transport, guard)
    async for data in reader.frames():    bytes of a binary frame, str of a text one
        reader.spawn(serve(data), len(data))

``frames`` stops reading while the requests in flight hold ``max_inflight_bytes`` (each
counted at least ``MIN_CHARGE``): aiohttp then stops reading the socket and TCP holds the
client back. It closes the connection (1000, "idle ...") after ``idle_timeout_s`` with no
frame, no ping and no request in progress. ``kill(code, reason)`` (the guard's deadline, an
unreadable frame) interrupts the frame being received and closes with that code and reason;
the close is sent from here, not from another task, so aiohttp waits ``CLOSE_WAIT_S`` for
the client's answer before it cuts the connection: the client can read why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web

from broker.remoting.connection_guard import CLOSE_WAIT_S, ConnectionGuard, close_reason

log = logging.getLogger("broker.server")

__all__ = ["MIN_CHARGE", "FrameReader", "open_websocket"]

#: what a request counts against max_inflight_bytes at least (bounds the number of tasks)
MIN_CHARGE = 1024

_ENDS = frozenset({WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR})


def open_websocket(max_msg_size: int) -> web.WebSocketResponse:
    """The server side of a client WebSocket (``prepare`` it with the request)."""
    return web.WebSocketResponse(max_msg_size=max_msg_size, autoping=False, timeout=CLOSE_WAIT_S)


class FrameReader:
    """One connection's frames and the tasks serving them (event loop only)."""

    def __init__(self, ws: web.WebSocketResponse, transport: asyncio.BaseTransport | None,
                 guard: ConnectionGuard) -> None:
        self.ws = ws
        self._transport = transport
        self._guard = guard
        self._idle_s = guard.limits.idle_timeout_s
        self._max_inflight = guard.limits.max_inflight_bytes
        self._inflight = 0
        self._room = asyncio.Event()
        self._room.set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._receiving: asyncio.Timeout | None = None  # while a frame is awaited
        self._kill: tuple[int, str] | None = None
        guard.watch(transport, ws, self.kill)

    async def frames(self) -> AsyncIterator[bytes | str]:
        """Data frames until the connection ends (closed by either side, idle, or an error)."""
        ws = self.ws
        while not ws.closed and self._kill is None:
            await self._wait_for_room()
            if self._kill is not None:
                break
            try:
                async with asyncio.timeout(self._idle_s) as self._receiving:
                    msg = await ws.receive()
            except TimeoutError:
                if self._kill is not None:
                    break
                if self._tasks:  # requests in progress (a parked pull): not idle
                    continue
                await self.close(WSCloseCode.OK, f"idle for {self._idle_s:g} s: no frame, ping or "
                                                 "request in progress")
                return
            finally:
                self._receiving = None
            if msg.type == WSMsgType.PING:
                self._guard.frame_done(self._transport, len(msg.data))
                with contextlib.suppress(ConnectionError, RuntimeError):
                    await ws.pong(msg.data)
                continue
            if msg.type == WSMsgType.PONG:
                self._guard.frame_done(self._transport, len(msg.data))
                continue
            if msg.type in _ENDS:
                return
            self._guard.frame_done(self._transport)
            yield msg.data
        if self._kill is not None:
            await self.close(*self._kill)

    def kill(self, code: int, reason: str) -> None:
        """End the connection with ``code`` and ``reason``: the frame being received is given
        up and ``frames`` closes the WebSocket (any task of the loop may call this)."""
        if self._kill is not None or self.ws.closed:
            return
        self._kill = (code, reason)
        if self._receiving is not None:
            with contextlib.suppress(RuntimeError):  # expiring already: frames() sees _kill
                self._receiving.reschedule(asyncio.get_running_loop().time())
        self._room.set()  # a reader held back for room goes on to the close

    def spawn(self, work: Coroutine[Any, Any, None], size: int) -> None:
        """Serve one request (``size`` bytes) in its own task, counted in flight until done."""
        charge = max(size, MIN_CHARGE)
        self._inflight += charge
        if self._inflight >= self._max_inflight:
            self._room.clear()
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._done(t, charge))

    def _done(self, task: asyncio.Task[None], charge: int) -> None:
        self._tasks.discard(task)
        self._inflight -= charge
        if self._inflight < self._max_inflight:
            self._room.set()
        error = None if task.cancelled() else task.exception()
        if isinstance(error, ConnectionResetError):  # the client went away mid-answer
            log.debug("an answer was not sent: the connection is closing (%s)", error)
        elif error is not None:
            log.error("serving a request failed", exc_info=error)

    async def _wait_for_room(self) -> None:
        if self._room.is_set():
            return
        self._guard.hold(self._transport, True)
        try:
            await self._room.wait()
        finally:
            self._guard.hold(self._transport, False)

    async def close(self, code: int, reason: str) -> None:
        """Close the WebSocket with ``code`` and ``reason`` (cut short to what a close frame holds)."""
        with contextlib.suppress(Exception):
            await self.ws.close(code=code, message=close_reason(reason))

    def cancel(self) -> None:
        """The connection ended: stop serving its requests."""
        for task in self._tasks:
            task.cancel()
