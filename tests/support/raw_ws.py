"""A WebSocket client on a bare blocking socket, for tests that must send what no library
would: half a frame, a byte at a time, or nothing at all.

    s = upgrade("127.0.0.1:10911")             # HTTP upgrade done; raises if not 101
    s.sendall(frame_header(8 << 20))           # a binary frame declared 8 MiB (client-masked)
    code, reason = read_close(s, timeout=5)    # the server's close frame, or None

Client frames carry a mask key of zeros, so the payload goes on the wire as it is.
"""

from __future__ import annotations

import socket
import struct
import time

__all__ = ["frame_header", "read_close", "upgrade"]

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


def read_close(s: socket.socket, timeout: float) -> tuple[int, str] | None:
    """Read server frames until a close frame: its (code, reason); None if none came within
    ``timeout`` or the connection ended without one."""
    deadline = time.monotonic() + timeout
    buf = b""
    while True:
        while len(buf) >= 2:
            length, start = buf[1] & 0x7F, 2
            if length == 126:
                if len(buf) < 4:
                    break
                length, start = struct.unpack("!H", buf[2:4])[0], 4
            elif length == 127:
                if len(buf) < 10:
                    break
                length, start = struct.unpack("!Q", buf[2:10])[0], 10
            if len(buf) < start + length:
                break
            opcode, payload, buf = buf[0] & 0x0F, buf[start:start + length], buf[start + length:]
            if opcode == 8:
                code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
                return code, payload[2:].decode(errors="replace")
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        s.settimeout(left)
        try:
            chunk = s.recv(65536)
        except TimeoutError:
            return None
        except OSError:
            return None
        if not chunk:
            return None
        buf += chunk
