"""Delayed, retried and transactional messages on three broker processes, each across a
leader kill: the replicated hold state lets the new leader continue where the old stopped."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from client import (
    Admin,
    ConsumeStatus,
    LocalTransactionState,
    Message,
    Producer,
    PullConsumer,
    PushConsumer,
    TransactionProducer,
)
from raftmq.local_group import LocalGroup
from tests.support.broker_group import running_brokers, servers
from tests.support.ledger import Ledger
from tests.support.procs import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[LocalGroup]:
    with running_brokers(tmp_path / "brokers", delay_levels="1s 2s 3s", retry_delays="1s 2s") as group:
        yield group


def create(group: LocalGroup, topic: str) -> None:
    admin = Admin(servers=servers(group))
    try:
        admin.create_topic(topic, queues=2)
    finally:
        admin.close()


def consumer(group: LocalGroup, topic: str, name: str, listener, **options) -> PushConsumer:  # type: ignore[no-untyped-def]
    c = PushConsumer(servers=servers(group), group=name, topic=topic, from_where="first",
                     read_from="any", long_poll_s=1.0, rebalance_interval=2.0, commit_interval=0.3,
                     **options)
    c.register(listener)
    return c.start()


def kill_leader(group: LocalGroup) -> tuple[str, float]:
    leader = group.wait_leader()
    group.kill(leader)
    killed_at = time.time()
    group.wait_leader(timeout=30, among=[n for n in group.nodes if n != leader])
    return leader, killed_at


def test_a_delayed_message_is_delivered_once_and_on_time_after_a_failover(brokers: LocalGroup) -> None:
    create(brokers, "later")
    got: list[tuple[bytes, float]] = []
    lock = threading.Lock()

    def listener(msgs, ctx):  # type: ignore[no-untyped-def]
        with lock:
            got.extend((m.body, m.store_timestamp / 1000) for m in msgs)  # when it was released
        return ConsumeStatus.SUCCESS

    c = consumer(brokers, "later", "g", listener)
    try:
        with Producer(servers=servers(brokers), send_timeout=20) as p:
            sent_at = time.time()
            p.send(Message("later", b"in-3s", delay_level=3), shard_key="k")
        kill_leader(brokers)  # held by the old leader's state; released by the new one
        wait_until(lambda: len(got) >= 1, 30, what="the delayed message")
        time.sleep(1.5)  # a second copy would arrive now
        assert [b for b, _ in got] == [b"in-3s"]
        late = got[0][1] - sent_at
        print(f"released {late:.2f} s after sending (3 s delay, a failover in between)")
        assert 2.0 <= late <= 4.0, f"released {late:.2f} s after sending: not within 3 s +- 1 s"
    finally:
        c.shutdown()


def test_retries_continue_after_a_failover_and_end_in_the_dead_letter_queue(brokers: LocalGroup) -> None:
    create(brokers, "jobs")
    attempts: list[int] = []

    def failing(msgs, ctx):  # type: ignore[no-untyped-def]
        attempts.extend(m.reconsume_times for m in msgs)
        return ConsumeStatus.RECONSUME_LATER

    c = consumer(brokers, "jobs", "workers", failing, max_reconsume_times=3, suspend_s=0.2)
    try:
        with Producer(servers=servers(brokers), send_timeout=20) as p:
            r = p.send(Message("jobs", b"poison"))
        wait_until(lambda: len(attempts) >= 2, 30, what="the first retry")
        kill_leader(brokers)
        wait_until(lambda: len(attempts) >= 4, 60, what="every retry")
        assert attempts[:4] == [0, 1, 2, 3], attempts
        pc = PullConsumer(servers=servers(brokers), read_from="any")
        try:
            def dead() -> list:  # type: ignore[type-arg]
                try:
                    return pc.pull(pc.queues("%DLQ%workers")[0], 0).messages
                except Exception:
                    return []
            wait_until(lambda: dead(), 30, what="the message in %DLQ%workers")
            (m,) = dead()
            assert m.msg_id == r.msg_id and m.body == b"poison"
        finally:
            pc.shutdown()
        time.sleep(1.0)
        assert len(attempts) == 4, attempts  # the dead letter ends the retries
    finally:
        c.shutdown()


def test_an_open_transaction_is_checked_back_by_the_new_leader_through_another_producer(
        brokers: LocalGroup) -> None:
    create(brokers, "pay")
    got: list[bytes] = []
    c = consumer(brokers, "pay", "billing", lambda msgs, ctx: got.extend(m.body for m in msgs)
                 or ConsumeStatus.SUCCESS)
    survivor_ledger = Ledger(LocalTransactionState.COMMIT)
    survivor = TransactionProducer(servers=servers(brokers), group="pay-tx", listener=survivor_ledger)
    survivor.start()
    try:
        doomed = TransactionProducer(servers=servers(brokers), group="pay-tx",
                                     listener=Ledger(LocalTransactionState.ROLLBACK))
        doomed.start()
        doomed.send_in_transaction(Message("pay", b"open"), None)
        doomed.shutdown()  # the producer that opened the transaction is gone
        kill_leader(brokers)
        wait_until(lambda: got == [b"open"], 40, what="the transaction committed by a check-back")
        assert survivor_ledger.checked[:1] == [b"open"]
        time.sleep(1.0)
        assert got == [b"open"]
    finally:
        survivor.shutdown()
        c.shutdown()
