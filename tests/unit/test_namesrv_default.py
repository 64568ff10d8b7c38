"""Where clients look for the name server when given none, and where `raftmq cluster up`
puts it: RocketMQ's 127.0.0.1:9876 unless told otherwise or taken."""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
from pathlib import Path

import pytest

from client.aio.core import ClientCore
from client.aio.routes import DEFAULT_NAMESRV, default_namesrv
from client.cli_cluster import client_kwargs
from protocol.tls import ClientTls, resolve_tls
from raftmq import cluster_cmd


def test_default_namesrv_is_the_environment_then_rocketmqs_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAFTMQ_NAMESRV", raising=False)
    assert default_namesrv() == ["127.0.0.1:9876"] == [DEFAULT_NAMESRV]
    monkeypatch.setenv("RAFTMQ_NAMESRV", " 10.0.0.1:9876, 10.0.0.2:9876 ,")
    assert default_namesrv() == ["10.0.0.1:9876", "10.0.0.2:9876"]


def test_a_client_given_nothing_asks_the_default_name_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAFTMQ_NAMESRV", "127.0.0.1:1234")

    async def main() -> None:
        given_nothing, given_servers = ClientCore(), ClientCore(servers=["a:1"])
        try:
            assert given_nothing.routes._namesrv == ["127.0.0.1:1234"]
            assert given_servers.routes._namesrv == []  # one group's servers: no name server
        finally:
            await given_nothing.close()
            await given_servers.close()

    asyncio.run(main())


def _args(**kw: object) -> argparse.Namespace:
    return argparse.Namespace(**{"servers": None, "namesrv": None, "dir": None, **kw})


def test_cliclient_kwargs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAFTMQ_NAMESRV", raising=False)
    # tls None: the environment decides; False: the cluster.json found names no TLS
    assert client_kwargs(_args()) == {"namesrv": ["127.0.0.1:9876"], "tls": None}
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "cluster.json").write_text(json.dumps({"namesrv": {"address": "127.0.0.1:2000"}}))
    assert client_kwargs(_args()) == {"namesrv": ["127.0.0.1:2000"], "tls": False}  # scripts/run
    monkeypatch.setenv("RAFTMQ_NAMESRV", "127.0.0.1:3000")
    assert client_kwargs(_args()) == {"namesrv": ["127.0.0.1:3000"], "tls": None}
    assert client_kwargs(_args(dir="run")) == {"namesrv": ["127.0.0.1:2000"], "tls": False}
    assert client_kwargs(_args(namesrv=["h:1"])) == {"namesrv": ["h:1"], "tls": None}
    with pytest.raises(SystemExit, match=r"no cluster\.json under nowhere"):
        client_kwargs(_args(dir="nowhere"))


def test_cli_tls_from_flags_else_the_cluster_json_else_the_environment(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAFTMQ_NAMESRV", raising=False)
    (tmp_path / "run").mkdir()
    tls = {"ca_file": "/c/ca.pem", "cert_file": "/c/client.pem", "key_file": "/c/client.key"}
    (tmp_path / "run" / "cluster.json").write_text(json.dumps({"namesrv": {"address": "127.0.0.1:2000"},
                                                              "tls": tls}))
    from_state = ClientTls("/c/ca.pem", "/c/client.pem", "/c/client.key")
    assert client_kwargs(_args())["tls"] == from_state
    assert client_kwargs(_args(dir="run"))["tls"] == from_state
    assert client_kwargs(_args(dir="run", ca_file="/other.pem"))["tls"] == ClientTls("/other.pem")
    assert client_kwargs(_args(namesrv=["h:1"], tls=True))["tls"] == ClientTls()
    monkeypatch.setenv("RAFTMQ_CA_FILE", "/env/ca.pem")
    assert resolve_tls(client_kwargs(_args(namesrv=["h:1"]))["tls"]) == ClientTls("/env/ca.pem")
    assert resolve_tls(client_kwargs(_args(dir="run"))["tls"]) == from_state  # the cluster's own CA wins


@pytest.mark.sockets
def test_cluster_up_takes_the_wanted_port_when_free_else_says_which(
        capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        chosen = cluster_cmd.choose_namesrv_port(taken)
        assert chosen != taken
        assert f"127.0.0.1:{taken} is taken" in capsys.readouterr().err
    assert cluster_cmd.choose_namesrv_port(chosen) == chosen  # free now: taken as asked
    assert cluster_cmd.choose_namesrv_port(0) not in (0, 9876)
    assert capsys.readouterr().err == ""


def test_the_suite_never_asks_for_9876() -> None:
    assert cluster_cmd.default_namesrv_port() == 0  # tests/conftest.py
