"""Retries through a name server, for every shape of consumer group name (issue 12).

A group's retry topic is looked up by name on the name server; ``%RETRY%acc-g`` was asked
for as ``/route/%RETRY%acc-g``, where ``%ac`` reads as a percent escape, so the consumer
never found its retry queue and a RECONSUME_LATER message never came back. Every shape
here runs in one cluster at once: each group gets the one message, fails it, and must get
it back on its schedule.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from client import Admin, ConsumeStatus, Message, Producer, PullConsumer, PushConsumer
from raftmq.local_group import LocalGroup
from raftmq.local_namesrv import configure_namesrv, namesrv_argv
from tests.support.procs import ManagedProcess, free_ports, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

#: Names the rules allow: '-', '_', '|', text that reads as percent escapes ("ac", "1f",
#: "de"), one of the longest (255 characters).
GROUP_SHAPES = ["rg", "billing", "acc-g", "acc-retry-g", "orders-consumer", "orders_consumer", "ab",
                "1f-x", "eu|pay", "de" + "-x" * 126 + "y"]


class Cluster:
    def __init__(self, ns: str, group: LocalGroup) -> None:
        self.ns, self.group = ns, group

    def http(self, name: str, path: str) -> str:
        with urllib.request.urlopen(f"http://{self.group.nodes[name].http}{path}", timeout=5) as resp:
            return resp.read().decode()


@pytest.fixture
def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """A name server and a 3-node broker group registered with it; ``request.param``:
    extra [broker] settings."""
    (port,) = free_ports(1)
    ns = f"127.0.0.1:{port}"
    group = LocalGroup(tmp_path / "brokers", 3, module="broker",
                       broker={"namesrv": [ns], "index_slots": 4096, "index_entries": 65536,
                               **getattr(request, "param", {})})
    namesrv = ManagedProcess(namesrv_argv(configure_namesrv(tmp_path, ns, [group])), tmp_path / "namesrv.log")
    try:
        group.start()
        group.wait_leader(timeout=30)
        admin = Admin(namesrv=ns)
        try:
            wait_until(lambda: admin.create_topic("rt", queues=4) or True, 30, interval=0.5,
                       what="topic rt created")
        finally:
            admin.close()
        yield Cluster(ns, group)
    finally:
        group.stop()
        namesrv.stop()


class Attempts:
    """Deliveries per consumer group: (reconsume times, when the listener was called,
    when it returned)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_group: dict[str, list[tuple[int, float, float]]] = {g: [] for g in GROUP_SHAPES}

    def listener(self, group: str, fail_until: int):  # type: ignore[no-untyped-def]
        def consume(msgs, ctx):  # type: ignore[no-untyped-def]
            called = time.time()
            status = (ConsumeStatus.RECONSUME_LATER if msgs[0].reconsume_times < fail_until
                      else ConsumeStatus.SUCCESS)
            with self.lock:
                self.by_group[group].extend((m.reconsume_times, called, time.time()) for m in msgs)
            return status
        return consume

    def count(self, n: int) -> bool:
        with self.lock:
            return all(len(v) >= n for v in self.by_group.values())

    def missing(self, n: int) -> list[str]:
        with self.lock:
            return [g for g, v in self.by_group.items() if len(v) < n]


def start_consumers(c: Cluster, attempts: Attempts, fail_until: int, **options) -> list[PushConsumer]:  # type: ignore[no-untyped-def]
    consumers = []
    for g in GROUP_SHAPES:
        consumer = PushConsumer(namesrv=c.ns, group=g, topic="rt", from_where="first", **options)
        consumer.register(attempts.listener(g, fail_until))
        consumers.append(consumer.start())
    return consumers


def test_a_failed_message_comes_back_once_after_the_first_retry_delay_for_every_group_name(
        cluster: Cluster) -> None:
    """Default schedule (10 s first) and default consumer settings (rebalance every 20 s):
    the retry queue is consumed from the subscription on, so the redelivery is on time."""
    attempts = Attempts()
    consumers = start_consumers(cluster, attempts, fail_until=1)
    try:
        with Producer(namesrv=cluster.ns, send_timeout=20) as p:
            p.send(Message("rt", b"retry-me"), shard_key="k")
        wait_until(lambda: attempts.count(1), 20, what="the first delivery in every group")
        wait_until(lambda: attempts.count(2), 25,
                   what=f"a redelivery in every group; missing: {attempts.missing(2)}")
        time.sleep(1.0)  # a second redelivery (or a duplicate) would arrive about now
        for g, rows in attempts.by_group.items():
            assert [r[0] for r in rows] == [0, 1], (g, rows)
            late = rows[1][1] - rows[0][2]
            print(f"{g[:20]:>20}: redelivered {late:.2f} s after the failure")
            assert 9.0 <= late <= 11.0, f"group {g!r}: redelivered {late:.2f} s after failing, not 10 +- 1 s"
        leader = cluster.group.wait_leader()
        assert "raftmq_retry_overdue_messages{" not in cluster.http(leader, "/metrics")
    finally:
        for consumer in consumers:
            consumer.shutdown()


@pytest.mark.parametrize("cluster", [{"retry_delays": "4s 1s 2s"}], indirect=True)
def test_retries_follow_the_schedule_to_the_dead_letter_queue_across_a_leader_kill(
        cluster: Cluster) -> None:
    """Every group fails the message every time; the leader is killed once every send-back
    is held (4 s before its redelivery). Each group sees reconsume times 0, 1, 2, 3 on the
    schedule, then the message is in its %DLQ%group, once."""
    attempts = Attempts()
    consumers = start_consumers(cluster, attempts, fail_until=99, max_reconsume_times=3,
                                long_poll_s=2.0)
    try:
        with Producer(namesrv=cluster.ns, send_timeout=20) as p:
            sent = p.send(Message("rt", b"poison"), shard_key="k")
        wait_until(lambda: attempts.count(1), 20, what="the first delivery in every group")
        leader = cluster.group.wait_leader()

        def held() -> int:
            return int(json.loads(cluster.http(leader, "/admin/cluster"))["held"]["delayed"])

        wait_until(lambda: held() == len(GROUP_SHAPES), 10, what="every group's send-back held")
        cluster.group.kill(leader)
        cluster.group.wait_leader(timeout=30, among=[n for n in cluster.group.nodes if n != leader])
        wait_until(lambda: attempts.count(4), 60,
                   what=f"three redeliveries in every group; missing: {attempts.missing(4)}")
        pc = PullConsumer(namesrv=cluster.ns, read_from="any")
        try:
            def dead(g: str) -> list:  # type: ignore[type-arg]
                try:
                    return pc.pull(pc.queues(f"%DLQ%{g}")[0], 0).messages
                except Exception:
                    return []
            for g in GROUP_SHAPES:
                (m,) = wait_until(lambda g=g: dead(g), 30, what=f"the message in %DLQ%{g}")
                assert m.msg_id == sent.msg_id and m.body == b"poison" and m.reconsume_times == 4
        finally:
            pc.shutdown()
        for g, rows in attempts.by_group.items():
            assert [r[0] for r in rows] == [0, 1, 2, 3], (g, rows)
            gaps = [b[1] - a[2] for a, b in itertools.pairwise(rows)]
            assert all(gap >= want - 0.3 for gap, want in zip(gaps, (4, 1, 2), strict=True)), (g, gaps)
    finally:
        for consumer in consumers:
            consumer.shutdown()
