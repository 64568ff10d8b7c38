"""The client against a one-node broker served in process (a background loop thread)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from client import Admin, ConsumeStatus, Message, Producer, PullConsumer, PushConsumer
from client.aio import AsyncProducer, AsyncPullConsumer
from client.backoff import Deadline
from client.errors import InvalidNameError, MessageTooLargeError, TopicNotExistError
from tests.support.procs import wait_until

#: these tests open IP sockets (a real port, the Raft transport or a client connection)
pytestmark = pytest.mark.sockets


def test_ordered_sends_pull_back_in_order_and_compressed_bodies_round_trip(broker: str) -> None:
    admin = Admin(servers=[broker])
    try:
        admin.create_topic("orders", queues=4)
        with Producer(servers=[broker], group="p") as p:
            sent = {}
            for i in range(200):
                key = f"k{i % 5}"
                body = (b"x" * 10_000 + str(i).encode()) if i % 50 == 0 else f"{key}:{i}".encode()
                r = p.send(Message("orders", body, tags="paid", keys=[f"order-{i}"]), shard_key=key)
                sent.setdefault(key, []).append((r.queue, r.queue_offset, body))
            # one shard key -> one queue, offsets strictly increasing with send order
            for rows in sent.values():
                assert len({q for q, _, _ in rows}) == 1
                assert [o for _, o, _ in rows] == sorted(o for _, o, _ in rows)
        c = PullConsumer(servers=[broker], group="reader", read_from="any")
        try:
            for rows in sent.values():
                q = rows[0][0]
                got = c.pull(q, rows[0][1], max_msgs=256).messages
                mine = [m for m in got if m.queue_offset in {o for _, o, _ in rows}]
                assert [m.body for m in mine] == [b for _, _, b in rows]
        finally:
            c.shutdown()
        found = admin.messages_by_key("orders", "order-50")
        assert len(found) == 1 and found[0].body.startswith(b"x" * 100)
        by_id = admin.message_by_id("orders", found[0].msg_id)
        assert by_id is not None and by_id.body == found[0].body
    finally:
        admin.close()


def test_bad_input_raises_typed_errors(broker: str) -> None:
    admin = Admin(servers=[broker])
    admin.create_topic("t1", queues=1)
    admin.create_topic("gone", queues=1)
    admin.delete_topic("gone")
    assert "gone" not in admin.topics() and "t1" in admin.topics()
    admin.close()
    with Producer(servers=[broker], max_message_bytes=1000) as p:
        with pytest.raises(MessageTooLargeError):
            p.send(Message("t1", b"x" * 1001))
        with pytest.raises(InvalidNameError):
            p.send(Message("bad topic!", b"x"))
        with pytest.raises(TopicNotExistError) as e:
            p.send(Message("nope", b"x"))
        assert not e.value.retriable
        # the queue keeps working after refusals
        assert p.send(Message("t1", b"fine"), shard_key="a").queue_offset == 0


def test_idempotent_resend_is_answered_not_stored(broker: str) -> None:
    async def main() -> None:
        p = AsyncProducer(servers=[broker], group="p")
        from client.aio import AsyncAdmin
        async with AsyncAdmin(servers=[broker]) as admin:
            await admin.create_topic("idem", queues=1)
        r1 = await p.send(Message("idem", b"one"), shard_key="s")
        sender = next(iter(p._senders.values()))
        # replay the exact request as a retry after a lost answer would
        from client.message import encode_batch
        from protocol.send import SendBatchRequest, SendBatchResponse
        record = encode_batch([Message("idem", b"one")], 0, [bytes.fromhex(r1.msg_id)], 0,
                              sender.producer_id, 0)
        reply = await p.core.leader_request(sender.queue.group, SendBatchRequest(records=(record,)),
                                            deadline=Deadline(5))
        (again,) = SendBatchResponse.from_frame(reply).rows
        assert again.code == 0 and "already" in again.reason and again.queue_offset == r1.queue_offset
        r2 = await p.send(Message("idem", b"two"), shard_key="s")
        assert r2.queue_offset == 1  # nothing was stored twice
        await p.shutdown()

    asyncio.run(main())


def test_push_consumer_orderly_and_tag_filter(broker: str) -> None:
    admin = Admin(servers=[broker])
    admin.create_topic("events", queues=2)
    admin.close()
    got: list[tuple[str, bytes]] = []
    lock = threading.Lock()

    def listener(msgs, ctx):  # type: ignore[no-untyped-def]
        with lock:
            got.extend((m.tags or "", m.body) for m in msgs)
        return ConsumeStatus.SUCCESS

    c = PushConsumer(servers=[broker], group="billing", topic="events", selector="paid || created",
                     orderly=True, from_where="first", commit_interval=0.2, long_poll_s=1.0)
    c.register(listener)
    c.start()
    try:
        with Producer(servers=[broker]) as p:
            for i in range(30):
                tag = ["paid", "created", "refunded"][i % 3]
                p.send(Message("events", f"{i}".encode(), tags=tag), shard_key="one-key")
        wait_until(timeout=15, predicate=lambda: len(got) == 20, what="20 matching messages")
        assert [int(b) for _, b in got] == [i for i in range(30) if i % 3 != 2]
        assert {t for t, _ in got} == {"paid", "created"}
    finally:
        c.shutdown()
    # offsets were committed at shutdown: past the last message, filtered ones included
    pc = AsyncPullConsumer(servers=[broker], group="billing")

    async def committed() -> list[int | None]:
        from client.aio.pull_consumer import committed_offset
        qs = await pc.queues("events")
        out = [await committed_offset(pc.core, "billing", q) for q in qs]
        await pc.close()
        return out

    offsets = asyncio.run(committed())
    assert sorted(o or 0 for o in offsets) == [0, 30]


def test_a_3_mib_message_round_trips_and_an_oversized_one_is_refused_before_sending(broker: str) -> None:
    import os

    admin = Admin(servers=[broker])
    admin.create_topic("big", queues=1)
    admin.close()
    body = os.urandom(3 << 20)  # incompressible
    with Producer(servers=[broker]) as p:
        r = p.send(Message("big", body, keys=["large"]), shard_key="s")
        with pytest.raises(MessageTooLargeError, match="exceeds max_message_bytes"):
            p.send(Message("big", os.urandom(4 << 20)))
        assert p.send(Message("big", b"after"), shard_key="s").queue_offset == r.queue_offset + 1
    c = PullConsumer(servers=[broker], read_from="any")
    try:
        got = c.pull(r.queue, r.queue_offset, max_msgs=8).messages
        assert got[0].body == body and got[1].body == b"after"
    finally:
        c.shutdown()


def test_broadcasting_consumers_each_get_every_message_and_keep_offsets_locally(broker: str,
                                                                               tmp_path) -> None:  # type: ignore[no-untyped-def]
    admin = Admin(servers=[broker])
    admin.create_topic("news", queues=2)
    admin.close()
    with Producer(servers=[broker]) as p:
        for i in range(10):
            p.send(Message("news", f"{i}".encode()), shard_key=f"k{i}")
    seen: dict[str, list[int]] = {"a": [], "b": []}
    consumers = []
    for name in seen:
        c = PushConsumer(servers=[broker], group="readers", topic="news", model="broadcasting",
                         from_where="first", instance_name=name, offset_store_dir=tmp_path,
                         long_poll_s=0.5, commit_interval=0.2)
        c.register(lambda msgs, ctx, name=name: seen[name].extend(int(m.body) for m in msgs)  # type: ignore[misc]
                   or ConsumeStatus.SUCCESS)
        consumers.append(c.start())
    try:
        wait_until(timeout=15, predicate=lambda: all(len(v) == 10 for v in seen.values()),
                   what="both consumers")
        assert all(sorted(v) == list(range(10)) for v in seen.values())
    finally:
        for c in consumers:
            c.shutdown()
    import json
    stored = json.loads((tmp_path / "readers" / "a.json").read_text())
    assert sum(stored.values()) == 10  # next offsets of both queues


def test_orderly_members_never_consume_one_queue_at_the_same_time(broker: str) -> None:
    """A queue moving between orderly members of a group is handed over through its consume
    lock: the old owner finishes the message in hand and commits before the new one starts,
    so each queue's deliveries, across both members, are its offsets once each, in order."""
    admin = Admin(servers=[broker])
    admin.create_topic("ledger", queues=4)
    admin.close()
    active: dict[int, int] = {}
    overlaps: list[tuple[int, int]] = []
    delivered: list[tuple[int, int]] = []  # (queue id, offset) in the order listeners ran
    guard = threading.Lock()

    def listener(msgs, ctx):  # type: ignore[no-untyped-def]
        q = ctx.queue.queue_id
        with guard:
            active[q] = active.get(q, 0) + 1
            if active[q] > 1:
                overlaps.append((q, msgs[0].queue_offset))
            delivered.extend((q, m.queue_offset) for m in msgs)
        threading.Event().wait(0.004)  # the work of consuming: keeps a message in hand for a while
        with guard:
            active[q] -= 1
        return ConsumeStatus.SUCCESS

    def member() -> PushConsumer:
        c = PushConsumer(servers=[broker], group="ledger-readers", topic="ledger", orderly=True,
                         from_where="first", commit_interval=0.2, long_poll_s=0.5, suspend_s=0.2)
        c.register(listener)
        return c.start()  # type: ignore[return-value]

    total = 400
    with Producer(servers=[broker]) as p:
        first = member()
        second = None
        try:
            for i in range(total):
                p.send(Message("ledger", f"{i}".encode()), shard_key=f"k{i % 8}")
                if i == total // 4:
                    second = member()  # takes half of the queues while the first is consuming them
            wait_until(timeout=60, predicate=lambda: len(delivered) >= total, what="every message")
            assert second is not None and first.assignment() and second.assignment()
        finally:
            first.shutdown()
            if second is not None:
                second.shutdown()
    assert overlaps == []
    for q in range(4):
        offsets = [o for qid, o in delivered if qid == q]
        assert offsets == list(range(len(offsets))), f"queue {q}: {offsets[:20]}..."
    assert len(delivered) == total
