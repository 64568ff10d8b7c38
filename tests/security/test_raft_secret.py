"""Issue 25, row 1: the Raft port never runs without the cluster secret.

pysyncobj unpickles whatever reaches its port when it has no password, and feeds a
``readonly`` connection the whole log (credentials included). A group of one needed no
secret, and the exposure check looked at the client port only: a broker with TLS and ACLs
and ``peers = { n1 = "0.0.0.0:P" }`` started, open to remote code execution. Now every
replica process refuses to start without a secret, whatever the group's size and address
(``--insecure`` starts it with a WARNING naming the Raft port). Processes stopped by PID.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from raftmq.local_acl import acl_broker_options
from raftmq.local_tls import LocalCA
from tests.support.procs import ProcessGroup, free_ports, wait_until

pytestmark = [pytest.mark.cluster]


def _broker_toml(tmp_path: Path, raft: str, port: int, secret: bool) -> Path:
    """A single-node broker with TLS and ACLs on its client port (loopback), Raft on ``raft``."""
    ca = LocalCA(tmp_path / "tls").ensure()
    tls = ca.server_tls()
    access = acl_broker_options(tmp_path)
    group = f'[group]\nname = "g1"\npeers = {{ n1 = "{raft}" }}\n'
    if secret:
        (tmp_path / "secret").write_text("a-long-cluster-secret-for-the-test\n")
        group += 'secret_file = "secret"\n'
    config = tmp_path / "n1.toml"
    config.write_text(f'[node]\nname = "n1"\ndata_dir = "n1"\n{group}'
                      f'[broker]\nlisten = "127.0.0.1:{port}"\nacl = true\n'
                      f'acl_bootstrap_file = "{access["acl_bootstrap_file"]}"\n'
                      f'[broker.tls]\ncert_file = "{tls.cert_file}"\nkey_file = "{tls.key_file}"\n')
    return config


def test_a_single_node_broker_without_a_secret_refuses_to_start(tmp_path: Path) -> None:
    raft, port = free_ports(2)
    config = _broker_toml(tmp_path, f"0.0.0.0:{raft}", port, secret=False)
    argv = [sys.executable, "-m", "broker", "--config", str(config)]
    with ProcessGroup(tmp_path / "logs") as procs:
        refused = procs.start("refused", argv)
        try:
            code = refused.wait(60)
        except Exception:
            pytest.fail("a broker whose Raft port has no secret started: " + refused.log_tail())
        assert code == 2
        assert "error: group g1 has no cluster secret" in refused.log_tail()
        assert "group.secret_file" in refused.log_tail()
        assert not (tmp_path / "n1").exists(), "refused before the replica opened its log"
        insecure = procs.start("insecure", [*argv, "--insecure"])
        wait_until(lambda: "INSECURE (--insecure): the Raft port" in insecure.log_tail(200), 60,
                   what="the warning of a Raft port without a secret")
        assert f"0.0.0.0:{raft} without a cluster secret" in insecure.log_tail(200)
        insecure.stop(10)


def test_a_single_node_broker_with_a_secret_starts_on_any_address(tmp_path: Path) -> None:
    raft, port = free_ports(2)
    config = _broker_toml(tmp_path, f"0.0.0.0:{raft}", port, secret=True)
    with ProcessGroup(tmp_path / "logs") as procs:
        node = procs.start("n1", [sys.executable, "-m", "broker", "--config", str(config)])
        wait_until(lambda: "serving wss://" in node.log_tail(200), 60, what="the broker serving")
        assert "INSECURE" not in node.log_tail(200)


def test_a_single_node_log_node_without_a_secret_refuses_to_start(tmp_path: Path) -> None:
    raft, http = free_ports(2)
    config = tmp_path / "n1.toml"
    config.write_text(f'[node]\nname = "n1"\n[group]\npeers = {{ n1 = "127.0.0.1:{raft}" }}\n')
    with ProcessGroup(tmp_path / "logs") as procs:
        node = procs.start("n1", [sys.executable, "-m", "dledger", "--config", str(config),
                                  "--http", f"127.0.0.1:{http}"])
        try:
            code = node.wait(60)
        except Exception:
            pytest.fail("a log node whose Raft port has no secret started: " + node.log_tail())
        assert code == 2 and "no cluster secret" in node.log_tail()
