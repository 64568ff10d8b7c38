"""Delayed, retried and transactional messages on three broker processes, each across a
leader kill: the replicated hold state lets the new leader continue where the old stopped."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from client import (
    ConsumeStatus,
    LocalTransactionState,
    Message,
    Producer,
    PushConsumer,
    ReceivedMessage,
    TransactionProducer,
)
from raftmq.local_group import LocalGroup
from tests.support.broker_group import create_topic, running_brokers, servers
from tests.support.client_calls import Listener, collecting_consumer, dead_letters
from tests.support.ledger import Ledger
from tests.support.procs import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[LocalGroup]:
    with running_brokers(tmp_path / "brokers", delay_levels="1s 2s 3s", retry_delays="1s 2s") as group:
        yield group


def consumer(group: LocalGroup, topic: str, name: str, listener: Listener | None = None,
             **options: Any) -> tuple[PushConsumer, list[ReceivedMessage]]:
    """``collecting_consumer`` on ``group``, reading from any replica, with polls and intervals
    that ride out an election."""
    return collecting_consumer(servers(group), topic, name, listener, read_from="any", long_poll_s=1.0,
                               rebalance_interval=2.0, commit_interval=0.3, **options)


def kill_leader(group: LocalGroup) -> tuple[str, float]:
    leader = group.wait_leader()
    group.kill(leader)
    killed_at = time.time()
    group.wait_leader(timeout=30, among=[n for n in group.nodes if n != leader])
    return leader, killed_at


def test_a_delayed_message_is_delivered_once_and_on_time_after_a_failover(brokers: LocalGroup) -> None:
    create_topic(brokers, "later", 2)
    c, got = consumer(brokers, "later", "g")
    try:
        with Producer(servers=servers(brokers), send_timeout=20) as p:
            sent_at = time.time()
            p.send(Message("later", b"in-3s", delay_level=3), shard_key="k")
        kill_leader(brokers)  # held by the old leader's state; released by the new one
        wait_until(lambda: len(got) >= 1, 30, what="the delayed message")
        time.sleep(1.5)  # a second copy would arrive now
        assert [m.body for m in got] == [b"in-3s"]
        late = got[0].store_timestamp / 1000 - sent_at  # when it was released
        print(f"released {late:.2f} s after sending (3 s delay, a failover in between)")
        assert 2.0 <= late <= 4.0, f"released {late:.2f} s after sending: not within 3 s +- 1 s"
    finally:
        c.shutdown()


def test_retries_continue_after_a_failover_and_end_in_the_dead_letter_queue(brokers: LocalGroup) -> None:
    create_topic(brokers, "jobs", 2)
    attempts: list[int] = []

    def failing(msgs, ctx):  # type: ignore[no-untyped-def]
        attempts.extend(m.reconsume_times for m in msgs)
        return ConsumeStatus.RECONSUME_LATER

    c, _ = consumer(brokers, "jobs", "workers", failing, max_reconsume_times=3, suspend_s=0.2)
    try:
        with Producer(servers=servers(brokers), send_timeout=20) as p:
            r = p.send(Message("jobs", b"poison"))
        wait_until(lambda: len(attempts) >= 2, 30, what="the first retry")
        kill_leader(brokers)
        wait_until(lambda: len(attempts) >= 4, 60, what="every retry")
        assert attempts[:4] == [0, 1, 2, 3], attempts
        (m,) = dead_letters(servers(brokers), "workers", timeout=30)
        assert m.msg_id == r.msg_id and m.body == b"poison"
        time.sleep(1.0)
        assert len(attempts) == 4, attempts  # the dead letter ends the retries
    finally:
        c.shutdown()


def test_an_open_transaction_is_checked_back_by_the_new_leader_through_another_producer(
        brokers: LocalGroup) -> None:
    create_topic(brokers, "pay", 2)
    c, got = consumer(brokers, "pay", "billing")
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
        wait_until(lambda: [m.body for m in got] == [b"open"], 40,
                   what="the transaction committed by a check-back")
        assert survivor_ledger.checked[:1] == [b"open"]
        time.sleep(1.0)
        assert [m.body for m in got] == [b"open"]
    finally:
        survivor.shutdown()
        c.shutdown()
