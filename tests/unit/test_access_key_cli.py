"""``raftmq user access-key create|list|revoke`` against a one-node broker served in process
with ACLs on and a cluster secret: the pair is printed once, listed without its secret,
refused to a user who is not a super user, and revoked."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.state.machine import BrokerStateMachine
from broker.store.commands import PutUser
from client import Admin, Credentials
from client.credentials import scram_record
from client.errors import AuthFailedError
from dledger.applier import Applier
from dledger.local_log import LocalLog
from raftmq.cli import main
from tests.support.one_node import one_node_group
from tests.support.procs import wait_until

pytestmark = pytest.mark.sockets  # a broker served on 127.0.0.1

ADMIN = Credentials("root", "root-secret")
SECRET = "the-cluster-secret-of-g1-0123456789"
_ROOT = scram_record(ADMIN.password)
BROKER_OPTIONS = {"acl": True, "acl_bootstrap": PutUser("root", True, _ROOT.salt, _ROOT.iterations,
                                                          _ROOT.stored_key, _ROOT.server_key)}


@pytest.fixture
def one_node_broker(tmp_path: Path) -> Iterator[tuple[LocalLog, BrokerStateMachine, Applier]]:
    """The conftest's, with a cluster secret: access keys are sealed with it."""
    with one_node_group(tmp_path, SECRET) as group:
        yield group


def _ready(broker: str) -> None:
    def listed() -> bool:
        admin = Admin(servers=[broker], credentials=ADMIN)
        try:
            admin.topics()
            return True
        except AuthFailedError:
            return False
        finally:
            admin.close()
    wait_until(listed, 10, what="the bootstrap super user to be added")


def _raftmq(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], who: Credentials,
            *argv: str) -> tuple[int, str]:
    monkeypatch.setenv("RAFTMQ_USER", who.user)
    monkeypatch.setenv("RAFTMQ_PASSWORD", who.password)
    code = main(list(argv))
    return code, capsys.readouterr().out


def test_access_keys_are_created_shown_once_listed_without_secrets_and_revoked(
        broker: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _ready(broker)
    where = ("--servers", broker)
    monkeypatch.setenv("RAFTMQ_NEW_PASSWORD", "alice-password")
    code, _ = _raftmq(monkeypatch, capsys, ADMIN, "user", "add", "alice", *where)
    assert code == 0
    code, out = _raftmq(monkeypatch, capsys, ADMIN, "user", "access-key", "create", "alice", "--json", *where)
    assert code == 0
    made = json.loads(out)
    assert made["user"] == "alice" and len(made["secret_key"]) >= 40 and made["access_key"].startswith("RMQ")
    code, out = _raftmq(monkeypatch, capsys, ADMIN, "user", "access-key", "list", *where)
    assert code == 0 and made["access_key"] in out and "alice" in out and made["secret_key"] not in out
    alice = Credentials("alice", "alice-password")
    code, _ = _raftmq(monkeypatch, capsys, alice, "user", "access-key", "create", "alice", *where)
    assert code != 0  # only super users give keys
    revoke = ("user", "access-key", "revoke", made["access_key"])
    code, out = _raftmq(monkeypatch, capsys, ADMIN, *revoke, *where)
    assert code == 0 and "revoked" in out
    code, out = _raftmq(monkeypatch, capsys, ADMIN, "user", "access-key", "list", "--json", *where)
    assert code == 0 and out.strip() == ""
