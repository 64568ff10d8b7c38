"""``RocketConnection``: one TCP connection speaking RocketMQ's remoting protocol
(``protocol.rocketmq.frame``), on a broker's client port or the name server's port (chosen
by ``common.protocol_sniffer``).

Frames are read off the stream as they complete; each request is served on a task of its
own (``serve``), its answer written when ready (answers may overtake each other: the opaque
pairs them, as with RocketMQ's Netty server); a oneway request's answer is dropped. The
connection may send requests of its own (``request``: a transaction check, a membership
notice) and match the responses by opaque.

Bounds: on a broker's port the bytes of frames still arriving count against the port's
budget for all connections (``RocketLimits.meter``: the connection guard, as WebSocket
frames do); a frame over ``max_frame_bytes`` or with a malformed header closes the connection
(RocketMQ's server does the same: the stream cannot be resynchronised); at most
``max_in_flight`` requests (and ``max_in_flight_bytes`` of them) are served at once -- past
that, reading pauses until some are answered; a frame must arrive whole within
``frame_deadline_s`` of its first byte, and a connection with nothing in flight that says
nothing for ``idle_timeout_s`` is closed.

Threads: the event loop only.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from protocol.rocketmq.codes import FrameFlag
from protocol.rocketmq.frame import RemotingFrame, RocketFrameError, decode_frame, read_length

__all__ = ["FrameMeter", "RocketConnection", "RocketLimits", "Serve"]

log = logging.getLogger("broker.rocketmq")

Serve = Callable[["RocketConnection", RemotingFrame], Awaitable[RemotingFrame | None]]


class FrameMeter(Protocol):
    """A port's meter of the bytes of frames still arriving, all connections together
    (``broker.remoting.connection_guard.ConnectionGuard``: past its budget reading pauses;
    a frame late past its deadline closes the connection)."""

    def watch(self, transport: asyncio.BaseTransport | None, ws: Any,
              kill: Callable[[int, str], None]) -> None: ...
    def frame_done(self, transport: asyncio.BaseTransport | None,
                   control_payload: int | None = None) -> None: ...


class RocketLimits:
    """What one RocketMQ connection may hold (module docstring); ``meter``: the port's."""

    def __init__(self, max_frame_bytes: int = 16 << 20, max_in_flight: int = 256,
                 max_in_flight_bytes: int = 64 << 20, frame_deadline_s: float = 30.0,
                 idle_timeout_s: float = 120.0, meter: FrameMeter | None = None) -> None:
        self.max_frame_bytes = max_frame_bytes
        self.max_in_flight = max_in_flight
        self.max_in_flight_bytes = max_in_flight_bytes
        self.frame_deadline_s = frame_deadline_s
        self.idle_timeout_s = idle_timeout_s
        self.meter = meter


class RocketConnection(asyncio.Protocol):
    """One client's RocketMQ connection (module docstring)."""

    def __init__(self, serve: Serve, limits: RocketLimits | None = None,
                 on_close: Callable[[RocketConnection], None] | None = None) -> None:
        self._serve = serve
        self.limits = limits or RocketLimits()
        self._on_close = on_close
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._in_flight_bytes = 0
        self._paused = False
        self._pending: dict[int, asyncio.Future[RemotingFrame]] = {}
        self._opaques = itertools.count(1 << 30)  # our requests' ids, apart from the client's
        self._partial_since: float | None = None
        self._last_heard = 0.0
        self._watch: asyncio.TimerHandle | None = None
        self.closed = False
        self.remote = ""

    # -- asyncio.Protocol -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.remote = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else str(peer)
        self._last_heard = asyncio.get_running_loop().time()
        if self.limits.meter is not None:
            self.limits.meter.watch(transport, self, lambda _code, _reason: self.close())
        self._arm()

    def data_received(self, data: bytes) -> None:
        loop = asyncio.get_running_loop()
        self._last_heard = loop.time()
        self._buffer += data
        try:
            while len(self._buffer) >= 4:
                length = read_length(bytes(self._buffer[:4]), self.limits.max_frame_bytes)
                if len(self._buffer) < 4 + length:
                    break
                payload = bytes(self._buffer[4:4 + length])
                del self._buffer[:4 + length]
                if self.limits.meter is not None:
                    self.limits.meter.frame_done(self._transport)
                self._dispatch(decode_frame(payload), len(payload))
        except RocketFrameError as e:
            log.info("closing the RocketMQ connection of %s: %s", self.remote, e)
            self.close()
            return
        self._partial_since = (self._partial_since or loop.time()) if self._buffer else None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._watch is not None:
            self._watch.cancel()
        for task in list(self._tasks):
            task.cancel()
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ConnectionError("the connection closed"))
        self._pending.clear()
        if self._on_close is not None:
            self._on_close(self)

    # -- frames ------------------------------------------------------------------------------
    def _dispatch(self, frame: RemotingFrame, size: int) -> None:
        if frame.is_response:
            future = self._pending.pop(frame.opaque, None)
            if future is not None and not future.done():
                future.set_result(frame)
            return
        self._in_flight_bytes += size
        task = asyncio.get_running_loop().create_task(self._answer(frame, size))
        self._tasks.add(task)
        limits = self.limits
        if len(self._tasks) >= limits.max_in_flight or self._in_flight_bytes >= limits.max_in_flight_bytes:
            self._pause(True)

    async def _answer(self, frame: RemotingFrame, size: int) -> None:
        try:
            reply = await self._serve(self, frame)
            if reply is not None and not frame.is_oneway:
                self.send(reply)
        except Exception:
            log.exception("serving RocketMQ request %s from %s failed", frame.code, self.remote)
        finally:
            self._in_flight_bytes -= size
            task = asyncio.current_task()
            if task is not None:
                self._tasks.discard(task)
            if (self._paused and len(self._tasks) < self.limits.max_in_flight
                    and self._in_flight_bytes < self.limits.max_in_flight_bytes):
                self._pause(False)

    def send(self, frame: RemotingFrame) -> None:
        """Write ``frame`` (dropped once the connection is closing)."""
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(frame.encode())

    async def request(self, frame: RemotingFrame, timeout_s: float) -> RemotingFrame | None:
        """Send a request of ours and wait for its answer (None: a oneway request, or no
        answer within ``timeout_s``)."""
        opaque = next(self._opaques) % (2**31)
        flag = frame.flag & FrameFlag.ONEWAY
        mine = dataclasses.replace(frame, opaque=opaque, flag=flag)
        if flag:
            self.send(mine)
            return None
        future: asyncio.Future[RemotingFrame] = asyncio.get_running_loop().create_future()
        self._pending[opaque] = future
        self.send(mine)
        try:
            return await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            return None
        finally:
            self._pending.pop(opaque, None)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    # -- bounds ------------------------------------------------------------------------------
    def _pause(self, pause: bool) -> None:
        if self._transport is None or pause == self._paused:
            return
        self._paused = pause
        if pause:
            self._transport.pause_reading()
        else:
            self._transport.resume_reading()

    def pause_reading(self) -> None:  # a connection guard's calls
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        if self._transport is not None and not self._paused:
            self._transport.resume_reading()

    def _arm(self) -> None:
        self._watch = asyncio.get_running_loop().call_later(1.0, self._check_deadlines)

    def _check_deadlines(self) -> None:
        if self.closed:
            return
        now = asyncio.get_running_loop().time()
        if self._partial_since is not None and now - self._partial_since > self.limits.frame_deadline_s:
            log.info("closing the RocketMQ connection of %s: a frame took longer than %g s to arrive",
                     self.remote, self.limits.frame_deadline_s)
            self.close()
            return
        if not self._tasks and now - self._last_heard > self.limits.idle_timeout_s:
            self.close()
            return
        self._arm()
