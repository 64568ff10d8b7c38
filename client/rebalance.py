"""How the members of a clustering consumer group share a topic's queues.

RocketMQ's allocation strategies, as pure functions. Every member calls the same
strategy with the same client ids and queues (in any order: both are sorted and
de-duplicated first) and takes the part that falls to ``me``; the parts of all
members are pairwise disjoint and together are exactly the queues. A member that
is not among ``clients`` gets nothing.

- ``allocate_averagely`` (RocketMQ's AllocateMessageQueueAveragely): each member
  gets one contiguous run of the sorted queues; the sizes differ by at most 1 and
  the larger runs go to the first members. 3 members, 8 queues: 3, 3, 2.
- ``allocate_by_circle`` (AllocateMessageQueueAveragelyByCircle): queue i of the
  sorted queues goes to member i % len(clients), dealing them out like cards.

Pure and thread-safe.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from client.queues import MessageQueue

__all__ = ["STRATEGIES", "AllocateStrategy", "allocate_averagely", "allocate_by_circle"]

AllocateStrategy = Callable[[str, Sequence[str], Sequence[MessageQueue]], list[MessageQueue]]


def _normalise(
    clients: Sequence[str], queues: Sequence[MessageQueue]
) -> tuple[list[str], list[MessageQueue]]:
    return sorted(set(clients)), sorted(set(queues))


def allocate_averagely(me: str, clients: Sequence[str], queues: Sequence[MessageQueue]) -> list[MessageQueue]:
    """The contiguous run of the sorted queues that falls to ``me``; [] if ``me`` is not a client."""
    cids, mqs = _normalise(clients, queues)
    if me not in cids:
        return []
    index = cids.index(me)
    mod = len(mqs) % len(cids)
    takes_extra = mod > 0 and index < mod  # the first ``mod`` members take one queue more
    average = 1 if len(mqs) <= len(cids) else len(mqs) // len(cids) + (1 if takes_extra else 0)
    start = index * average if takes_extra else index * average + mod
    length = min(average, len(mqs) - start)
    if length <= 0:
        return []
    return mqs[start:start + length]


def allocate_by_circle(me: str, clients: Sequence[str], queues: Sequence[MessageQueue]) -> list[MessageQueue]:
    """Every ``len(clients)``-th sorted queue, starting at ``me``'s index; [] if ``me`` is not a client."""
    cids, mqs = _normalise(clients, queues)
    if me not in cids:
        return []
    return mqs[cids.index(me)::len(cids)]


STRATEGIES: dict[str, AllocateStrategy] = {
    "averagely": allocate_averagely,
    "circle": allocate_by_circle,
}
