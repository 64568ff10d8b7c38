"""The fault confirmations of ``tests/chaos/confirm.py`` fail when the fault is not where they look.

Each case puts the toxic on the WRONG proxy (a broken fault helper) while the link the
helper probes fails in some other way -- its node dead (the proxy closes every connection),
its proxy disabled (connection refused), or the link hung (a timeout toxic) -- and the
helper must raise :class:`FaultNotApplied`: an error is not a delay, and a refusal or a
timeout is not a reset. Before issue 31's review (G3) ``delay_seen`` counted any probe
error as the delay and ``reset_seen`` any error as the reset, so every case below passed.
The controls show the helpers confirm the real fault on the right proxy.

No broker runs here: the probed server is a small HTTP server answering ``GET /status``
behind real Toxiproxy proxies, and the scenario a stand-in with what the helpers use.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import cast

import pytest

from raftmq.cluster_http import ClusterHttp
from raftmq.local_group import free_port
from tests.chaos import confirm
from tests.chaos.confirm import FaultNotApplied
from tests.chaos.scenario import Scenario
from tests.chaos.toxi import Link, Toxi

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(60)]

LATENCY_MS = 100
BOUND_S = 0.08  # 2 x (100 - 60) ms: what a 100 +/- 60 ms toxic adds at least to a round trip


class _StatusHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"role": "follower"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return None


@pytest.fixture
def status_port() -> Iterator[int]:
    """A server answering ``GET /status`` on 127.0.0.1 (stopped at the end)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), _StatusHandler)
    thread = threading.Thread(target=server.serve_forever, name="status-server", daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@dataclass
class _Brokers:
    http: ClusterHttp = field(default_factory=ClusterHttp)


@dataclass
class _Probing:
    """What the confirm helpers use of a Scenario."""
    brokers: _Brokers = field(default_factory=_Brokers)
    confirmed: list[str] = field(default_factory=list)

    def event(self, what: str) -> float:
        print(what)
        return 0.0


def _scenario() -> Scenario:
    return cast(Scenario, _Probing())


def _links(toxi: Toxi, status_port: int) -> tuple[Link, Link]:
    """Two proxies to the status server: the one the helper probes, and another one."""
    return (toxi.proxy("probed", free_port(), status_port), toxi.proxy("other", free_port(), status_port))


def _dead_port() -> int:
    return free_port()  # nothing listens there: a node that died


# -- delay_seen -------------------------------------------------------------------------------------
def test_delay_seen_confirms_the_latency_toxic_on_the_probed_link(toxi: Toxi, status_port: int) -> None:
    probed, _ = _links(toxi, status_port)
    probed.latency(LATENCY_MS, 60, stream="both")
    s = _scenario()
    confirm.delay_seen(s, probed, BOUND_S)
    assert s.confirmed and "took" in s.confirmed[0]


def test_delay_seen_fails_without_the_toxic(toxi: Toxi, status_port: int) -> None:
    probed, other = _links(toxi, status_port)
    other.latency(LATENCY_MS, 60, stream="both")  # the wrong proxy
    with pytest.raises(FaultNotApplied, match="under the 80 ms"):
        confirm.delay_seen(_scenario(), probed, BOUND_S)


def test_delay_seen_fails_when_the_probed_node_is_dead(toxi: Toxi, status_port: int) -> None:
    """The latency toxic on the wrong proxy and the probed link's node dead: each request is
    closed at once, which the old helper took for the delay."""
    probed = toxi.proxy("probed", free_port(), _dead_port())
    toxi.proxy("other", free_port(), status_port).latency(LATENCY_MS, 60, stream="both")
    with pytest.raises(FaultNotApplied, match="no request through probed was answered"):
        confirm.delay_seen(_scenario(), probed, BOUND_S)


def test_delay_seen_fails_when_the_probed_proxy_refuses(toxi: Toxi, status_port: int) -> None:
    probed, other = _links(toxi, status_port)
    other.latency(LATENCY_MS, 60, stream="both")
    probed.disable()
    with pytest.raises(FaultNotApplied, match="no request through probed was answered"):
        confirm.delay_seen(_scenario(), probed, BOUND_S)


# -- reset_seen -------------------------------------------------------------------------------------
@pytest.mark.parametrize("stream", ["upstream", "downstream"])
def test_reset_seen_confirms_resets_on_the_probed_link(toxi: Toxi, status_port: int, stream: str) -> None:
    probed, _ = _links(toxi, status_port)
    probed.reset_peer(1.0, stream=stream)  # type: ignore[arg-type]
    s = _scenario()
    confirm.reset_seen(s, probed)
    assert s.confirmed and "cut" in s.confirmed[0]


def test_reset_seen_fails_when_the_probed_link_hangs(toxi: Toxi, status_port: int) -> None:
    """Resets on the wrong proxy while the probed link swallows bytes: every request times
    out, which the old helper took for the reset."""
    probed, other = _links(toxi, status_port)
    other.reset_peer(1.0, stream="downstream")
    probed.cut("both")
    with pytest.raises(FaultNotApplied, match="none was reset or closed"):
        confirm.reset_seen(_scenario(), probed, attempts=2, probe_timeout=1.0)


def test_reset_seen_fails_when_the_probed_proxy_refuses(toxi: Toxi, status_port: int) -> None:
    probed, other = _links(toxi, status_port)
    other.reset_peer(1.0, stream="downstream")
    probed.disable()
    with pytest.raises(FaultNotApplied, match="none was reset or closed"):
        confirm.reset_seen(_scenario(), probed)


def test_reset_seen_fails_when_the_probed_node_is_dead(toxi: Toxi, status_port: int) -> None:
    """The proxy accepts and closes each connection before any answer (its node is dead):
    a closed connection, but not the reset toxic's."""
    probed = toxi.proxy("probed", free_port(), _dead_port())
    toxi.proxy("other", free_port(), status_port).reset_peer(1.0, stream="downstream")
    with pytest.raises(FaultNotApplied, match="none was reset or closed"):
        confirm.reset_seen(_scenario(), probed, attempts=5)


def test_reset_seen_fails_when_every_request_is_answered(toxi: Toxi, status_port: int) -> None:
    probed, other = _links(toxi, status_port)
    other.reset_peer(1.0, stream="downstream")
    with pytest.raises(FaultNotApplied, match="none was reset or closed"):
        confirm.reset_seen(_scenario(), probed, attempts=5)
