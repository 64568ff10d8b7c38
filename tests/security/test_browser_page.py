"""Issue 25, row 4 from the browser's side: a page served from another origin, opened in
the project's headless Chromium (tests/console/conftest.py), tries what any web site an
operator visits could: a ``no-cors`` POST creating a topic on a local broker and through the
local console (the console's session cookie goes along: the page is same-site, only the port
differs), and a WebSocket to the broker's ``/ws``. All three are refused and nothing is
created. Before the fix both topics were created and the WebSocket opened. Processes (a
one-replica cluster, the console, the page's web server) are stopped by PID.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.console.conftest import browser, console_process, wait_for
from tests.security.namesrv_cluster import Cluster, http_json, local_cluster
from tests.support.procs import ProcessGroup, free_ports, wait_until

pytestmark = [pytest.mark.console]
__all__ = ["browser"]  # the fixture, imported for this module

PAGE = """<!doctype html><title>an unrelated site</title><script>
window.results = {};
const broker = "%(broker)s", console_ = "%(console)s";
function post(url, topic) {
  return fetch(url, {method: "POST", mode: "no-cors", credentials: "include",
                     body: JSON.stringify({topic: topic, queues: 1})}).then(r => "sent (" + r.type + ")");
}
function socket() {
  return new Promise(resolve => {
    const ws = new WebSocket("ws://" + broker + "/ws");
    ws.onopen = () => { resolve("open"); ws.close(); };
    ws.onerror = () => resolve("refused");
    setTimeout(() => resolve("no answer"), 8000);
  });
}
(async () => {
  await fetch(console_ + "/api/whoami", {mode: "no-cors", credentials: "include"}).catch(() => null);
  for (const [name, run] of [["broker", () => post("http://" + broker + "/admin/topics", "page-broker")],
                             ["console", () => post(console_ + "/api/topics", "page-console")],
                             ["ws", socket]]) {
    try { window.results[name] = await run(); } catch (e) { window.results[name] = "error: " + e; }
  }
  window.done = true;
})();
</script>"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with local_cluster(tmp_path_factory.mktemp("page") / "c", "--nodes", "1", "--namesrv-port", "0") as c:
        yield c


def test_a_page_of_another_origin_can_neither_post_nor_open_the_websocket(
        cluster: Cluster, browser: Any, tmp_path: Path) -> None:
    broker = cluster.leader()[1]
    (port,) = free_ports(1)
    with console_process("--namesrv", cluster.ns) as console, ProcessGroup(tmp_path / "logs") as procs:
        site = tmp_path / "site"
        site.mkdir()
        (site / "attack.html").write_text(PAGE % {"broker": broker, "console": console})
        procs.start("site", [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                             "--directory", str(site)])
        url = f"http://127.0.0.1:{port}/attack.html"
        wait_until(lambda: http_ok(url), 20, what="the page's web server")
        browser.get(url)
        wait_for("the page's attempts", lambda: browser.execute_script("return window.done === true"), 30)
        results = browser.execute_script("return window.results")
    assert results["ws"] == "refused", results
    code, topics = http_json(f"http://{broker}/admin/topics")
    assert code == 200
    assert "page-broker" not in topics and "page-console" not in topics, (results, sorted(topics))


def http_ok(url: str) -> bool:
    import urllib.request
    with urllib.request.urlopen(url, timeout=2) as resp:
        return resp.status == 200
