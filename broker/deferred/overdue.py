"""Redeliveries that are late: the broker's own check that retries and delays arrive.

A message sent back for a retry is held until its time, then stored in the group's
``%RETRY%group`` queue 0 (its store time is then its due time). A live group consumes
that queue and commits past it within seconds (clients commit every 5 s). So::

    overdue retry    a message of %RETRY%group, group has a live consumer on this
                     replica, stored more than ``threshold`` ago, at or above the
                     group's committed offset of that queue
    overdue delay    a held (delayed or retried) message whose time passed more than
                     ``threshold`` ago and that the leader has not released

Both are shown as metrics on every replica (``/metrics``) and, on the leader, as a
WARNING when a group becomes overdue and every ``REPEAT_S`` while it stays so, then an
INFO when it recovers: a consumer that never looks at its retry queue (issue 12: the
route of ``%RETRY%acc-g`` was asked for under a mangled name) cannot hide again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from broker.state.machine import BrokerStateMachine
from protocol.names import retry_topic

__all__ = ["DEFAULT_THRESHOLD_S", "REPEAT_S", "OverdueRetries", "OverdueWatch", "overdue_delays",
           "overdue_retries"]

log = logging.getLogger("broker.overdue")

#: Clients commit every 5 s and pull at once: a healthy group is never this late.
DEFAULT_THRESHOLD_S = 15.0
REPEAT_S = 60.0


@dataclass(frozen=True, slots=True)
class OverdueRetries:
    group: str
    messages: int       # retry messages waiting longer than the threshold
    oldest_s: float     # how long past its due time the oldest of them is


def overdue_retries(machine: BrokerStateMachine, groups: Iterable[str], now_ms: int,
                    threshold_ms: int) -> list[OverdueRetries]:
    """The groups in ``groups`` (those with a live consumer) whose retry queue holds
    messages due more than ``threshold_ms`` ago (their ConsumeQueue units' store times) and
    not committed."""
    out = []
    for group in sorted(set(groups)):
        topic = retry_topic(group)
        cq = machine.queue(topic, 0)
        if cq is None:
            continue
        committed = machine.committed_offset(group, topic, 0)
        start = max(cq.min_offset, committed or 0)
        if start >= cq.max_offset:
            continue
        horizon = now_ms - threshold_ms
        late_end = cq.bisect(lambda u: u.store_ms, horizon)  # first not yet late
        if late_end <= start:
            continue
        oldest = cq.get(start).store_ms
        out.append(OverdueRetries(group, late_end - start, max(0.0, (now_ms - oldest) / 1000)))
    return out


def overdue_delays(machine: BrokerStateMachine, now_ms: int, threshold_ms: int) -> int:
    """Held messages whose time passed more than ``threshold_ms`` ago."""
    return len(machine.timers.due(now_ms - threshold_ms, 1 << 30))


class OverdueWatch:
    """Logs overdue groups on the leader; ``check()`` is called every few seconds."""

    def __init__(self, machine: BrokerStateMachine, live_groups: Callable[[], Iterable[str]],
                 is_leader: Callable[[], bool],
                 threshold_s: float = DEFAULT_THRESHOLD_S,
                 clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.machine, self.live_groups = machine, live_groups
        self.is_leader, self.threshold_s = is_leader, threshold_s
        self.clock_ms, self.monotonic = clock_ms, monotonic
        self._warned: dict[str, float] = {}  # group (or "" for delays) -> when last warned
        self.last: list[OverdueRetries] = []
        self.delays = 0

    def measure(self) -> tuple[list[OverdueRetries], int]:
        now = self.clock_ms()
        threshold_ms = int(self.threshold_s * 1000)
        return (overdue_retries(self.machine, self.live_groups(), now, threshold_ms),
                overdue_delays(self.machine, now, threshold_ms))

    def check(self) -> None:
        self.last, self.delays = self.measure()
        if not self.is_leader():
            self._warned.clear()
            return
        now = self.monotonic()
        late = {o.group: o for o in self.last}
        for group, o in late.items():
            if now - self._warned.get(group, -REPEAT_S) >= REPEAT_S:
                self._warned[group] = now
                log.warning("consumer group %s: %d retried message(s) in %s overdue, the oldest by "
                            "%.0f s: its consumers are not pulling or not committing that queue",
                            group, o.messages, retry_topic(group), o.oldest_s)
        if self.delays and now - self._warned.get("", -REPEAT_S) >= REPEAT_S:
            self._warned[""] = now
            log.warning("%d delayed or retried message(s) are more than %.0f s past their delivery "
                        "time and not released", self.delays, self.threshold_s)
        for key in [k for k in self._warned if k and k not in late]:
            del self._warned[key]
            log.info("consumer group %s: its retried messages are on time again", key)
        if not self.delays:
            self._warned.pop("", None)
