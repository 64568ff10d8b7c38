"""Group configuration: bad configs are refused with a message that says what to fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from dledger.config import ConfigError, FlushPolicy, GroupConfig, load_group_config
from dledger.raft.node import group_conf

PEERS = {"n1": "127.0.0.1:7001", "n2": "127.0.0.1:7002", "n3": "127.0.0.1:7003"}


def make(**kw: object) -> GroupConfig:
    args: dict[str, object] = {"node": "n1", "peers": dict(PEERS), "data_dir": Path("d"),
                               "secret": "s3cret"}
    args.update(kw)
    return GroupConfig(**args)  # type: ignore[arg-type]


def test_valid_config() -> None:
    c = make()
    assert c.address == "127.0.0.1:7001"
    assert set(c.other_peers) == {"n2", "n3"}
    assert c.flush == FlushPolicy.SYNC


def test_self_missing_from_peers() -> None:
    with pytest.raises(ConfigError, match=r"node 'n9' is not in group\.peers"):
        make(node="n9")


def test_duplicate_peer_address() -> None:
    with pytest.raises(ConfigError, match="same address"):
        make(peers={**PEERS, "n3": PEERS["n2"]})


def test_duplicate_peer_name_in_toml(tmp_path: Path) -> None:
    f = tmp_path / "n1.toml"
    f.write_text('[node]\nname = "n1"\n[group]\npeers = { n1 = "127.0.0.1:1", '
                 'n1 = "127.0.0.1:2" }\nsecret = "x"\n')
    with pytest.raises(ConfigError, match=str(f)):
        load_group_config(f)


def test_multi_node_group_needs_a_secret() -> None:
    with pytest.raises(ConfigError, match="cluster secret"):
        make(secret=None)
    assert make(secret=None, insecure=True).insecure
    assert make(secret=None, peers={"n1": "127.0.0.1:7001"}).secret is None  # LocalLog: no Raft port


def test_every_raft_port_needs_a_secret_a_single_nodes_too(tmp_path: Path) -> None:
    """Issue 25, row 1: pysyncobj without a password runs what reaches its port."""
    alone = make(secret=None, peers={"n1": "0.0.0.0:7001"})
    with pytest.raises(ConfigError, match=r"group g1 has no cluster secret.*group\.secret_file"):
        alone.require_secret()
    with pytest.raises(ConfigError, match="no cluster secret"):
        group_conf(alone, "k", str(tmp_path / "dump"), lambda _path: None, True)
    f = tmp_path / "n1.toml"
    f.write_text('[node]\nname = "n1"\n[group]\npeers = { n1 = "127.0.0.1:1" }\n')
    with pytest.raises(ConfigError, match="no cluster secret"):
        load_group_config(f)
    assert load_group_config(f, insecure=True).secret is None


def test_bad_address() -> None:
    with pytest.raises(ConfigError, match="not host:port"):
        make(peers={**PEERS, "n2": "localhost"})


def test_dial_of_a_member_added_later_is_kept_and_checked() -> None:
    assert make(dial={"n7": "127.0.0.1:9000"}).dial == {"n7": "127.0.0.1:9000"}
    with pytest.raises(ConfigError, match="not host:port"):
        make(dial={"n7": "localhost"})


def test_load_toml_with_secret_file(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("abc\n")
    f = tmp_path / "n2.toml"
    f.write_text('[node]\nname = "n2"\ndata_dir = "data"\n[group]\nname = "g7"\n'
                 'peers = { n1 = "127.0.0.1:7001", n2 = "127.0.0.1:7002" }\n'
                 'secret_file = "secret"\n[raft]\nflush = "async"\nflush_interval_ms = 5\n')
    c = load_group_config(f)
    assert (c.node, c.group, c.secret, c.flush, c.flush_interval_ms) == (
        "n2", "g7", "abc", FlushPolicy.ASYNC, 5)
    assert c.data_dir == tmp_path / "data"


def test_bad_flush_policy(tmp_path: Path) -> None:
    f = tmp_path / "n1.toml"
    f.write_text('[node]\nname = "n1"\n[group]\npeers = { n1 = "127.0.0.1:7001" }\n'
                 '[raft]\nflush = "sometimes"\n')
    with pytest.raises(ConfigError, match="use \"sync\" or \"async\""):
        load_group_config(f)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_group_config(tmp_path / "nope.toml")
