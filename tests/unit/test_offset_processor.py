"""The offset processor (COMMIT_OFFSET, QUERY_OFFSET, LOCK/UNLOCK_BATCH_MQ) through its
``BrokerContext`` alone -- the memory log, the apply step, the write path, a leader clock the
test moves; no server, no socket: a committed offset is read back, through the log; a queue's
lock is one client's until given back or expired."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from broker.state.locks import LOCK_EXPIRY_MS
from broker.state.machine import BrokerStateMachine
from dledger.applier import Applier
from dledger.errors import NotLeader
from dledger.log import Log
from protocol.names import InvalidName
from protocol.offset import (
    CommitOffsetRequest,
    LockQueuesRequest,
    LockQueuesResponse,
    QueryOffsetRequest,
    QueryOffsetResponse,
    UnlockQueuesRequest,
)
from protocol.remoting import ResponseCode
from protocol.send import WriteResponse
from tests.support.memory_broker import MemoryBroker, run_on_topic

Parts = tuple[Log, BrokerStateMachine, Applier]


def run(parts: Parts, scenario: Callable[[MemoryBroker], Awaitable[None]]) -> None:
    run_on_topic(parts, "orders", 4, scenario)


async def committed(b: MemoryBroker, group: str, queue: int) -> int:
    answer = await b.call(b.offsets.query_offset,
                          QueryOffsetRequest(group=group, topic="orders", queue_id=queue))
    return QueryOffsetResponse.from_frame(answer).offset


async def lock(b: MemoryBroker, client: str, *queues: int, take: bool = True) -> tuple[int, ...]:
    kind = LockQueuesRequest if take else UnlockQueuesRequest
    answer = await b.call(b.offsets.lock_queues, kind(group="billing", client_id=client, topic="orders",
                                                      queues=queues))
    return LockQueuesResponse.from_frame(answer).queue_ids


def test_a_committed_offset_is_read_back_and_went_through_the_log(one_node_broker: Parts) -> None:
    async def scenario(b: MemoryBroker) -> None:
        assert await committed(b, "billing", 1) == -1  # nothing committed yet
        before = b.rlog.committed_index
        answer = await b.call(b.offsets.commit_offset, CommitOffsetRequest(group="billing", topic="orders",
                                                                           queue_id=1, offset=10))
        assert answer.code == ResponseCode.SUCCESS, answer.remark
        WriteResponse.from_frame(answer)  # a write's answer
        assert b.rlog.committed_index > before
        assert await committed(b, "billing", 1) == 10
        assert await committed(b, "billing", 0) == -1 and await committed(b, "other", 1) == -1
        await b.call(b.offsets.commit_offset, CommitOffsetRequest(group="billing", topic="orders",
                                                                  queue_id=1, offset=7))
        assert await committed(b, "billing", 1) == 7  # a commit sets it, as RocketMQ's does (a reset)

    run(one_node_broker, scenario)


def test_a_follower_answers_queries_but_refuses_commits(one_node_broker: Parts) -> None:
    async def scenario(b: MemoryBroker) -> None:
        await b.call(b.offsets.commit_offset, CommitOffsetRequest(group="g", topic="orders", queue_id=0,
                                                                  offset=3))
        b.leading = False
        before = b.rlog.committed_index
        with pytest.raises(NotLeader):
            await b.call(b.offsets.commit_offset, CommitOffsetRequest(group="g", topic="orders", queue_id=0,
                                                                      offset=9))
        with pytest.raises(NotLeader):
            await lock(b, "a", 0)
        assert b.rlog.committed_index == before and await committed(b, "g", 0) == 3

    run(one_node_broker, scenario)


def test_a_bad_group_name_is_refused_before_anything_is_proposed(one_node_broker: Parts) -> None:
    async def scenario(b: MemoryBroker) -> None:
        before = b.rlog.committed_index
        with pytest.raises(InvalidName):
            await b.call(b.offsets.commit_offset, CommitOffsetRequest(group="bad name", topic="orders",
                                                                      queue_id=0, offset=1))
        assert b.rlog.committed_index == before

    run(one_node_broker, scenario)


def test_a_queue_lock_is_one_clients_until_given_back_or_expired(one_node_broker: Parts) -> None:
    async def scenario(b: MemoryBroker) -> None:
        assert await lock(b, "a", 0, 1) == (0, 1)
        assert await lock(b, "b", 1, 2) == (2,)  # 1 is a's
        assert await lock(b, "a", 0, 1) == (0, 1)  # a renews its own
        assert await lock(b, "a", 1, take=False) == (1,)
        assert await lock(b, "b", 1) == (1,)  # given back: b may take it
        b.clock.now_ms += LOCK_EXPIRY_MS + 1  # a's lock of 0 not renewed in time
        assert await lock(b, "b", 0, 0) == (0,)  # the expired lock taken; a queue named twice counts once

    run(one_node_broker, scenario)
