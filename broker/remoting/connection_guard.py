"""Bounds on the broker's client port before any request is read (issue 15, rows 5 and 6).

Every TCP connection to the client port is accepted by ``broker.remoting.guarded_site`` and passes
the guard before aiohttp sees it::

    accept ─▶ fewer than fd_reserve descriptors left under RLIMIT_NOFILE (``accepting``)?
    │           yes: closed at once, nothing read (the Raft port, the peers and the log's
    │           files keep their descriptors); logged once a minute with a count
    ├─▶ over max_connections, or max_connections_per_address from its address (``admit``)?
    │           yes: its request is answered 503 with the reason (JSON, and the header
    │           X-RaftMQ-Refused for WebSocket clients); closed after REFUSED_GRACE_S anyway
    ▼
    aiohttp's RequestHandler: an HTTP connection with no request for idle_timeout_s is closed
    │ GET /ws: the upgraded connection is watched (``watch``) and read by broker.remoting.frame_reader
    ▼
    data_received: the bytes of WebSocket frames still arriving are metered per connection
      - a frame not whole within frame_deadline_s of its first byte: closed with 1008
        (policy violation) and the reason, logged once a minute
      - all connections' together above max_partial_frame_bytes: the connection that
        brought more is not read until others' frames complete or expire

Without the guard (before issue 15) 40 connections each sending 7 MiB of a frame and then a
byte every 20 s held 300 MB of the leader for ever, and idle connections could take every
descriptor of a replica, which then stopped replicating. The frame reader tells the guard
when a frame completed (``frame_done``) and when it stops reading a connection on purpose
(``hold``: its requests in flight are at their bound; the frame deadline waits meanwhile).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import resource
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from broker.remoting.client_limits import ClientLimits
from common.refusal_log import RefusalLog
from protocol.remoting import REFUSED_HEADER

__all__ = ["CLOSE_WAIT_S", "ConnectionGuard", "FdBudget", "Link", "close_reason"]

log = logging.getLogger("broker.connections")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: a refused connection that sends no request is closed after this long
REFUSED_GRACE_S = 5.0
#: how often deadlines are checked
SWEEP_S = 0.5
#: a WebSocket close the peer does not answer is cut after this long
CLOSE_WAIT_S = 2.0
#: a client's control frame (ping, pong) on the wire: 2 header bytes and the 4-byte mask
#: (its payload is at most 125 bytes)
CONTROL_FRAME_OVERHEAD = 6


def close_reason(text: str) -> bytes:
    """``text`` as a WebSocket close reason: UTF-8, at most 123 bytes (RFC 6455 5.5), cut at a
    character boundary."""
    return text.encode()[:123].decode("utf-8", "ignore").encode()


class FdBudget:
    """Whether another client connection leaves ``reserve`` descriptors free under the soft
    RLIMIT_NOFILE. Open descriptors are counted (``/proc/self/fd``) at most every
    ``sample_s``; between two counts every connection taken is assumed to add one."""

    def __init__(self, reserve: int, *, sample_s: float = 0.1,
                 clock: Callable[[], float] = time.monotonic,
                 count_open: Callable[[], int | None] | None = None,
                 limit: Callable[[], int] | None = None) -> None:
        self._reserve = reserve
        self._sample_s = sample_s
        self._clock = clock
        self._count_open = count_open or _open_descriptors
        self._limit = limit or _descriptor_limit
        self._sampled_at = -float("inf")
        self._open: int | None = None
        self._since = 0

    def room(self) -> bool:
        now = self._clock()
        if now - self._sampled_at >= self._sample_s:
            self._open, self._since, self._sampled_at = self._count_open(), 0, now
        if self._open is None:  # not countable here: max_connections alone bounds them
            return True
        return self._open + self._since + self._reserve < self._limit()

    def took(self) -> None:
        self._since += 1


def _descriptor_limit() -> int:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def _open_descriptors() -> int | None:
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # less the one listdir held
    except OSError as e:
        if e.errno in (errno.EMFILE, errno.ENFILE):
            return _descriptor_limit()  # none left to count them with: full
        return None


@dataclass(slots=True, eq=False)
class Link:
    """One accepted connection, as the guard sees it."""

    address: str
    transport: asyncio.Transport
    protocol: Any  # aiohttp's handler: pause_reading / resume_reading
    opened: float
    refused: str | None = None
    ws: web.WebSocketResponse | None = None
    kill: Callable[[int, str], None] | None = None  # the frame reader's: close with code, reason
    partial: int = 0  # bytes received since the last whole frame
    partial_since: float = 0.0
    paused: bool = False
    held: bool = False
    closing: bool = False


class ConnectionGuard:
    """The client port's connections (event loop only). ``run`` checks deadlines while the
    server runs; ``middleware`` answers the refused connections' requests."""

    def __init__(self, limits: ClientLimits | None = None, *, clock: Callable[[], float] = time.monotonic,
                 fds: FdBudget | None = None) -> None:
        self.limits = limits or ClientLimits()
        self._clock = clock
        self._fds = fds or FdBudget(self.limits.fd_reserve, clock=clock)
        self._links: dict[asyncio.BaseTransport, Link] = {}
        self._per_address: dict[str, int] = {}
        self._admitted = 0
        self._partial_total = 0
        self._paused: dict[Link, None] = {}  # in the order they were paused
        self._refusals = RefusalLog(log, "refused a client connection from")
        self.closed_at_accept = 0  # connections closed for want of descriptors (tests, metrics)

    # -- connections ---------------------------------------------------------------------
    def accepting(self, peer: object) -> bool:
        """Whether a socket just accepted from ``peer`` may stay: False (the caller closes it at
        once) when fewer than ``fd_reserve`` descriptors would be left."""
        if self._fds.room():
            self._fds.took()
            return True
        self.closed_at_accept += 1
        self._refusals.note("descriptors", _host(peer),
                            f"fewer than {self.limits.fd_reserve} file descriptors left under the open-file "
                            "limit: closed at once (the reserve is for the log, its files and the peers)")
        return False

    def note_accept_failed(self, error: OSError) -> None:
        """accept() itself failed: for want of descriptors (something else took the reserve),
        or for one connection (EPROTO, EPERM); the loop goes on after a pause."""
        self._refusals.note("accept failed", "the client port", f"accept() failed: {error}")

    def admit(self, transport: asyncio.Transport, protocol: Any) -> Link:
        """A new connection's link (refused when over a connection cap)."""
        address = _host(transport.get_extra_info("peername"))
        link = Link(address, transport, protocol, self._clock())
        held = self._per_address.get(address, 0)
        if held >= self.limits.max_connections_per_address:
            link.refused = (f"too many connections from {address}: {held} open, at most "
                            f"{self.limits.max_connections_per_address} per address")
        elif self._admitted >= self.limits.max_connections:
            link.refused = (f"too many connections to this broker: {self._admitted} open, at most "
                            f"{self.limits.max_connections}")
        if link.refused is not None:
            self._refusals.note(link.refused.split(":")[0], address, link.refused)
        else:
            self._per_address[address] = held + 1
            self._admitted += 1
        self._links[transport] = link
        return link

    def release(self, link: Link) -> None:
        """The connection is gone."""
        if self._links.pop(link.transport, None) is None:
            return
        if link.refused is None:
            left = self._per_address[link.address] - 1
            if left:
                self._per_address[link.address] = left
            else:
                del self._per_address[link.address]
            self._admitted -= 1
        self._partial_total -= link.partial
        link.partial = 0
        self._paused.pop(link, None)
        self._resume_paused()

    @property
    def open_connections(self) -> int:
        """Admitted connections (refused ones not counted)."""
        return self._admitted

    # -- WebSocket frames -----------------------------------------------------------------
    def watch(self, transport: asyncio.BaseTransport | None, ws: web.WebSocketResponse,
              kill: Callable[[int, str], None]) -> None:
        """The connection on ``transport`` was upgraded to ``ws``: meter its frames; ``kill``
        closes it with a code and a reason."""
        link = self._links.get(transport) if transport is not None else None
        if link is not None:
            link.ws, link.kill = ws, kill

    def received(self, link: Link, size: int) -> bool:
        """``size`` bytes arrived on ``link``: False when they are to be dropped (it is being
        closed for a deadline: nothing more of it is buffered)."""
        if link.closing:
            return False
        if link.ws is None:
            return True
        if link.partial == 0:
            link.partial_since = self._clock()
        link.partial += size
        self._partial_total += size
        if self._partial_total > self.limits.max_partial_frame_bytes and not link.paused:
            link.paused = True
            self._paused[link] = None
            link.protocol.pause_reading()
        return True

    def frame_done(self, transport: asyncio.BaseTransport | None, control_payload: int | None = None) -> None:
        """A whole frame was read from ``transport``: a data frame (every byte so far was
        its), or a control frame of ``control_payload`` bytes (ping, pong)."""
        link = self._links.get(transport) if transport is not None else None
        if link is None or link.partial == 0:
            return
        done = link.partial if control_payload is None else min(
            link.partial, CONTROL_FRAME_OVERHEAD + control_payload)
        link.partial -= done
        self._partial_total -= done
        if link.paused and link.partial == 0:
            self._paused.pop(link, None)
            link.paused = False
            link.protocol.resume_reading()
        self._resume_paused()

    def hold(self, transport: asyncio.BaseTransport | None, held: bool) -> None:
        """The reader stops (``held``) or resumes reading the connection on purpose; a frame's
        deadline does not run meanwhile."""
        link = self._links.get(transport) if transport is not None else None
        if link is not None:
            link.held = held
            if not held and link.partial:
                link.partial_since = self._clock()

    def _resume_paused(self) -> None:
        while self._paused and self._partial_total < self.limits.max_partial_frame_bytes:
            link = next(iter(self._paused))
            del self._paused[link]
            link.paused = False
            link.protocol.resume_reading()

    # -- HTTP -------------------------------------------------------------------------------
    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Answers a refused connection's request with 503 and the reason, and closes it."""
        link = self._links.get(request.transport) if request.transport is not None else None
        if link is None or link.refused is None:
            return await handler(request)
        resp = web.json_response({"error": link.refused, "reason": "connection limit"}, status=503,
                                 headers={REFUSED_HEADER: link.refused})
        resp.force_close()
        return resp

    # -- deadlines ----------------------------------------------------------------------------
    async def run(self) -> None:
        """Close what is past its deadline, every SWEEP_S, until cancelled."""
        while True:
            await asyncio.sleep(SWEEP_S)
            try:
                self.sweep()
            except Exception:  # never stop checking deadlines
                log.exception("checking the client connections' deadlines failed")

    def sweep(self) -> None:
        now = self._clock()
        deadline = self.limits.frame_deadline_s
        for link in list(self._links.values()):
            if link.closing:
                continue
            if link.refused is not None and link.ws is None and now - link.opened > REFUSED_GRACE_S:
                link.closing = True
                link.transport.close()
            elif (link.ws is not None and link.partial and not link.held
                  and now - link.partial_since > deadline):
                why = (f"a frame took longer than {deadline:g} s to arrive ({link.partial} bytes of it "
                       "came); send each frame at once")
                self._refusals.note("frame deadline", link.address, why)
                self.close(link, 1008, why)

    def close(self, link: Link, code: int, reason: str) -> None:
        """Close ``link`` with ``code`` and ``reason``; what it sends meanwhile is dropped (its
        frame's bytes stay counted until it is gone: aiohttp holds them until then)."""
        link.closing = True
        if link.paused:  # read (and drop) what it sends, so the close is not cut by a reset
            self._paused.pop(link, None)
            link.paused = False
            link.protocol.resume_reading()
        if link.kill is not None:
            link.kill(code, reason)
        else:
            link.transport.close()

    async def background(self, _app: web.Application) -> AsyncIterator[None]:
        """For ``app.cleanup_ctx``: the deadline checks run while the app does."""
        task = asyncio.create_task(self.run())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _host(peer: object) -> str:
    return str(peer[0]) if isinstance(peer, tuple) and peer else str(peer)
