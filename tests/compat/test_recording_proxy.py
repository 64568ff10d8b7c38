"""The recording proxy of the reference captures: frames cut at their length prefix in both
directions, recorded in order, and the route rewrite applied to what the client gets but
never to what is recorded. A server on 127.0.0.1 answers each frame with its bytes plus an
address the proxy must rewrite."""

from __future__ import annotations

import io
import socket
import struct
import threading
from collections.abc import Iterator

import pytest

from tests.compat.recording_proxy import Recorder, RecordingProxy, Route, describe
from tests.support.procs import free_ports

ADDR, PROXIED = b"127.0.0.1:20911", b"127.0.0.1:20921"


def frame(header: bytes, body: bytes = b"") -> bytes:
    return struct.pack(">II", 4 + len(header) + len(body), len(header)) + header + body


def read_frame(s: socket.socket) -> bytes:
    buf = b""
    while len(buf) < 4 or len(buf) < 4 + struct.unpack_from(">I", buf)[0]:
        chunk = s.recv(65536)
        assert chunk, "connection closed"
        buf += chunk
    return buf


@pytest.fixture
def echo_server() -> Iterator[int]:
    """Answers every frame with a frame: header {"code":0,"flag":1}, body = request body + ADDR."""
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(10)
    port = srv.getsockname()[1]

    def serve() -> None:
        try:
            conn, _ = srv.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(10)
            try:
                while True:
                    f = read_frame(conn)
                    hlen = struct.unpack_from(">I", f, 4)[0] & 0xFFFFFF
                    conn.sendall(frame(b'{"code":0,"flag":1,"opaque":1}', f[8 + hlen :] + ADDR))
            except (AssertionError, OSError):
                return

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield port
    srv.close()
    t.join(timeout=10)


def test_frames_are_recorded_whole_and_the_route_rewritten_for_the_client(echo_server: int) -> None:
    (listen,) = free_ports(1)
    out = io.StringIO()
    recorder = Recorder(out)
    proxy = RecordingProxy([Route("ns", listen, "127.0.0.1", echo_server)], recorder, {ADDR: PROXIED}).start()
    try:
        with socket.create_connection(("127.0.0.1", listen), timeout=10) as c:
            request = frame(b'{"code":105,"flag":0,"opaque":1}', b"x" * 70000)  # > one read
            # sent in two pieces: the proxy must not cut a frame at a read boundary
            c.sendall(request[:10])
            c.sendall(request[10:])
            answer = read_frame(c)
    finally:
        proxy.stop()
    assert answer.endswith(PROXIED)
    lines = [line.split(" ") for line in out.getvalue().splitlines() if not line.startswith("#")]
    assert [(r, n, d) for r, n, d, _ in lines] == [("ns", "1", ">"), ("ns", "1", "<")]
    assert bytes.fromhex(lines[0][3]) == request
    assert bytes.fromhex(lines[1][3]).endswith(ADDR)  # recorded as the server sent it
    assert recorder.frames == 2


def test_describe_reads_both_serializations() -> None:
    assert "JSON request code=105" in describe(frame(b'{"code":105,"flag":0,"opaque":3}'))
    binary = struct.pack(">hBhii", 310, 0, 407, 9, 0) + struct.pack(">i", 0) + struct.pack(">i", 0)
    f = struct.pack(">II", 4 + len(binary), (1 << 24) | len(binary)) + binary
    assert "ROCKETMQ request code=310" in describe(f) and "opaque=9" in describe(f)
    assert describe(b"\x00\x00") == "undecodable frame of 2B"
