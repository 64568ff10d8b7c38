"""``LatencyHistogram``: cumulative counts of durations in fixed buckets, as Prometheus
histograms count them, kept without a metrics library (dledger imports nothing above it;
``broker.http_api.metrics`` exposes it at scrape time).

One writer thread (the caller of ``observe``); readers take ``snapshot()``, a consistent
enough copy for monitoring (a count may be one observation ahead of the sum).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

__all__ = ["FSYNC_BUCKETS", "LatencyHistogram"]

#: Seconds: an fsync on an SSD takes 0.1-2 ms, on a loaded or network disk tens of ms.
FSYNC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass
class LatencyHistogram:
    bounds: tuple[float, ...] = FSYNC_BUCKETS
    counts: list[int] = field(default_factory=list)  # per bucket (not cumulative), then +Inf
    total_s: float = 0.0

    def __post_init__(self) -> None:
        if list(self.bounds) != sorted(self.bounds):
            raise ValueError("bucket bounds must ascend")
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.total_s += seconds

    def snapshot(self) -> tuple[list[tuple[str, int]], float]:
        """([(upper bound as Prometheus writes it, cumulative count)] ending with "+Inf", sum)."""
        out, running = [], 0
        for bound, n in zip([*map(repr, self.bounds), "+Inf"], list(self.counts), strict=True):
            running += n
            out.append((bound, running))
        return out, self.total_s
