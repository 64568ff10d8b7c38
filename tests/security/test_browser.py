"""Issue 25, row 4: a web page the operator visits must not drive a local broker or console.

Before: from any page, ``fetch("http://127.0.0.1:PORT/admin/topics", {method: "POST", mode:
"no-cors", body: '{"topic": ...}'})`` (text/plain, a foreign Origin, no credential) created a
topic; a WebSocket from a foreign Origin was accepted on ``/ws``; the console's POST routes
likewise. Now the broker and the console refuse a state-changing request or a WebSocket
whose Origin is neither their own nor allowed (403), JSON routes want ``Content-Type:
application/json`` (415), and the console's POSTs need the session's CSRF token. Real
processes (``raftmq cluster up --nodes 1``, the console in its own process), stopped by PID;
the same attack from a real Chromium page of another origin: tests/security/test_browser_page.py.
"""

from __future__ import annotations

import asyncio
import http.cookiejar
import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from raftmq.local_tls import LocalCA
from tests.console.conftest import console_process
from tests.security.namesrv_cluster import Cluster, http_json, local_cluster

pytestmark = [pytest.mark.cluster]

EVIL = "http://evil.example:8000"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with local_cluster(tmp_path_factory.mktemp("browser") / "c", "--nodes", "1",
                       "--namesrv-port", "0") as c:
        yield c


@pytest.fixture(scope="module")
def console(cluster: Cluster) -> Iterator[str]:
    with console_process("--namesrv", cluster.ns) as base:
        yield base


def raw_post(url: str, body: bytes, headers: dict[str, str],
             opener: urllib.request.OpenerDirector | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with (opener or urllib.request.build_opener()).open(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def topics(c: Cluster) -> dict[str, Any]:
    code, doc = http_json(f"http://{c.leader()[1]}/admin/topics")
    assert code == 200, doc
    return dict(doc)


def test_a_foreign_page_cannot_post_to_the_broker(cluster: Cluster) -> None:
    leader = cluster.leader()[1]
    body = json.dumps({"topic": "from-a-web-page", "queues": 1}).encode()
    code, doc = raw_post(f"http://{leader}/admin/topics", body,
                         {"Content-Type": "text/plain;charset=UTF-8", "Origin": EVIL})
    assert code == 403 and EVIL in doc["error"], (code, doc)
    code, doc = raw_post(f"http://{leader}/admin/topics", body, {"Content-Type": "application/json",
                                                                  "Origin": EVIL})
    assert code == 403, (code, doc)
    code, doc = raw_post(f"http://{leader}/admin/topics", body, {"Content-Type": "text/plain"})
    assert code == 415 and "application/json" in doc["error"], (code, doc)
    code, doc = raw_post(f"http://{leader}/auth/scram", b'{"step": 1}', {"Content-Type": "text/plain"})
    assert code == 415, (code, doc)
    assert "from-a-web-page" not in topics(cluster)
    code, doc = raw_post(f"http://{leader}/admin/topics", body,  # tools: no Origin, JSON
                         {"Content-Type": "application/json"})
    assert code == 200, (code, doc)
    code, doc = raw_post(f"http://{leader}/admin/topics", json.dumps({"topic": "same-origin"}).encode(),
                         {"Content-Type": "application/json", "Origin": f"http://{leader}"})
    assert code == 200, (code, doc)


def test_a_foreign_page_cannot_open_the_websocket(cluster: Cluster) -> None:
    leader = cluster.leader()[1]

    async def status_of(origin: str | None) -> int:
        headers = {"Origin": origin} if origin else {}
        async with aiohttp.ClientSession() as s:
            try:
                async with s.ws_connect(f"ws://{leader}/ws", headers=headers):
                    return 101
            except aiohttp.WSServerHandshakeError as e:
                return e.status

    assert asyncio.run(status_of(EVIL)) == 403
    assert asyncio.run(status_of("null")) == 403  # a sandboxed frame, a file:// page
    assert asyncio.run(status_of(None)) == 101  # clients send no Origin
    assert asyncio.run(status_of(f"http://{leader}")) == 101


def _session(base: str) -> tuple[urllib.request.OpenerDirector, str]:
    """A cookie-keeping opener of a console session, and that session's CSRF token."""
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    with opener.open(f"{base}/api/whoami", timeout=10) as resp:
        doc = json.loads(resp.read())
    return opener, str(doc["csrf"])


def test_a_foreign_page_cannot_post_to_the_console(cluster: Cluster, console: str) -> None:
    opener, csrf = _session(console)
    body = json.dumps({"topic": "console-from-a-web-page", "queues": 1}).encode()
    code, doc = raw_post(f"{console}/api/topics", body, {"Content-Type": "text/plain", "Origin": EVIL},
                         opener)
    assert code == 403, (code, doc)
    code, doc = raw_post(f"{console}/api/topics", body,  # no CSRF token: a forged form
                         {"Content-Type": "application/json", "Origin": console}, opener)
    assert code == 403 and "CSRF" in doc["error"], (code, doc)
    code, doc = raw_post(f"{console}/api/topics", body, {"Content-Type": "text/plain", "Origin": console,
                                                          "X-CSRF-Token": csrf}, opener)
    assert code == 415, (code, doc)
    assert "console-from-a-web-page" not in topics(cluster)
    code, doc = raw_post(f"{console}/api/topics", body, {"Content-Type": "application/json",
                                                          "Origin": console, "X-CSRF-Token": csrf}, opener)
    assert code == 200, (code, doc)
    other, _ = _session(console)  # another session's token is not this one's
    code, doc = raw_post(f"{console}/api/topics", body, {"Content-Type": "application/json",
                                                          "X-CSRF-Token": csrf}, other)
    assert code == 403, (code, doc)


def test_the_console_refuses_to_front_a_cluster_without_acls_off_loopback(cluster: Cluster,
                                                                          tmp_path: Path) -> None:
    tls = LocalCA(tmp_path / "tls").ensure().server_tls()
    argv = [sys.executable, "-m", "raftmq", "console", "--namesrv", cluster.ns, "--listen", "0.0.0.0:0",
            "--listen-cert-file", tls.cert_file, "--listen-key-file", tls.key_file]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "without ACLs" in done.stderr and "--insecure" in done.stderr


def test_a_rebound_name_cannot_read_the_broker_over_plain_http(cluster: Cluster) -> None:
    """DNS rebinding: a page on evil.example whose name now resolves to 127.0.0.1 is
    same-origin to its browser, sends no Origin on a GET, and reads the answer. On plain
    http the broker answers only requests that name it by IP address or localhost."""
    address = cluster.leader()[1]
    port = address.rsplit(":", 1)[1]
    for path in ("/admin/topics", "/status"):
        req = urllib.request.Request(f"http://{address}{path}", headers={"Host": f"evil.example:{port}"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                code, doc = resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            code, doc = e.code, json.loads(e.read() or b"null")
        assert code == 403 and "rebind" in doc["error"], (path, code, doc)
    assert http_json(f"http://localhost:{port}/status")[0] == 200  # tools name it so
    topics(cluster)  # and by IP address
