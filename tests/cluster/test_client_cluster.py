"""The client against three broker processes: ordered sends through leader kills,
a consumer group rebalancing, consumption from a follower while no leader exists."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from client import ConsumeStatus, Message, PushConsumer
from client.aio import AsyncProducer
from client.errors import ClientError
from raftmq.local_group import LocalGroup
from tests.support.broker_group import create_topic, running_brokers, servers
from tests.support.message_history import MessageHistory
from tests.support.procs import wait_until

pytestmark = [pytest.mark.cluster]


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[LocalGroup]:
    with running_brokers(tmp_path / "brokers") as group:
        yield group


def recording_consumer(group: LocalGroup, history: MessageHistory, name: str, **options) -> PushConsumer:  # type: ignore[no-untyped-def]
    c = PushConsumer(servers=servers(group), group="billing", topic="orders",
                     from_where="first", commit_interval=0.5, long_poll_s=2.0, **options)

    def listener(msgs, ctx):  # type: ignore[no-untyped-def]
        for m in msgs:
            history.delivered(m.body, str(m.queue), m.queue_offset, name)
        return ConsumeStatus.SUCCESS

    c.register(listener)
    return c.start()


@pytest.mark.slow
def test_ordered_sends_survive_two_leader_kills(brokers: LocalGroup) -> None:
    """8 shard keys x 2,000 messages, sent in order per key while the leader is killed
    with SIGKILL twice: the orderly consumer sees every acknowledged message of each key
    exactly once and in order."""
    keys, per_key = 8, 2000
    create_topic(brokers, "orders", 8)
    history = MessageHistory()
    consumer = recording_consumer(brokers, history, "c1", orderly=True)
    progress = [0]

    async def send_all() -> None:
        async with AsyncProducer(servers=servers(brokers), group="orders-producer",
                                 send_timeout=15.0) as p:
            async def one_key(k: int) -> None:
                key = f"key-{k}"
                for i in range(per_key):
                    payload = f"{key}:{i:05d}".encode()
                    try:
                        r = await p.send(Message("orders", payload), shard_key=key)
                        history.ok(payload, key, str(r.queue), r.queue_offset)
                    except ClientError:
                        history.unknown(payload, key)
                    progress[0] += 1
            await asyncio.gather(*(one_key(k) for k in range(keys)))

    sender = threading.Thread(target=lambda: asyncio.run(send_all()))
    sender.start()
    try:
        kills = []
        for fraction in (0.3, 0.6):
            wait_until(lambda f=fraction: progress[0] >= f * keys * per_key, 120, what=f"{fraction:.0%} sent")
            leader = brokers.wait_leader(timeout=30)
            brokers.kill(leader)
            kills.append(leader)
            brokers.wait_leader(timeout=30, among=[n for n in brokers.nodes if n != leader])
            brokers.start_node(leader)  # back as a follower: the next kill leaves a majority
        sender.join(timeout=300)
        assert not sender.is_alive(), "the sends did not finish within 300 s"
        acked = {s.payload for s in history.acked()}
        assert len(acked) >= 0.95 * keys * per_key, history.summary()
        wait_until(lambda: not history.missing(), 120, what="every acknowledged message consumed")
    finally:
        sender.join(timeout=60)
        consumer.shutdown()
    history.check(exactly_once=True)
    print("ordered sends through two leader kills:", history.summary(), "killed:", kills)


@pytest.mark.slow
def test_consumer_group_rebalances_when_a_member_leaves(brokers: LocalGroup) -> None:
    create_topic(brokers, "orders", 8)
    history = MessageHistory()
    members = [recording_consumer(brokers, history, f"c{i}", rebalance_interval=2.0) for i in range(3)]
    try:
        def spread() -> list[int]:  # the topic's queues (the group's retry queue is one more)
            return sorted(len([q for q in c.assignment() if q.topic == "orders"]) for c in members)

        wait_until(lambda: spread() == [2, 3, 3], 30, what="the 8 queues spread over 3 members")

        async def send(n: int, start: int) -> None:
            async with AsyncProducer(servers=servers(brokers)) as p:
                for i in range(start, start + n):
                    payload = f"m{i:05d}".encode()
                    r = await p.send(Message("orders", payload))
                    history.ok(payload, None, str(r.queue), r.queue_offset)

        asyncio.run(send(600, 0))
        leaving = members.pop(1)
        leaving.shutdown()
        wait_until(lambda: spread() == [4, 4], 30, what="the leaver's queues taken over")
        asyncio.run(send(600, 600))
        wait_until(lambda: not history.missing(), 60, what="every acknowledged message consumed")
    finally:
        for c in members:
            c.shutdown()
    history.check()  # at-least-once: redelivery after the hand-over is allowed, loss is not
    assert {d[3] for d in history.deliveries} >= {"c0", "c2"}


@pytest.mark.slow
def test_consumption_continues_from_a_follower_while_no_leader_exists(brokers: LocalGroup) -> None:
    create_topic(brokers, "orders", 4)
    history = MessageHistory()

    async def send() -> None:
        async with AsyncProducer(servers=servers(brokers)) as p:
            for i in range(400):
                payload = f"m{i:04d}".encode()
                r = await p.send(Message("orders", payload), shard_key=f"k{i % 4}")
                history.ok(payload, f"k{i % 4}", str(r.queue), r.queue_offset)

    asyncio.run(send())
    leader = brokers.wait_leader()
    survivor = next(n for n in brokers.nodes if n != leader)
    target = brokers.status(leader)["commit_index"]  # type: ignore[index]
    brokers.wait_status(survivor, lambda s: s["applied_index"] >= target, 30, "catch-up")
    for name in brokers.nodes:
        if name != survivor:
            brokers.kill(name)  # two of three down: no leader can be elected
    assert brokers.status(survivor)["role"] != "leader"  # type: ignore[index]
    consumer = recording_consumer(brokers, history, "c1", orderly=True)
    try:
        wait_until(lambda: not history.missing(), 60, what="every message consumed from the lone follower")
    finally:
        consumer.shutdown()
    history.check(exactly_once=True)
