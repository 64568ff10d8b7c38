"""Two broker groups behind one name server serve one topic; the route follows a new leader."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raftmq.local_group import LocalGroup
from raftmq.local_namesrv import configure_namesrv, namesrv_argv
from tests.support.procs import ManagedProcess, free_ports, wait_until

pytestmark = [pytest.mark.cluster]


def http_json(url: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if data else "GET",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[str, dict[str, LocalGroup]]]:
    (port,) = free_ports(1)
    ns = f"127.0.0.1:{port}"
    groups = {g: LocalGroup(tmp_path / g, 3, module="broker", group=g,
                            broker={"namesrv": [ns], "index_slots": 64, "index_entries": 1024})
              for g in ("g1", "g2")}
    namesrv = ManagedProcess(namesrv_argv(configure_namesrv(tmp_path, ns, groups.values())),
                             tmp_path / "namesrv.log")
    try:
        wait_until(lambda: http_json(f"http://{ns}/cluster")[0] == 200, 15, what="the name server")
        yield ns, groups
    finally:
        for group in groups.values():
            group.stop()
        namesrv.stop()


def test_one_topic_across_two_groups(setup: tuple[str, dict[str, LocalGroup]]) -> None:
    ns, groups = setup
    for group in groups.values():
        group.start()
    leaders = {g: group.wait_leader(timeout=30) for g, group in groups.items()}
    for g, group in groups.items():
        code, body = http_json(f"http://{group.nodes[leaders[g]].http}/admin/topics",
                               {"topic": "orders", "queues": 4})
        assert code == 200, body

    def route() -> dict[str, Any] | None:
        code, body = http_json(f"http://{ns}/route/orders")
        complete = code == 200 and len(body["groups"]) == 2 and all(g["leader"] for g in body["groups"])
        return body if complete else None

    found = wait_until(route, 20, what="a route over both groups")
    for entry in found["groups"]:
        group = groups[entry["group"]]
        assert entry["queues"] == 4
        assert entry["leader"] == group.nodes[leaders[entry["group"]]].http
        assert set(entry["replicas"]) == {"n1", "n2", "n3"}

    groups["g1"].kill(leaders["g1"])
    new = groups["g1"].wait_leader(timeout=30, among=[n for n in groups["g1"].nodes if n != leaders["g1"]])
    wait_until(lambda: any(e["group"] == "g1" and e["leader"] == groups["g1"].nodes[new].http
                           for e in (route() or {"groups": []})["groups"]),
               20, what="the route naming g1's new leader")
