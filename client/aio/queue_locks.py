"""Orderly clustering consumers' queue locks on the brokers (RocketMQ's lockBatchMQ): a
queue is consumed only while this client holds its lock, decided by the apply step of
the queue's broker group (``broker.processors.offset``), so two members never consume one
queue at the same time.

    LOCK_BATCH_MQ / UNLOCK_BATCH_MQ   to each broker group's leader, one request per
                                      (group, topic); 3 s each, all at once
    held                              the queues the answer names (given back, for unlock)
    undecided                         the queues of a group whose leader could not be
                                      reached: no lock can be decided (nor granted to anyone)

A lock is renewed every ``LOCK_RENEW_S`` and trusted ``LOCK_VALID_S`` after the request
that took it (the broker lets it expire after 60 s).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from client.aio.core import ClientCore
from client.backoff import Deadline
from client.errors import ClientError
from client.queues import MessageQueue
from protocol.offset import LockQueuesRequest, LockQueuesResponse, UnlockQueuesRequest

__all__ = ["LOCK_RENEW_S", "LOCK_VALID_S", "lock_queues"]

log = logging.getLogger("client.consumer")

LOCK_RENEW_S = 20.0  # orderly clustering: queue locks are taken again this often
LOCK_VALID_S = 30.0  # and trusted this long after the request that took them (the broker: 60 s)


async def lock_queues(core: ClientCore, group: str, client_id: str, queues: Sequence[MessageQueue],
                      take: bool = True) -> tuple[set[MessageQueue], set[MessageQueue]]:
    """Take (or give back) consumer group ``group``'s locks of ``queues`` for ``client_id``:
    (the ones held (given back), the undecided ones: their group's leader could not be
    reached). A failure is logged, never raised."""
    by_group: dict[tuple[str, str], list[MessageQueue]] = {}
    for q in queues:
        by_group.setdefault((q.group, q.topic), []).append(q)
    kind = LockQueuesRequest if take else UnlockQueuesRequest
    held: set[MessageQueue] = set()
    undecided: set[MessageQueue] = set()

    async def ask(broker_group: str, topic: str, qs: list[MessageQueue]) -> None:
        try:
            reply = await core.leader_request(
                broker_group, kind(group=group, client_id=client_id, topic=topic,
                                   queues=tuple(q.queue_id for q in qs)), deadline=Deadline(3.0), topic=topic)
        except ClientError as e:
            log.warning("%s: %s of %s failed: %s", client_id, kind.CODE.name, qs, e)
            undecided.update(qs)
            return
        ids = set(LockQueuesResponse.from_frame(reply).queue_ids)
        held.update(q for q in qs if q.queue_id in ids)

    await asyncio.gather(*(ask(g, topic, qs) for (g, topic), qs in by_group.items()))
    return held, undecided
