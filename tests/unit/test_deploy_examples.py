"""The example configs in deploy/ stay valid (so docs/DEPLOY.md does not rot)."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.config import read_broker_section
from dledger.config import load_group_config

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


@pytest.mark.parametrize("name", ["broker-n1.toml", "broker-n2.toml", "broker-n3.toml"])
def test_example_config_loads(name: str, tmp_path: Path) -> None:
    text = (DEPLOY / name).read_text().replace("/etc/raftmq/cluster.secret", str(tmp_path / "s"))
    (tmp_path / "s").write_text("example-secret")
    (tmp_path / name).write_text(text)
    config = load_group_config(tmp_path / name, other_sections=["broker"])
    broker = read_broker_section(tmp_path / name)
    node = config.node
    assert broker.addresses[node] == broker.listen
    assert config.peers[node].split(":")[0] == broker.listen.split(":")[0], "same host"
