"""Per-message acknowledgement (POP, issue 29): which messages of each queue a group's
SimpleConsumers hold, until when, how often each was delivered; and each group's retry
policy (replicated state, applied from ``broker.store.pop_commands`` records).

A group's POP view of one queue is a window of offsets::

        settled below          claimed at least once                   never claimed
    ... ────────────── floor ─────────────────────────────────── next ──────────────── queue end
                              each offset either settled (acked or
                              dead-lettered) or in flight: [deadline ms, delivery]

* A claim of ``next`` extends the window (the leader claims new offsets in order); a claim
  of an offset in flight whose deadline has passed delivers it again (delivery + 1); any
  other claim is refused (LOCKED: another consumer holds it; DUPLICATE: settled).
* Ack / dead-letter of (offset, delivery) settles it if that delivery is the current one;
  the floor then moves past every settled offset. An ack of an older delivery is refused
  (INVALID: the receipt handle is stale) -- the message went to another consumer.
* An invisibility change of (offset, delivery) sets its deadline to store time + ms (a nack
  is one, with the group's backoff).
* Time is the apply step's clock: the latest store time of the entries applied
  (``DerivedState.last_store_ms``), so every replica decides alike.
* An ordered group (its policy's ``ordered``): a claim of a new offset is refused (LOCKED)
  while a message of the queue is in flight, so a queue's messages go out one at a time,
  in order; one comes back (nack, invisibility end) before any later one is handed out.
* Bounded: a claim that would make a group's windows (next - floor, over its queues) span
  more than ``MAX_IN_FLIGHT`` messages is refused (IN_FLIGHT_CAP) -- a stuck message holds
  its window open, so the cap bounds the acked set kept above it too.

A claim's result is ``(DONE, queue id, offset, delivery, "")``: the result's position field
carries the delivery, which with (group, topic, queue, offset) is the receipt handle.

Checkpoint form (only when not empty, so a state without POP keeps its form)::

    "pops":     {"group\\0topic\\0queue id": [next, floor, [settled offsets above floor],
                                              [[offset, deadline ms, delivery], ...]]}
    "retry":    {group: [[backoff ms, ...], max deliveries(, true: ordered)]}

Threads: the apply thread writes; the leader's event loop reads (each read copies under
the GIL: one dict or list operation).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from broker.state.keys import GroupQueue, join_key, split_key
from broker.state.outcome import Kept, Outcome, kept
from broker.store.pop_commands import GroupPolicy, PopClaim, PopInvisible, PopRecord

__all__ = ["DEFAULT_POLICY", "MAX_IN_FLIGHT", "InFlight", "PopTables", "RetryPolicy"]

#: Most messages a group's windows may span (module docstring).
MAX_IN_FLIGHT = 10_000


class RetryPolicy(NamedTuple):
    backoff_ms: tuple[int, ...]
    max_deliveries: int
    ordered: bool = False  # one message of a queue in flight at a time (module docstring)

    def backoff_after(self, delivery: int) -> int:
        """How long a nacked ``delivery`` (1, 2, ...) stays invisible."""
        return self.backoff_ms[min(delivery, len(self.backoff_ms)) - 1]


#: A group with no policy of its own: RocketMQ's first retry levels, 16 deliveries.
DEFAULT_POLICY = RetryPolicy((1_000, 5_000, 10_000, 30_000, 60_000), 16)


class InFlight(NamedTuple):
    """One message a group's consumer holds (or held, and whose invisibility ended)."""

    queue_id: int
    offset: int
    deadline_ms: int
    delivery: int


class _Window:
    __slots__ = ("floor", "in_flight", "next", "settled")

    def __init__(self, next_offset: int, floor: int, settled: set[int],
                 in_flight: dict[int, list[int]]) -> None:
        self.next, self.floor, self.settled, self.in_flight = next_offset, floor, settled, in_flight

    def settle(self, offset: int) -> None:
        del self.in_flight[offset]
        self.settled.add(offset)
        while self.floor in self.settled:
            self.settled.discard(self.floor)
            self.floor += 1


class PopTables:
    """Apply thread writes (``apply``); readers see copies (module docstring)."""

    def __init__(self, pops: Mapping[str, list[Any]] | None = None,
                 retry: Mapping[str, list[Any]] | None = None) -> None:
        self._windows: dict[GroupQueue, _Window] = {}
        for text, (next_offset, floor, settled, in_flight) in (pops or {}).items():
            self._windows[GroupQueue(*split_key(text))] = _Window(
                next_offset, floor, set(settled), {o: [d, n] for o, d, n in in_flight})
        self._policies: dict[str, RetryPolicy] = {
            group: RetryPolicy(tuple(row[0]), row[1], len(row) > 2 and row[2])
            for group, row in (retry or {}).items()}
        self._span: dict[str, int] = {}  # group -> sum of its windows' next - floor
        for key, window in self._windows.items():
            self._span[key.group] = self._span.get(key.group, 0) + window.next - window.floor

    # -- applying ------------------------------------------------------------------------
    def apply(self, cmd: PopRecord, now_ms: int, queue_end: int) -> Kept:
        """Apply one record at store time ``now_ms``; ``queue_end``: the next offset of the
        record's queue (0 when it has none)."""
        if isinstance(cmd, GroupPolicy):
            self._policies[cmd.group] = RetryPolicy(cmd.backoff_ms, cmd.max_deliveries, cmd.ordered)
            return kept(Outcome.DONE)
        key = GroupQueue(cmd.group, cmd.topic, cmd.queue_id)
        if isinstance(cmd, PopClaim):
            return self._claim(key, cmd.offset, now_ms + cmd.invisible_ms, now_ms, queue_end)
        window = self._windows.get(key)
        held = None if window is None else window.in_flight.get(cmd.offset)
        if window is None or held is None:
            return kept(Outcome.DUPLICATE, cmd.queue_id, cmd.offset,
                        reason=f"offset {cmd.offset} is not in flight (settled, or never claimed)")
        if held[1] != cmd.delivery:
            return kept(Outcome.INVALID, cmd.queue_id, cmd.offset, reason=(
                f"stale receipt handle: delivery {cmd.delivery} of offset {cmd.offset} ended; "
                f"it was delivered again (delivery {held[1]})"))
        if isinstance(cmd, PopInvisible):
            held[0] = now_ms + cmd.invisible_ms
        else:  # PopAck, PopDead
            before = window.floor
            window.settle(cmd.offset)
            self._span[cmd.group] -= window.floor - before
        return kept(Outcome.DONE, cmd.queue_id, cmd.offset, held[1])

    def _claim(self, key: GroupQueue, offset: int, deadline: int, now_ms: int, queue_end: int) -> Kept:
        qid = key.queue_id
        if offset >= queue_end:
            return kept(Outcome.INVALID, qid, offset, reason=f"queue {qid} ends at offset {queue_end}")
        window = self._windows.get(key)
        if window is None:  # the group's first claim in this queue starts its window
            window = self._windows[key] = _Window(offset, offset, set(), {})
        held = window.in_flight.get(offset)
        if held is not None:
            if held[0] > now_ms:
                return kept(Outcome.LOCKED, qid, offset, reason=f"invisible until {held[0]}")
            held[0], held[1] = deadline, held[1] + 1
            return kept(Outcome.DONE, qid, offset, held[1])
        if offset < window.next:
            return kept(Outcome.DUPLICATE, qid, offset, reason=f"offset {offset} is settled")
        if offset > window.next:
            return kept(Outcome.INVALID, qid, offset, reason=f"claims go in order: the next is {window.next}")
        if window.in_flight and self.policy(key.group).ordered:
            return kept(Outcome.LOCKED, qid, offset, reason=(
                f"ordered group: offset {min(window.in_flight)} of queue {qid} is not settled yet"))
        span = self._span.get(key.group, 0)
        if span >= MAX_IN_FLIGHT:
            return kept(Outcome.IN_FLIGHT_CAP, qid, offset, reason=(
                f"group {key.group!r} has {span} messages in flight or settled above one in "
                f"flight (the cap is {MAX_IN_FLIGHT}): ack or nack what its consumers hold"))
        window.in_flight[offset] = [deadline, 1]
        window.next += 1
        self._span[key.group] = span + 1
        return kept(Outcome.DONE, qid, offset, 1)

    def forget_topic(self, topic: str) -> None:
        """Deleted means deleted: a topic created again under the name has no POP state."""
        for key in [k for k in self._windows if k.topic == topic]:
            window = self._windows.pop(key)
            self._span[key.group] -= window.next - window.floor

    # -- reading (any thread) ----------------------------------------------------------------
    def policy(self, group: str) -> RetryPolicy:
        return self._policies.get(group, DEFAULT_POLICY)

    def explicit_policy(self, group: str) -> RetryPolicy | None:
        """The policy set for ``group`` (``raftmq group config``), None if none was."""
        return self._policies.get(group)

    def next_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        """The first offset of the queue the group never claimed (None: no window yet)."""
        window = self._windows.get(GroupQueue(group, topic, queue_id))
        return None if window is None else window.next

    def held_in(self, group: str, topic: str, queue_id: int) -> int:
        """How many messages of the queue the group has in flight."""
        window = self._windows.get(GroupQueue(group, topic, queue_id))
        return 0 if window is None else len(window.in_flight)

    def span(self, group: str) -> int:
        return self._span.get(group, 0)

    def in_flight(self, group: str, topic: str) -> list[InFlight]:
        """The group's messages of ``topic`` in flight, earliest deadline first."""
        found = []
        for key, window in list(self._windows.items()):
            if key.group == group and key.topic == topic:
                held = list(window.in_flight.items())
                found += [InFlight(key.queue_id, offset, d, n) for offset, (d, n) in held]
        return sorted(found, key=lambda m: (m.deadline_ms, m.queue_id, m.offset))

    def expired(self, group: str, topic: str, now_ms: int) -> list[InFlight]:
        """The group's messages of ``topic`` whose invisibility ended by ``now_ms``, earliest
        deadline first (what a POP delivers again; cheaper than ``in_flight`` when many are held)."""
        found = []
        for key, window in list(self._windows.items()):
            if key.group == group and key.topic == topic:
                found += [InFlight(key.queue_id, offset, d, n)
                          for offset, (d, n) in list(window.in_flight.items()) if d <= now_ms]
        return sorted(found, key=lambda m: (m.deadline_ms, m.queue_id, m.offset))

    def earliest_deadline(self, group: str, topic: str) -> int | None:
        """The soonest deadline of the group's messages of ``topic`` in flight (None: none)."""
        soonest: int | None = None
        for key, window in list(self._windows.items()):
            if key.group == group and key.topic == topic:
                for deadline, _ in list(window.in_flight.values()):
                    if soonest is None or deadline < soonest:
                        soonest = deadline
        return soonest

    def held_by(self, group: str) -> list[tuple[str, InFlight]]:
        """(topic, message) of every message ``group`` has in flight, earliest deadline first."""
        found = []
        for key, window in list(self._windows.items()):
            if key.group == group:
                held = list(window.in_flight.items())
                found += [(key.topic, InFlight(key.queue_id, offset, d, n)) for offset, (d, n) in held]
        return sorted(found, key=lambda row: (row[1].deadline_ms, row[0], row[1].queue_id, row[1].offset))

    def groups(self) -> dict[str, int]:
        """Every group with a window -> how many of its messages are in flight."""
        counts: dict[str, int] = {}
        for key, window in list(self._windows.items()):
            counts[key.group] = counts.get(key.group, 0) + len(window.in_flight)
        return counts

    def state(self) -> dict[str, Any]:
        """The checkpoint form (module docstring): empty when there is no POP state."""
        out: dict[str, Any] = {}
        if self._windows:
            out["pops"] = {join_key(k): [w.next, w.floor, sorted(w.settled),
                                         [[o, d, n] for o, (d, n) in sorted(w.in_flight.items())]]
                           for k, w in sorted(self._windows.items())}
        if self._policies:
            out["retry"] = {g: [list(p.backoff_ms), p.max_deliveries, *([True] if p.ordered else [])]
                            for g, p in sorted(self._policies.items())}
        return out
