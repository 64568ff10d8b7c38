"""Failed authentications counted per user and per source address (issue 25, row 7): the
broker's SCRAM exchanges and the console's sign-in use it.

The rule (OWASP Authentication Cheat Sheet: throttling rather than permanent lockout;
NIST SP 800-63B 5.2.2: at most 100 consecutive failures per account)::

    failures  counted per key (a user name, a source address) within WINDOW_S of the last
              one; a success clears the user's count (never the source's)
    free      the first ``free`` failures of a key cost nothing
    delay     after them, an attempt must wait 2 ** (failures - free) s (at most MAX_DELAY_S)
              after the last failure; earlier ones are refused without being checked and
              without counting
    cap       at ``cap`` failures the key is refused until WINDOW_S after the last failure
    in flight an attempt between ``begin`` and ``end`` counts as a failure made now, so
              attempts checked in parallel get no more than those made one after another
              (at most ``free`` proofs checked however many run at once)

    user:    free 5,  cap 20          source:  free 10, cap 100

The counts are this replica's (an attacker spreading guesses over the replicas of a group
gets at most their number times as many). At most MAX_KEYS keys of each kind are kept
(the oldest forgotten first), so invented user names cannot grow it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["MAX_DELAY_S", "SOURCE_CAP", "SOURCE_FREE", "USER_CAP", "USER_FREE", "WINDOW_S",
           "LoginThrottle", "Throttled"]

USER_FREE, USER_CAP = 5, 20
SOURCE_FREE, SOURCE_CAP = 10, 100
WINDOW_S = 900.0
MAX_DELAY_S = 60.0
MAX_KEYS = 10_000


@dataclass(frozen=True, slots=True)
class Throttled:
    """Why an attempt is refused: the key's kind and value, its failures, and when to retry."""

    kind: str  # "user" or "source"
    key: str
    failures: int
    retry_after_s: float

    def message(self, what: str = "authentications") -> str:
        where = f"for user {self.key!r}" if self.kind == "user" else f"from {self.key}"
        return (f"too many failed {what} {where} ({self.failures}); "
                f"try again in {max(1, round(self.retry_after_s))} s")


class _Counts:
    def __init__(self, free: int, cap: int) -> None:
        self.free, self.cap = free, cap
        self._last: OrderedDict[str, tuple[int, float]] = OrderedDict()  # key -> (failures, last)
        self._in_flight: dict[str, int] = {}  # key -> attempts begun and not ended

    def wait(self, key: str, now: float) -> tuple[int, float]:
        """(failures, seconds the next attempt must still wait; <= 0: none), attempts in
        flight counted as failures made ``now``."""
        failures, last = self._last.get(key, (0, 0.0))
        if failures and now - last >= WINDOW_S:
            del self._last[key]
            failures = 0
        in_flight = self._in_flight.get(key, 0)
        if in_flight:
            failures, last = failures + in_flight, now
        if failures < self.free:
            return failures, 0.0
        return failures, last + self._delay(failures) - now

    def _delay(self, failures: int) -> float:
        return WINDOW_S if failures >= self.cap else min(2.0 ** (failures - self.free), MAX_DELAY_S)

    def begin(self, key: str) -> None:
        self._in_flight[key] = self._in_flight.get(key, 0) + 1

    def end(self, key: str) -> None:
        left = self._in_flight.get(key, 0) - 1
        if left > 0:
            self._in_flight[key] = left
        else:
            self._in_flight.pop(key, None)

    def fail(self, key: str, now: float) -> int:
        failures, last = self._last.get(key, (0, 0.0))
        failures = (0 if now - last >= WINDOW_S else failures) + 1
        self._last[key] = (failures, now)
        self._last.move_to_end(key)
        while len(self._last) > MAX_KEYS:
            self._last.popitem(last=False)
        return failures

    def clear(self, key: str) -> None:
        self._last.pop(key, None)


class LoginThrottle:
    """One replica's failure counts (module docstring); not thread-safe (the event loop's)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._users = _Counts(USER_FREE, USER_CAP)
        self._sources = _Counts(SOURCE_FREE, SOURCE_CAP)

    def check(self, user: str, source: str | None) -> Throttled | None:
        """None if ``user`` may try now from ``source``; else why not."""
        now = self._clock()
        for kind, counts, key in (("user", self._users, user), ("source", self._sources, source)):
            if key is None:
                continue
            failures, wait = counts.wait(key, now)
            if wait > 0:
                return Throttled(kind, key, failures, wait)
        return None

    def begin(self, user: str, source: str | None) -> Throttled | None:
        """``check``, and if allowed count the attempt as in flight until ``end``: call this
        right before a proof is checked, and ``end`` exactly once after (in ``finally``)."""
        refused = self.check(user, source)
        if refused is None:
            self._users.begin(user)
            if source is not None:
                self._sources.begin(source)
        return refused

    def end(self, user: str, source: str | None, *, ok: bool | None) -> None:
        """The outcome of an attempt ``begin`` allowed: ``succeeded`` (True), ``failed``
        (False) or none (None: no verdict on the password, e.g. the cluster did not answer)."""
        self._users.end(user)
        if source is not None:
            self._sources.end(source)
        if ok:
            self.succeeded(user)
        elif ok is not None:
            self.failed(user, source)

    def failed(self, user: str, source: str | None) -> None:
        now = self._clock()
        self._users.fail(user, now)
        if source is not None:
            self._sources.fail(source, now)

    def succeeded(self, user: str) -> None:
        self._users.clear(user)
