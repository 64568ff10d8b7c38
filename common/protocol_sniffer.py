"""``ProtocolSniffer``: one listening port, two protocols told apart by a connection's first
byte (RaftMQ's HTTP/WebSocket, and RocketMQ's remoting frames, whose first byte -- the high
byte of a frame's length -- is 0 for any frame under 16 MiB, where HTTP starts with a
letter and a TLS handshake with 0x16).

The sniffer is an ``asyncio.Protocol`` standing for the connection until its first bytes
arrive; then it makes the chosen protocol (``http()`` or ``alternate()``), hands it the
transport and those bytes, and forwards everything after. A connection that sends nothing
for ``first_byte_timeout_s`` is closed (no protocol exists yet to time it out). With TLS the
sniffer sees the decrypted bytes, so both protocols work over TLS as well. Only asyncio's
public Protocol calls are used.

Threads: the event loop only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

__all__ = ["FIRST_BYTE_TIMEOUT_S", "ProtocolSniffer", "is_rocketmq_frame"]

FIRST_BYTE_TIMEOUT_S = 30.0


def is_rocketmq_frame(first: bytes) -> bool:
    """Whether a connection's first bytes start a RocketMQ frame (length < 16 MiB)."""
    return first[:1] == b"\x00"


class ProtocolSniffer(asyncio.Protocol):
    """Stands for one connection until its first bytes choose its protocol (module docstring)."""

    def __init__(self, http: Callable[[], Any], alternate: Callable[[], asyncio.Protocol], *,
                 first_byte_timeout_s: float = FIRST_BYTE_TIMEOUT_S) -> None:
        self._http = http
        self._alternate = alternate
        self._timeout_s = first_byte_timeout_s
        self._transport: asyncio.Transport | None = None
        self._inner: Any = None
        self._timer: asyncio.TimerHandle | None = None
        self._paused = False
        #: why this connection is refused (a connection cap), set before its first bytes: the
        #: HTTP side answers it (503 with the reason); the alternate is closed at once
        self.refused: str | None = None

    @property
    def chosen(self) -> Any:
        """The protocol chosen (None until the first bytes came)."""
        return self._inner

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._timer = asyncio.get_running_loop().call_later(self._timeout_s, self._silent)

    def _silent(self) -> None:
        if self._inner is None and self._transport is not None:
            self._transport.close()

    def data_received(self, data: bytes) -> None:
        if self._inner is None:
            if self._timer is not None:
                self._timer.cancel()
            if is_rocketmq_frame(data) and self.refused is not None:
                if self._transport is not None:
                    self._transport.close()
                return
            self._inner = self._alternate() if is_rocketmq_frame(data) else self._http()
            self._inner.connection_made(self._transport)
            if self._paused and hasattr(self._inner, "pause_reading"):
                self._inner.pause_reading()
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        if self._inner is None:
            return False  # nothing was said: close
        keep: bool | None = self._inner.eof_received()
        return keep

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._inner is not None:
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    # what a connection guard calls to stop and resume reading a connection
    def pause_reading(self) -> None:
        if self._inner is not None and hasattr(self._inner, "pause_reading"):
            self._inner.pause_reading()
        elif self._transport is not None:
            self._paused = True
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        if self._inner is not None and hasattr(self._inner, "resume_reading"):
            self._inner.resume_reading()
        elif self._transport is not None:
            self._paused = False
            self._transport.resume_reading()
