"""Delayed, retried, dead-lettered and transactional messages, and SQL92 subscriptions,
against a one-node broker in process (short delay levels so the tests are fast)."""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest

from client import (
    Admin,
    ConsumeStatus,
    LocalTransactionState,
    Message,
    Producer,
    PullConsumer,
    PushConsumer,
    ReceivedMessage,
    TransactionProducer,
)
from client.tag_filter import SubscriptionError
from tests.support.client_calls import Listener, collecting_consumer, create_topic_at, dead_letters
from tests.support.ledger import Ledger
from tests.support.procs import wait_until

#: these tests open IP sockets (a real port, the Raft transport or a client connection)
pytestmark = pytest.mark.sockets

BROKER_OPTIONS = {"delay_levels": "300ms 600ms 1s", "retry_delays": "200ms 300ms"}

#: short polls and intervals: the one broker answers at once
QUICK_CONSUMER = {"long_poll_s": 0.5, "rebalance_interval": 1.0, "commit_interval": 0.2, "suspend_s": 0.1}


def collect(broker: str, topic: str, group: str, listener: Listener | None = None,
            **options: Any) -> tuple[PushConsumer, list[ReceivedMessage]]:
    """``collecting_consumer`` on ``broker``, QUICK_CONSUMER unless ``options`` say otherwise."""
    return collecting_consumer([broker], topic, group, listener, **{**QUICK_CONSUMER, **options})


def test_a_delayed_message_is_held_until_its_level_then_delivered_once(broker: str) -> None:
    create_topic_at([broker], "t", 1)
    c, got = collect(broker, "t", "g")
    try:
        with Producer(servers=[broker]) as p:
            sent_at = time.time()
            p.send(Message("t", b"later", delay_level=3), shard_key="k")  # 1 s
            p.send(Message("t", b"at-once"), shard_key="k")
            p.send(Message("t", b"timer", deliver_at_ms=int((sent_at + 0.6) * 1000)), shard_key="k")
        wait_until(timeout=15, predicate=lambda: len(got) >= 3, what="three deliveries")
        by_body = {m.body: m for m in got}
        assert got[0].body == b"at-once"
        delay = by_body[b"later"].store_timestamp / 1000 - sent_at
        assert 0.9 <= delay <= 2.5, delay
        timer = by_body[b"timer"].store_timestamp / 1000 - sent_at
        assert 0.5 <= timer <= 2.0, timer
        time.sleep(0.5)  # nothing more arrives (no second copy)
        assert sorted(m.body for m in got) == [b"at-once", b"later", b"timer"]
    finally:
        c.shutdown()


def test_bad_delays_and_reserved_properties_are_refused(broker: str) -> None:
    create_topic_at([broker], "t2", 1)
    from client.errors import InvalidArgumentError
    with Producer(servers=[broker]) as p:
        with pytest.raises(InvalidArgumentError, match=r"DELAY must be a level 1\.\.3"):
            p.send(Message("t2", b"x", delay_level=4))
        with pytest.raises(InvalidArgumentError, match="3 days"):
            p.send(Message("t2", b"x", deliver_at_ms=int(time.time() * 1000) + 4 * 86_400_000))
        with pytest.raises(InvalidArgumentError, match="reserved"):
            p.send(Message("t2", b"x", properties={"__SCHEDULED_FROM": "0"}))


@pytest.mark.parametrize("group", ["acc-g", "orders-consumer", "ab_1", "eu|pay"])
def test_a_clustering_consumer_s_retry_topic_exists_once_it_has_started(broker: str, group: str) -> None:
    """The broker creates %RETRY%group at the group's first heartbeat (RocketMQ does too), so the
    consumer pulls its retry queue before anything fails; broadcasting consumers have none."""
    create_topic_at([broker], "subscribed", 1)
    c, _ = collect(broker, "subscribed", group)
    b, _ = collect(broker, "subscribed", f"{group}-bc", model="broadcasting")
    admin = Admin(servers=[broker])
    try:
        topics = admin.topics()
        assert topics.get(f"%RETRY%{group}") is not None, sorted(topics)
        assert f"%RETRY%{group}-bc" not in topics
        assert any(q.topic == f"%RETRY%{group}" for q in c.assignment()), c.assignment()
    finally:
        admin.close()
        b.shutdown()
        c.shutdown()


def test_failed_messages_are_retried_on_schedule_then_dead_lettered(broker: str) -> None:
    create_topic_at([broker], "jobs", 1)
    attempts: list[tuple[int, float]] = []

    def failing(msgs, ctx):  # type: ignore[no-untyped-def]
        attempts.extend((m.reconsume_times, time.time()) for m in msgs)
        assert all(m.topic == "jobs" for m in msgs)  # retried copies show their original topic
        return ConsumeStatus.RECONSUME_LATER

    c, _ = collect(broker, "jobs", "workers", failing, max_reconsume_times=3)
    try:
        with Producer(servers=[broker]) as p:
            r = p.send(Message("jobs", b"poison", keys=["poison-1"]))
        wait_until(timeout=15, predicate=lambda: len(attempts) >= 4, what="4 attempts (1 + 3 retries)")
        assert [a[0] for a in attempts[:4]] == [0, 1, 2, 3]
        gaps = [b[1] - a[1] for a, b in itertools.pairwise(attempts[:4])]
        assert all(g >= 0.15 for g in gaps), gaps  # the retry schedule, not a hot loop
        (m,) = dead_letters([broker], "workers", timeout=15)
        assert m.msg_id == r.msg_id and m.body == b"poison" and m.reconsume_times == 4
        time.sleep(0.5)
        assert len(attempts) == 4  # nothing after the dead letter
    finally:
        c.shutdown()
    # `raftmq dlq resend` puts it back on its original topic, once
    import subprocess
    import sys
    def raftmq(*args: str) -> str:
        out = subprocess.run([sys.executable, "-m", "raftmq", *args, "--servers", broker],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stderr

    assert "1 dead letters listed" in raftmq("dlq", "list", "workers")
    assert "1 dead letters resent" in raftmq("dlq", "resend", "workers")
    assert "0 dead letters resent" in raftmq("dlq", "resend", "workers")  # progress is remembered
    pc = PullConsumer(servers=[broker], read_from="any")
    try:
        again = pc.pull(pc.queues("jobs")[0], 0).messages
        assert [m.body for m in again] == [b"poison", b"poison"]  # the original and the resent copy
    finally:
        pc.shutdown()


def test_transactions_commit_rollback_and_check_back(broker: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import broker.state.held as deferred

    monkeypatch.setattr(deferred, "TRANSACTION_TIMEOUT_MS", 300)
    create_topic_at([broker], "pay", 1)
    c, got = collect(broker, "pay", "billing")
    ledger = Ledger(LocalTransactionState.COMMIT)
    tp = TransactionProducer(servers=[broker], group="pay-tx", listener=ledger)
    tp.start()
    try:
        tp.send_in_transaction(Message("pay", b"committed"), "commit")
        tp.send_in_transaction(Message("pay", b"rolled-back"), "rollback")
        tp.send_in_transaction(Message("pay", b"checked"), "unknown")  # the broker asks back
        wait_until(timeout=15, predicate=lambda: sorted(m.body for m in got) == [b"checked", b"committed"],
                   what="the committed and the checked-back messages")
        assert set(ledger.checked) == {b"checked"}  # asked back (again if the answer is slow)
        time.sleep(0.6)
        assert sorted(m.body for m in got) == [b"checked", b"committed"]
    finally:
        tp.shutdown()
        c.shutdown()


def test_an_open_transaction_is_rolled_back_after_15_checks(broker: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import broker.state.held as deferred

    monkeypatch.setattr(deferred, "TRANSACTION_TIMEOUT_MS", 20)
    create_topic_at([broker], "pay2", 1)
    ledger = Ledger(LocalTransactionState.UNKNOWN)
    tp = TransactionProducer(servers=[broker], group="pay2-tx", listener=ledger)
    tp.start()
    try:
        tp.send_in_transaction(Message("pay2", b"undecided"), "unknown")
        wait_until(timeout=15, predicate=lambda: len(ledger.checked) >= 15, what="15 check-backs")
        time.sleep(0.5)
        assert len(ledger.checked) == 15
    finally:
        tp.shutdown()
    pc = PullConsumer(servers=[broker], read_from="any")
    try:
        q = pc.queues("pay2")[0]
        assert pc.pull(q, 0).messages == []  # rolled back: never visible
    finally:
        pc.shutdown()


def test_sql92_subscriptions_select_on_properties(broker: str) -> None:
    create_topic_at([broker], "ev", 1)
    with pytest.raises(SubscriptionError, match="position"):
        PushConsumer(servers=[broker], group="s", topic="ev", sql="region = 'eu' AND")
    c, got = collect(broker, "ev", "sql", sql="region = 'eu' AND (amount > 100 OR vip IS NOT NULL)")
    try:
        with Producer(servers=[broker]) as p:
            rows = [({"region": "eu", "amount": "150"}, True), ({"region": "eu", "amount": "50"}, False),
                    ({"region": "us", "amount": "500"}, False), ({"region": "eu", "vip": "1"}, True),
                    ({"amount": "1000"}, False)]
            for i, (props, _) in enumerate(rows):
                p.send(Message("ev", str(i).encode(), properties=props), shard_key="k")
        wait_until(timeout=15, predicate=lambda: len(got) >= 2, what="the matching messages")
        time.sleep(0.5)
        assert sorted(int(m.body) for m in got) == [i for i, (_, ok) in enumerate(rows) if ok]
    finally:
        c.shutdown()


def test_a_held_message_s_send_result_names_its_queue_and_no_internal_offset(broker: str) -> None:
    """Issue 13 row 8: a delayed send reported its offset in SCHEDULE_TOPIC_XXXX's queue."""
    create_topic_at([broker], "held", 1)
    with Producer(servers=[broker]) as p:
        first = p.send(Message("held", b"now"), shard_key="k")
        later = p.send(Message("held", b"later", deliver_at_ms=int(time.time() * 1000) + 600), shard_key="k")
        last = p.send(Message("held", b"also now"), shard_key="k")
    assert later.queue == first.queue and later.queue_offset == -1
    assert (first.queue_offset, last.queue_offset) == (0, 1)
    c, got = collect(broker, "held", "g-held")
    try:
        wait_until(timeout=15, predicate=lambda: len(got) >= 3, what="three deliveries")
        assert {m.body: m.queue_offset for m in got}[b"later"] == 2  # its offset, given at delivery
    finally:
        c.shutdown()


def test_consume_max_with_commit_commits_exactly_what_it_printed(broker: str) -> None:
    """Issue 13 row 8: `raftmq consume --max 20 --commit` printed 20 and committed 32."""
    import subprocess
    import sys

    create_topic_at([broker], "counted", 1)
    with Producer(servers=[broker]) as p:
        p.send_batch([Message("counted", f"m{i}".encode()) for i in range(50)], shard_key="k")
    out = subprocess.run([sys.executable, "-m", "raftmq", "consume", "counted", "--group", "cli-g",
                          "--from", "first", "--max", "20", "--commit", "--servers", broker],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.splitlines()) == 20
    admin = Admin(servers=[broker])
    try:
        (row,) = admin.progress("cli-g", "counted")
        assert (row.committed, row.max_offset) == (20, 50)
    finally:
        admin.close()
