"""Messages whose delivery is deferred: delayed (and retried) messages, transaction halves.

Both are replicated state of the apply step, so a new leader continues exactly where
the old one stopped: nothing is skipped, nothing delivered twice.

Reserved message properties (a client may not set ``__`` properties; the server
refuses them, so only the leader writes them):

    DELAY                 level 1..N asked by the producer (the leader turns it into
    TIMER_DELIVER_MS      / an absolute time, up to 3 days ahead)
    __DELIVER_AT_MS       set by the leader: hold the message until this time
    __SCHEDULED_FROM      on a delivered copy: the CommitLog position of the held message
    TRAN_MSG, PGROUP      a transaction half message and its producer group
    __TRANSACTION_OF      on a committed copy: the position of the half message
    RETRY_TOPIC           a retried message's original topic (shown to consumers as its topic)
    __CARRIED_FROM        on a carried-forward copy of a held message: the position it is
                          held by (its identity), see "Carrying forward" below

Delayed: a message with ``__DELIVER_AT_MS`` later than its store time is stored in
``SCHEDULE_TOPIC_XXXX`` (queue = level - 1; the last queue for absolute times) and
held in ``Timers`` by position. The leader's scheduler proposes a copy carrying
``__SCHEDULED_FROM``; applying the copy releases the hold -- a second copy (two
leaders, a retried proposal) finds no hold and is not stored.

Transactions: a half message is stored in ``RMQ_SYS_TRANS_HALF_TOPIC`` and held in
``Halves``. Commit proposes a copy carrying ``__TRANSACTION_OF`` (stored only while
the half is held); rollback and each check-back are records (see broker.store.commands).
After ``MAX_CHECKS`` unanswered checks the leader rolls back.

Carrying forward (RocketMQ's timer roll): a held message is known by the position it was
first stored at -- its *identity*, which ``__SCHEDULED_FROM``, ``__TRANSACTION_OF``,
RollbackHalf, CheckHalf, CHECK_TRANSACTION and END_TRANSACTION name -- but its bytes may
have moved: when its record is about to block retention, the leader re-appends it with
``__CARRIED_FROM = identity`` (``broker.deferred.carry_forward``), and applying that copy while the
message is still held records the copy's position and size as where it is read
(``Held.at``, ``Held.size``). Applying it after the message was released or resolved
changes nothing; a release or commit applied after it finds the hold as before. Retention
then keeps ``Held.at``, never the identity.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

__all__ = [
    "DEFAULT_DELAY_LEVELS",
    "MAX_CHECKS",
    "MAX_TIMER_AHEAD_MS",
    "RETRY_DELAYS",
    "TRANSACTION_TIMEOUT_MS",
    "Halves",
    "Held",
    "Prop",
    "Timers",
    "parse_delay_levels",
    "retry_delay_ms",
]

DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
#: The retry schedule of reconsume times 1..16 (RocketMQ's delay levels 3..18); then 2 h.
RETRY_DELAYS = "10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
MAX_TIMER_AHEAD_MS = 3 * 24 * 3600 * 1000
TRANSACTION_TIMEOUT_MS = 6_000
MAX_CHECKS = 15

class Prop:
    """The message properties the broker reads or sets (RocketMQ's ``MessageConst``); names
    starting with ``__`` are the broker's own and never come from a client."""

    DELAY = "DELAY"
    TIMER = "TIMER_DELIVER_MS"
    DELIVER_AT = "__DELIVER_AT_MS"
    SCHEDULED_FROM = "__SCHEDULED_FROM"
    TRAN = "TRAN_MSG"
    PGROUP = "PGROUP"
    TRANSACTION_OF = "__TRANSACTION_OF"
    RETRY_TOPIC = "RETRY_TOPIC"
    #: On a retry or dead-letter copy: "group:position" of the message sent back. The apply
    #: step stores one copy per value within SENT_BACK_WINDOW_MS, so a send-back the consumer
    #: retried after an unknown outcome does not make a second copy.
    SENT_BACK = "__SENT_BACK"
    #: On a carried-forward copy of a held message: the position the message is held by.
    CARRIED_FROM = "__CARRIED_FROM"

_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_delay_levels(text: str) -> list[int]:
    """``"1s 5s 100ms 2h"`` -> milliseconds per level; ValueError names a bad item."""
    out = []
    for item in text.split():
        unit = "ms" if item.endswith("ms") else item[-1:]
        number = item[: -len(unit)] if unit in _UNITS else ""
        if not number.isdigit() or int(number) <= 0:
            raise ValueError(f"delay level {item!r} is not like 500ms, 10s, 5m, 2h or 1d")
        out.append(int(number) * _UNITS[unit])
    if not out:
        raise ValueError("at least one delay level is needed")
    return out


def retry_delay_ms(reconsume_times: int, schedule: list[int]) -> int:
    """Delay before the ``reconsume_times``-th redelivery (1-based); the last step repeats."""
    return schedule[min(max(reconsume_times, 1), len(schedule)) - 1]


@dataclass(frozen=True, slots=True)
class Held:
    position: int        # its identity: where it was first stored
    size: int            # of the record at ``at``
    due_ms: int          # timers: deliver at; halves: next check at
    checks: int = 0      # halves: check-backs sent
    group: str = ""      # halves: producer group
    topic: str = ""      # the topic the message belongs to (a retry's original topic)
    moved_to: int = -1   # where a carried-forward copy holds its bytes (-1: not carried)

    @property
    def at(self) -> int:
        """The CommitLog position its bytes are read from (and retention keeps)."""
        return self.position if self.moved_to < 0 else self.moved_to

    def carried(self, position: int, size: int) -> Held:
        return replace(self, size=size, moved_to=position)

    def form(self, *items: object) -> list[object]:
        """Its checkpoint form: ``items``, then where it moved to if it was carried."""
        return [*items] if self.moved_to < 0 else [*items, self.moved_to]


class Timers:
    """Delayed messages held until their time, by CommitLog position (replicated state), with
    the topic each belongs to: deleting a topic drops its held messages (``forget_topic``).

    Checkpoint form: ``{position: [size, due ms, topic]}`` (two items in checkpoints written
    before the topic was kept: its topic is then unknown, ""), and a fourth item, the
    position of its carried-forward copy, once it was carried.
    """

    def __init__(self, state: Mapping[int, list[int | str]] | None = None) -> None:
        self._held: dict[int, Held] = {
            int(p): Held(int(p), int(v[0]), int(v[1]), topic=str(v[2]) if len(v) > 2 else "",
                         moved_to=int(v[3]) if len(v) > 3 else -1)
            for p, v in (state or {}).items()}

    def hold(self, position: int, size: int, due_ms: int, topic: str = "") -> None:
        self._held[position] = Held(position, size, due_ms, topic=topic)

    def forget_topic(self, topic: str) -> None:
        """``topic`` was deleted: its delayed messages and retries are never delivered."""
        for position in [p for p, h in self._held.items() if h.topic == topic]:
            del self._held[position]

    def release(self, position: int) -> bool:
        return self._held.pop(position, None) is not None

    def carry(self, position: int, to: int, size: int) -> bool:
        """The message held by ``position`` is read from ``to`` (``size`` bytes) from now
        on; False if it is not held (released, or its topic deleted)."""
        h = self._held.get(position)
        if h is None:
            return False
        self._held[position] = h.carried(to, size)
        return True

    def get(self, position: int) -> Held | None:
        return self._held.get(position)

    def held(self) -> list[Held]:
        return list(self._held.values())

    def due(self, now_ms: int, limit: int) -> list[Held]:
        ready = sorted((h for h in self._held.values() if h.due_ms <= now_ms),
                       key=lambda h: (h.due_ms, h.position))
        return ready[:limit]

    def __len__(self) -> int:
        return len(self._held)

    def positions(self) -> list[int]:
        return list(self._held)

    def stored_positions(self) -> list[int]:
        """Where the held messages' bytes are (``Held.at``)."""
        return [h.at for h in self._held.values()]

    def state(self) -> dict[int, list[object]]:
        return {p: h.form(h.size, h.due_ms, h.topic) for p, h in sorted(self._held.items())}


class Halves:
    """Transaction half messages awaiting commit or rollback (replicated state), with the
    topic each belongs to: deleting a topic drops its halves (``forget_topic``).

    Checkpoint form: ``{position: [size, next check ms, checks, producer group, topic]}``
    (four items in checkpoints written before the topic was kept: its topic is then ""),
    and a sixth item, the position of its carried-forward copy, once it was carried.
    """

    def __init__(self, state: Mapping[int, list[object]] | None = None) -> None:
        self._held: dict[int, Held] = {}
        for p, v in (state or {}).items():
            size, due, checks, group = v[:4]
            topic = str(v[4]) if len(v) > 4 else ""
            moved = int(v[5]) if len(v) > 5 else -1  # type: ignore[call-overload]
            self._held[int(p)] = Held(int(p), int(size), int(due), int(checks), str(group), topic, moved)  # type: ignore[call-overload]

    def hold(self, position: int, size: int, stored_ms: int, group: str, topic: str = "") -> None:
        self._held[position] = Held(position, size, stored_ms + TRANSACTION_TIMEOUT_MS, 0, group, topic)

    def forget_topic(self, topic: str) -> None:
        """``topic`` was deleted: its open transactions can no longer be committed."""
        for position in [p for p, h in self._held.items() if h.topic == topic]:
            del self._held[position]

    def resolve(self, position: int) -> bool:
        return self._held.pop(position, None) is not None

    def checked(self, position: int, at_ms: int) -> bool:
        h = self._held.get(position)
        if h is None:
            return False
        self._held[position] = replace(h, due_ms=at_ms + TRANSACTION_TIMEOUT_MS, checks=h.checks + 1)
        return True

    def carry(self, position: int, to: int, size: int) -> bool:
        """As ``Timers.carry``: the half held by ``position`` is read from ``to`` now."""
        h = self._held.get(position)
        if h is None:
            return False
        self._held[position] = h.carried(to, size)
        return True

    def held(self) -> list[Held]:
        return list(self._held.values())

    def stored_positions(self) -> list[int]:
        return [h.at for h in self._held.values()]

    def get(self, position: int) -> Held | None:
        return self._held.get(position)

    def due(self, now_ms: int) -> list[Held]:
        return sorted((h for h in self._held.values() if h.due_ms <= now_ms), key=lambda h: h.position)

    def __len__(self) -> int:
        return len(self._held)

    def positions(self) -> list[int]:
        return list(self._held)

    def state(self) -> dict[int, list[object]]:
        return {p: h.form(h.size, h.due_ms, h.checks, h.group, h.topic)
                for p, h in sorted(self._held.items())}
