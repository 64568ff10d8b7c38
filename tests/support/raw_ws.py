"""A WebSocket client on a bare blocking socket, for tests that must send what no library
would: half a frame, a byte at a time, or nothing at all.

    s = upgrade("127.0.0.1:10911")             # HTTP upgrade done; raises if not 101
    s.sendall(frame_header(8 << 20))           # a binary frame declared 8 MiB (client-masked)
    code, reason = read_close(s, timeout=5)    # the server's close frame, or None
    send_binary(s, frame.encode()); read_binary(s, timeout=5)   # one request, one answer

Client frames carry a mask key of zeros, so the payload goes on the wire as it is.
"""

from __future__ import annotations

import select
import socket
import struct
import time

__all__ = ["FrameInbox", "frame_header", "read_binary", "read_close", "read_frame", "send_binary", "upgrade"]

_KEY = "dGhlIHNhbXBsZSBub25jZQ=="


def upgrade(address: str, timeout: float = 5.0) -> socket.socket:
    """A socket whose ``/ws`` upgrade was accepted (101); OSError/AssertionError otherwise."""
    host, port = address.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=timeout)
    try:
        s.sendall((f"GET /ws HTTP/1.1\r\nHost: {address}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                   f"Sec-WebSocket-Key: {_KEY}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = s.recv(4096)
            if not chunk:
                raise ConnectionError(f"{address} closed during the upgrade: {head!r}")
            head += chunk
        status = head.split(b"\r\n", 1)[0]
        if b" 101 " not in status + b" ":
            raise AssertionError(f"upgrade refused: {head.decode(errors='replace')}")
        return s
    except BaseException:
        s.close()
        raise


def frame_header(length: int, opcode: int = 2, fin: bool = True) -> bytes:
    """A client frame's header declaring ``length`` payload bytes (mask key of zeros)."""
    first = (0x80 if fin else 0) | opcode
    if length < 126:
        head = struct.pack("!BB", first, 0x80 | length)
    elif length < 1 << 16:
        head = struct.pack("!BBH", first, 0x80 | 126, length)
    else:
        head = struct.pack("!BBQ", first, 0x80 | 127, length)
    return head + b"\0\0\0\0"


def send_binary(s: socket.socket, data: bytes) -> None:
    """One binary frame holding ``data``."""
    s.sendall(frame_header(len(data)) + data)


def read_frame(s: socket.socket, timeout: float) -> tuple[int, bytes] | None:
    """The server's next frame: (opcode, payload); None if none came whole within ``timeout``
    or the connection ended. What of a frame came before the timeout is lost: to wait in short
    turns (while sending), use ``FrameInbox``."""
    deadline = time.monotonic() + timeout
    try:
        head = _read_exactly(s, 2, deadline)
        length = head[1] & 0x7F
        if length == 126:
            length = struct.unpack("!H", _read_exactly(s, 2, deadline))[0]
        elif length == 127:
            length = struct.unpack("!Q", _read_exactly(s, 8, deadline))[0]
        return head[0] & 0x0F, _read_exactly(s, length, deadline)
    except (TimeoutError, OSError, EOFError):
        return None


def read_binary(s: socket.socket, timeout: float) -> bytes | None:
    """The payload of the server's next binary frame (other frames skipped), or None."""
    deadline = time.monotonic() + timeout
    while True:
        got = read_frame(s, max(0.0, deadline - time.monotonic()))
        if got is None or got[0] == 8:
            return None
        if got[0] == 2:
            return got[1]


def read_close(s: socket.socket, timeout: float) -> tuple[int, str] | None:
    """Read server frames until a close frame: its (code, reason); None if none came within
    ``timeout`` or the connection ended without one."""
    deadline = time.monotonic() + timeout
    while True:
        got = read_frame(s, max(0.0, deadline - time.monotonic()))
        if got is None:
            return None
        opcode, payload = got
        if opcode == 8:
            code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
            return code, payload[2:].decode(errors="replace")


def _read_exactly(s: socket.socket, n: int, deadline: float) -> bytes:
    out = bytearray()
    while len(out) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        s.settimeout(left)
        chunk = s.recv(min(n - len(out), 1 << 20))
        if not chunk:
            raise EOFError
        out += chunk
    return bytes(out)


class FrameInbox:
    """The server's frames on ``s`` as they come, for a socket that is also being written: the
    bytes of a frame cut short by a timeout are kept for the next call (``read_frame`` loses
    them), and how the connection ended, if it did, is kept in ``ended``."""

    def __init__(self, s: socket.socket) -> None:
        self._s = s
        self._buf = bytearray()
        self.ended: str | None = None  # "EOF" or the error of recv

    def close_frame(self, timeout: float) -> tuple[int, str] | None:
        """The server's close frame: (code, reason); None if none came whole within ``timeout``
        or the connection ended without one (see ``ended``)."""
        deadline = time.monotonic() + timeout
        while True:
            while (frame := self._take()) is not None:
                opcode, payload = frame
                if opcode == 8:
                    code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
                    return code, payload[2:].decode(errors="replace")
            left = deadline - time.monotonic()
            if self.ended is not None or left <= 0 or not select.select([self._s], [], [], left)[0]:
                return None
            try:
                chunk = self._s.recv(1 << 16)
            except (TimeoutError, BlockingIOError):
                continue
            except OSError as e:
                self.ended = f"{type(e).__name__}: {e}"
                continue
            if not chunk:
                self.ended = "EOF"
            self._buf += chunk

    def _take(self) -> tuple[int, bytes] | None:
        """The first whole frame of the buffer, removed from it (server frames are unmasked)."""
        buf = self._buf
        if len(buf) < 2:
            return None
        length, at = buf[1] & 0x7F, 2
        if length == 126:
            if len(buf) < 4:
                return None
            length, at = struct.unpack_from("!H", buf, 2)[0], 4
        elif length == 127:
            if len(buf) < 10:
                return None
            length, at = struct.unpack_from("!Q", buf, 2)[0], 10
        if len(buf) < at + length:
            return None
        frame = buf[0] & 0x0F, bytes(buf[at:at + length])
        del buf[:at + length]
        return frame
