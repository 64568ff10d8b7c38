"""deploy/prometheus and deploy/grafana name only series broker/http_api/metrics.py exposes (a
renamed metric must not silently empty a dashboard panel or disarm an alert)."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERIES = re.compile(r"\braftmq_[a-z_]+")
SUFFIXES = ("_total", "_bucket", "_count", "_sum")


def _exposed() -> set[str]:
    source = (ROOT / "broker" / "http_api" / "metrics.py").read_text()
    return set(re.findall(r'"(raftmq_[a-z_]+)"', source))


def _base(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


def test_rules_and_dashboard_use_exposed_series() -> None:
    exposed = _exposed()
    rules = (ROOT / "deploy" / "prometheus" / "raftmq-rules.yml").read_text()
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "raftmq-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = set(SERIES.findall(rules)) | {s for e in exprs for s in SERIES.findall(e)}
    assert used, "no RaftMQ series found"
    unknown = sorted(s for s in used if s not in exposed and _base(s) not in exposed)
    assert not unknown, f"not exposed by broker/http_api/metrics.py: {unknown}"


def test_the_dashboard_covers_what_the_alerts_watch() -> None:
    dashboard = (ROOT / "deploy" / "grafana" / "raftmq-dashboard.json").read_text()
    for series in ("raftmq_is_leader", "raftmq_leader_changes_total", "raftmq_replication_lag_entries",
                   "raftmq_consumer_lag", "raftmq_disk_free_bytes", "raftmq_fsync_seconds_bucket"):
        assert series in dashboard
