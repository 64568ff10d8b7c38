"""``client.SimpleConsumer`` and ``client.aio.AsyncSimpleConsumer`` (issue 29) against a
one-node broker served in process: several consumers of one group share a 2-queue topic
and each message is acked once; an unacked message comes back; a stale receipt is refused;
a tag selector; the group's retry policy set through the admin."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker.state.machine import BrokerStateMachine
from broker.state.pops import RetryPolicy
from client import Admin, Message, Producer, SimpleConsumer, SimpleMessage
from client.aio import AsyncSimpleConsumer
from client.backoff import Deadline
from client.cli import durations_s
from client.errors import BrokerError
from dledger.applier import Applier
from dledger.log import Log
from raftmq import bench
from raftmq.cli import main

pytestmark = pytest.mark.sockets


def _admin(broker: str, topic: str, queues: int,
           policy: tuple[str, tuple[float, ...], int] | None = None) -> None:
    admin = Admin(servers=[broker])
    try:
        admin.create_topic(topic, queues=queues)
        if policy is not None:
            admin.group_config(*policy)
    finally:
        admin.close()


def _produce(broker: str, topic: str, count: int, tags: str | None = None) -> set[bytes]:
    bodies = {f"job-{i}".encode() for i in range(count)}
    with Producer(servers=[broker], group="p") as p:
        for i, body in enumerate(sorted(bodies)):
            p.send(Message(topic, body, tags=tags), shard_key=str(i))
    return bodies


def test_consumers_of_one_group_share_the_queues_and_ack_each_message_once(broker: str) -> None:
    _admin(broker, "jobs", 2)
    sent = _produce(broker, "jobs", 200)

    async def drain() -> tuple[list[bytes], list[int]]:
        consumers = [AsyncSimpleConsumer(group="workers", topic="jobs", servers=[broker]) for _ in range(4)]
        got: list[bytes] = []
        per_consumer = [0] * len(consumers)
        deadline = Deadline(60)

        async def work(i: int, c: AsyncSimpleConsumer) -> None:
            while len(got) < len(sent) and not deadline.expired():
                batch = await c.receive(max_messages=8, invisible_duration_s=60, wait_s=0.5)
                for m in batch:
                    got.append(m.body)
                    per_consumer[i] += 1
                    await c.ack(m)
        try:
            await asyncio.gather(*(work(i, c) for i, c in enumerate(consumers)))
        finally:
            for c in consumers:
                await c.close()
        return got, per_consumer

    got, per_consumer = asyncio.run(asyncio.wait_for(drain(), 90))
    assert sorted(got) == sorted(sent)  # every message, each once
    assert all(n > 0 for n in per_consumer)  # all four did work, on 2 queues
    with SimpleConsumer(servers=[broker], group="workers", topic="jobs") as late:
        assert late.receive(wait_s=0) == []  # acked: never delivered again


def test_an_unacked_message_comes_back_and_its_old_receipt_is_stale(broker: str) -> None:
    _admin(broker, "tasks", 1)
    _produce(broker, "tasks", 1)
    with SimpleConsumer(servers=[broker], group="g", topic="tasks") as a, \
            SimpleConsumer(servers=[broker], group="g", topic="tasks") as b:
        (first,) = a.receive(invisible_duration_s=1, wait_s=5)
        assert first.delivery == 1
        assert b.receive(wait_s=0) == []  # invisible to the group's other consumers
        (again,) = b.receive(invisible_duration_s=30, wait_s=10)  # after the second, from b
        assert (again.body, again.delivery) == (first.body, 2)
        with pytest.raises(BrokerError, match="stale"):
            a.ack(first)
        assert _in_flight_metric(broker, "g") == 1
        with urllib.request.urlopen(f"http://{broker}/admin/groups/g/in-flight", timeout=10) as r:
            doc = json.loads(r.read())
        (row,) = doc["in_flight"]
        assert (doc["count"], row["topic"], row["delivery"]) == (1, "tasks", 2)
        assert row["offset"] == again.receipt.offset
        assert row["deadline_ms"] > time.time() * 1000 + 20_000  # the 30 s lease b took
        assert doc["policy"] == {"retry_ms": [1_000, 5_000, 10_000, 30_000, 60_000], "max_deliveries": 16,
                                 "ordered": False, "set": False}
        b.ack(again)
        assert _in_flight_metric(broker, "g") == 0


def _in_flight_metric(broker: str, group: str) -> float:
    """``raftmq_pop_in_flight_messages`` of ``group`` on the broker's ``/metrics``."""
    with urllib.request.urlopen(f"http://{broker}/metrics", timeout=10) as r:
        text = r.read().decode()
    (value,) = [s.value for family in text_string_to_metric_families(text) for s in family.samples
                if s.name == "raftmq_pop_in_flight_messages" and s.labels.get("consumer_group") == group]
    return value


def test_a_selector_skips_other_tags_and_a_nack_follows_the_policy(broker: str) -> None:
    _admin(broker, "mixed", 2, ("picky", (1.0,), 2))
    _produce(broker, "mixed", 3, tags="red")
    wanted = _produce(broker, "mixed", 1, tags="blue")
    with SimpleConsumer(servers=[broker], group="picky", topic="mixed", selector="blue") as c:
        got = []
        deadline = Deadline(20)
        while not got and not deadline.expired():
            got = c.receive(wait_s=1)
        assert [m.body for m in got] == sorted(wanted)
        assert c.nack(got[0]) is False  # back after 1 s
        (second,) = c.receive(wait_s=10)
        assert second.delivery == 2
        assert c.nack(second) is True  # the group's max of 2 deliveries: dead-lettered
        assert c.receive(wait_s=1.5) == []  # the red ones were acked on receipt, the blue one is gone


def test_raftmq_group_config_sets_the_policy_through_the_log(
        broker: str, one_node_broker: tuple[Log, BrokerStateMachine, Applier],
        capsys: pytest.CaptureFixture[str]) -> None:
    machine = one_node_broker[1]
    assert main(["group", "config", "cli-g", "--retry", "500ms 2s 1m", "--max-deliveries", "5",
                 "--servers", broker]) == 0
    assert machine.pops.policy("cli-g") == RetryPolicy((500, 2_000, 60_000), 5)
    assert "at most 5 deliveries" in capsys.readouterr().out
    assert main(["group", "config", "cli-g", "--retry", "5 parsecs", "--servers", broker]) == 2
    assert durations_s("1s, 30 2m 1h") == [1.0, 30.0, 120.0, 3600.0]


def test_an_ordered_group_consumes_each_queue_in_order_with_many_consumers(broker: str) -> None:
    assert main(["topic", "create", "fifo", "--queues", "2", "--servers", broker]) == 0
    assert main(["group", "config", "fifo-g", "--retry", "1s", "--ordered", "--servers", broker]) == 0
    with Producer(servers=[broker], group="p") as p:
        for i in range(60):
            p.send(Message("fifo", f"{i % 4}:{i:03d}".encode()), shard_key=f"key-{i % 4}")

    async def consume() -> list[tuple[int, int, bytes]]:
        consumers = [AsyncSimpleConsumer(group="fifo-g", topic="fifo", servers=[broker]) for _ in range(4)]
        done: list[tuple[int, int, bytes]] = []  # (queue, offset, body) in the order acked
        deadline = Deadline(60)

        async def work(c: AsyncSimpleConsumer) -> None:
            while len(done) < 60 and not deadline.expired():
                for m in await c.receive(max_messages=4, wait_s=0.5):
                    done.append((m.message.queue_id, m.message.queue_offset, m.body))
                    await c.ack(m)
        try:
            await asyncio.gather(*(work(c) for c in consumers))
        finally:
            for c in consumers:
                await c.close()
        return done

    done = asyncio.run(asyncio.wait_for(consume(), 90))
    assert len(done) == 60 and len({body for _, _, body in done}) == 60
    for q in (0, 1):
        offsets = [o for queue, o, _ in done if queue == q]
        assert offsets == sorted(offsets)  # each queue handed out and acked in order
    for key in "0123":  # so each shard key's messages in send order
        bodies = [b for _, _, b in done if b.startswith(key.encode())]
        assert bodies == sorted(bodies)


def test_raftmq_bench_receive_drains_what_it_loaded(broker: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The benchmark's receive mode runs (its figures are not asserted)."""
    assert bench.main(["receive", "--servers", broker, "--topic", "bench", "--messages", "300",
                       "--consumers", "3", "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (result["mode"], result["messages"], result["expected"]) == ("receive", 300, 300)


def test_an_sql_filter_selects_by_properties(broker: str) -> None:
    _admin(broker, "props", 1)
    with Producer(servers=[broker], group="p") as p:
        for region, amount in (("eu", 50), ("eu", 500), ("us", 900)):
            p.send(Message("props", f"{region}-{amount}".encode(),
                           properties={"region": region, "amount": str(amount)}))
    with SimpleConsumer(servers=[broker], group="big-eu", topic="props",
                        sql="region = 'eu' AND amount > 100") as c:
        got: list[SimpleMessage] = []
        deadline = Deadline(20)
        while not got and not deadline.expired():
            got = c.receive(wait_s=1)
        assert [m.body for m in got] == [b"eu-500"]
        c.ack(got[0])
        assert c.receive(wait_s=0) == []  # the others were acked on receipt
    with pytest.raises(ValueError):
        SimpleConsumer(servers=[broker], group="g", topic="props", selector="a", sql="b = 1")
