"""One WebSocket per broker address, carrying remoting frames both ways.

``Connection.request`` sends a request (a ``protocol`` request class) and waits for the
response with the same opaque; ``oneway`` sends without waiting. Requests the broker
sends to us (e.g. NOTIFY_CONSUMER_IDS_CHANGED) go to the ``on_request`` callback. ``ConnectionPool``
keeps one live connection per address and reconnects on the next use after a drop; given
a ``ClientTls`` it dials ``wss://`` (and its ``session`` and ``url`` speak https), else
``ws://`` (``protocol.tls``); given ``credentials`` it authenticates each new connection
before its first request (``client.aio.auth``).

When the broker closes the connection with a code and a reason (a malformed frame, a frame
too slow to arrive, idle, stopping) or refuses it (503: a connection limit, the reason in
``REFUSED_HEADER``), the ``ConnectionLostError`` of every request it ends says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import logging
from collections.abc import Callable

import aiohttp

from client.credentials import Credentials
from client.errors import ConnectionLostError, RequestTimeoutError, TlsError, broker_error
from protocol.remoting import DEFAULT_MAX_FRAME, REFUSED_HEADER, Frame, FrameError, ResponseCode, decode_frame
from protocol.tls import ClientTls, http_url, ws_url
from protocol.wire import NotLeaderResponse, Request

__all__ = ["Connection", "ConnectionPool", "certificate_refused", "tls_hint"]

log = logging.getLogger("client.connection")

CONNECT_TIMEOUT_S = 3.0
#: How long a closing client waits for a broker's side of each close: a healthy broker
#: answers in milliseconds, a stalled one never (a consumer's restart waits for it).
CLOSE_WAIT_S = 0.5

_ENDS = frozenset({aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED,
                   aiohttp.WSMsgType.ERROR})
#: what a close code says when the broker gave no reason
_CLOSE_MEANING = {1001: "going away", 1006: "connection dropped", 1007: "malformed frame",
                  1008: "policy violation", 1009: "frame too large", 1011: "internal error"}


class Connection:
    def __init__(self, address: str, ws: aiohttp.ClientWebSocketResponse,
                 on_request: Callable[[str, Frame], None] | None = None) -> None:
        self.address = address
        self._ws = ws
        self._on_request = on_request
        self._opaques = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Frame]] = {}
        #: why the broker closed the connection, when it said: "closed by the broker: 1008 ..."
        self.close_reason = ""
        self._reader = asyncio.create_task(self._read())

    @property
    def closed(self) -> bool:
        return self._ws.closed or self._reader.done()

    def _lost(self, what: str) -> str:
        """``what`` happened to the connection, with why the broker closed it if it said."""
        why = self.close_reason
        return f"{what} ({why})" if why else what

    async def _read(self) -> None:
        try:
            while True:
                msg = await self._ws.receive()
                if msg.type in _ENDS:
                    self._note_close(msg)
                    break
                if msg.type != aiohttp.WSMsgType.BINARY:
                    continue
                try:
                    frame = decode_frame(msg.data)
                except FrameError as e:
                    log.warning("%s sent an undecodable frame: %s", self.address, e)
                    continue
                if not frame.is_response:
                    if self._on_request is not None:
                        self._on_request(self.address, frame)
                    continue
                fut = self._waiting.pop(frame.opaque, None)
                if fut is not None and not fut.done():
                    fut.set_result(frame)
        except (aiohttp.ClientError, ConnectionError) as e:
            log.debug("connection to %s failed: %s", self.address, e)
        finally:
            lost = ConnectionLostError(self._lost(f"connection to broker {self.address} was lost"))
            for fut in self._waiting.values():
                if not fut.done():
                    fut.set_exception(lost)
            self._waiting.clear()

    async def call(self, request: Request, timeout: float = 10.0) -> Frame:
        """Send a request and return the response frame (any code). Raises
        ConnectionLostError or RequestTimeoutError."""
        if self.closed:
            raise ConnectionLostError(self._lost(f"connection to broker {self.address} is closed"))
        opaque = next(self._opaques) % (2**32)
        fut = self._waiting[opaque] = asyncio.get_running_loop().create_future()
        try:
            await self._ws.send_bytes(request.to_frame(opaque).encode())
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            raise RequestTimeoutError(f"broker {self.address} did not answer request {request.CODE} "
                                      f"within {timeout:.1f} s") from None
        except (aiohttp.ClientError, ConnectionError) as e:
            raise ConnectionLostError(f"cannot send to broker {self.address}: {e}") from None
        finally:
            self._waiting.pop(opaque, None)

    async def request(self, request: Request, timeout: float = 10.0,
                      ok: tuple[int, ...] = (ResponseCode.SUCCESS,)) -> Frame:
        """``call``, raising the typed BrokerError unless the code is in ``ok``."""
        reply = await self.call(request, timeout)
        if reply.code not in ok:
            raise broker_error(reply.code, reply.remark, self.address, _leader_address(reply))
        return reply

    async def oneway(self, request: Request) -> None:
        if self.closed:
            raise ConnectionLostError(self._lost(f"connection to broker {self.address} is closed"))
        frame = request.to_frame(next(self._opaques) % (2**32), oneway=True)
        try:
            await self._ws.send_bytes(frame.encode())
        except (aiohttp.ClientError, ConnectionError) as e:
            raise ConnectionLostError(f"cannot send to broker {self.address}: {e}") from None

    def _note_close(self, msg: aiohttp.WSMessage) -> None:
        """Keep why the connection ended: the broker's close frame (code and reason), or the
        close code of a connection that ended without one."""
        if msg.type == aiohttp.WSMsgType.CLOSE:
            code, reason = msg.data, msg.extra if isinstance(msg.extra, str) else ""
            said = reason or _CLOSE_MEANING.get(code, "")
            if code != aiohttp.WSCloseCode.OK or reason:
                self.close_reason = f"closed by the broker: {code} {said}".rstrip()
        elif self._ws.close_code not in (None, aiohttp.WSCloseCode.OK):
            code = self._ws.close_code
            self.close_reason = f"closed: {code} {_CLOSE_MEANING.get(code, '')}".rstrip()

    async def close(self) -> None:
        await self._ws.close()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


def _leader_address(reply: Frame) -> str | None:
    """The leader a NOT_LEADER answer names (None: another code, or it names none)."""
    if reply.code != ResponseCode.NOT_LEADER:
        return None
    try:
        return NotLeaderResponse.from_frame(reply).leader_address
    except FrameError:
        return None


def certificate_refused(who: str, error: aiohttp.ClientConnectorCertificateError) -> TlsError:
    """The error for a server whose certificate did not verify (the same on every attempt)."""
    return TlsError(f"cannot connect to {who}: its certificate was refused ({error.certificate_error}); "
                    "is the client's tls= given the CA that signed it?")


def tls_hint(error: BaseException, tls: ClientTls | None) -> str:
    """What a connection closed during its opening may mean. A server that requires a client
    certificate ends a TLS 1.3 connection after the client's handshake: by timing the client
    sees the alert, the server going away, or a reset -- each means the same here."""
    closed = isinstance(error, aiohttp.ServerDisconnectedError | ConnectionResetError) or (
        isinstance(error, OSError) and error.errno == errno.ECONNRESET)
    if tls is not None and tls.cert_file is None and (
            closed or "CERTIFICATE_REQUIRED" in str(error)):
        return " (does it require mutual TLS? then give the client a certificate in tls=)"
    if tls is None and isinstance(error, aiohttp.ServerDisconnectedError):
        return " (does it serve TLS? then give the client tls= with its CA)"
    if isinstance(error, aiohttp.ClientSSLError) and "WRONG_VERSION_NUMBER" in str(error):
        return " (it does not serve TLS: give the client no tls=)"
    return ""


class ConnectionPool:
    def __init__(self, on_request: Callable[[str, Frame], None] | None = None,
                 tls: ClientTls | None = None, credentials: Credentials | None = None) -> None:
        self.tls = tls
        self.credentials = credentials
        self._session: aiohttp.ClientSession | None = None
        self._conns: dict[str, Connection] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._on_request = on_request
        self.on_connect: list[Callable[[str], None]] = []

    async def get(self, address: str) -> Connection:
        conn = self._conns.get(address)
        if conn is not None and not conn.closed:
            return conn
        lock = self._locks.setdefault(address, asyncio.Lock())
        async with lock:
            conn = self._conns.get(address)
            if conn is not None and not conn.closed:
                return conn
            try:
                ws = await asyncio.wait_for(self.session.ws_connect(
                    ws_url(address, "/ws", self.tls is not None), max_msg_size=2 * DEFAULT_MAX_FRAME,
                    heartbeat=10.0), CONNECT_TIMEOUT_S)
            except aiohttp.ClientConnectorCertificateError as e:
                raise certificate_refused(f"broker {address}", e) from None
            except aiohttp.WSServerHandshakeError as e:
                why = (e.headers or {}).get(REFUSED_HEADER) or e.message
                raise ConnectionLostError(f"cannot connect to broker {address}: {e.status} {why}") from None
            except (aiohttp.ClientError, OSError, TimeoutError) as e:
                hint = tls_hint(e, self.tls)
                raise ConnectionLostError(f"cannot connect to broker {address}: {e}{hint}") from None
            conn = Connection(address, ws, self._on_request)
            if self.credentials is not None:
                await _login(conn, self.credentials)
            self._conns[address] = conn
        for cb in self.on_connect:
            cb(address)
        return conn

    async def call(self, address: str, request: Request, timeout: float = 10.0) -> Frame:
        return await (await self.get(address)).call(request, timeout)

    async def request(self, address: str, request: Request, timeout: float = 10.0,
                      ok: tuple[int, ...] = (ResponseCode.SUCCESS,)) -> Frame:
        return await (await self.get(address)).request(request, timeout, ok)

    async def close(self) -> None:
        """Close every connection at once, each waiting at most CLOSE_WAIT_S for the broker's
        side of the close (a hung link would hold it 10 s); the session then drops what is
        left."""
        async def close_one(conn: Connection) -> None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(CLOSE_WAIT_S):
                    await conn.close()

        await asyncio.gather(*(close_one(c) for c in list(self._conns.values())))
        self._conns.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        """HTTP(S) to brokers and name servers (``url``), with this pool's TLS."""
        if self._session is None:
            ssl = self.tls.context() if self.tls is not None else True
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ssl))
        return self._session

    def url(self, address: str, path: str) -> str:
        """``path`` at ``address`` over https when this pool speaks TLS, else http."""
        return http_url(address, path, self.tls is not None)


async def _login(conn: Connection, credentials: Credentials) -> None:
    """Authenticate ``conn``; closed if that fails."""
    from client.aio.auth import login  # auth imports this module's Connection

    try:
        await login(conn, credentials)
    except BaseException:
        await conn.close()
        raise
