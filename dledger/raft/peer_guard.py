"""Bounds on the Raft port before a connection has proved it belongs to the group.

pysyncobj's ``TcpConnection`` reads whatever arrives into one buffer until a whole frame
is there, and a frame declares its own length::

    +----------------------+---------------------------------------------+
    | length (int32, host) | body: (encrypted) zlib(pickle(message))     |
    +----------------------+---------------------------------------------+

so a stranger who declares 2**31-1 bytes and keeps sending makes the node buffer all of
it before anything is checked (measured: 53 -> 411 MB RSS for 256 MiB), and a connection
that never finishes its handshake is kept open forever (pysyncobj's timeout is only
checked when the connection has traffic), until the process runs out of descriptors.

The guard (attached through pysyncobj's extension points: the module name
``pysyncobj.tcp_server.TcpConnection`` that its server calls for each accepted socket,
and the transport's protected ``_onNewIncomingConnection`` / ``_onTick``):

* **frames**: an accepted connection is *unproven* until the node first sends on it --
  with the group's secret set, pysyncobj answers only after the peer's first frame
  decrypted with the group's key -- or, with no secret, until its first frame (the
  peer's address) was read. An unproven connection may declare frames of at most
  ``HANDSHAKE_FRAME_BYTES`` and send at most ``HANDSHAKE_BYTES`` in all; a proven one
  frames of at most ``MAX_PEER_FRAME_BYTES``. A connection over its bound is closed
  before the body is read, and the refusal logged (once a minute, with a count).
* **handshakes**: a connection the transport has not matched to a member or learner
  within ``HANDSHAKE_TIMEOUT_S`` is closed; at most ``MAX_PENDING_HANDSHAKES`` may be
  pending at once (a new one beyond that closes the oldest pending, so strangers cannot
  lock a member out: a member's handshake takes one round trip).
"""

from __future__ import annotations

import logging
import struct
import time
from typing import Any

import pysyncobj.tcp_server
from pysyncobj.tcp_connection import TcpConnection

from common.refusal_log import RefusalLog

__all__ = [
    "HANDSHAKE_BYTES",
    "HANDSHAKE_FRAME_BYTES",
    "HANDSHAKE_TIMEOUT_S",
    "MAX_PEER_FRAME_BYTES",
    "MAX_PENDING_HANDSHAKES",
    "GuardedConnection",
    "PendingHandshakes",
    "install",
]

log = logging.getLogger(__name__)

HANDSHAKE_FRAME_BYTES = 64 * 1024  # a handshake frame: a random key or an address, < 1 KiB
HANDSHAKE_BYTES = 2 * HANDSHAKE_FRAME_BYTES + 8
#: a proven peer's largest frame: an append batch (1 MiB of entries <= 60 KiB each, plus
#: pickling and encryption) or a 256 KiB snapshot chunk, with room to spare
MAX_PEER_FRAME_BYTES = 8 << 20
HANDSHAKE_TIMEOUT_S = 5.0
MAX_PENDING_HANDSHAKES = 16
_LENGTH = struct.Struct("i")  # pysyncobj's length prefix: native int32


refusals = RefusalLog(log, "closed a Raft connection from")


class _FrameMeter:
    """Follows the frame boundaries of a byte stream and checks each declared length."""

    __slots__ = ("_body_left", "_header", "frames", "received")

    def __init__(self) -> None:
        self._header = bytearray()
        self._body_left = 0
        self.frames = 0  # headers read
        self.received = 0

    def feed(self, data: bytes, limit: int) -> int | None:
        """Account for ``data``; the first declared length over ``limit`` (or negative), if any."""
        self.received += len(data)
        i, n = 0, len(data)
        while i < n:
            if self._body_left:
                take = min(self._body_left, n - i)
                self._body_left -= take
                i += take
                continue
            take = min(4 - len(self._header), n - i)
            self._header += data[i:i + take]
            i += take
            if len(self._header) == 4:
                (length,) = _LENGTH.unpack(self._header)
                self._header.clear()
                if length < 0 or length > limit:
                    return length
                self.frames += 1
                self._body_left = length
        return None


class _MeteredSocket:
    """An accepted socket whose reads pass through its connection's frame meter."""

    def __init__(self, sock: Any, conn: GuardedConnection) -> None:
        self._sock = sock
        self._conn = conn

    def recv(self, bufsize: int) -> bytes:
        data = self._sock.recv(bufsize)
        if data and not self._conn.admit(data):
            return b""  # pysyncobj takes an empty read as the peer's close and disconnects
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class GuardedConnection(TcpConnection):
    """pysyncobj's connection for accepted sockets, with the frame bounds (module docstring)."""

    def __init__(self, *args: Any, socket: Any = None, **kwargs: Any) -> None:
        self._meter = _FrameMeter()
        self._proven = False
        self.peer = "?"
        if socket is not None:
            try:
                host, port = socket.getpeername()[:2]
                self.peer = f"{host}:{port}"
            except OSError:
                pass
            socket = _MeteredSocket(socket, self)
        super().__init__(*args, socket=socket, **kwargs)

    @property
    def proven(self) -> bool:
        return self._proven

    def send(self, message: Any) -> None:
        if self.encryptor is not None:
            self._proven = True  # pysyncobj answers only a frame that decrypted
        super().send(message)

    def admit(self, data: bytes) -> bool:
        """Account for bytes read; False closes the connection."""
        meter = self._meter
        limit = MAX_PEER_FRAME_BYTES if self._proven else HANDSHAKE_FRAME_BYTES
        declared = meter.feed(data, limit)
        if declared is not None:
            when = "" if self._proven else " before authentication"
            refusals.note("frame" + when, self.peer,
                          f"a frame of {declared} bytes declared{when} (at most {limit} accepted)")
            return False
        if not self._proven:
            if self.encryptor is None and meter.frames >= 1:
                self._proven = True  # no secret: nothing to prove (an insecure group)
            elif meter.received > HANDSHAKE_BYTES:
                refusals.note("bytes before authentication", self.peer,
                              f"{meter.received} bytes sent before authentication "
                              f"(at most {HANDSHAKE_BYTES} accepted)")
                return False
        return True


class PendingHandshakes:
    """The transport's accepted connections not yet matched to a node: bounded in number
    and in time. Tick thread only."""

    def __init__(self, clock: Any = time.monotonic) -> None:
        self._accepted_at: dict[Any, float] = {}
        self._clock = clock

    def accepted(self, conn: Any, pending: set[Any]) -> None:
        self._forget_done(pending)
        self._accepted_at[conn] = self._clock()
        while len(self._accepted_at) > MAX_PENDING_HANDSHAKES:
            oldest = min(self._accepted_at, key=self._accepted_at.__getitem__)
            self._close(oldest, "too many connections in their handshake "
                                f"(at most {MAX_PENDING_HANDSHAKES}): the oldest is closed")

    def sweep(self, pending: set[Any]) -> None:
        if not self._accepted_at:
            return
        self._forget_done(pending)
        deadline = self._clock() - HANDSHAKE_TIMEOUT_S
        for conn, at in list(self._accepted_at.items()):
            if at < deadline:
                self._close(conn, f"no handshake within {HANDSHAKE_TIMEOUT_S:.0f} s")

    def _forget_done(self, pending: set[Any]) -> None:
        for conn in [c for c in self._accepted_at if c not in pending]:
            del self._accepted_at[conn]

    def _close(self, conn: Any, why: str) -> None:
        self._accepted_at.pop(conn, None)
        refusals.note(why, getattr(conn, "peer", "?"), why)
        conn.disconnect()


def install() -> None:
    """Make pysyncobj's server wrap every accepted socket (idempotent)."""
    pysyncobj.tcp_server.TcpConnection = GuardedConnection  # type: ignore[attr-defined]
