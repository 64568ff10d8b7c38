"""A bare test client of the broker's WebSocket protocol (the real client is client/).

One reader task matches responses to requests by opaque, so calls may overlap.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import aiohttp

from protocol.remoting import Frame, RequestCode, ResponseCode, decode_frame
from protocol.tls import ClientTls, ws_url

__all__ = ["FrameClient", "client_session"]


def client_session(tls: ClientTls | None = None, **options: Any) -> aiohttp.ClientSession:
    """An aiohttp session for a test's own calls: verified against ``tls``'s CA (presenting
    its certificate) when given, else plain."""
    ssl = tls.context() if tls is not None else True
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ssl), **options)


class FrameClient:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.ids = itertools.count(1)
        self.waiting: dict[int, asyncio.Future[Frame]] = {}
        self.requests: asyncio.Queue[Frame] = asyncio.Queue()  # server-to-client requests
        self.reader = asyncio.create_task(self._read())

    @classmethod
    async def connect(cls, session: aiohttp.ClientSession, address: str, tls: bool = False) -> FrameClient:
        """A WebSocket to ``address`` (``tls``: wss://, verified by the ``session``'s context)."""
        return cls(await session.ws_connect(ws_url(address, "/ws", tls), max_msg_size=16 << 20))

    async def _read(self) -> None:
        async for msg in self.ws:
            frame = decode_frame(msg.data)
            if not frame.is_response:
                self.requests.put_nowait(frame)
                continue
            fut = self.waiting.pop(frame.opaque, None)
            if fut is not None and not fut.done():
                fut.set_result(frame)
        for fut in self.waiting.values():
            if not fut.done():
                fut.set_exception(ConnectionError("connection closed"))

    async def call(self, code: int, ext: dict[str, Any] | None = None, body: bytes = b"",
                   timeout: float = 15.0) -> Frame:
        return await self.raw(Frame.request(code, next(self.ids), ext, body).encode(), timeout=timeout)

    async def raw(self, data: bytes, opaque: int | None = None, timeout: float = 15.0) -> Frame:
        key = decode_frame(data).opaque if opaque is None else opaque
        fut = self.waiting[key] = asyncio.get_running_loop().create_future()
        await self.ws.send_bytes(data)
        return await asyncio.wait_for(fut, timeout)

    async def login(self, user: str, password: str) -> tuple[str, str, Frame]:
        """A SCRAM-SHA-256 exchange by hand (brokers with ACLs on): (client-first,
        client-final, the AUTH_FINISH answer) -- a test may replay or break them."""
        import scramp

        client = scramp.ScramClient(["SCRAM-SHA-256"], user, password)
        first = client.get_client_first()
        r1 = await self.call(RequestCode.AUTH_START, {"mechanism": "SCRAM-SHA-256", "message": first})
        if r1.code != ResponseCode.SUCCESS:
            return first, "", r1
        client.set_server_first(str(r1.ext["message"]))
        final = client.get_client_final()
        return first, final, await self.call(RequestCode.AUTH_FINISH, {"message": final})

    async def close(self) -> None:
        self.reader.cancel()
        await self.ws.close()
