"""``scripts/bench-log --breakdown``: where one entry's commit time goes, stage by stage.

Reads every replica's ``GET /stages`` (``dledger.stage_clock``) before and after a
phase and turns the difference into a table: per stage the entries timed, the mean and
the p50/p99 read from the histogram's buckets (an upper bound: the bucket an entry fell
in). Leader stages come from the leader, ``follower_*`` from all followers together. The
last row, *client and wire*, is the client's mean latency minus the sum of the server
stages' means (the HTTP request and answer on loopback, the client's own loop).
"""

from __future__ import annotations

from typing import Any

from dledger.stage_clock import FOLLOWER_STAGES, LEADER_STAGES, SERVER_STAGES
from raftmq.local_group import LocalGroup

__all__ = ["StageSnapshot", "breakdown_rows", "breakdown_table"]

#: stage -> (cumulative [(upper bound, count)], sum of seconds)
Histograms = dict[str, tuple[list[tuple[str, int]], float]]
StageSnapshot = dict[str, Histograms]  # replica name -> its histograms


def read_stages(group: LocalGroup) -> StageSnapshot:
    """Every replica's ``/stages`` now."""
    out: StageSnapshot = {}
    for name, node in group.nodes.items():
        raw = group.http.get(node.http, "/stages", 5.0)
        out[name] = {stage: ([(str(b), int(n)) for b, n in h["buckets"]], float(h["sum"]))
                     for stage, h in raw.items()}
    return out


def _minus(after: Histograms, before: Histograms, stage: str) -> tuple[list[tuple[str, int]], float]:
    buckets, total = after[stage]
    old_buckets, old_total = before.get(stage, ([(b, 0) for b, _ in buckets], 0.0))
    return [(b, n - m) for (b, n), (_, m) in zip(buckets, old_buckets, strict=True)], total - old_total


def _quantile(buckets: list[tuple[str, int]], q: float) -> float:
    """The upper bound (s) of the bucket holding quantile ``q`` (inf past the last bound)."""
    count = buckets[-1][1]
    for bound, n in buckets:
        if n >= q * count:
            return float(bound)
    return float("inf")


def breakdown_rows(before: StageSnapshot, after: StageSnapshot, leader: str,
                   client_mean_ms: float | None) -> list[dict[str, Any]]:
    """One row per stage: {stage, entries, mean_ms, p50_ms, p99_ms}; then client and wire."""
    rows: list[dict[str, Any]] = []
    server_ms = 0.0
    for stage in (*SERVER_STAGES[:1], *LEADER_STAGES, *SERVER_STAGES[1:], *FOLLOWER_STAGES):
        names = [n for n in after if n != leader] if stage in FOLLOWER_STAGES else [leader]
        parts = [_minus(after[n], before.get(n, {}), stage) for n in names]
        buckets = [(b, sum(p[0][i][1] for p in parts)) for i, (b, _) in enumerate(parts[0][0])]
        total = sum(p[1] for p in parts)
        count = buckets[-1][1]
        mean_ms = total / count * 1000 if count else None
        if mean_ms is not None and stage not in FOLLOWER_STAGES:
            server_ms += mean_ms
        rows.append({"stage": stage, "entries": count, "mean_ms": _round(mean_ms),
                     "p50_ms": _round(_quantile(buckets, 0.5) * 1000) if count else None,
                     "p99_ms": _round(_quantile(buckets, 0.99) * 1000) if count else None})
    if client_mean_ms is not None:
        rows.append({"stage": "client and wire", "entries": None,
                     "mean_ms": _round(client_mean_ms - server_ms), "p50_ms": None, "p99_ms": None})
    return rows


def _round(ms: float | None) -> float | None:
    return None if ms is None else round(ms, 3)


def breakdown_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table (p50/p99: bucket upper bounds)."""
    def cell(v: Any) -> str:
        return "" if v is None else str(v)
    lines = ["| stage | entries | mean ms | p50 ms (<=) | p99 ms (<=) |", "|---|---|---|---|---|"]
    lines += [f"| {r['stage']} | {cell(r['entries'])} | {cell(r['mean_ms'])} | {cell(r['p50_ms'])} | "
              f"{cell(r['p99_ms'])} |" for r in rows]
    return "\n".join(lines)
