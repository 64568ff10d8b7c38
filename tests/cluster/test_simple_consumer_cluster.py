"""SimpleConsumers (issue 29) against three broker processes: many consumers of one group
drain a 2-queue topic with each message acked once; a consumer that stops holding messages
hands them back after their invisibility; a nack follows the group's backoff; max deliveries
send a message to %DLQ%group; a leader killed with SIGKILL loses no ack and no deadline."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from client import Admin, Message, PullConsumer
from client.aio import AsyncProducer, AsyncSimpleConsumer, SimpleMessage
from client.backoff import Deadline
from client.errors import ClientError
from raftmq.local_group import LocalGroup
from tests.support.broker_group import create_topic, running_brokers, servers

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[LocalGroup]:
    with running_brokers(tmp_path / "brokers") as group:
        yield group


async def _produce(group: LocalGroup, topic: str, count: int, prefix: str = "job") -> set[bytes]:
    bodies = [f"{prefix}-{i:06d}".encode() for i in range(count)]
    async with AsyncProducer(servers=servers(group), group="p", send_timeout=15.0) as p:
        for start in range(0, count, 256):
            await p.send_batch([Message(topic, b) for b in bodies[start:start + 256]], shard_key=str(start))
    return set(bodies)


def _consumer(group: LocalGroup, name: str, topic: str = "jobs") -> AsyncSimpleConsumer:
    return AsyncSimpleConsumer(group=name, topic=topic, servers=servers(group), timeout=30.0)


def test_twelve_consumers_drain_a_two_queue_topic_each_message_acked_once(brokers: LocalGroup) -> None:
    create_topic(brokers, "jobs", 2)
    count, workers = 6000, 12

    async def run() -> tuple[Counter[bytes], list[int], set[bytes]]:
        sent = await _produce(brokers, "jobs", count)
        acked: Counter[bytes] = Counter()
        per_worker = [0] * workers
        deadline = Deadline(240)
        consumers = [_consumer(brokers, "workers") for _ in range(workers)]

        async def work(i: int, c: AsyncSimpleConsumer) -> None:
            while len(acked) < count and not deadline.expired():
                for m in await c.receive(max_messages=16, invisible_duration_s=60, wait_s=1):
                    await c.ack(m)
                    acked[m.body] += 1
                    per_worker[i] += 1
        try:
            await asyncio.gather(*(work(i, c) for i, c in enumerate(consumers)))
            leftover = await consumers[0].receive(wait_s=0)
        finally:
            for c in consumers:
                await c.close()
        assert leftover == []
        return acked, per_worker, sent

    started = time.monotonic()
    acked, per_worker, sent = asyncio.run(run())
    assert set(acked) == sent and set(acked.values()) == {1}  # every message, each acked once
    assert all(n > 0 for n in per_worker), per_worker  # 12 consumers on 2 queues all got work
    print(f"{workers} SimpleConsumers drained {count} messages in {time.monotonic() - started:.1f} s; "
          f"per consumer {sorted(per_worker)}")


def test_messages_held_by_a_stopped_consumer_come_back_to_the_others(brokers: LocalGroup) -> None:
    create_topic(brokers, "jobs", 2)

    async def run() -> None:
        sent = await _produce(brokers, "jobs", 40)
        quitter = _consumer(brokers, "workers")
        held = await quitter.receive(max_messages=16, invisible_duration_s=3, wait_s=5)
        assert held
        await quitter.close()  # stops with messages in hand: never acks them
        others = [_consumer(brokers, "workers") for _ in range(3)]
        seen: dict[bytes, int] = {}
        deadline = Deadline(60)
        try:
            while len(seen) < len(sent) and not deadline.expired():
                batches = await asyncio.gather(*(c.receive(wait_s=2, invisible_duration_s=30)
                                                 for c in others))
                for c, batch in zip(others, batches, strict=True):
                    for m in batch:
                        seen[m.body] = m.delivery
                        await c.ack(m)
        finally:
            for c in others:
                await c.close()
        assert set(seen) == sent  # none lost
        assert {seen[m.body] for m in held} == {2}  # the held ones came back once, after 3 s
        assert {d for b, d in seen.items() if b not in {m.body for m in held}} == {1}

    asyncio.run(run())


def test_a_nack_follows_the_backoff_and_max_deliveries_dead_letter(brokers: LocalGroup) -> None:
    create_topic(brokers, "jobs", 2)
    admin = Admin(servers=servers(brokers))
    try:
        admin.group_config("retrying", retry_s=(1.0, 3.0), max_deliveries=3)
    finally:
        admin.close()

    async def run() -> list[tuple[int, float]]:
        await _produce(brokers, "jobs", 1, prefix="poison")
        c = _consumer(brokers, "retrying")
        waits: list[tuple[int, float]] = []  # (delivery nacked, seconds until it came back)
        try:
            (m,) = await c.receive(wait_s=10)
            while True:
                nacked_at = time.monotonic()
                if await c.nack(m):
                    break
                got: list[SimpleMessage] = []
                while not got:
                    got = await c.receive(wait_s=10)
                waits.append((m.delivery, time.monotonic() - nacked_at))
                m = got[0]
            assert m.delivery == 3
            assert await c.receive(wait_s=4) == []  # dead-lettered: not delivered again
        finally:
            await c.close()
        return waits

    waits = asyncio.run(run())
    assert [d for d, _ in waits] == [1, 2]
    for (_, waited), backoff in zip(waits, (1.0, 3.0), strict=True):
        assert waited >= backoff - 0.05, waits  # not before its backoff (the leader's clock)
    print("nack -> redelivery (delivery, seconds):", [(d, round(w, 2)) for d, w in waits])
    dlq = PullConsumer(servers=servers(brokers), group="dlq-reader", read_from="leader")
    try:
        (queue,) = dlq.queues("%DLQ%retrying")
        (dead,) = dlq.pull(queue, 0, max_msgs=8).messages
        assert dead.body == b"poison-000000" and dead.topic == "jobs"
    finally:
        dlq.shutdown()


def test_a_leader_kill_while_eight_consumers_work_loses_nothing_and_redelivers_no_ack(
        brokers: LocalGroup) -> None:
    """SIGKILL of the leader while 8 SimpleConsumers receive and ack: every message is acked,
    none is delivered after its ack returned, and a message whose ack was lost with the leader
    (or that was in hand at the failover) comes back at most once more (counted, printed)."""
    create_topic(brokers, "jobs", 2)
    count = 2000

    async def run() -> tuple[set[bytes], dict[bytes, float], list[tuple[bytes, float, int]], str]:
        sent = await _produce(brokers, "jobs", count)
        acked_at: dict[bytes, float] = {}
        received: list[tuple[bytes, float, int]] = []  # (body, when, delivery)
        consumers = [_consumer(brokers, "workers") for _ in range(8)]
        deadline = Deadline(180)

        async def work(c: AsyncSimpleConsumer) -> None:
            while len(acked_at) < count and not deadline.expired():
                try:
                    batch = await c.receive(max_messages=8, invisible_duration_s=4, wait_s=1)
                except ClientError:
                    continue  # no leader for a moment: retried until the deadline
                for m in batch:
                    received.append((m.body, time.monotonic(), m.delivery))
                    try:
                        await c.ack(m)
                    except ClientError:
                        continue  # lost with the leader, or stale: it comes back
                    acked_at.setdefault(m.body, time.monotonic())

        async def kill_the_leader() -> str:
            while len(acked_at) < count // 3 and not deadline.expired():
                await asyncio.sleep(0.05)
            leader = await asyncio.to_thread(brokers.wait_leader, 30)
            await asyncio.to_thread(brokers.kill, leader)
            return leader

        try:
            killed, *_ = await asyncio.gather(kill_the_leader(), *(work(c) for c in consumers))
        finally:
            for c in consumers:
                await c.close()
        return sent, acked_at, received, killed

    sent, acked_at, received, killed = asyncio.run(run())
    assert set(acked_at) == sent  # none lost
    after_ack = [(b, t) for b, t, _ in received if t > acked_at[b]]
    assert not after_ack, after_ack[:5]  # no acked message delivered again
    again = Counter(b for b, _, d in received if d > 1)
    assert all(n <= 2 for n in Counter(b for b, _, _ in received).values())
    print(f"leader {killed} killed while 8 SimpleConsumers worked: {len(sent)} acked, "
          f"{len(again)} delivered a second time (in hand or ack lost at the failover)")


def test_an_ordered_group_keeps_each_keys_order_with_eight_consumers(brokers: LocalGroup) -> None:
    create_topic(brokers, "fifo", 4)
    admin = Admin(servers=servers(brokers))
    try:
        admin.group_config("fifo-g", retry_s=(1.0,), max_deliveries=16, ordered=True)
    finally:
        admin.close()
    keys, per_key = 8, 50

    async def run() -> list[bytes]:
        async with AsyncProducer(servers=servers(brokers), group="p", send_timeout=15.0) as p:
            for i in range(per_key):
                for k in range(keys):
                    await p.send(Message("fifo", f"k{k}:{i:04d}".encode()), shard_key=f"k{k}")
        consumers = [_consumer(brokers, "fifo-g", topic="fifo") for _ in range(8)]
        done: list[bytes] = []
        deadline = Deadline(180)

        async def work(c: AsyncSimpleConsumer) -> None:
            while len(done) < keys * per_key and not deadline.expired():
                for m in await c.receive(max_messages=8, wait_s=1):
                    done.append(m.body)
                    await c.ack(m)
        try:
            await asyncio.gather(*(work(c) for c in consumers))
        finally:
            for c in consumers:
                await c.close()
        return done

    done = asyncio.run(run())
    assert len(done) == keys * per_key == len(set(done))
    for k in range(keys):
        mine = [b for b in done if b.startswith(f"k{k}:".encode())]
        assert mine == sorted(mine)  # each key in send order
