"""The example configs in deploy/ stay valid (so docs/DEPLOY.md does not rot)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker.config import read_broker_section
from client.credentials import scram_record
from dledger.config import load_group_config

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


@pytest.mark.parametrize("name", ["broker-n1.toml", "broker-n2.toml", "broker-n3.toml"])
def test_example_config_loads(name: str, tmp_path: Path) -> None:
    text = (DEPLOY / name).read_text().replace("/etc/raftmq/cluster.secret", str(tmp_path / "s"))
    (tmp_path / "s").write_text("example-secret")
    (tmp_path / name).write_text(text)
    record = scram_record("example-password")  # what `raftmq user hash admin --out admin.scram` writes
    (tmp_path / "admin.scram").write_text(json.dumps({
        "user": "admin", "salt": record.salt.hex(), "iterations": record.iterations,
        "stored_key": record.stored_key.hex(), "server_key": record.server_key.hex()}))
    config = load_group_config(tmp_path / name, other_sections=["broker"])
    broker = read_broker_section(tmp_path / name)
    assert broker.acl and broker.acl_bootstrap_file == str(tmp_path / "admin.scram")
    node = config.node
    assert broker.addresses[node] == broker.listen
    assert config.peers[node].split(":")[0] == broker.listen.split(":")[0], "same host"
