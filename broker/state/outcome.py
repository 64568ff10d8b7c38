"""What applying one record did: ``Outcome`` (typed) and ``Applied`` (the answer's fields).

The apply step keeps one result per record of the last ``RECENT_RESULTS`` entries, so a
proposer can read its answers (``BrokerStateMachine.results``). It keeps them as ``Kept``:
exact tuples of atoms -- the outcome as its plain ``str`` value, ints, the reason -- which
the garbage collector stops tracking (it untracks a tuple of untracked items, never a
tuple subclass nor a tuple holding an enum member: members have a ``__dict__``). As tracked
objects they made every full collection walk one per message (39 ms per 240,000 results,
~0.45 s pauses at steady full load). ``results`` turns them into ``Applied`` with a typed
``Outcome`` at the API boundary.

Measured for this choice (CPython 3.11, ``gc.collect()`` then ``gc.is_tracked``): a tuple
holding ``"stored"`` or an int is untracked; one holding ``Outcome.STORED`` (``StrEnum``)
or an ``IntEnum`` member stays tracked. Building the kept tuple directly costs 0.015 us
against 0.22 us for an ``Applied`` NamedTuple converted with ``tuple()`` (what the apply
step did before); turning a kept tuple back into an ``Applied`` with its ``Outcome`` costs
0.3 us, on the proposer's side only. ``python -m benchmarks.apply`` (240,000 messages,
best of 3 runs interleaved on a shared 2-core box): 5.22 us CPU per message with an
``Applied`` per message and plain-string outcomes, 4.59 us with the kept tuples built
directly and the typed tables of ``broker.state``.

``Outcome`` is a ``StrEnum``: its members equal their values, so code comparing an outcome
with a string, a msgpack encoder or a log line see the same text as before.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple

__all__ = ["DONE", "STORED", "Applied", "Kept", "Outcome", "applied", "kept"]


class Outcome(StrEnum):
    STORED = "stored"
    DUPLICATE = "duplicate"
    DONE = "done"
    TOPIC_NOT_EXIST = "topic_not_exist"
    NO_PERMISSION = "no_permission"
    INVALID = "invalid"
    SEQUENCE_GAP = "sequence_gap"
    LOCKED = "locked"        # the queue's consume lock is held by another client
    FRAGMENT = "fragment"    # a fragment before the last of its chain: nothing yet
    ABANDONED = "abandoned"  # a fragment that does not continue a chain: nothing stored
    IN_FLIGHT_CAP = "in_flight_cap"  # a POP claim beyond the group's cap (broker.state.pops)


class Applied(NamedTuple):
    """What happened to one record: for messages, where it is (or was) stored."""

    outcome: Outcome
    queue_id: int = -1
    queue_offset: int = -1
    position: int = -1
    reason: str = ""


#: An ``Applied`` as the apply step keeps it: (outcome's value, queue id, queue offset,
#: position, reason), an exact tuple of atoms.
Kept = tuple[str, int, int, int, str]

#: The values of the outcomes the hot path gives, as plain ``str``.
STORED: str = Outcome.STORED.value
DONE: str = Outcome.DONE.value
_BY_VALUE: dict[str, Outcome] = {o.value: o for o in Outcome}


def kept(outcome: Outcome, queue_id: int = -1, queue_offset: int = -1, position: int = -1,
         reason: str = "") -> Kept:
    """The kept form of a result (the hot path writes its tuples directly)."""
    return (outcome.value, queue_id, queue_offset, position, reason)


def applied(result: Kept) -> Applied:
    """A kept result as the API gives it (a fresh ``Applied``, its outcome typed)."""
    outcome, queue_id, queue_offset, position, reason = result
    return Applied(_BY_VALUE[outcome], queue_id, queue_offset, position, reason)
