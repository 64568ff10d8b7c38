"""The example configs in deploy/ stay valid (so docs/DEPLOY.md does not rot)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker.config import read_broker_section
from broker.namesrv.config import read_namesrv_config
from client.credentials import scram_record
from dledger.config import load_group_config
from protocol.exposure import missing_protections

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def example_broker(name: str, tmp_path: Path) -> Path:
    """The example ``name`` copied into ``tmp_path`` with the secret and bootstrap user it names."""
    text = (DEPLOY / name).read_text().replace("/etc/raftmq/cluster.secret", str(tmp_path / "s"))
    (tmp_path / "s").write_text("example-secret")
    (tmp_path / name).write_text(text)
    record = scram_record("example-password")  # what `raftmq user hash admin --out admin.scram` writes
    (tmp_path / "admin.scram").write_text(json.dumps({
        "user": "admin", "salt": record.salt.hex(), "iterations": record.iterations,
        "stored_key": record.stored_key.hex(), "server_key": record.server_key.hex()}))
    return tmp_path / name


@pytest.mark.parametrize("name", ["broker-n1.toml", "broker-n2.toml", "broker-n3.toml"])
def test_example_config_loads(name: str, tmp_path: Path) -> None:
    example_broker(name, tmp_path)
    config = load_group_config(tmp_path / name, other_sections=["broker"])
    broker = read_broker_section(tmp_path / name)
    assert broker.acl and broker.acl_bootstrap_file == str(tmp_path / "admin.scram")
    node = config.node
    assert broker.addresses[node] == broker.listen
    assert config.peers[node].split(":")[0] == broker.listen.split(":")[0], "same host"


@pytest.mark.parametrize("name", ["broker-n1.toml", "broker-n2.toml", "broker-n3.toml"])
def test_example_brokers_may_listen_on_their_hosts_address(name: str, tmp_path: Path) -> None:
    """Off loopback a broker needs TLS and ACLs (broker/security/exposure.py): the examples have both,
    each with its own certificate."""
    broker = read_broker_section(example_broker(name, tmp_path))
    assert broker.tls is not None and broker.tls.ca_file == "/etc/raftmq/tls/ca.pem"
    assert broker.tls.cert_file == f"/etc/raftmq/tls/broker{name[-6]}.pem"
    assert missing_protections(broker.listen, tls=True, acl=broker.acl) == []


def test_example_name_server_serves_https(tmp_path: Path) -> None:
    text = (DEPLOY / "namesrv.toml").read_text().replace("/etc/raftmq/g1.namesrv-key", str(tmp_path / "k"))
    (tmp_path / "k").write_text("00" * 32)
    (tmp_path / "namesrv.toml").write_text(text)
    config = read_namesrv_config(tmp_path / "namesrv.toml")
    assert config.tls is not None and config.tls.cert_file == "/etc/raftmq/tls/namesrv1.pem"
    assert missing_protections(config.listen, tls=True, acl=None) == []
