"""Held messages carried forward, so that none pins retention (RocketMQ's timer roll).

A delayed or retried message before its time and a transaction half before its outcome
are read from their record in the CommitLog, so retention keeps that record
(``dledger.raft.log_retention``). Left there, a message delayed by 3 days keeps 3 days of log
whatever ``retention_bytes`` says. So the leader re-appends a held record before
retention reaches it, with ``__CARRIED_FROM`` naming the message it carries (its
identity: the position it was first stored at); applying the copy moves the hold's
bytes there (``broker.state.deferral.Deferral.carry``), and the old record pins nothing::

    log  |seg 0      |seg 1      |seg 2      |seg 3      |seg 4 (active)
              ^held                    ^ carry_below: older than half the age limit,
                                         or more than half the size cap behind the end
    leader: to_carry(held, below)  -> carried_copy(...) appended now  -> apply: Held.at moves

    carry_below(...)     the position under which held records are carried now
    to_carry(...)        which: the oldest first, at most ``budget`` bytes per round
    carried_copy(m, p)   the copy: every field as stored (id, properties, delivery time,
                         transaction group), plus ``__CARRIED_FROM = p``

Everything here is the leader's choice, and may be wrong or repeated: the apply step
decides by log order (a copy applied after its message was released or resolved changes
nothing; one applied first leaves the release or commit to find the hold as before).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from broker.state.held import Held, Prop
from dledger.storage.segments import SegmentInfo
from protocol.message_format import Message

__all__ = ["CARRY_BYTES", "carried_copy", "carry_below", "to_carry"]

#: Bytes of held records carried per round of the leader's deferred loop (every 0.1 s).
CARRY_BYTES = 1 << 20


def carry_below(segments: Sequence[SegmentInfo], segment_bytes: int, write_position: int, *,
                now: float, max_age_s: float, max_bytes: int | None) -> int:
    """The CommitLog position under which held records are carried now: the end of the
    closed segments retention may soon delete -- those older than half the age limit, and
    those wholly more than half of ``max_bytes`` behind the log's end. A segment start."""
    below = segments[0].start if segments else 0
    if max_bytes is not None:
        behind = write_position - max_bytes // 2
        below = max(below, behind - behind % segment_bytes)
    for seg in segments[:-1]:  # never the active segment
        if now - seg.mtime <= max_age_s / 2:
            break
        below = max(below, seg.start + segment_bytes)
    last = segments[-1].start if segments else 0
    return min(below, last)


def to_carry(held: Iterable[Held], below: int, budget: int = CARRY_BYTES) -> list[Held]:
    """The held messages whose bytes lie under ``below``, oldest first, up to ``budget``
    bytes (at least one, whatever its size)."""
    out, total = [], 0
    for h in sorted((h for h in held if h.at < below), key=lambda h: h.at):
        if out and total + h.size > budget:
            break
        out.append(h)
        total += h.size
    return out


def carried_copy(m: Message, identity: int) -> Message:
    """``m`` (a held message as stored) to be appended again, carrying the message held by
    ``identity``; no producer sequence (it is the broker's copy, not a send)."""
    fields = {f: getattr(m, f) for f in Message.__dataclass_fields__}
    props = {**m.properties, Prop.CARRIED_FROM: str(identity)}
    return Message(**{**fields, "properties": props, "producer_id": None, "sequence": None})
