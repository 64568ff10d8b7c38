"""``RefusalLog``: warnings about refused peers or requests, at most once a minute per reason.

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

__all__ = ["RefusalLog"]

LOG_EVERY_S = 60.0


class RefusalLog:
    """Thread-safe; ``prefix`` starts every line (e.g. "closed a Raft connection from")."""

    def __init__(self, logger: logging.Logger, prefix: str, every_s: float = LOG_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._logger = logger
        self._prefix = prefix
        self._every = every_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._count: dict[str, int] = {}

    def note(self, reason: str, peer: object, detail: str) -> None:
        """One refusal for ``reason`` from ``peer``; logged if ``reason`` was not logged in the
        last minute."""
        now = self._clock()
        with self._lock:
            self._count[reason] = self._count.get(reason, 0) + 1
            if now - self._last.get(reason, -self._every) < self._every:
                return
            count, self._count[reason] = self._count[reason], 0
            self._last[reason] = now
        more = f" ({count - 1} more like it in the last minute)" if count > 1 else ""
        self._logger.warning("%s %s: %s%s", self._prefix, peer, detail, more)
