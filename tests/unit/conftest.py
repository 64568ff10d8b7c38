"""Fixtures shared by the unit tests, and the guard that keeps them off the network: a unit
test that binds or connects an IP socket fails unless it is marked ``@pytest.mark.sockets``
(for the tests whose subject is a connection, a port or the Raft transport)."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from broker.remoting.guarded_site import GuardedSite
from broker.remoting.server import AppliedSignal, BrokerServer
from broker.state.machine import BrokerStateMachine
from dledger.applier import Applier
from dledger.config import MAX_ENTRY_BYTES
from dledger.local_log import LocalLog
from dledger.log import Log
from raftmq.local_group import free_port
from tests.support.one_node import one_node_group


class NetworkForbidden(AssertionError):
    """A unit test not marked ``sockets`` opened an IP socket."""


_IP_FAMILIES = (socket.AF_INET, socket.AF_INET6)


@pytest.fixture(autouse=True)
def no_network_unless_marked(request: pytest.FixtureRequest,
                             monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Fail a test that binds or connects an IP socket, unless marked ``sockets`` -- also
    when the code under test caught the error (each attempt is recorded in the yielded list
    and reported at teardown)."""
    if request.node.get_closest_marker("sockets") is not None:
        yield []
        return
    opened: list[str] = []

    def guarded(name: str):  # type: ignore[no-untyped-def]
        original = getattr(socket.socket, name)

        def call(self: socket.socket, *args: object, **kw: object) -> object:
            if self.family in _IP_FAMILIES:
                opened.append(f"socket.{name}{args}")
                raise NetworkForbidden(f"socket.{name}{args} in a unit test not marked "
                                       "@pytest.mark.sockets (run it in memory, or mark it)")
            return original(self, *args, **kw)

        return call

    for name in ("bind", "connect", "connect_ex"):
        monkeypatch.setattr(socket.socket, name, guarded(name))
    yield opened
    if opened:
        pytest.fail(f"NetworkForbidden: opened IP sockets without @pytest.mark.sockets: {opened[:3]}")


@pytest.fixture
def one_node_broker(tmp_path: Path) -> Iterator[tuple[Log, BrokerStateMachine, Applier]]:
    """A one-replica group (leader once yielded) with the broker's apply step behind it:
    a ``LocalLog`` (no pysyncobj node, no election, no Raft socket)."""
    with one_node_group(tmp_path) as group:
        yield group


@pytest.fixture
def small_segment_broker(tmp_path: Path) -> Iterator[tuple[LocalLog, BrokerStateMachine, Applier]]:
    """``one_node_broker`` whose CommitLog rolls a segment every 240 KiB (the least there
    is), so a test can delete old segments as retention does: ``rlog.commitlog.delete_before``."""
    with one_node_group(tmp_path, segment_bytes=4 * MAX_ENTRY_BYTES) as group:
        yield group


@pytest.fixture
def broker(one_node_broker, request) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """A BrokerServer on 127.0.0.1 (its own loop thread) over ``one_node_broker``; a test
    module may set ``BROKER_OPTIONS`` (BrokerServer keyword arguments), and serve TLS with
    the ``ssl.SSLContext`` of its fixture ``broker_ssl_context``."""
    rlog, machine, applier = one_node_broker
    options = getattr(request.module, "BROKER_OPTIONS", {})
    ssl_context = (request.getfixturevalue("broker_ssl_context")
                   if "broker_ssl_context" in request.fixturenames else None)
    loop = asyncio.new_event_loop()
    port = free_port()
    address = f"127.0.0.1:{port}"
    runner_box: list[web.AppRunner] = []

    async def up() -> None:
        signal = AppliedSignal(asyncio.get_running_loop())
        server = BrokerServer(rlog, machine, applier, signal, lambda n: address,
                              addresses={rlog.config.node: address}, **options)
        runner = server.runner()
        await runner.setup()
        await GuardedSite(runner, "127.0.0.1", port, ssl_context=ssl_context).start()
        runner_box.append(runner)

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(up(), loop).result(10)
    try:
        yield address
    finally:
        asyncio.run_coroutine_threadsafe(runner_box[0].cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
