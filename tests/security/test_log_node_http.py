"""The log node's control API (``python -m dledger``, ``raftmq log-node``) has no
authentication (issue 25, row 9): it listens on loopback only, unless ``--insecure``,
which logs a WARNING at every start."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

from raftmq.local_group import LocalGroup
from tests.support.procs import ProcessGroup, free_ports, led, wait_until


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


def _call(url: str, data: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET",
                                 headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_a_web_page_can_neither_propose_nor_read_through_a_rebound_name(tmp_path: Path) -> None:
    """Issue 25, row 4 (second pass, G6): the log node's browser guard. A page of another
    origin cannot POST ``/propose`` (403, nothing appended), and a page on a DNS name
    rebound to 127.0.0.1 cannot read ``/entries`` (403); tools (no Origin, an IP address in
    Host) can. A one-node group's process (``raftmq.local_group``), stopped by PID."""
    with led(LocalGroup(tmp_path / "g", 1), LocalGroup.wait_leader) as group:
        http = group.nodes["n1"].http
        base = f"http://{http}"
        port = http.rsplit(":", 1)[1]
        wait_until(lambda: _call(f"{base}/propose", b"from-a-tool")[0] == 200, 30,
                   what="a leader that takes a proposal")
        before = json.loads(_call(f"{base}/status")[1])["last_index"]
        code, answer = _call(f"{base}/propose", b"from-a-web-page",
                             {"Origin": "http://evil.example", "Content-Type": "text/plain"})
        assert code == 403 and b"http://evil.example" in answer, (code, answer)
        code, answer = _call(f"{base}/entries?from=1", headers={"Host": f"rebound.example:{port}"})
        assert code == 403 and b"rebound.example" in answer, (code, answer)
        assert json.loads(_call(f"{base}/status")[1])["last_index"] == before
        code, rows = _call(f"{base}/entries?from=1")
        assert code == 200 and b"from-a-web-page" not in rows and b"from-a-tool" in rows
