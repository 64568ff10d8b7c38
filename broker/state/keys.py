"""The keys of the state tables, and their form in checkpoints and snapshots.

In memory a table is keyed by a tuple; a checkpoint or snapshot (``broker.state.snapshot``)
writes such a key as one string, its parts joined by NUL (msgpack maps want atoms, and
the digest is over these bytes, so the form is fixed)::

    "group\\0topic\\0queue id"      queue locks            GroupQueue
    "producer\\0topic\\0queue id"   producer windows       ProducerQueue

Topic and group names cannot hold NUL (``protocol.names``); a producer id may, so a key is
split from the right.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["GroupQueue", "ProducerQueue", "join_key", "split_key"]


class GroupQueue(NamedTuple):
    """A consumer group's view of one queue: its committed offset, its consume lock."""

    group: str
    topic: str
    queue_id: int


#: (producer id, topic, queue id): one idempotent producer's sequence on one queue. A plain
#: tuple, not a NamedTuple: the apply step makes one per message, and a NamedTuple's
#: constructor costs ~10x a tuple display.
ProducerQueue = tuple[str, str, int]


def join_key(key: tuple[str, str, int]) -> str:
    """The checkpoint form of a (name, topic, queue id) key."""
    return f"{key[0]}\x00{key[1]}\x00{key[2]}"


def split_key(text: str) -> tuple[str, str, int]:
    """A (name, topic, queue id) key from its checkpoint form; ValueError if it is not one."""
    name, topic, queue_id = text.rsplit("\x00", 2)
    return name, topic, int(queue_id)
