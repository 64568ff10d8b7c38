"""The leader's write path on a one-node group: group commit, outcomes, idempotency."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest

from broker.replication.write_path import WritePath
from broker.state.machine import BrokerStateMachine, Outcome
from broker.store.commands import CreateTopic, RecordKind, encode_admin, record_kind
from broker.store.entry_batch import MessageTooLarge, max_message_bytes, read_stamp, unpack_entry
from broker.store.fragments import parse_fragment, read_message
from dledger.applier import Applier
from dledger.log import Log
from protocol.message_format import Message, decode_message, encode_message


@dataclass(frozen=True)
class Node:
    """The one-node group of ``one_node_broker``: its log, its state machine, and write
    paths made over them."""

    rlog: Log
    machine: BrokerStateMachine
    applier: Applier

    def write_path(self, **options: Any) -> WritePath:
        """A leader's ``WritePath`` over this node (``options``: its keyword arguments)."""
        return WritePath(self.rlog, self.machine, self.applier, **options)


@pytest.fixture
def node(one_node_broker: tuple[Log, BrokerStateMachine, Applier]) -> Node:
    return Node(*one_node_broker)


async def create_topic(path: WritePath, topic: str, queues: int = 1) -> Outcome:
    """Create ``topic`` through ``path``: the outcome of its one admin record."""
    (created,) = await path.send([encode_admin(CreateTopic(topic, queues))])
    return created.outcome


def test_concurrent_sends_share_entries_and_get_their_own_outcomes(node: Node) -> None:
    async def main() -> None:
        path = node.write_path(linger_ms=2)
        assert await create_topic(path, "orders", 2) == Outcome.DONE
        first_index = node.rlog.committed_index
        sends = [path.send([encode_message(Message("orders", f"m{i}".encode(), i % 2))])
                 for i in range(200)]
        results = await asyncio.gather(*sends)
        stored = [r[0] for r in results]
        assert all(a.outcome == Outcome.STORED for a in stored)
        for q in (0, 1):
            offsets = [a.queue_offset for a in stored if a.queue_id == q]
            assert offsets == list(range(100)), "per-queue offsets follow send order, no gaps"
        entries_used = node.rlog.committed_index - first_index
        assert entries_used < 50, f"200 sends took {entries_used} entries: no group commit"

    asyncio.run(main())


def test_a_send_with_nothing_in_flight_does_not_linger_and_one_behind_a_batch_would(node: Node) -> None:
    async def main() -> None:
        path = node.write_path(linger_ms=400)
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await create_topic(path, "orders") == Outcome.DONE
        assert loop.time() - started < 0.3, "a send with nothing in flight waited for the linger"
        for _ in range(10):  # the write task's done callback runs after its caller resumes
            if not path._writes:
                break
            await asyncio.sleep(0)
        assert path.linger_now() == 0.0
        held = asyncio.get_running_loop().create_future()
        path._writes.add(held)  # type: ignore[arg-type]  # a batch proposed and unanswered
        assert path.linger_now() == 0.4
        path._writes.discard(held)  # type: ignore[arg-type]

    asyncio.run(main())


def test_idempotent_retry_returns_the_original_offset(node: Node) -> None:
    async def main() -> None:
        path = node.write_path()
        await create_topic(path, "t")
        m = encode_message(Message("t", b"pay", 0, producer_id="p-1", sequence=0))
        (first,) = await path.send([m])
        (retry,) = await path.send([m])
        assert first.outcome == Outcome.STORED
        assert (retry.outcome, retry.queue_offset) == (Outcome.DUPLICATE, first.queue_offset)
        assert node.machine.queue("t", 0).max_offset == 1

    asyncio.run(main())


def test_oversized_record_fails_alone(node: Node) -> None:
    async def main() -> None:
        path = node.write_path()
        with pytest.raises(MessageTooLarge):
            await path.send([b"x" * (max_message_bytes() + 1)])
        assert await create_topic(path, "fine") == Outcome.DONE

    asyncio.run(main())


def test_store_times_never_go_backwards_across_a_slow_clock(node: Node) -> None:
    async def main() -> None:
        fast = node.write_path(clock_ms=lambda: 5_000_000_000_000)
        await create_topic(fast, "t")
        slow = node.write_path(clock_ms=lambda: 1_000)  # a new leader, behind
        await create_topic(slow, "u")
        last = node.rlog.read(node.rlog.committed_index)[-1]
        assert read_stamp(last.body) == 5_000_000_000_000

    asyncio.run(main())


def test_large_messages_go_in_chains_among_small_ones_in_order(node: Node) -> None:
    async def main() -> None:
        path = node.write_path(linger_ms=5, max_message_bytes=300_000)
        await create_topic(path, "t")
        first = node.rlog.committed_index + 1
        sizes = [10, 200_000, 10, 70_000, 10, 10]
        sends = [path.send([encode_message(Message("t", bytes([i]) * n, 0, keys=(f"k{i}",)))])
                 for i, n in enumerate(sizes)]
        results = await asyncio.gather(*sends)
        assert [r[0].outcome for r in results] == [Outcome.STORED] * len(sizes)
        assert [r[0].queue_offset for r in results] == list(range(len(sizes)))
        # each chain's fragments are consecutive entries, alone in them, the message in its place
        order, chain = [], b""
        for entry in node.rlog.read(first, 16 << 20):
            records = unpack_entry(entry.body).messages
            if record_kind(records[0]) != RecordKind.FRAGMENT:
                assert chain == b""
                order += [decode_message(r).body[0] for r in records]
                continue
            (record,) = records
            fragment = parse_fragment(record)
            assert (fragment.number == 0) == (chain == b"")
            chain += fragment.data
            if len(chain) == fragment.total:
                order.append(decode_message(chain).body[0])
                chain = b""
        assert order == list(range(len(sizes)))
        cq = node.machine.queue("t", 0)
        for off, n in enumerate(sizes):
            unit = cq.get(off)
            data = read_message(node.rlog.commitlog, unit.position, unit.size)
            assert decode_message(data).body == bytes([off]) * n
        with pytest.raises(MessageTooLarge, match="300001 bytes exceeds the 300000-byte limit"):
            await path.send([b"x" * 300_001])
        assert node.machine.queue("t", 0).max_offset == len(sizes)

    asyncio.run(main())


def test_the_write_path_times_its_receive_and_answer_stages(node: Node) -> None:
    """Issue 30: each send's wait to be proposed (the accumulator) is a ``receive``, each
    batch's wait from its last entry's commit to the callers' outcomes an ``answer``."""
    def count(stage: str) -> int:
        return node.rlog.stage_seconds[stage].snapshot()[0][-1][1]

    async def main() -> None:
        path = node.write_path(linger_ms=2)
        assert await create_topic(path, "orders") == Outcome.DONE
        receives, answers = count("receive"), count("answer")
        await asyncio.gather(*(path.send([encode_message(Message("orders", b"m"))]) for _ in range(20)))
        assert count("receive") - receives == 20
        assert 1 <= count("answer") - answers <= 20

    asyncio.run(main())
