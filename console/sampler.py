"""``Sampler``: what the console shows over time, sampled every ``interval_s`` from every
replica's ``/status`` and ``/metrics`` (the same series Prometheus scrapes).

    series     t, produce (msg/s), consume (msg/s), send p99 (ms), over the last ``keep`` samples
    leaders    per broker group: (time, term, leader node) each time the group's leader changed
    rates      per topic: produce msg/s (from its queues' max offsets);
               per consumer group: consume msg/s (from its committed offsets)

Rates come from counter deltas between two samples (a counter that went down -- a restarted
replica -- counts from zero); the p99 from the deltas of the send-commit histogram's
cumulative buckets over the last ``P99_WINDOW`` samples of every replica together.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from client.errors import AuthFailedError
from console.gateway import HTTP_TIMEOUT, ClusterGateway

__all__ = ["Sampler", "parse_metrics", "quantile_from_buckets"]

log = logging.getLogger("console.sampler")

P99_WINDOW = 5
_SENT = "raftmq_messages_sent_total"
_PULLED = "raftmq_messages_pulled_total"
_COMMIT_BUCKET = "raftmq_commit_latency_seconds_bucket"


def parse_metrics(text: str) -> dict[str, Any]:
    """From one replica's exposition: messages sent and pulled (totals) and the commit
    latency's cumulative buckets {upper bound: count}."""
    out: dict[str, Any] = {"sent": 0.0, "pulled": 0.0, "buckets": {}}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == _SENT:
                out["sent"] += s.value
            elif s.name == _PULLED:
                out["pulled"] += s.value
            elif s.name == _COMMIT_BUCKET:
                bound = float(s.labels["le"])
                out["buckets"][bound] = out["buckets"].get(bound, 0.0) + s.value
    return out


def quantile_from_buckets(buckets: Mapping[float, float], q: float) -> float | None:
    """The ``q`` quantile of cumulative histogram ``buckets`` (upper bound -> count), by
    linear interpolation inside its bucket as Prometheus' histogram_quantile does; None
    when nothing was observed. A quantile in the +Inf bucket is the last finite bound."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    rank = q * buckets[bounds[-1]]
    lower_bound, lower_count = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            width = count - lower_count
            return lower_bound + (bound - lower_bound) * ((rank - lower_count) / width if width else 1.0)
        lower_bound, lower_count = bound, count
    return lower_bound


def _delta(new: float, old: float | None) -> float:
    return new if old is None or new < old else new - old


@dataclass
class _Replica:
    sent: float | None = None
    pulled: float | None = None
    buckets: deque[dict[float, float]] = field(default_factory=lambda: deque(maxlen=P99_WINDOW + 1))


class Sampler:
    """Samples in the background (``start``/``stop``) on the console's loop; readers take
    the ``snapshot()`` dict."""

    def __init__(self, gateway: ClusterGateway, interval_s: float = 1.0, keep: int = 300,
                 clock: Callable[[], float] = time.time) -> None:
        self.gateway = gateway
        self.interval_s = interval_s
        self.clock = clock
        self.series: dict[str, deque[float | None]] = {k: deque(maxlen=keep)
                                                       for k in ("t", "produce", "consume", "p99_ms")}
        self.leaders: dict[str, list[dict[str, Any]]] = {}
        self.topic_rates: dict[str, float] = {}
        self.group_rates: dict[str, float] = {}
        self._replicas: dict[str, _Replica] = {}
        self._topic_totals: dict[str, float] = {}
        self._group_totals: dict[str, float] = {}
        self._last_at: float | None = None  # of the last sample of the series
        self._offsets_at: float | None = None  # of the last sample of the topic and group rates
        self._refused = False  # an /admin read was refused (logged once)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            await self.sample_logged()
            await asyncio.sleep(self.interval_s)

    async def sample_logged(self) -> None:
        """One ``sample``; a failure is logged (a cluster down or restarting: sampling goes
        on), a refused ``/admin`` read only the first time."""
        try:
            await self.sample()
        except AuthFailedError as e:  # ACLs on: this anonymous reader gets no topic or group rates
            if not self._refused:
                log.warning("per-topic and per-group rates are not sampled: %s", e)
            self._refused = True
        except Exception as e:
            log.warning("sample failed: %s", e)

    async def sample(self) -> None:
        """The series from every replica's /status and /metrics, then the topic and group
        rates from /admin reads (which ACLs may refuse: AuthFailedError, the series kept)."""
        now = self.clock()
        statuses = await self.gateway.statuses()
        self._note_leaders(now, statuses)
        addresses = [a for nodes in statuses.values() for a, s in nodes.values() if s is not None]
        texts = await asyncio.gather(*(self._metrics(a) for a in addresses))
        elapsed = None if self._last_at is None else max(now - self._last_at, 1e-3)
        sent = pulled = 0.0
        window: dict[float, float] = {}
        for address, text in zip(addresses, texts, strict=True):
            if text is None:
                continue
            m = parse_metrics(text)
            r = self._replicas.setdefault(address, _Replica())
            sent += _delta(m["sent"], r.sent)
            pulled += _delta(m["pulled"], r.pulled)
            r.sent, r.pulled = m["sent"], m["pulled"]
            r.buckets.append(m["buckets"])
            oldest = r.buckets[0]
            for bound, count in m["buckets"].items():
                window[bound] = window.get(bound, 0.0) + _delta(count, oldest.get(bound) if len(r.buckets) > 1
                                                                else None)
        p99 = quantile_from_buckets(window, 0.99)
        self._append(now, None if elapsed is None else sent / elapsed,
                     None if elapsed is None else pulled / elapsed, None if p99 is None else p99 * 1000)
        self._last_at = now
        await self._sample_offsets(now)

    async def _metrics(self, address: str) -> str | None:
        try:
            url = self.gateway.url(address, "/metrics")
            async with self.gateway.http.get(url, timeout=HTTP_TIMEOUT) as resp:
                return await resp.text() if resp.status == 200 else None
        except (OSError, TimeoutError):
            return None

    def _append(self, t: float, produce: float | None, consume: float | None, p99_ms: float | None) -> None:
        for key, value in (("t", t), ("produce", produce), ("consume", consume), ("p99_ms", p99_ms)):
            self.series[key].append(value)

    def _note_leaders(self, now: float, statuses: dict[str, dict[str, tuple[str, Any]]]) -> None:
        for group, nodes in statuses.items():
            leading = [(s["term"], n) for n, (_, s) in nodes.items() if s and s.get("role") == "leader"]
            if not leading:
                continue
            term, node = max(leading)
            history = self.leaders.setdefault(group, [])
            if not history or history[-1]["leader"] != node or history[-1]["term"] != term:
                history.append({"t": now, "term": term, "leader": node})
                del history[:-50]

    async def _sample_offsets(self, now: float) -> None:
        elapsed = None if self._offsets_at is None else max(now - self._offsets_at, 1e-3)
        topics = await self.gateway.topics()
        totals = {t: float(sum(sum(info["max_offsets"]) for info in by_group.values()))
                  for t, by_group in topics.items()}
        self.topic_rates = self._rates(totals, self._topic_totals, elapsed)
        self._topic_totals = totals
        groups = await self.gateway.consumer_groups()
        committed = {}
        for g in groups:
            committed[g] = float(sum(r["committed"] or 0 for r in await self.gateway.lag_rows(g)))
        self.group_rates = self._rates(committed, self._group_totals, elapsed)
        self._group_totals = committed
        self._offsets_at = now

    @staticmethod
    def _rates(totals: dict[str, float], before: dict[str, float], elapsed: float | None) -> dict[str, float]:
        if elapsed is None:
            return {k: 0.0 for k in totals}
        return {k: _delta(v, before.get(k)) / elapsed if k in before else 0.0 for k, v in totals.items()}

    def snapshot(self) -> dict[str, Any]:
        return {"series": {k: list(v) for k, v in self.series.items()},
                "leaders": {g: list(h) for g, h in self.leaders.items()},
                "topic_rates": dict(self.topic_rates), "group_rates": dict(self.group_rates),
                "interval_s": self.interval_s}
