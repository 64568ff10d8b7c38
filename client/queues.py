"""Message queues as the client sees them, and sharding a key onto one.

A topic is served by one or more broker (Raft) groups, each holding some of the
topic's queues; a client addresses a queue by (topic, group, queue id). The
ordering of ``MessageQueue`` (topic, then group, then queue id) is the one every
client sorts by, so that members of a consumer group, or producers sharding by
key, compute the same answer from the same set of queues.

Pure and thread-safe.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mmh3

__all__ = ["MessageQueue", "shard_index", "shard_queue"]


@dataclass(frozen=True, order=True, slots=True)
class MessageQueue:
    """One queue of a topic: ``queue_id`` on the broker group ``group``."""

    topic: str
    group: str
    queue_id: int

    def __str__(self) -> str:
        return f"{self.topic}@{self.group}#{self.queue_id}"


def shard_queue(shard_key: str, queues: Sequence[MessageQueue]) -> MessageQueue:
    """The queue that messages with ``shard_key`` go to, among ``queues``.

    Stable: the queues are sorted first, so the answer depends only on the key and
    the set of queues (not their order), and is the same in every process: the
    index is the unsigned 32-bit murmur3 (seed 0) of the key's UTF-8 bytes modulo
    the number of queues. Raises ValueError if ``queues`` is empty.
    """
    if not queues:
        raise ValueError(f"no queue to shard key {shard_key!r} onto")
    ordered = sorted(queues)
    return ordered[shard_index(shard_key, len(ordered))]


def shard_index(shard_key: str, count: int) -> int:
    """The index of ``shard_key``'s queue among ``count`` queues sorted (``shard_queue``)."""
    return mmh3.hash(shard_key.encode(), seed=0, signed=False) % count
