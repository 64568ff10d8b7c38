"""Issue 25, row 4 (second pass, G5): ``[broker] allowed_origins`` reaches a broker process.

A web page of an origin the operator listed (an internal dashboard) may open ``/ws`` and
change state over HTTP, however its Origin is spelt (case, a trailing slash); any other
page is still refused (403) and nothing it sent is done. A one-replica broker process,
stopped by PID; the defaults (no list) are tests/security/test_browser.py's.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from raftmq.local_group import LocalGroup
from tests.support.procs import led

pytestmark = [pytest.mark.cluster]

DASHBOARD = "http://dashboard.example:3000"
EVIL = "http://evil.example:8000"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    group = LocalGroup(tmp_path_factory.mktemp("origins") / "g", 1, module="broker",
                       broker={"allowed_origins": [DASHBOARD]})
    with led(group, LocalGroup.wait_leader):
        yield group.nodes["n1"].http


def post_topic(address: str, topic: str, origin: str) -> tuple[int, Any]:
    req = urllib.request.Request(f"http://{address}/admin/topics", method="POST",
                                 data=json.dumps({"topic": topic, "queues": 1}).encode(),
                                 headers={"Content-Type": "application/json", "Origin": origin})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def topic_names(address: str) -> set[str]:
    with urllib.request.urlopen(f"http://{address}/admin/topics", timeout=10) as resp:
        return set(json.loads(resp.read()))


def test_a_listed_origin_may_drive_the_broker_and_others_may_not(broker: str) -> None:
    code, doc = post_topic(broker, "from-the-dashboard", DASHBOARD)
    assert code == 200, (code, doc)
    code, doc = post_topic(broker, "from-the-dashboard-2", "HTTP://Dashboard.Example:3000/")
    assert code == 200, (code, doc)
    code, doc = post_topic(broker, "from-a-web-page", EVIL)
    assert code == 403 and EVIL in doc["error"], (code, doc)
    names = topic_names(broker)
    assert {"from-the-dashboard", "from-the-dashboard-2"} <= names and "from-a-web-page" not in names

    async def upgrade(origin: str) -> int:
        async with aiohttp.ClientSession() as session:
            try:
                async with session.ws_connect(f"ws://{broker}/ws", headers={"Origin": origin}):
                    return 101
            except aiohttp.WSServerHandshakeError as e:
                return e.status

    assert asyncio.run(upgrade(DASHBOARD)) == 101
    assert asyncio.run(upgrade(EVIL)) == 403
