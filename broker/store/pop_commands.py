"""The records of per-message acknowledgement (POP, issue 29) and of a group's retry policy.

Each is a msgpack array whose first element is its kind (``broker.store.commands`` routes
kinds 160..164 here); the leader proposes them, the apply step (``broker.state.pops``)
decides at the entry's store time::

    kind  record                                                   effect at apply
    ----  -------------------------------------------------------  ------------------------------
     160  [160, group, [backoff ms, ...], max_deliveries(,        the group's retry policy; an
           ordered)]                                               ordered group has one message
                                                                   of a queue in flight at a time
     161  [161, group, topic, queue_id, offset, invisible_ms]      claim one message: invisible
                                                                   to the group until store time
                                                                   + invisible_ms; delivery + 1
     162  [162, group, topic, queue_id, offset, delivery]          acknowledge that delivery
     163  [163, group, topic, queue_id, offset, delivery, ms]      that delivery's message is
                                                                   invisible until store time + ms
                                                                   (change_invisible_duration; a
                                                                   nack: ms = the backoff)
     164  [164, group, topic, queue_id, offset, delivery]          settled by a dead-letter copy
                                                                   (stored in %DLQ%group)

A *delivery* is the message's delivery count when claimed (1 for the first): with the
group, topic, queue and offset it is the receipt handle, so an ack of a delivery the
message has outlived (its invisibility ended and another consumer took it) is refused.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["MAX_BACKOFF_STEPS", "MAX_DELIVERIES", "MAX_INVISIBLE_MS", "POP_KINDS", "POP_TYPES", "GroupPolicy",
           "PopAck", "PopClaim", "PopDead", "PopInvisible", "PopKind", "PopRecord", "decode_pop",
           "pop_row"]

#: Longest invisibility a claim or a change may ask for (RocketMQ 5 allows 12 h).
MAX_INVISIBLE_MS = 12 * 3600 * 1000
#: Most steps of a backoff list, and the largest max deliveries a policy may set.
MAX_BACKOFF_STEPS = 32
MAX_DELIVERIES = 1000


class PopKind(enum.IntEnum):
    GROUP_POLICY = 160
    POP_CLAIM = 161
    POP_ACK = 162
    POP_INVISIBLE = 163
    POP_DEAD = 164


POP_KINDS = frozenset(int(k) for k in PopKind)


@dataclass(frozen=True, slots=True)
class GroupPolicy:
    """A group's retry policy: a nacked delivery n comes back after ``backoff_ms[n - 1]``
    (the last step for every later one); a message is dead-lettered once it was delivered
    ``max_deliveries`` times and is handed back again. ``ordered``: a queue's next message
    is handed out only once the one before is settled (acked or dead-lettered), so each
    queue -- each shard key -- is consumed in order (RocketMQ 5's FIFO groups, by queue)."""

    group: str
    backoff_ms: tuple[int, ...]
    max_deliveries: int
    ordered: bool = False


@dataclass(frozen=True, slots=True)
class PopClaim:
    group: str
    topic: str
    queue_id: int
    offset: int
    invisible_ms: int


@dataclass(frozen=True, slots=True)
class PopAck:
    group: str
    topic: str
    queue_id: int
    offset: int
    delivery: int


@dataclass(frozen=True, slots=True)
class PopInvisible:
    group: str
    topic: str
    queue_id: int
    offset: int
    delivery: int
    invisible_ms: int


@dataclass(frozen=True, slots=True)
class PopDead(PopAck):
    """Settled by its dead-letter copy (proposed with it)."""


PopRecord = GroupPolicy | PopClaim | PopAck | PopInvisible | PopDead
POP_TYPES = (GroupPolicy, PopClaim, PopAck, PopInvisible, PopDead)


def pop_row(record: PopRecord) -> list[object]:
    """The msgpack array of ``record``."""
    match record:
        case GroupPolicy():
            row: list[object] = [PopKind.GROUP_POLICY, record.group, list(record.backoff_ms),
                                 record.max_deliveries]
            return [*row, True] if record.ordered else row
        case PopClaim():
            return [PopKind.POP_CLAIM, record.group, record.topic, record.queue_id, record.offset,
                    record.invisible_ms]
        case PopInvisible():
            return [PopKind.POP_INVISIBLE, record.group, record.topic, record.queue_id, record.offset,
                    record.delivery, record.invisible_ms]
        case PopDead():
            return [PopKind.POP_DEAD, record.group, record.topic, record.queue_id, record.offset,
                    record.delivery]
        case _:
            return [PopKind.POP_ACK, record.group, record.topic, record.queue_id, record.offset,
                    record.delivery]


def _natural(value: object, limit: int | None = None) -> bool:
    return type(value) is int and value >= 0 and (limit is None or value <= limit)


def decode_pop(kind: int, args: list[object]) -> PopRecord:
    """The record of ``kind`` with fields ``args``; ValueError (or TypeError) if malformed."""
    if kind == PopKind.GROUP_POLICY:
        group, backoff, max_deliveries, *flags = args
        ordered = flags == [True]
        if flags and not ordered:
            raise ValueError("bad group-policy flags")
        if not (isinstance(group, str) and group and isinstance(backoff, list)
                and 0 < len(backoff) <= MAX_BACKOFF_STEPS
                and all(_natural(b, MAX_INVISIBLE_MS) for b in backoff)
                and _natural(max_deliveries, MAX_DELIVERIES) and max_deliveries):
            raise ValueError("bad group-policy record")
        assert isinstance(max_deliveries, int)
        return GroupPolicy(group, tuple(b for b in backoff if isinstance(b, int)), max_deliveries, ordered)
    group, topic, queue_id, offset, *rest = args
    if not (isinstance(group, str) and group and isinstance(topic, str) and topic
            and _natural(queue_id, 1023) and _natural(offset)):
        raise ValueError("bad pop record")
    assert isinstance(queue_id, int) and isinstance(offset, int)
    if kind == PopKind.POP_CLAIM:
        (invisible_ms,) = rest
        if not _natural(invisible_ms, MAX_INVISIBLE_MS):
            raise ValueError("bad invisible duration")
        assert isinstance(invisible_ms, int)
        return PopClaim(group, topic, queue_id, offset, invisible_ms)
    delivery, *more = rest
    if not (_natural(delivery) and delivery):
        raise ValueError("bad delivery")
    assert isinstance(delivery, int)
    if kind == PopKind.POP_INVISIBLE:
        (invisible_ms,) = more
        if not _natural(invisible_ms, MAX_INVISIBLE_MS):
            raise ValueError("bad invisible duration")
        assert isinstance(invisible_ms, int)
        return PopInvisible(group, topic, queue_id, offset, delivery, invisible_ms)
    if more:
        raise ValueError("too many fields")
    if kind == PopKind.POP_DEAD:
        return PopDead(group, topic, queue_id, offset, delivery)
    if kind == PopKind.POP_ACK:
        return PopAck(group, topic, queue_id, offset, delivery)
    raise ValueError(f"not a pop record kind: {kind}")
