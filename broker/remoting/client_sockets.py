"""The client WebSockets of a ``BrokerServer`` (``GET /ws``): each binary message one
``protocol.remoting`` frame, each request served concurrently, its response sent back.

A text message gets MALFORMED_FRAME; a frame that does not decode gets its error response
(the connection stays open), or, when nobody can be answered (its opaque unreadable, a
malformed oneway or response), the connection is closed with 1007 and the reason. A oneway
request is served and its answer dropped; responses from the client are ignored (the
broker has no request of its own outstanding). When a socket closes, its consumer and
producer registrations go with it. Runs on the server's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from typing import TYPE_CHECKING

from aiohttp import WSCloseCode, web

from broker.processors.context import CONNECTION
from broker.remoting.frame_reader import FrameReader, open_websocket
from protocol.remoting import Frame, FrameError, ResponseCode, decode_frame

if TYPE_CHECKING:
    from broker.remoting.server import BrokerServer

__all__ = ["ClientSockets"]


class ClientSockets:
    """The open client WebSockets of ``server``, and how each is served."""

    def __init__(self, server: BrokerServer) -> None:
        self._server = server
        self._open: set[web.WebSocketResponse] = set()

    async def serve(self, request: web.Request) -> web.WebSocketResponse:
        """The ``/ws`` route: one client's WebSocket, served until it closes."""
        server = self._server
        # twice the frame limit: a somewhat larger frame still gets a MESSAGE_TOO_LARGE answer
        ws = open_websocket(max_msg_size=2 * server.max_frame_bytes)
        await ws.prepare(request)
        reader = FrameReader(ws, request.transport, server.connections)
        CONNECTION.set(ws)
        server.access.open_connection(request.remote)
        self._open.add(ws)
        try:
            await self._read_frames(reader)
        finally:
            reader.cancel()
            self._open.discard(ws)
            await server.client_requests.members_changed(server.consumers.drop_connection(ws))
            server.producers.drop_connection(ws)
        return ws

    async def close_all(self) -> None:
        """Close every client WebSocket (going away): clients reconnect elsewhere."""
        for ws in list(self._open):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ws.close(code=1001, message=b"broker stopping"), 1.0)

    async def _read_frames(self, reader: FrameReader) -> None:
        async for data in reader.frames():
            if isinstance(data, str):
                await reader.ws.send_bytes(Frame(ResponseCode.MALFORMED_FRAME, 0, 1,
                                                 "frames are binary WebSocket messages").encode())
                continue
            reader.spawn(self._serve_frame(reader, data), len(data))

    async def _serve_frame(self, reader: FrameReader, data: bytes) -> None:
        ws = reader.ws
        try:
            frame = decode_frame(data, self._server.max_frame_bytes)
        except FrameError as e:
            reply = e.response()
            if reply is None:  # nobody to answer: say why on the way out
                reader.kill(WSCloseCode.INVALID_TEXT, e.message)
            elif not ws.closed:
                await ws.send_bytes(reply.encode())
            return
        if frame.is_response:
            return  # no server-to-client requests are outstanding yet
        if frame.is_oneway:  # handled as a request; its answer (an error, say) goes nowhere
            await self._server.handle(dataclasses.replace(frame, flags=0))
            return
        reply = await self._server.handle(frame)
        if not ws.closed:
            await ws.send_bytes(reply.encode())
