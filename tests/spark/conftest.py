"""Fixtures of the Spark tests: one local[2] SparkSession for the whole run, a 3-node broker
group per module, and helpers to fill topics and read the nodes' counters.

Spark's Python workers must import ``spark.datasource``: the package is installed into
the venv (``pip install -e .[spark,test]`` by scripts/bootstrap), and the workers run
this interpreter (PYSPARK_PYTHON).
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from client import Message, MessageQueue
from client.aio import AsyncProducer
from client.queues import shard_queue
from raftmq.local_group import LocalGroup
from tests.support.broker_group import create_topic as create_topic  # re-exported for the spark tests
from tests.support.broker_group import running_brokers, servers

SPARK_ENV = {"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
             "PYSPARK_DRIVER_PYTHON": sys.executable}


def spark_builder_conf() -> dict[str, str]:
    """The session settings the Spark tests add to ``local_session``'s."""
    return {"spark.driver.memory": "1g", "spark.sql.streaming.stopTimeout": "10s"}


@pytest.fixture(scope="session")
def spark_session() -> Iterator[Any]:
    os.environ.update(SPARK_ENV)
    from spark.datasource import local_session

    session = local_session("raftmq-tests", spark_builder_conf())
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="module")
def brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalGroup]:
    with running_brokers(tmp_path_factory.mktemp("brokers"), segment_bytes=16 << 20,
                         log_level="WARNING") as group:
        yield group


@dataclass
class Sent:
    """What was acknowledged: per (group, queue id) the message ids in queue order."""

    by_queue: dict[tuple[str, int], list[str]] = field(default_factory=dict)
    tags: dict[str, str | None] = field(default_factory=dict)

    @property
    def ids(self) -> set[str]:
        return {i for ids in self.by_queue.values() for i in ids}

    def count(self) -> int:
        return sum(len(v) for v in self.by_queue.values())


def shard_keys(topic: str, queues: int, prefix: str, group: str = "g1") -> list[str]:
    """One shard key per queue of a one-group topic (so that every queue gets messages)."""
    mqs = [MessageQueue(topic, group, q) for q in range(queues)]
    found: dict[int, str] = {}
    j = 0
    while len(found) < queues:
        key = f"{prefix}-key-{j}"
        found.setdefault(shard_queue(key, mqs).queue_id, key)
        j += 1
    return [found[q] for q in range(queues)]


def send(group: LocalGroup, topic: str, n: int, *, queues: int, body_bytes: int = 256,
         tags: tuple[str, ...] = ("red", "green", "blue", "gold"), prefix: str = "m",
         sent: Sent | None = None) -> Sent:
    """``n`` messages, the same number to each of the ``queues`` queues (send order kept
    per queue), bodies of ``body_bytes``, tags cycling; returns what was acknowledged
    (added to ``sent``)."""
    sent = sent or Sent()
    keys = shard_keys(topic, queues, prefix)
    per_key = n // queues

    async def run() -> None:
        async with AsyncProducer(servers=servers(group), group=f"spark-test-{topic}",
                                 send_timeout=30.0) as p:
            async def one_key(k: int) -> None:
                for start in range(0, per_key, 1000):
                    batch = []
                    for i in range(start, min(per_key, start + 1000)):
                        label = f"{prefix}-{k}-{i}"
                        body = label.encode().ljust(body_bytes, b".")
                        batch.append(Message(topic, body, tags=tags[i % len(tags)], keys=[label],
                                             properties={"k": str(k)}))
                    results = await p.send_batch(batch, shard_key=keys[k])
                    for m, r in zip(batch, results, strict=True):
                        sent.by_queue.setdefault((r.queue.group, r.queue.queue_id), []).append(r.msg_id)
                        sent.tags[r.msg_id] = m.tags

            await asyncio.gather(*(one_key(k) for k in range(queues)))

    asyncio.run(run())
    return sent


_METRIC = re.compile(r'^(raftmq_[a-z_]+)\{[^}]*node="([^"]+)"[^}]*\} (\S+)$')


def metrics(group: LocalGroup) -> dict[str, dict[str, float]]:
    """node -> {metric: value} for the live nodes (the per-node counters of /metrics)."""
    out: dict[str, dict[str, float]] = {}
    for node in group.nodes.values():
        if not node.alive:
            continue
        try:
            with urllib.request.urlopen(f"http://{node.http}/metrics", timeout=5) as resp:
                text = resp.read().decode()
        except OSError:  # starting, or just killed
            continue
        for line in text.splitlines():
            m = _METRIC.match(line)
            if m and "consumer_group" not in line:
                out.setdefault(m.group(2), {})[m.group(1)] = float(m.group(3))
    return out


def pulled(group: LocalGroup) -> dict[str, float]:
    return {n: v.get("raftmq_messages_pulled_total", 0.0) for n, v in metrics(group).items()}


def leader_name(group: LocalGroup) -> str:
    leaders = [n for n, v in metrics(group).items() if v.get("raftmq_is_leader") == 1]
    assert len(leaders) == 1, f"expected one leader, /metrics says {leaders}"
    return leaders[0]


def wait_caught_up(group: LocalGroup, timeout: float = 60) -> None:
    """Every live replica has applied what the leader committed."""
    leader = group.wait_leader(timeout=30)
    target = group.status(leader)["commit_index"]  # type: ignore[index]
    for name, node in group.nodes.items():
        if node.alive and name != leader:
            group.wait_status(name, lambda s: s.get("applied_index", 0) >= target, timeout, "catch-up")


def tmp_dir(base: Path, name: str) -> Path:
    path = base / name
    path.mkdir(parents=True, exist_ok=True)
    return path
