"""deploy/prometheus and deploy/grafana against Debian's real ``prometheus`` and ``promtool``
(installed by scripts/bootstrap): the config and rules check, each alert fires on its
series (promtool's rule tests), and a Prometheus scraping a live local cluster loads the
rules and answers RaftMQ series and every dashboard query."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raftmq.local_group import free_port
from tests.support.procs import stop_popen, wait_until

pytestmark = [pytest.mark.monitoring, pytest.mark.cluster]

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is missing: run scripts/bootstrap (apt-get install prometheus)"
    return path


def test_promtool_checks_the_config_and_rules_and_every_alert_fires_on_its_series() -> None:
    promtool = _tool("promtool")
    for args in (["check", "config", "prometheus.yml"], ["check", "rules", "raftmq-rules.yml"],
                 ["test", "rules", "raftmq-rules.test.yml"]):
        done = subprocess.run([promtool, *args], cwd=DEPLOY / "prometheus", capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, f"promtool {' '.join(args)}:\n{done.stdout}{done.stderr}"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[dict[str, Any]]:
    d = tmp_path / "c"
    run = [sys.executable, "-m", "raftmq", "cluster"]
    try:
        up = subprocess.run([*run, "up", "--dir", str(d), "--namesrv-port", "0"], capture_output=True,
                            text=True, timeout=120)
        assert up.returncode == 0, up.stdout + up.stderr
        yield json.loads((d / "cluster.json").read_text())
    finally:
        subprocess.run([*run, "down", "--dir", str(d)], capture_output=True, timeout=60)


def _query(base: str, promql: str) -> dict[str, Any]:
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    with urllib.request.urlopen(url, timeout=5) as resp:
        return dict(json.loads(resp.read()))


def _wait(what: str, check: Any, timeout: float = 30.0) -> Any:
    return wait_until(check, timeout, 0.25, what)  # an OSError (not listening yet) is "not yet"


def test_prometheus_scrapes_a_local_cluster_with_the_rules_and_dashboard(cluster: dict[str, Any],
                                                                         tmp_path: Path) -> None:
    targets = [n["address"] for nodes in cluster["groups"].values() for n in nodes.values()]
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({  # YAML is a superset of JSON
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(DEPLOY / "prometheus" / "raftmq-rules.yml")],
        "scrape_configs": [{"job_name": "raftmq-brokers", "static_configs": [{"targets": targets}]}]}))
    listen = f"127.0.0.1:{free_port()}"
    base = f"http://{listen}"
    with open(tmp_path / "prometheus.log", "wb") as log:
        proc = subprocess.Popen([_tool("prometheus"), f"--config.file={config}",
                                 f"--storage.tsdb.path={tmp_path / 'data'}",
                                 f"--web.listen-address={listen}"], stdout=log, stderr=subprocess.STDOUT)
    try:
        leaders = _wait("raftmq_is_leader of all 3 replicas", lambda: (lambda r: len(r) == 3 and r)(
            _query(base, "raftmq_is_leader")["data"]["result"]))
        assert sorted(float(s["value"][1]) for s in leaders) == [0.0, 0.0, 1.0]
        assert {s["metric"]["node"] for s in leaders} == {"n1", "n2", "n3"}
        assert _wait("fsync histogram", lambda: _query(base, "raftmq_fsync_seconds_count")["data"]["result"])

        with urllib.request.urlopen(f"{base}/api/v1/rules", timeout=5) as resp:
            groups = json.loads(resp.read())["data"]["groups"]
        rules = {r["name"]: r for g in groups for r in g["rules"]}
        assert {"RaftMQNoLeader", "RaftMQLeaderChanges", "RaftMQReplicationLag", "RaftMQConsumerLag",
                "RaftMQDiskNearlyFull", "RaftMQFsyncSlow"} <= set(rules)
        _wait("every rule evaluated without error", lambda: all(
            r["health"] == "ok" for g in json.loads(urllib.request.urlopen(
                f"{base}/api/v1/rules", timeout=5).read())["data"]["groups"] for r in g["rules"]))

        dashboard = json.loads((DEPLOY / "grafana" / "raftmq-dashboard.json").read_text())
        for panel in dashboard["panels"]:
            for target in panel["targets"]:
                answer = _query(base, target["expr"])
                assert answer["status"] == "success", (panel["title"], answer)
        assert _query(base, "max by (group) (raftmq_term)")["data"]["result"]
    finally:
        stop_popen(proc, 15)
