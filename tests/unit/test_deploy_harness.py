"""The deploy test's harness (tests/deploy), without root: a failing set-up leaves no
namespace and no process behind; ``raftmq cluster status`` is read as its printer writes
it; the commands docs/DEPLOY.md and docs/SECURITY.md give, which the deploy test runs as
written, are there once each."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import socket
import subprocess
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from broker.store.commands import PutUser
from client.aio.connection import ConnectionPool
from client.credentials import Credentials, scram_record
from client.errors import BrokerError
from protocol.acl import PutUserRequest
from raftmq import cluster_cmd
from tests.deploy import deployment as deployment_module
from tests.deploy import hosts, port_probes
from tests.deploy.docs_commands import bash_lines, documented, exported
from tests.deploy.hosts import Network, ServiceUser
from tests.support.inprocess_broker import serving_broker


class FakeIp:
    """``ip`` as the harness calls it: namespaces kept in a set; ``fails(args)`` True raises
    as ``hosts._ip`` does for a failed command."""

    def __init__(self, fails: Callable[[tuple[str, ...]], bool]) -> None:
        self.namespaces: set[str] = set()
        self.fails = fails

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        if self.fails(args):
            if check:
                raise RuntimeError(f"ip {' '.join(args)}: RTNETLINK answers: Operation not permitted")
            return subprocess.CompletedProcess(["ip", *args], 2, "", "failed")
        if args[:2] == ("netns", "add"):
            self.namespaces.add(args[2])
        elif args[:2] == ("netns", "delete"):
            self.namespaces.discard(args[2])
        return subprocess.CompletedProcess(["ip", *args], 0, "", "")


@pytest.fixture
def anchors(monkeypatch: pytest.MonkeyPatch) -> list[subprocess.Popen[bytes]]:
    """Each host's anchor a real ``sleep`` (so the test sees it stopped), none in a namespace."""
    started: list[subprocess.Popen[bytes]] = []

    def anchor(ns: str) -> subprocess.Popen[bytes]:
        started.append(subprocess.Popen(["sleep", "60"], stdin=subprocess.DEVNULL))
        return started[-1]
    monkeypatch.setattr(hosts, "_anchor", anchor)
    yield started
    for proc in started:  # a failing test must not leave them either
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def test_a_bridge_that_cannot_be_made_leaves_no_namespace(monkeypatch: pytest.MonkeyPatch,
                                                           tmp_path: Path) -> None:
    fake = FakeIp(lambda args: args[-4:] == ("add", "br0", "type", "bridge"))
    monkeypatch.setattr(hosts, "_ip", fake)
    with pytest.raises(RuntimeError, match="br0"):
        Network(tmp_path / "hosts", tmp_path / "logs")
    assert not fake.namespaces


@pytest.mark.parametrize(("what", "anchored"), [("br0", 0), ("p22", 2)])
def test_a_set_up_that_fails_leaves_no_namespace_no_process_and_no_directory(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, anchors: list[subprocess.Popen[bytes]],
        what: str, anchored: int) -> None:
    """As the deploy fixture sets up: the bridge fails, or name server 2's veth fails after
    the switch, the client and name server 1 were made (their anchors started)."""
    made: list[Sequence[str]] = []

    def fails(args: tuple[str, ...]) -> bool:
        made.append(args)
        return "add" in args and what in args
    fake = FakeIp(fails)
    monkeypatch.setattr(hosts, "_ip", fake)
    work = tmp_path / "work"
    (work / "operator").mkdir(parents=True)
    hosts_of_run = deployment_module.deployment_hosts(work, tmp_path / "logs", work / "operator",
                                                      ServiceUser(1, 1))
    with pytest.raises(RuntimeError, match=what), hosts_of_run:
        pytest.fail("the set-up should have failed")
    assert any(a[:2] == ("netns", "add") for a in made)  # something was made
    assert not fake.namespaces, fake.namespaces
    assert len(anchors) == anchored and all(p.poll() is not None for p in anchors)
    assert not work.exists()


def test_cluster_status_is_read_as_its_printer_writes_it(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    statuses: dict[str, dict[str, Any] | None] = {
        "10.0.0.11:10911": {"role": "leader", "term": 7, "commit_index": 120, "applied_index": 120,
                            "first_index": 1, "disk": {}, "healthy": True},
        "10.0.0.12:10911": {"role": "follower", "term": 7, "commit_index": 118, "applied_index": 117,
                            "first_index": 1, "snapshot_index": 90, "disk": {}, "healthy": False,
                            "apply_stalled": "apply stalled"},
        "10.0.0.13:10911": None,
    }
    monkeypatch.setattr(cluster_cmd, "find_replicas", lambda args: {"g1": {
        "n1": "10.0.0.11:10911", "n2": "10.0.0.12:10911", "n3": "10.0.0.13:10911"}})
    monkeypatch.setattr(cluster_cmd.ClusterHttp, "of", staticmethod(lambda args: None))
    monkeypatch.setattr(cluster_cmd, "_replica_status", lambda http, address: statuses[address])
    assert cluster_cmd._status(argparse.Namespace(namesrv="10.0.0.21:9876")) == 0
    rows = deployment_module.parse_cluster_status(capsys.readouterr().out)
    assert rows["n1"] == {"group": "g1", "address": "10.0.0.11:10911", "role": "leader", "term": "7",
                          "commit": "120", "applied": "120", "health": "ok"}
    assert rows["n2"]["applied"] == "117" and rows["n2"]["health"] == "UNHEALTHY: apply stalled"
    assert rows["n3"] == {"group": "g1", "address": "10.0.0.13:10911", "role": "DOWN"}


def test_the_commands_the_deploy_test_runs_as_written_are_documented_once() -> None:
    key = documented("DEPLOY.md", " namesrv-key --config ")
    assert key.startswith("( umask 077; sudo -u raftmq /opt/raftmq/.venv/bin/raftmq namesrv-key"), key
    assert key.endswith("> g1.namesrv-key )"), key
    assert documented("DEPLOY.md", " replica init --config ").startswith(
        "sudo -u raftmq /opt/raftmq/.venv/bin/raftmq replica init")
    assert exported("DEPLOY.md", "RAFTMQ_NAMESRV") == "10.0.0.21:9876,10.0.0.22:9876"
    assert exported("DEPLOY.md", "RAFTMQ_CA_FILE") == "/etc/raftmq/tls/ca.pem"
    assert exported("DEPLOY.md", "PATH") == "/opt/raftmq/.venv/bin:$PATH"
    for needle in ("raftmq user add billing", "raftmq user add shipper", "acl grant billing topic:orders",
                   "acl grant billing group:billing", "acl grant shipper topic:orders", "raftmq acl list"):
        documented("SECURITY.md", needle)
    assert exported("SECURITY.md", "RAFTMQ_NAMESRV") == exported("DEPLOY.md", "RAFTMQ_NAMESRV")
    # a continued line is one command
    lines = bash_lines("SECURITY.md")
    assert any(line.startswith("openssl req -x509 ") and "-addext" in line for line in lines)


def test_every_systemctl_line_names_a_unit_of_deploy() -> None:
    units = {p.stem for p in (hosts.REPO / "deploy").glob("*.service")}
    for doc in ("DEPLOY.md", "SECURITY.md"):
        text = (hosts.REPO / "docs" / doc).read_text()
        named = re.findall(r"systemctl (?:enable --now|restart|start|stop) ([\w-]+)", text)
        assert named and set(named) <= units, (doc, named, units)


@pytest.mark.sockets
@pytest.mark.parametrize(("answer", "received", "ended"), [(b"", 0, "eof"), (b"pickle", 6, "eof")])
def test_the_raft_probe_sees_what_the_port_sends_before_it_closes(answer: bytes, received: int,
                                                                  ended: str) -> None:
    """``port_probes._raft`` counts any byte a port sends: a port that answered a stranger
    fails the deploy test's assertion (``received == 0``)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(10)  # accept never waits past it

        def serve() -> None:
            conn, _ = server.accept()
            with conn:
                conn.recv(1024)
                conn.sendall(answer)
        thread = threading.Thread(target=serve)
        thread.start()
        probe = port_probes._raft(f"127.0.0.1:{server.getsockname()[1]}", b"\x05\x00\x00\x00hello")
        thread.join(10)
    assert (probe["received"], probe["ended"]) == (received, ended), probe


@pytest.mark.sockets
def test_the_client_port_probe_tells_a_refusal_from_an_acceptance(tmp_path: Path) -> None:
    """``port_probes._brokers`` against a broker with ACLs on (in this process, plain ws):
    unauthenticated AUTH_FAILED, a user without ``pub`` NO_PERMISSION naming it -- and a
    super user's send SUCCESS, which the deploy test's assertions would refuse."""
    root = scram_record("root-password")
    bootstrap = PutUser("root", True, root.salt, root.iterations, root.stored_key, root.server_key)
    (tmp_path / "root.credentials").write_text("root\nroot-password\n")
    (tmp_path / "billing.credentials").write_text("billing\nbilling-password\n")

    async def probe() -> tuple[dict[str, Any], dict[str, Any]]:
        async with serving_broker(tmp_path, acl=True, acl_bootstrap=bootstrap) as (_, address):
            billing = scram_record("billing-password")
            put = PutUserRequest(user="billing", super=False, salt=billing.salt,
                                 iterations=billing.iterations, stored_key=billing.stored_key,
                                 server_key=billing.server_key)
            deadline = asyncio.get_running_loop().time() + 10
            while True:  # the bootstrap super user is proposed within a second
                pool = ConnectionPool(credentials=Credentials("root", "root-password"))
                try:
                    await pool.request(address, put)
                    break
                except BrokerError:
                    assert asyncio.get_running_loop().time() < deadline, "no bootstrap super user in 10 s"
                    await asyncio.sleep(0.1)
                finally:
                    await pool.close()
            refused = await port_probes._brokers([address], str(tmp_path / "billing.credentials"), None)
            accepted = await port_probes._brokers([address], str(tmp_path / "root.credentials"), None)
            return refused[address], accepted[address]

    refused, accepted = asyncio.run(probe())
    assert refused["anonymous"]["code"] == "AUTH_FAILED", refused
    assert "authentication required" in refused["anonymous"]["remark"], refused
    assert refused["ungranted"]["code"] == "NO_PERMISSION", refused
    assert "user 'billing' may not pub on topic:orders" in refused["ungranted"]["remark"], refused
    granted = accepted["ungranted"]  # root: may pub anywhere
    assert "login_refused" not in granted and granted["code"] != "NO_PERMISSION", accepted


def test_typing_at_a_program_that_cannot_start_fails_in_the_parent_only(tmp_path: Path) -> None:
    """``typed_twice``'s forked child execs at once; an exec that fails must end the child
    (exit 127), not raise in it -- a raising child ran the rest of pytest's session in the
    fork, whose teardown deleted the deploy run's namespaces under the parent."""
    parent = os.getpid()
    with pytest.raises(AssertionError, match=r"no-such-program.* exited 127"):
        deployment_module.typed_twice([str(tmp_path / "no-such-program")], "pw", tmp_path, timeout=10)
    assert os.getpid() == parent
