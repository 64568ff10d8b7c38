"""Fixtures for the chaos tests: one real Toxiproxy server per session.

``toxiproxy`` (session) starts ``.venv/bin/toxiproxy-server`` on a free 127.0.0.1 port
and stops it by PID when the session ends, whatever happened. A missing binary FAILS
the tests that need it (it is never a skip): run ``scripts/bootstrap``.

``toxi`` (function) is a :class:`Toxi` on that server; after each test every proxy is
healed (``reset``) and deleted (``destroy_all``), so tests never see each other's links.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.toxi import Toxi, ToxiproxyMissing, ToxiproxyServer, toxiproxy_binary
from tests.support.procs import free_ports


@pytest.fixture(scope="session")
def toxiproxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ToxiproxyServer]:
    """A running toxiproxy-server; stopped by PID at the end of the session."""
    binary: Path | None = None
    try:
        binary = toxiproxy_binary()
    except ToxiproxyMissing as exc:
        missing = str(exc)
    if binary is None:
        pytest.fail(missing, pytrace=False)  # outside the except: no chained traceback
    (port,) = free_ports(1)
    with ToxiproxyServer(binary, port, log_dir=tmp_path_factory.mktemp("toxiproxy")) as server:
        yield server


@pytest.fixture
def toxi(toxiproxy: ToxiproxyServer) -> Iterator[Toxi]:
    """A client of the session server; heals and deletes every proxy afterwards."""
    client = toxiproxy.client()
    try:
        yield client
    finally:
        try:
            client.reset()
        finally:
            client.destroy_all()
