"""console.sampler's arithmetic: the metrics it reads, p99 from histogram buckets as
Prometheus computes it, rates from counter deltas, leader changes noted once each."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from client.errors import AuthFailedError
from console.sampler import Sampler, parse_metrics, quantile_from_buckets
from protocol.remoting import ResponseCode

EXPOSITION = """\
# TYPE raftmq_messages_sent_total counter
raftmq_messages_sent_total{group="g1",node="n1"} 10.0
# TYPE raftmq_messages_pulled_total counter
raftmq_messages_pulled_total{group="g1",node="n1"} 4.0
# TYPE raftmq_commit_latency_seconds histogram
raftmq_commit_latency_seconds_bucket{group="g1",le="0.001",node="n1"} 2.0
raftmq_commit_latency_seconds_bucket{group="g1",le="0.01",node="n1"} 10.0
raftmq_commit_latency_seconds_bucket{group="g1",le="+Inf",node="n1"} 10.0
raftmq_commit_latency_seconds_count{group="g1",node="n1"} 10.0
raftmq_commit_latency_seconds_sum{group="g1",node="n1"} 0.05
"""


def test_parse_metrics_reads_the_totals_and_cumulative_buckets() -> None:
    m = parse_metrics(EXPOSITION)
    assert m["sent"] == 10 and m["pulled"] == 4
    assert m["buckets"] == {0.001: 2.0, 0.01: 10.0, float("inf"): 10.0}


def test_quantile_interpolates_inside_its_bucket_like_histogram_quantile() -> None:
    buckets = {0.001: 2.0, 0.01: 10.0, float("inf"): 10.0}
    assert quantile_from_buckets(buckets, 0.5) == pytest.approx(0.001 + 0.009 * (5 - 2) / 8)
    assert quantile_from_buckets(buckets, 0.1) == pytest.approx(0.001 * 1 / 2)
    assert quantile_from_buckets({0.01: 0.0, float("inf"): 3.0}, 0.99) == 0.01  # in +Inf: last bound
    assert quantile_from_buckets({0.01: 0.0, float("inf"): 0.0}, 0.99) is None
    assert quantile_from_buckets({}, 0.99) is None


class FakeGateway:
    """Replies of one replica that sends 5 messages between samples."""

    def __init__(self) -> None:
        self.sent = 0
        self.leader = "n1"
        self.http = self

    async def statuses(self) -> dict[str, Any]:
        return {"g1": {"n1": ("a1", {"role": "leader" if self.leader == "n1" else "follower", "term": 1}),
                       "n2": ("a2", {"role": "leader" if self.leader == "n2" else "follower", "term": 2})}}

    async def topics(self) -> dict[str, Any]:
        return {"orders": {"g1": {"max_offsets": [self.sent, 0]}}}

    async def consumer_groups(self) -> dict[str, Any]:
        return {}

    async def lag_rows(self, group: str) -> list[dict[str, Any]]:
        return []


def sampled(gateway: FakeGateway, steps: int, leader_at: int | None = None) -> Sampler:
    """A sampler of ``gateway`` after ``steps`` samples (each through ``sample_logged``, as
    its loop takes them) 2 s apart, 5 messages sent between two; ``leader_at``: the step
    from which n2 leads."""
    clock = [100.0]
    sampler = Sampler(gateway, clock=lambda: clock[0])  # type: ignore[arg-type]

    async def metrics(address: str) -> str | None:
        return EXPOSITION.replace("} 10.0\n# TYPE raftmq_messages_pulled", f"}} {gateway.sent}.0\n# TYPE "
                                  "raftmq_messages_pulled") if address == "a1" else None

    sampler._metrics = metrics  # type: ignore[method-assign]

    async def run() -> None:
        for step in range(steps):
            gateway.sent = 5 * step
            if step == leader_at:
                gateway.leader = "n2"
            await sampler.sample_logged()
            clock[0] += 2.0

    asyncio.run(run())
    return sampler


def test_sampler_rates_and_leader_history() -> None:
    snap = sampled(FakeGateway(), 3, leader_at=2).snapshot()
    assert snap["series"]["t"] == [100.0, 102.0, 104.0]
    assert snap["series"]["produce"] == [None, 2.5, 2.5]  # 5 messages per 2 s
    assert snap["topic_rates"] == {"orders": 2.5}
    assert [(c["leader"], c["term"]) for c in snap["leaders"]["g1"]] == [("n1", 1), ("n2", 2)]


class RefusingGateway(FakeGateway):
    """ACLs on: the anonymous sampler may read /status and /metrics, not /admin/..."""

    async def topics(self) -> dict[str, Any]:
        raise AuthFailedError(ResponseCode.AUTH_FAILED, "authentication required", "a1")


def test_the_charted_rates_do_not_need_the_admin_reads(caplog: pytest.LogCaptureFixture) -> None:
    """A cluster with ACLs on refuses the anonymous sampler /admin/topics: the produce and
    consume series (from /metrics) go on; the refusal is logged once, not every sample."""
    snap = sampled(RefusingGateway(), 3).snapshot()
    assert snap["series"]["produce"] == [None, 2.5, 2.5]
    assert snap["topic_rates"] == {}
    refusals = [r for r in caplog.records if "authentication required" in r.getMessage()]
    assert len(refusals) == 1, [r.getMessage() for r in caplog.records]
