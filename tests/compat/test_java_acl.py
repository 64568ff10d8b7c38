"""RocketMQ's AK/SK with ACLs on (issue 27, build item 5): the stock Java client 4.9.7 with
``AclClientRPCHook(AK, SK)`` against a 3-node RaftMQ group whose ACLs are on. The super user
adds alice, grants her pub and sub on one topic (and her groups), and gives her an access
key with ``raftmq user access-key create`` (the secret key printed once); the harness's
``acl`` scenario sends and consumes on her topic and is refused NO_PERMISSION on another;
once the key is revoked the same client is refused everything.

Not collected against the reference RocketMQ (it runs without ACLs: conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from client import Admin
from raftmq.local_acl import local_credentials
from tests.compat.checks import first_deliveries
from tests.compat.harness import JavaRun, run_scenario
from tests.compat.targets import Target, raftmq_target

pytestmark = [pytest.mark.cluster, pytest.mark.compat]

NO_PERMISSION = 16  # RocketMQ's ResponseCode.NO_PERMISSION


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory, harness_built: str) -> Iterator[Target]:
    """A fresh RaftMQ group with ACLs on (this module's, in place of conftest's)."""
    yield from raftmq_target(tmp_path_factory.mktemp("compat-acl"), acl=True)


def _raftmq(base: Path, *argv: str) -> str:
    """``raftmq ARGV`` as the local super user (credentials from its 0600 file, never argv)."""
    env = {**os.environ, "RAFTMQ_CREDENTIALS_FILE": str(base / "admin.credentials")}
    done = subprocess.run([sys.executable, "-m", "raftmq", *argv], capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    assert done.returncode == 0, (argv, done.stdout, done.stderr)
    return done.stdout


def _acl_run(target: Target, topic: str, denied: str, suffix: str, keys: dict[str, str],
             name: str) -> JavaRun:
    return run_scenario("acl", target.namesrv, log_dir=target.logs / f"acl-{name}-{suffix}", timeout_s=90,
                        env={"RAFTMQ_COMPAT_ACCESS_KEY": keys["access_key"],
                             "RAFTMQ_COMPAT_SECRET_KEY": keys["secret_key"]},
                        topic=topic, group=f"cg-acl-{suffix}", run=suffix, deniedTopic=denied, count=10)


def test_a_signed_java_client_uses_its_users_topic_is_refused_another_and_revoked(target: Target) -> None:
    target.require_frontend()
    base = target.logs.parent
    suffix = uuid.uuid4().hex[:8]
    topic, denied = f"compat-acl-ok-{suffix}", f"compat-acl-no-{suffix}"
    target.create_topic(topic, 4)
    target.create_topic(denied, 4)
    admin = Admin(target.namesrv, credentials=local_credentials(base))
    try:
        admin.put_user("alice", "alice-password-0123")
        admin.grant("alice", f"topic:{topic}", ["pub", "sub"])
        admin.grant("alice", f"group:cg-acl-{suffix}", ["sub"])  # her consumer group (and its %RETRY%)
        admin.grant("alice", f"group:pg-{suffix}", ["pub"])  # her producer group (its heartbeats)
    finally:
        admin.close()
    created = _raftmq(base, "user", "access-key", "create", "alice", "--json", "--namesrv", target.namesrv)
    keys = json.loads(created)
    assert keys["user"] == "alice" and keys["groups"] == ["g1"]

    run = _acl_run(target, topic, denied, suffix, keys, "signed")
    assert run.rc == 0, run.tail()
    sent = {e["key"] for e in run.of("sent")}
    assert sent == {f"acl-{i}" for i in range(10)}, run.tail()  # denied-0 was never stored
    assert sent <= set(first_deliveries(run)), run.tail()
    (refused,) = run.of("refused")
    assert refused["code"] == NO_PERMISSION, refused
    assert f"user 'alice' may not pub on topic:{denied}" in refused["message"], refused

    listed = _raftmq(base, "user", "access-key", "list", "--namesrv", target.namesrv)
    assert keys["access_key"] in listed and keys["secret_key"] not in listed
    _raftmq(base, "user", "access-key", "revoke", keys["access_key"], "--namesrv", target.namesrv)
    after = _acl_run(target, topic, denied, suffix, keys, "revoked")
    assert after.rc == 1, after.tail()  # the first send fails: no sent event, an error naming why
    (error,) = after.of("error")
    assert not after.of("sent") and "unknown or revoked" in error["causes"], after.tail()
