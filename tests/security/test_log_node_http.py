"""The log node's control API (``python -m dledger``, ``raftmq log-node``) has no
authentication (issue 25, row 9): it listens on loopback only, unless ``--insecure``,
which logs a WARNING at every start."""

from __future__ import annotations

import sys
import urllib.request
from pathlib import Path

from tests.support.procs import ProcessGroup, free_ports, wait_until


def _config(tmp_path: Path, raft: int) -> Path:
    (tmp_path / "secret").write_text("a-cluster-secret-of-the-test")
    config = tmp_path / "n1.toml"
    config.write_text(f'[node]\nname = "n1"\ndata_dir = "n1"\n[group]\n'
                      f'peers = {{ n1 = "127.0.0.1:{raft}" }}\nsecret_file = "secret"\n')
    return config


def _healthz(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def test_a_log_node_api_reachable_from_other_hosts_is_refused_unless_insecure(tmp_path: Path) -> None:
    raft, http = free_ports(2)
    argv = [sys.executable, "-m", "dledger", "--config", str(_config(tmp_path, raft)),
            "--http", f"0.0.0.0:{http}"]
    with ProcessGroup(tmp_path / "logs") as procs:
        refused = procs.start("refused", argv)
        assert refused.wait(60) == 2
        assert f"error: the log node's control API (--http 0.0.0.0:{http}) has no authentication" \
            in refused.log_tail()
        assert not (tmp_path / "n1").exists(), "refused before the replica opened its log"
        insecure = procs.start("insecure", [*argv, "--insecure"])
        wait_until(lambda: _healthz(http), 60, what="the insecure log node")
        assert f"INSECURE (--insecure): the log node's control API listens on 0.0.0.0:{http}" \
            in insecure.log_tail(200)
