"""``GET /metrics``: one broker replica in the Prometheus text format (prometheus-client).

Every series carries ``group`` and ``node``. Two kinds of series:

* observed on the request paths -- histograms ``raftmq_commit_latency_seconds`` (a send
  from the leader's receipt to its apply result) and ``raftmq_pull_serve_seconds`` (a
  pull from the end of its long-poll wait to its answer), and the counters
  ``raftmq_messages_sent_total`` / ``raftmq_messages_pulled_total`` /
  ``raftmq_requests_total{code}`` (a served code, or ``unknown`` for every code the
  broker does not serve: a client inventing codes adds no series);
* read from the replica at scrape time (``_ReplicaCollector``) -- role, term, commit and
  applied index, replication lag of each follower (on the leader, in entries), consumer lag
  per queue, SimpleConsumer groups' messages in flight (``raftmq_pop_in_flight_messages``),
  divergence, apply stalls, overdue retries and delayed messages, free disk,
  the disk-full flag (``raftmq_disk_full``: 1 while a write failed for want of space and
  the room to resume is not back) and CommitLog size, the histogram
  ``raftmq_fsync_seconds`` of the log's fsyncs, ``raftmq_commit_stage_seconds{stage}``
  (where entries' commit time goes, one fixed stage set: ``dledger.stage_clock``; the
  broker's ``receive`` and ``answer`` are its WritePath's) and ``raftmq_build_info{version}``;
* ``raftmq_leader_changes_total``: how often this replica learned of a new leader; and
  prometheus-client's ``process_*`` series (start time, CPU, memory).

``deploy/prometheus/`` alerts on these series and ``deploy/grafana/`` graphs them; a test
(tests/unit/test_monitoring_files.py) keeps every series they name in this module.

prometheus-client escapes label values and writes the exposition; each broker has its
own registry (no process-global state, so tests may run several brokers in one process).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from importlib import metadata
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from broker.http_api.server_view import ServerView
    from dledger.log_events import LeaderChange
    from dledger.log_status import Status

__all__ = ["CONTENT_TYPE", "VERSION", "BrokerMetrics"]

CONTENT_TYPE = CONTENT_TYPE_LATEST.split(";")[0]
disable_created_metrics()  # no *_created series: nobody graphs them, every scrape pays for them
try:
    VERSION = metadata.version("raftmq")
except metadata.PackageNotFoundError:  # run from a source tree that was never installed
    VERSION = "unknown"
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class BrokerMetrics:
    """The registry of one broker replica and the instruments its request paths update."""

    def __init__(self, server: ServerView) -> None:
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
        self._request_children: dict[int | None, Counter] = {}
        self._values = values
        self.auth_failures = Counter("raftmq_auth_failures", "SCRAM proofs refused on this replica "
                                     "(wrong user name or password)", names, registry=self.registry
                                     ).labels(*values)
        self.auth_throttled = Counter("raftmq_auth_throttled", "Authentications refused unchecked: too "
                                      "many failures of the user or the source", names,
                                      registry=self.registry).labels(*values)
        self.leader_changes = Counter("raftmq_leader_changes", "Times this replica learned of a new leader",
                                      names, registry=self.registry).labels(*values)
        self._last_leader: str | None = None
        server.rlog.add_leader_listener(self._on_leader_change)
        self.registry.register(_ReplicaCollector(server, labels))
        ProcessCollector(registry=self.registry)

    def _on_leader_change(self, change: LeaderChange) -> None:
        if change.leader is not None and change.leader != self._last_leader:
            self.leader_changes.inc()
            self._last_leader = change.leader

    def request(self, code: int | None) -> None:
        """Count a request of ``code`` (None: a code the broker does not serve, counted as
        ``unknown``: the children stay as few as the served codes)."""
        child = self._request_children.get(code)
        if child is None:
            label = "unknown" if code is None else str(code)
            child = self._request_children[code] = self._requests.labels(*self._values, label)
        child.inc()

    def exposition(self) -> bytes:
        return bytes(generate_latest(self.registry))


class _ReplicaCollector(Collector):
    def __init__(self, server: ServerView, labels: dict[str, str]) -> None:
        self._server = server
        self._labels = labels

    def _gauge(self, name: str, doc: str, value: float, **extra: str) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, doc, labels=[*self._labels, *extra])
        family.add_metric([*self._labels.values(), *extra.values()], value)
        return family

    def _replication(self, s: Status) -> Iterator[Metric]:
        lag = GaugeMetricFamily("raftmq_replication_lag_entries", "On the leader: entries of its log a "
                                "follower does not hold yet", labels=[*self._labels, "follower"])
        for follower, index in sorted(s.follower_match_index.items()):
            lag.add_metric([*self._labels.values(), follower], max(0, s.last_index - index))
        yield lag

    def _disk(self) -> Iterator[Metric]:
        rlog = self._server.rlog
        yield self._gauge("raftmq_disk_free_bytes", "Free bytes on the data directory's file system",
                          rlog.disk.free_bytes())
        yield self._gauge("raftmq_disk_full", "1 while this replica's disk is full: a write failed for "
                          "want of space and not enough room is free again to resume", int(rlog.disk.full))
        yield self._gauge("raftmq_disk_total_bytes", "Size of the data directory's file system",
                          shutil.disk_usage(rlog.config.data_dir).total)
        cl = rlog.reader
        yield self._gauge("raftmq_commitlog_bytes", "Bytes of the retained CommitLog",
                          cl.write_position - cl.start_position)
        buckets, total = rlog.fsync_seconds.snapshot()
        family = HistogramMetricFamily("raftmq_fsync_seconds", "fsync of the CommitLog: duration",
                                       labels=list(self._labels))
        family.add_metric(list(self._labels.values()), buckets, total)
        yield family
        stages = HistogramMetricFamily("raftmq_commit_stage_seconds", "An entry's commit, stage by stage "
                                       "(dledger.stage_clock): leader stages on the leader, follower_* "
                                       "on followers", labels=[*self._labels, "stage"])
        for stage, histogram in rlog.stage_seconds.items():
            buckets, total = histogram.snapshot()
            stages.add_metric([*self._labels.values(), stage], buckets, total)
        yield stages

    def _pop_groups(self) -> Metric:
        """SimpleConsumer groups (issue 29): messages in flight (claimed, not yet settled)."""
        in_flight = GaugeMetricFamily("raftmq_pop_in_flight_messages", "Messages a SimpleConsumer group "
                                      "holds or held (claimed, not acked or dead-lettered yet)",
                                      labels=[*self._labels, "consumer_group"])
        for group, count in sorted(self._server.machine.pops.groups().items()):
            in_flight.add_metric([*self._labels.values(), group], count)
        return in_flight

    def collect(self) -> Iterator[Metric]:
        server = self._server
        s = server.rlog.status()
        yield self._gauge("raftmq_is_leader", "1 on the group's leader", int(s.role == "leader"))
        yield self._gauge("raftmq_term", "Raft term", s.term)
        yield self._gauge("raftmq_commit_index", "Raft commit index", s.commit_index)
        yield self._gauge("raftmq_applied_index", "Index the broker state machine applied",
                          server.machine.applied_index())
        yield self._gauge("raftmq_build_info", "1, labelled with the RaftMQ version", 1, version=VERSION)
        yield from self._replication(s)
        yield from self._disk()
        lag = GaugeMetricFamily("raftmq_consumer_lag", "Retained messages not yet committed by a group",
                                labels=[*self._labels, "consumer_group", "topic", "queue"])
        for group in server.machine.offsets.groups():
            for row in server.lag_rows(group):
                lag.add_metric([*self._labels.values(), group, row["topic"], str(row["queue"])], row["lag"])
        yield lag
        yield self._pop_groups()
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
