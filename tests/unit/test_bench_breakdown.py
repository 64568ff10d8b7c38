"""``scripts/bench-log --breakdown`` (issue 30): the table from two /stages readings."""

from __future__ import annotations

from dledger.stage_clock import STAGES
from raftmq.bench_breakdown import breakdown_rows, breakdown_table

_BOUNDS = ["0.001", "0.01", "+Inf"]


def _reading(counts: dict[str, tuple[list[int], float]]) -> dict[str, tuple[list[tuple[str, int]], float]]:
    """Every stage; those named get (cumulative counts per bound, sum of seconds)."""
    out = {s: ([(b, 0) for b in _BOUNDS], 0.0) for s in STAGES}
    for stage, (cumulative, total) in counts.items():
        out[stage] = (list(zip(_BOUNDS, cumulative, strict=True)), total)
    return out


def test_rows_are_the_difference_of_two_readings_leader_and_followers_apart() -> None:
    before = {"n1": _reading({"queue": ([1, 1, 1], 0.0005)}),
              "n2": _reading({}), "n3": _reading({})}
    after = {"n1": _reading({"queue": ([3, 5, 5], 0.0125), "follower_fsync": ([9, 9, 9], 9.0)}),
             "n2": _reading({"follower_fsync": ([1, 2, 2], 0.006)}),
             "n3": _reading({"follower_fsync": ([2, 2, 2], 0.002)})}
    rows = {r["stage"]: r for r in breakdown_rows(before, after, "n1", client_mean_ms=5.0)}
    # the leader's queue: 4 more entries, 12 ms more, 2 of them under 1 ms
    assert rows["queue"] == {"stage": "queue", "entries": 4, "mean_ms": 3.0, "p50_ms": 1.0, "p99_ms": 10.0}
    # follower stages from the followers only (the leader's own count is not theirs)
    assert rows["follower_fsync"]["entries"] == 4
    assert rows["follower_fsync"]["mean_ms"] == 2.0
    assert rows["apply"]["entries"] == 0 and rows["apply"]["mean_ms"] is None
    # the client's mean less the server stages' means
    assert rows["client and wire"]["mean_ms"] == 2.0
    assert list(rows)[:2] == ["receive", "queue"] and "| queue | 4 | 3.0 | 1.0 | 10.0 |" in breakdown_table(
        list(rows.values()))
