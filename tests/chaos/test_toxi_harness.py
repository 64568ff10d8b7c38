"""The Toxiproxy harness against a real server and a tiny threaded TCP echo server.

Each fault is checked by its observable effect on a round trip through the proxy:
a cut makes reads time out (connection accepted, bytes swallowed), a disabled link
refuses connections, latency slows the round trip, healing restores traffic at once.
Every wait has a deadline; nothing sleeps to synchronise.
"""

from __future__ import annotations

import contextlib
import os
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.toxi import (
    Link,
    Toxi,
    ToxiproxyError,
    ToxiproxyMissing,
    ToxiproxyServer,
    toxiproxy_binary,
)
from tests.support.procs import ProcessGroup, free_ports, wait_until

pytestmark = pytest.mark.chaos

HANG_S = 0.5  # how long a read must stay unanswered to count as "hangs"
IO_TIMEOUT_S = 3.0  # deadline for round trips that must succeed


class _ThreadingServer(socketserver.ThreadingTCPServer):
    daemon_threads = True  # handlers of hung connections never block shutdown
    allow_reuse_address = True


class EchoServer:
    """Threaded TCP echo server on 127.0.0.1:``port`` recording every byte received."""

    def __init__(self) -> None:
        self._received = bytearray()
        self._lock = threading.Lock()
        echo = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                self.request.settimeout(10.0)  # a hung proxy connection ends eventually
                with contextlib.suppress(OSError):  # resets and timeouts are the point here
                    while chunk := self.request.recv(4096):
                        echo._record(chunk)
                        self.request.sendall(chunk)

        self._server = _ThreadingServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        self.port: int = self._server.server_address[1]

    def _record(self, chunk: bytes) -> None:
        with self._lock:
            self._received += chunk

    def seen(self, payload: bytes) -> bool:
        """True if ``payload`` arrived (on any connection)."""
        with self._lock:
            return payload in self._received

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5.0)


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    try:
        yield server
    finally:
        server.close()


def connect(address: str, timeout: float = IO_TIMEOUT_S) -> socket.socket:
    """Open a TCP connection to ``host:port`` with ``timeout`` on every operation."""
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=timeout)


def exchange(sock: socket.socket, payload: bytes) -> bytes:
    """Send ``payload`` and read back as many bytes; ConnectionError if closed early."""
    sock.sendall(payload)
    data = b""
    while len(data) < len(payload):
        chunk = sock.recv(len(payload) - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {len(payload)} bytes")
        data += chunk
    return data


def round_trip(address: str, payload: bytes, timeout: float = IO_TIMEOUT_S) -> bytes:
    """One request/response on a new connection."""
    with connect(address, timeout) as sock:
        return exchange(sock, payload)


def assert_hangs(address: str, payload: bytes) -> None:
    """The connection is accepted but no answer comes within HANG_S (and not much later)."""
    started = time.monotonic()
    with connect(address, HANG_S) as sock, pytest.raises(TimeoutError):
        exchange(sock, payload)
    assert time.monotonic() - started < HANG_S + 2.0


def assert_works(link: Link, payload: bytes) -> None:
    assert round_trip(link.listen, payload) == payload


def test_traffic_flows_through_a_proxy(toxi: Toxi, echo: EchoServer) -> None:
    (port,) = free_ports(1)
    link = toxi.proxy("plain", port, echo.port)
    assert link.listen == f"127.0.0.1:{port}"
    assert link.upstream == f"127.0.0.1:{echo.port}"
    assert_works(link, b"hello")
    assert echo.seen(b"hello")
    assert set(toxi.proxies()) == {"plain"}


def test_cut_hangs_open_and_new_connections_and_heal_restores(
    toxi: Toxi, echo: EchoServer
) -> None:
    link = toxi.proxy("cut", 0, echo.port)
    with connect(link.listen, HANG_S) as open_conn:
        assert exchange(open_conn, b"before") == b"before"
        assert sorted(link.cut()) == ["cut_downstream", "cut_upstream"]
        assert link.cut() == ["cut_upstream", "cut_downstream"]  # idempotent
        with pytest.raises(TimeoutError):
            exchange(open_conn, b"open-during")
    assert_hangs(link.listen, b"new-during")
    assert not echo.seen(b"new-during")

    link.heal()
    assert link.toxics() == []
    assert_works(link, b"after")


def test_upstream_cut_lets_no_request_through(toxi: Toxi, echo: EchoServer) -> None:
    link = toxi.proxy("one-way-up", 0, echo.port)
    link.cut("upstream")
    assert_hangs(link.listen, b"lost-request")
    assert not echo.seen(b"lost-request")  # HANG_S passed while we waited for the reply


def test_downstream_cut_delivers_requests_but_no_replies(toxi: Toxi, echo: EchoServer) -> None:
    link = toxi.proxy("one-way-down", 0, echo.port)
    link.cut("downstream")
    assert_hangs(link.listen, b"unanswered")
    wait_until(lambda: echo.seen(b"unanswered"), IO_TIMEOUT_S, what="request at the server")


def test_latency_slows_round_trip(toxi: Toxi, echo: EchoServer) -> None:
    link = toxi.proxy("slow", 0, echo.port)
    assert link.latency(200, 0) == ["latency_downstream"]
    started = time.monotonic()
    assert_works(link, b"slow")
    assert time.monotonic() - started >= 0.15


def test_disable_refuses_and_drops_connections_enable_restores(
    toxi: Toxi, echo: EchoServer
) -> None:
    link = toxi.proxy("crash", 0, echo.port)
    with connect(link.listen) as open_conn:
        assert exchange(open_conn, b"up") == b"up"
        link.disable()
        with pytest.raises(ConnectionError):  # reset, broken pipe or orderly close
            exchange(open_conn, b"gone")
    with pytest.raises(ConnectionRefusedError):
        connect(link.listen)
    link.enable()
    assert_works(link, b"back")


def test_reset_peer_resets_after_request_reached_server(toxi: Toxi, echo: EchoServer) -> None:
    link = toxi.proxy("rst", 0, echo.port)
    link.reset_peer(1.0)
    with pytest.raises(ConnectionResetError):
        round_trip(link.listen, b"maybe-applied")
    wait_until(lambda: echo.seen(b"maybe-applied"), IO_TIMEOUT_S, what="request at the server")


def test_reset_heals_everything(toxi: Toxi, echo: EchoServer) -> None:
    cut, down, slow = (toxi.proxy(name, 0, echo.port) for name in ("a", "b", "c"))
    cut.cut()
    down.disable()
    slow.latency(60_000, 0)  # a latency left in place would outlast the round trip's deadline
    toxi.reset()
    for link in (cut, down, slow):
        assert link.toxics() == []
        started = time.monotonic()
        assert_works(link, link.name.encode())  # within IO_TIMEOUT_S, a liveness deadline
        print(f"{link.name}: round trip after the reset {(time.monotonic() - started) * 1000:.0f} ms")


def test_toxic_context_manager_removes_toxic_even_on_error(
    toxi: Toxi, echo: EchoServer
) -> None:
    link = toxi.proxy("ctx", 0, echo.port)
    with pytest.raises(RuntimeError, match="body failed"), \
            link.toxic("timeout", stream="both", timeout=0) as names:
        assert names == ["timeout_upstream", "timeout_downstream"]
        assert_hangs(link.listen, b"x")
        raise RuntimeError("body failed")
    assert link.toxics() == []
    with link.partitioned("upstream"):
        assert_hangs(link.listen, b"y")
    with link.down():
        with pytest.raises(ConnectionRefusedError):
            connect(link.listen)
        toxi.reset()  # undone from elsewhere: leaving the block must not fail
    assert link.toxics() == []
    assert_works(link, b"z")


def test_server_errors_become_toxiproxy_errors(toxi: Toxi, echo: EchoServer) -> None:
    link = toxi.proxy("dup", 0, echo.port)
    ghost = toxi.proxy("ghost", 0, echo.port)
    ghost.destroy()
    ghost.destroy()  # already gone: fine
    cases = [
        (lambda: toxi.proxy("dup", 0, echo.port), 409, "already exists"),
        # the toxiproxy-python client turns this 500 into KeyError: 'name'
        (lambda: toxi.proxy("busy", link.listen_port, echo.port), 500, "address already in use"),
        (lambda: link.add_toxic("no-such-toxic"), 400, "invalid toxic type"),
        (ghost.heal, 404, "proxy not found"),
    ]
    for call, status, body in cases:
        with pytest.raises(ToxiproxyError) as info:
            call()
        assert (info.value.status, body in info.value.body) == (status, True), info.value
    with pytest.raises(ValueError, match="stream"):
        link.latency(10, stream="sideways")  # type: ignore[arg-type]


def test_unreachable_server_is_an_error_with_no_status() -> None:
    (port,) = free_ports(1)
    with pytest.raises(ToxiproxyError) as info:
        Toxi(port, timeout=1.0).version()
    assert info.value.status is None


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_server_is_gone_after_its_block_even_on_error(
    toxiproxy: ToxiproxyServer, tmp_path: Path
) -> None:
    (port,) = free_ports(1)
    with pytest.raises(RuntimeError, match="test body"), \
            ToxiproxyServer(toxiproxy_binary(), port, log_dir=tmp_path) as server:
        pid = server.pid
        assert server.client().version() == server.version
        raise RuntimeError("test body")
    assert _pid_gone(pid)
    with pytest.raises(ConnectionRefusedError):
        connect(f"127.0.0.1:{port}")
    assert toxiproxy.alive  # the session server is untouched


def test_server_on_a_taken_port_fails_fast_instead_of_trusting_the_other(
    toxiproxy: ToxiproxyServer, tmp_path: Path
) -> None:
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="address already in use"):
        ToxiproxyServer(toxiproxy_binary(), toxiproxy.port, log_dir=tmp_path)
    assert time.monotonic() - started < 5.0
    assert toxiproxy.alive


def test_missing_binary_names_the_bootstrap_script(tmp_path: Path) -> None:
    with pytest.raises(ToxiproxyMissing, match="scripts/bootstrap"):
        toxiproxy_binary(tmp_path)


def test_process_group_stops_every_process_even_on_error(tmp_path: Path) -> None:
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    stubborn = [sys.executable, "-c",
                "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
                "print('ready', flush=True); time.sleep(60)"]
    with pytest.raises(RuntimeError), ProcessGroup(tmp_path, stop_timeout=0.5) as group:
        polite = group.start("polite", sleeper)
        rude = group.start("rude", stubborn)
        wait_until(lambda: "ready" in rude.log_tail(), 5.0, what="SIGTERM handler installed")
        raise RuntimeError("test body")
    assert polite.returncode == -15 and rude.returncode == -9
    assert _pid_gone(polite.pid) and _pid_gone(rude.pid)
