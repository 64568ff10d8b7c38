"""The client port's listening socket and accept loop, and aiohttp's protocol behind the guard.

    runner = GuardedRunner(app, guard)          # web.AppRunner whose connections pass ``guard``
    await runner.setup()
    await GuardedSite(runner, host, port).start()    # (ssl_context= as TCPSite's)

``GuardedSite`` accepts one socket at a time and asks the guard first
(``ConnectionGuard.accepting``): with too few descriptors left the socket is closed at once
-- its descriptor is back before the next accept -- and when accept() itself fails for want
of descriptors it waits ``ACCEPT_RETRY_S`` and logs once a minute. asyncio's own server
(what ``web.TCPSite`` uses) accepts up to ``backlog`` sockets in a burst before any code may
refuse them, and on EMFILE logs a traceback per attempt in a tight loop: a follower at its
open-file limit wrote 491 MB of log in 3 minutes and stopped applying (tests/security/
test_descriptors.py against the branch point).

``GuardedProtocol`` stands in front of aiohttp's ``RequestHandler`` for one connection: it
registers the connection with the guard (caps), meters what arrives (frames still arriving)
and drops what a connection being closed for a deadline still sends. Only asyncio's public
Protocol calls are used.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
from collections.abc import Callable
from ssl import SSLContext
from typing import Any

from aiohttp import web

from broker.remoting.connection_guard import ConnectionGuard, Link
from common.protocol_sniffer import ProtocolSniffer

__all__ = ["ACCEPT_RETRY_S", "GuardedProtocol", "GuardedRunner", "GuardedSite"]

log = logging.getLogger("broker.connections")

ACCEPT_RETRY_S = 0.5
HANDSHAKE_TIMEOUT_S = 10.0  # a TLS handshake (asyncio's default: 60 s)


class GuardedProtocol(asyncio.Protocol):
    """aiohttp's protocol for one connection, behind the guard."""

    __slots__ = ("_guard", "_inner", "_link")

    def __init__(self, inner: Any, guard: ConnectionGuard) -> None:
        self._inner = inner
        self._guard = guard
        self._link: Link | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._link = self._guard.admit(transport, self._inner)  # type: ignore[arg-type]
        if isinstance(self._inner, ProtocolSniffer):  # over a cap: a RocketMQ client is closed at once
            self._inner.refused = self._link.refused
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._link is not None and self._guard.received(self._link, len(data)):
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._link is not None:
            self._guard.release(self._link)
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


class _GuardedServer:
    """aiohttp's ``web.Server`` whose protocols are behind the guard (the rest delegated)."""

    def __init__(self, server: web.Server, guard: ConnectionGuard,
                 alternate: Callable[[], asyncio.Protocol] | None = None) -> None:
        self._server = server
        self._guard = guard
        self._alternate = alternate

    def __call__(self) -> GuardedProtocol:
        if self._alternate is None:
            return GuardedProtocol(self._server(), self._guard)
        return GuardedProtocol(ProtocolSniffer(self._server, self._alternate), self._guard)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)


class GuardedRunner(web.AppRunner):
    """``web.AppRunner`` whose connections pass ``guard`` (serve it with ``GuardedSite``).
    ``alternate``: the protocol of connections whose first byte is not HTTP's (RocketMQ's
    remoting frames, ``common.protocol_sniffer``); None: HTTP only."""

    def __init__(self, app: web.Application, guard: ConnectionGuard, *,
                 alternate: Callable[[], asyncio.Protocol] | None = None, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.guard = guard
        self._alternate = alternate

    async def _make_server(self) -> web.Server:
        return _GuardedServer(await super()._make_server(), self.guard,  # type: ignore[return-value]
                              self._alternate)


class _Listening:
    """What ``BaseSite.stop`` and ``BaseRunner.addresses`` need of a site's server."""

    def __init__(self, socks: list[socket.socket], accepting: list[asyncio.Task[None]]) -> None:
        self.sockets = socks
        self._accepting = accepting

    def close(self) -> None:
        for task in self._accepting:
            task.cancel()
        for sock in self.sockets:
            sock.close()


class GuardedSite(web.BaseSite):
    """A TCP site of a ``GuardedRunner`` with its own accept loop (module docstring)."""

    __slots__ = ("_handshakes", "_host", "_port")

    def __init__(self, runner: GuardedRunner, host: str, port: int, *,
                 ssl_context: SSLContext | None = None, backlog: int = 128) -> None:
        super().__init__(runner, ssl_context=ssl_context, backlog=backlog)
        self._host = host
        self._port = port
        self._handshakes: set[asyncio.Task[Any]] = set()

    @property
    def name(self) -> str:
        return f"{'https' if self._ssl_context else 'http'}://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(self._host or None, self._port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
        socks: list[socket.socket] = []
        try:
            for family, address in dict.fromkeys((info[0], info[4]) for info in infos):  # once each
                socks.append(socket.create_server(address, family=family, backlog=self._backlog))
                socks[-1].setblocking(False)
        except OSError:
            for sock in socks:
                sock.close()
            raise
        self._server = _Listening(socks, [loop.create_task(self._accept(sock)) for sock in socks])

    async def _accept(self, sock: socket.socket) -> None:
        runner = self._runner
        assert isinstance(runner, GuardedRunner)
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, peer = await loop.sock_accept(sock)
            except ConnectionAbortedError:
                continue  # the peer gave up while in the backlog
            except OSError as e:
                if sock.fileno() == -1 or e.errno in (errno.EBADF, errno.EINVAL):
                    return  # the listening socket was closed: the site stopped
                runner.guard.note_accept_failed(e)  # out of descriptors, EPROTO, EPERM, ...
                await asyncio.sleep(ACCEPT_RETRY_S)
                continue
            if not runner.guard.accepting(peer):
                conn.close()
                continue
            conn.setblocking(False)
            task = loop.create_task(self._connect(conn))
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)

    async def _connect(self, conn: socket.socket) -> None:
        """``conn`` served by the runner's server (after its TLS handshake, with TLS)."""
        factory = self._runner.server
        assert factory is not None
        tls: dict[str, Any] = {} if self._ssl_context is None else {
            "ssl": self._ssl_context, "ssl_handshake_timeout": HANDSHAKE_TIMEOUT_S}
        try:
            await asyncio.get_running_loop().connect_accepted_socket(factory, conn, **tls)  # type: ignore[arg-type]
        except Exception as e:  # a failed handshake: nothing was served
            log.debug("connection not served: %s", e)
            with contextlib.suppress(OSError):
                conn.close()
