"""Deadlines and retry delays for the client's request loops.

``Deadline`` measures on the monotonic clock, so a wall-clock step does not
shorten or stretch a timeout. ``backoff_delays`` yields the pauses between
retries: exponential from ``first`` by ``factor``, each randomised by up to
``jitter`` of itself either way so that clients retrying together drift apart
(at the cap too), and never more than ``cap``.

A Deadline may be read from any thread; a generator from ``backoff_delays`` is
for one caller (it draws from ``rng``, which must not be shared across threads).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterator

__all__ = ["Deadline", "backoff_delays"]


class Deadline:
    """A point ``seconds`` from now on a monotonic clock (``clock`` is for tests)."""

    __slots__ = ("_at", "_clock")

    def __init__(self, seconds: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        if math.isnan(seconds):
            raise ValueError("a deadline of NaN seconds")
        self._clock = clock
        self._at = clock() + seconds

    def remaining(self) -> float:
        """Seconds left, never negative (0.0 once expired)."""
        return max(0.0, self._at - self._clock())

    def expired(self) -> bool:
        """Whether the deadline has been reached; a Deadline(0) is expired at once."""
        return self._clock() >= self._at


def backoff_delays(
    first: float = 0.05,
    factor: float = 2.0,
    cap: float = 1.0,
    jitter: float = 0.2,
    rng: random.Random | None = None,
) -> Iterator[float]:
    """An endless series of retry delays in seconds.

    The n-th base delay is ``b = min(cap, first * factor**n)``; the delay is drawn
    uniformly from ``[b * (1 - jitter), min(cap, b * (1 + jitter))]``, so every delay
    lies in ``[0, cap]`` and delays at the cap still spread (downwards only). With
    ``jitter=0`` the series is exactly the bases. Raises ValueError (when the
    generator is created) unless ``0 < first``, ``factor >= 1``, ``cap > 0`` and
    ``0 <= jitter <= 1``.
    """
    if not first > 0:
        raise ValueError(f"first delay must be > 0, not {first!r}")
    if not factor >= 1:
        raise ValueError(f"factor must be >= 1, not {factor!r}")
    if not cap > 0:
        raise ValueError(f"cap must be > 0, not {cap!r}")
    if not 0 <= jitter <= 1:
        raise ValueError(f"jitter must be in [0, 1], not {jitter!r}")
    return _delays(first, factor, cap, jitter, rng if rng is not None else random.Random())


def _delays(first: float, factor: float, cap: float, jitter: float, rng: random.Random) -> Iterator[float]:
    base = min(first, cap)
    while True:
        if jitter:  # min(): uniform() may round one ulp past its upper end
            yield min(cap, rng.uniform(base * (1.0 - jitter), min(cap, base * (1.0 + jitter))))
        else:
            yield base
        base = min(cap, base * factor)
