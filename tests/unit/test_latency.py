"""LatencyHistogram: Prometheus' bucket rule (le: at most the bound), cumulative snapshot."""

from __future__ import annotations

import pytest

from dledger.latency import LatencyHistogram


def test_buckets_count_at_or_below_their_bound_cumulatively() -> None:
    h = LatencyHistogram((0.001, 0.01))
    for seconds in (0.0005, 0.001, 0.002, 5.0):
        h.observe(seconds)
    buckets, total = h.snapshot()
    assert buckets == [("0.001", 2), ("0.01", 3), ("+Inf", 4)]
    assert total == pytest.approx(5.0035)


def test_bounds_must_ascend() -> None:
    with pytest.raises(ValueError, match="ascend"):
        LatencyHistogram((0.1, 0.01))
