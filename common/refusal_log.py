"""``RefusalLog``: warnings about refused peers or requests, at most once a minute per reason;
``Throttle``: the once-per-interval-per-key decision under it, for other logs that repeat.

A port under attack refuses many times a second; each reason is logged the first time and
then once a minute, with how many were refused meanwhile::

    WARNING <prefix> 10.0.0.9: frame of 2147483647 bytes before authentication (4123 more like it
            in the last minute)
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

__all__ = ["RefusalLog", "Throttle"]

LOG_EVERY_S = 60.0


class Throttle:
    """Once per ``every_s`` per key (thread-safe): ``take(key)`` is None while the key had its
    turn less than ``every_s`` ago, else how many takes of it were skipped since that turn."""

    def __init__(self, every_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._every = every_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._skipped: dict[str, int] = {}

    def take(self, key: str) -> int | None:
        now = self._clock()
        with self._lock:
            if now - self._last.get(key, now - self._every) < self._every:
                self._skipped[key] = self._skipped.get(key, 0) + 1
                return None
            self._last[key] = now
            return self._skipped.pop(key, 0)


class RefusalLog:
    """Thread-safe; ``prefix`` starts every line (e.g. "closed a Raft connection from")."""

    def __init__(self, logger: logging.Logger, prefix: str, every_s: float = LOG_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._logger = logger
        self._prefix = prefix
        self._turns = Throttle(every_s, clock)

    def note(self, reason: str, peer: object, detail: str) -> None:
        """One refusal for ``reason`` from ``peer``; logged if ``reason`` was not logged in the
        last minute."""
        skipped = self._turns.take(reason)
        if skipped is None:
            return
        more = f" ({skipped} more like it in the last minute)" if skipped else ""
        self._logger.warning("%s %s: %s%s", self._prefix, peer, detail, more)
