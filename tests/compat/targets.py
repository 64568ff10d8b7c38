"""The targets of tests/compat: what the real RocketMQ clients talk to.

By default a real RaftMQ cluster -- a name server and one 3-node broker group on
127.0.0.1, stopped by PID after the module -- reached by the clients through its RocketMQ
front end (issue 27). With ``COMPAT_TARGET=reference`` the same tests run against the REAL
Apache RocketMQ 4.9.7 started by ``scripts/reference-rocketmq start`` (name server
``COMPAT_REFERENCE_NAMESRV``, default 127.0.0.1:19876): that is how every scenario and
assertion is validated before RaftMQ is blamed for a failure. ``raftmq_xfail`` marks what
RaftMQ does not pass yet; it marks nothing against the reference.
"""

from __future__ import annotations

import json
import os
import re
import socket
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.compat.harness import mqadmin

TARGET = os.environ.get("COMPAT_TARGET", "raftmq")
REFERENCE_NAMESRV = os.environ.get("COMPAT_REFERENCE_NAMESRV", "127.0.0.1:19876")
REFERENCE_CLUSTER = "ReferenceCluster"

# [broker] settings a RaftMQ broker needs to serve RocketMQ clients (none while the front
# end listens by default).
ROCKETMQ_BROKER_SETTINGS: dict[str, Any] = {}

F = TypeVar("F", bound=Callable[..., Any])


def raftmq_xfail(reason: str) -> Callable[[F], F]:
    """``xfail(strict=True, reason="issue 27: ...")`` against RaftMQ; nothing against the
    reference, which must pass every scenario."""
    if TARGET != "raftmq":
        return lambda f: f
    return pytest.mark.xfail(strict=True, reason=f"issue 27: {reason}")  # type: ignore[return-value]


@dataclass
class Target:
    """What a compat test talks to."""

    kind: str  # "raftmq" | "reference"
    namesrv: str
    cluster: str  # the cluster name mqadmin shows
    broker_names: list[str]  # RocketMQ broker names (one per RaftMQ group)
    replicas: int  # brokers per broker name (BID 0 and slaves)
    logs: Path
    create_topic: Callable[[str, int], None]
    frontend_error: str | None  # why the RocketMQ protocol is not answered, None if it is
    group: Any = None  # the RaftMQ LocalGroup (None for the reference)

    def require_frontend(self) -> None:
        """Fails the test at once (no client started) when the name server does not answer
        RocketMQ's protocol: a scenario would only wait for its deadline."""
        assert self.frontend_error is None, (
            f"no RocketMQ name server at {self.namesrv}: {self.frontend_error}"
        )


def probe_rocketmq(addr: str, timeout_s: float = 5.0) -> str | None:
    """Sends GET_BROKER_CLUSTER_INFO (106) as a JSON remoting frame; None when a response
    frame with the request's opaque comes back, else what went wrong."""
    return _cluster_info(addr, timeout_s)[0]


_MASTER = re.compile(rb'"brokerAddrs"\s*:\s*\{(?:[^}]*?,)?\s*"?0"?\s*:')


def names_a_master(addr: str) -> bool:
    """Whether the name server's cluster info names a master (brokerId 0): what a RocketMQ
    client needs before it can send; a group just started may name only slaves until its
    leader has registered."""
    error, body = _cluster_info(addr, 5.0)
    return error is None and _MASTER.search(body) is not None


def _cluster_info(addr: str, timeout_s: float) -> tuple[str | None, bytes]:
    """(what went wrong or None, the answer's body) of GET_BROKER_CLUSTER_INFO."""
    header = json.dumps({"code": 106, "flag": 0, "language": "JAVA", "opaque": 7,
                         "serializeTypeCurrentRPC": "JSON", "version": 407}).encode()
    frame = struct.pack(">II", 4 + len(header), len(header)) + header
    host, port = addr.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as s:
            s.sendall(frame)
            buf = b""
            while len(buf) < 8:
                chunk = s.recv(65536)
                if not chunk:
                    return f"connection closed after {buf!r}", b""
                buf += chunk
            (length, mark) = struct.unpack_from(">II", buf, 0)
            if length > 16 << 20 or (mark >> 24) not in (0, 1):
                return f"answered what is no remoting frame: {buf[:40]!r}", b""
            while len(buf) < 4 + length:
                chunk = s.recv(65536)
                if not chunk:
                    return "connection closed mid-frame", b""
                buf += chunk
    except OSError as e:
        return f"{type(e).__name__}: {e}", b""
    hlen = mark & 0xFFFFFF
    if mark >> 24 == 0:
        h = json.loads(buf[8 : 8 + hlen])
        opaque, flag = h.get("opaque"), h.get("flag", 0)
    else:
        _code, _lang, _ver, opaque, flag = struct.unpack_from(">hBhii", buf, 8)
    if opaque != 7 or not flag & 1:
        return f"answer is not the response to the probe (opaque={opaque}, flag={flag})", b""
    return None, bytes(buf[8 + hlen : 4 + length])


def reference_target(logs: Path) -> Iterator[Target]:
    def create(topic: str, queues: int) -> None:
        command = ["updateTopic", "-c", REFERENCE_CLUSTER, "-t", topic, "-r", str(queues), "-w", str(queues)]
        run = mqadmin(command, REFERENCE_NAMESRV, log_dir=logs)
        assert run.rc == 0, run.tail()

    yield Target("reference", REFERENCE_NAMESRV, REFERENCE_CLUSTER, ["reference-broker-a"], 1, logs, create,
                 probe_rocketmq(REFERENCE_NAMESRV))


def raftmq_target(base: Path, *, acl: bool = False) -> Iterator[Target]:
    """A fresh 3-node group g1 and its name server; ``acl``: ACLs on, the super user
    ``admin`` bootstrapped (its credentials in ``base/admin.credentials``: raftmq.local_acl),
    topics created as it."""
    from raftmq.local_acl import acl_broker_options, local_credentials, wait_for_super_user
    from raftmq.local_group import LocalGroup
    from raftmq.local_namesrv import configure_namesrv, namesrv_argv
    from tests.support.procs import ManagedProcess, free_ports, wait_until

    (port,) = free_ports(1)
    ns = f"127.0.0.1:{port}"
    group = LocalGroup(base / "g1", 3, module="broker", group="g1",
                       broker={"namesrv": [ns], "index_slots": 4096, "index_entries": 65536,
                               **ROCKETMQ_BROKER_SETTINGS, **(acl_broker_options(base) if acl else {})})
    namesrv = ManagedProcess(namesrv_argv(configure_namesrv(base, ns, [group])), base / "namesrv.log")
    try:
        group.start()
        group.wait_leader(timeout=60)
        wait_until(lambda: _listening(ns), 30, what="the name server")
        wait_until(lambda: names_a_master(ns), 30, what="the name server naming g1's leader as master")
        if acl:
            wait_for_super_user(ns, base)
        credentials = local_credentials(base) if acl else None
        # one RocketMQ broker per RaftMQ group, named as the group, in cluster DefaultCluster
        def create(topic: str, queues: int) -> None:
            # a connection to a replica can still drop just after the group formed
            from client.errors import ClientError
            from tests.support.broker_group import servers

            def made() -> bool:
                try:
                    create_topic_as(servers(group), topic, queues, credentials)
                    return True
                except ClientError:
                    return False
            wait_until(made, 30, interval=0.5, what=f"topic {topic} created")
        yield Target("raftmq", ns, "DefaultCluster", ["g1"], 3, base / "java", create,
                     probe_rocketmq(ns), group)
    finally:
        group.stop()
        namesrv.stop()


def create_topic_as(servers: list[str], topic: str, queues: int, credentials: Any) -> None:
    """``topic`` created through an Admin on ``servers`` as ``credentials`` (None: anonymous)."""
    from client import Admin

    admin = Admin(servers=servers, credentials=credentials)
    try:
        admin.create_topic(topic, queues=queues)
    finally:
        admin.close()


def _listening(addr: str) -> bool:
    host, port = addr.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False
