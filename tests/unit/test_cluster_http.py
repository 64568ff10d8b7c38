"""raftmq.cluster_http.ClusterHttp's admin tokens, against a stand-in replica (a stdlib HTTP
server on 127.0.0.1 that takes only the newest token on ``/admin/...``): a token only on
admin paths and only with a user, one per replica address, renewed once when refused, and
an unreachable replica's token fetch an OSError as the call's own would be."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from client.credentials import Credentials
from client.errors import ConnectionLostError
from protocol.tls import ClientTls
from raftmq import cluster_http
from raftmq.cluster_http import ClusterHttp

USER = Credentials("admin", "pw")


class Replica(BaseHTTPRequestHandler):
    """``/status`` open; ``/admin/...`` answers 200 only to ``Bearer <valid>``, else 401."""

    valid = "t1"
    seen: list[tuple[str, str | None]] = []

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._answer()

    def _answer(self) -> None:
        auth = self.headers.get("Authorization")
        type(self).seen.append((self.path, auth))
        ok = not self.path.startswith("/admin") or auth == f"Bearer {type(self).valid}"
        body = json.dumps({"path": self.path} if ok else {"error": "token expired"}).encode()
        self.send_response(200 if ok else 401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def replica() -> Iterator[str]:
    Replica.valid, Replica.seen = "t1", []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Replica)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def fetched(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, ClientTls | None]]:
    """The token fetches (address, user, tls), each giving the replica's current token."""
    calls: list[tuple[str, str, ClientTls | None]] = []

    def fetch(address: str, credentials: Credentials, tls: ClientTls | None = None) -> str:
        calls.append((address, credentials.user, tls))
        return Replica.valid

    monkeypatch.setattr(cluster_http, "fetch_admin_token", fetch)
    return calls


@pytest.mark.sockets
def test_a_token_goes_only_to_admin_paths_and_only_with_a_user(replica: str, fetched: list[Any]) -> None:
    ClusterHttp().get(replica, "/status")
    assert ClusterHttp().call(replica, "/admin/members")[0] == 401  # no user: the replica refuses
    http = ClusterHttp.with_tls(None, USER)
    assert http.get(replica, "/status") == {"path": "/status"}
    assert http.call(replica, "/admin/members", {"op": "x"}) == (200, {"path": "/admin/members"})
    assert http.get(replica, "/admin/cluster") == {"path": "/admin/cluster"}
    assert [auth for _, auth in Replica.seen] == [None, None, None, "Bearer t1", "Bearer t1"]
    assert fetched == [(replica, "admin", None)]  # one fetch per replica, kept


@pytest.mark.sockets
def test_a_refused_token_is_renewed_once(replica: str, fetched: list[Any]) -> None:
    http = ClusterHttp.with_tls(None, USER)
    http.get(replica, "/admin/cluster")
    Replica.valid = "t2"  # expired (or the password changed): the kept token is refused
    assert http.call(replica, "/admin/members") == (200, {"path": "/admin/members"})
    Replica.valid = "t3"
    assert http.get(replica, "/admin/cluster") == {"path": "/admin/cluster"}
    assert len(fetched) == 3
    assert [auth for _, auth in Replica.seen] == ["Bearer t1", "Bearer t1", "Bearer t2", "Bearer t2",
                                                  "Bearer t3"]


def test_a_replica_that_cannot_give_a_token_is_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    def down(address: str, credentials: Credentials, tls: ClientTls | None = None) -> str:
        raise ConnectionLostError(f"cannot authenticate at https://{address}/auth/scram: refused")

    monkeypatch.setattr(cluster_http, "fetch_admin_token", down)
    with pytest.raises(OSError, match="cannot authenticate"):  # what callers take for "down"
        ClusterHttp.with_tls(None, USER).call("127.0.0.1:1", "/admin/members")
