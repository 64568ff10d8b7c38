"""``GET /metrics``: one broker replica in the Prometheus text format (prometheus-client).

Every series carries ``group`` and ``node``. Two kinds of series:

* observed on the request paths -- histograms ``raftmq_commit_latency_seconds`` (a send
  from the leader's receipt to its apply result) and ``raftmq_pull_serve_seconds`` (a
  pull from the end of its long-poll wait to its answer), and the counters
  ``raftmq_messages_sent_total`` / ``raftmq_messages_pulled_total`` /
  ``raftmq_requests_total{code}``;
* read from the replica at scrape time (``_ReplicaCollector``) -- role, term, commit and
  applied index, consumer lag per queue, divergence, apply stalls, overdue retries and
  delayed messages.

prometheus-client escapes label values and writes the exposition; each broker has its
own registry (no process-global state, so tests may run several brokers in one process).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from broker.server import BrokerServer

__all__ = ["CONTENT_TYPE", "BrokerMetrics"]

CONTENT_TYPE = CONTENT_TYPE_LATEST.split(";")[0]
disable_created_metrics()  # no *_created series: nobody graphs them, every scrape pays for them
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class BrokerMetrics:
    """The registry of one broker replica and the instruments its request paths update."""

    def __init__(self, server: BrokerServer) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        labels = {"group": server.rlog.config.group, "node": server.rlog.config.node}
        names, values = list(labels), list(labels.values())
        self.commit_latency = Histogram(
            "raftmq_commit_latency_seconds", "Sends on this leader: from receipt to the apply result",
            names, registry=self.registry, buckets=_LATENCY_BUCKETS).labels(*values)
        self.pull_serve = Histogram(
            "raftmq_pull_serve_seconds", "Pulls that found messages or waited out their long poll: "
            "from the end of the wait to the answer", names, registry=self.registry,
            buckets=_LATENCY_BUCKETS).labels(*values)
        self.sent = Counter("raftmq_messages_sent", "Messages stored through this leader",
                            names, registry=self.registry).labels(*values)
        self.pulled = Counter("raftmq_messages_pulled", "Messages served by pulls on this replica",
                              names, registry=self.registry).labels(*values)
        self._requests = Counter("raftmq_requests", "Requests received, by request code",
                                 [*names, "code"], registry=self.registry)
        self._request_children: dict[int, Counter] = {}
        self._values = values
        self.registry.register(_ReplicaCollector(server, labels))

    def request(self, code: int) -> None:
        child = self._request_children.get(code)
        if child is None:
            child = self._request_children[code] = self._requests.labels(*self._values, str(code))
        child.inc()

    def exposition(self) -> bytes:
        return bytes(generate_latest(self.registry))


class _ReplicaCollector(Collector):
    def __init__(self, server: BrokerServer, labels: dict[str, str]) -> None:
        self._server = server
        self._labels = labels

    def _gauge(self, name: str, doc: str, value: float, **extra: str) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, doc, labels=[*self._labels, *extra])
        family.add_metric([*self._labels.values(), *extra.values()], value)
        return family

    def collect(self) -> Iterator[Metric]:
        server = self._server
        s = server.rlog.status()
        yield self._gauge("raftmq_is_leader", "1 on the group's leader", int(s["role"] == "leader"))
        yield self._gauge("raftmq_term", "Raft term", s["term"])
        yield self._gauge("raftmq_commit_index", "Raft commit index", s["commit_index"])
        yield self._gauge("raftmq_applied_index", "Index the broker state machine applied",
                          server.machine.applied_index())
        lag = GaugeMetricFamily("raftmq_consumer_lag", "Retained messages not yet committed by a group",
                                labels=[*self._labels, "consumer_group", "topic", "queue"])
        for group in server.machine.offsets.groups():
            for row in server.lag_rows(group):
                lag.add_metric([*self._labels.values(), group, row["topic"], str(row["queue"])], row["lag"])
        yield lag
        yield self._gauge("raftmq_state_divergent", "1 when this replica's state digest differs from a "
                          "majority of its peers' (it then serves nothing)",
                          int(server.divergence.divergent is not None))
        mismatches = CounterMetricFamily("raftmq_state_digest_mismatch_checks",
                                         "Digest checks that found a difference", labels=list(self._labels))
        mismatches.add_metric(list(self._labels.values()), server.divergence.mismatches)
        yield mismatches
        yield self._gauge("raftmq_apply_stalled", "1 while the apply step is stalled",
                          int(server.applier.stalled is not None))
        retries, delays = server.overdue.measure()
        threshold = f"{server.overdue.threshold_s:g} s"
        overdue = GaugeMetricFamily("raftmq_retry_overdue_messages", "Retried messages of a live group "
                                    f"waiting longer than {threshold} past their due time",
                                    labels=[*self._labels, "consumer_group"])
        oldest = GaugeMetricFamily("raftmq_retry_overdue_oldest_seconds",
                                   "Age past due of a group's oldest overdue retry",
                                   labels=[*self._labels, "consumer_group"])
        for o in retries:
            overdue.add_metric([*self._labels.values(), o.group], o.messages)
            oldest.add_metric([*self._labels.values(), o.group], o.oldest_s)
        yield overdue
        yield oldest
        yield self._gauge("raftmq_delayed_overdue_messages",
                          f"Held messages not released {threshold} after their time", delays)
