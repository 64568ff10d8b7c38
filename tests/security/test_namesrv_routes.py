"""The name server's routes against the findings of issue 15 (rows 1 and 3), on a local
cluster started by ``raftmq cluster up``:

* row 1: an unauthenticated ``POST /register`` claiming g1's leadership with a huge term
  made the route's leader another process; the client then sent there.
* row 3: ~7,500 topics with 127-character names made a broker's registration larger than
  the name server's 1 MiB request limit; the group expired from routing and every topic
  became unreachable. 20,000 such topics must register and route.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
from pathlib import Path

import pytest

from client.aio.connection import ConnectionPool
from protocol.remoting import ResponseCode
from protocol.topic import CreateTopicRequest
from tests.security.namesrv_cluster import http_json, local_cluster, raftmq
from tests.support.procs import wait_until

pytestmark = [pytest.mark.cluster]


def test_a_forged_leader_claim_does_not_move_the_route(tmp_path: Path) -> None:
    with local_cluster(tmp_path / "c") as c, socket.socket() as impostor:
        d = str(c.root)
        made = raftmq("topic", "create", "orders", "--queues", "2", "--dir", d)
        assert made.returncode == 0, made.stderr
        _, leader = c.leader()
        impostor.bind(("127.0.0.1", 0))
        impostor.listen()
        fake = f"127.0.0.1:{impostor.getsockname()[1]}"
        forged = {"group": "g1", "node": "evil", "role": "leader", "term": 99999, "address": fake,
                  "members": ["evil"], "topics": {"orders": [2, 6]}}
        code, answer = http_json(f"http://{c.ns}/register", forged)
        assert code in (401, 403), (code, answer)
        assert "error" in answer
        code, route = http_json(f"http://{c.ns}/route/orders")
        assert code == 200 and route["groups"][0]["leader"] == leader, route
        assert "evil" not in route["groups"][0]["replicas"]
        sent = raftmq("send", "orders", "stored", "--dir", d, "--json")
        assert sent.returncode == 0 and json.loads(sent.stdout)["status"] == "SEND_OK", sent.stderr
        got = raftmq("consume", "orders", "--group", "g", "--from", "first", "--idle", "2", "--json",
                     "--dir", d)
        assert [json.loads(line)["body"] for line in got.stdout.splitlines()] == ["stored"], got.stderr
        assert "refused" in (c.root / "namesrv.log").read_text()


def long_topics(n: int) -> list[str]:
    """``n`` distinct topic names of the longest length allowed (127 characters)."""
    return [f"t{i:06d}-".ljust(127, "x") for i in range(n)]


async def create_topics(leader: str, topics: list[str], in_flight: int = 256) -> None:
    pool = ConnectionPool()
    gate = asyncio.Semaphore(in_flight)

    async def create(topic: str) -> None:
        async with gate:
            reply = await pool.request(leader, CreateTopicRequest(topic=topic, queues=2), timeout=60)
            assert reply.code == ResponseCode.SUCCESS, reply.remark

    try:
        await asyncio.gather(*(create(t) for t in topics))
    finally:
        await pool.close()


def test_20000_topics_with_long_names_register_and_route(tmp_path: Path) -> None:
    with local_cluster(tmp_path / "c") as c:
        d = str(c.root)
        topics = long_topics(20_000)
        _, leader = c.leader()
        asyncio.run(create_topics(leader, topics))

        def routed(topic: str) -> bool:
            code, route = http_json(f"http://{c.ns}/route/{topic}")
            return code == 200 and route["groups"][0]["leader"] is not None \
                and len(route["groups"][0]["replicas"]) == 3
        wait_until(lambda: routed(topics[-1]), 90, interval=0.5, what="the last topic's route")
        sample = [topics[0], *random.Random(15).sample(topics, 200)]
        missing = [t for t in sample if not routed(t)]
        assert not missing, f"{len(missing)} of {len(sample)} sampled topics have no route"
        code, cluster = http_json(f"http://{c.ns}/cluster")
        assert code == 200 and all(node["topics"] >= 20_000 for node in cluster["g1"].values()), cluster
        sent = raftmq("send", topics[12_345], "found", "--dir", d, "--json")
        assert sent.returncode == 0 and json.loads(sent.stdout)["status"] == "SEND_OK", sent.stderr
        assert " 413 " not in (c.root / "namesrv.log").read_text()
