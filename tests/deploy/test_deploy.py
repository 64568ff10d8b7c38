"""docs/DEPLOY.md followed word for word on five hosts and a client, in network namespaces.

The hosts (``tests/deploy/hosts.py``): brokers n1-n3 at .11-.13 (n4, n5 at .14-.15 when the
group grows), name servers at .21-.22, the client at .31, on a private /24 (10.77.0.0/24)
made by the test; the docs' ``10.0.0.x`` are read as ``10.77.0.x``. Namespaces share the
file system, so each host has its own root directory and the absolute paths of the deploy
files and units are that host's: ``/etc/raftmq`` and ``/var/lib/raftmq`` -> ``HOSTROOT/etc/raftmq``,
``HOSTROOT/var/lib/raftmq``; ``/opt/raftmq`` -> this repository (its ``.venv`` is the install).
Nothing else in the copied files is changed. Each process is its unit's ``ExecStart`` line from
``deploy/*.service`` (no systemd), run with ``ip netns exec`` as the unit's ``User=`` (a uid of
its own: ``raftmq`` if the machine has that user).

The tests run in file order on one deployment (``conftest.deployed``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.deploy.deployment import NAMESRVS, Deployment
from tests.support.procs import wait_until

pytestmark = [pytest.mark.deploy, pytest.mark.slow]

BROKER_PORT = 10911
RAFT_PORT = 20911
NAMESRV_PORT = 9876


def test_the_group_forms_as_documented_and_serves_status_over_tls(deployed: Deployment) -> None:
    t0 = time.monotonic()
    deployed.form()
    leader = deployed.leader(["n1", "n2", "n3"], timeout=40)
    statuses = {n: deployed.status(n) for n in ("n1", "n2", "n3")}
    for status in statuses.values():
        assert status is not None
        assert status["storage"].startswith("f-"), status
        assert status.get("voter", True), status
    assert statuses[leader]["role"] == "leader"
    for ns in NAMESRVS.values():  # step 9's second check: every replica registered with each
        def registered(ns: int = ns) -> dict[str, object] | None:
            done = deployed.curl(f"https://{deployed.net.subnet}.{ns}:{NAMESRV_PORT}/cluster")
            body = json.loads(done.stdout) if done.returncode == 0 and done.stdout else None
            text = json.dumps(body)
            return body if body and all(f'"{n}"' in text for n in ("n1", "n2", "n3")) else None
        wait_until(registered, 40, 0.5, f"the three replicas registered with name server .{ns}")
    print(f"formed in {time.monotonic() - t0:.1f}s, leader {leader}")
    check_listeners(deployed, all_up=True)
    for name, proc in deployed.services.items():  # the units' User=raftmq
        status = Path(f"/proc/{proc.pid}/status").read_text().splitlines()
        uid = next(line.split()[1] for line in status if line.startswith("Uid:"))
        assert int(uid) == deployed.user.uid, (name, uid)


def check_listeners(deployed: Deployment, all_up: bool = False) -> None:
    """Nothing listens off loopback but a broker's TLS+ACL client port and its Raft port
    (the cluster secret) and a name server's TLS port; the broker and name server ports are
    probed: https with the CA answers, plain http does not, ``/admin`` without a token is 401."""
    deployed.sample_listeners()
    subnet = deployed.net.subnet
    expected = {}
    for name, host in deployed.net.hosts.items():
        if name.startswith("n") and name[1:].isdigit():
            expected[(name, host.ip, BROKER_PORT)] = "broker"
            expected[(name, host.ip, RAFT_PORT)] = "raft"
        elif name.startswith("namesrv"):
            expected[(name, host.ip, NAMESRV_PORT)] = "namesrv"
    loopback = ("127.", "::1")
    off = {k for k in deployed.seen_listeners if not k[1].startswith(loopback)}
    unexpected = sorted(k for k in off if k not in expected)
    assert not unexpected, f"listening off loopback and not a protected port: {unexpected}"
    assert all(k[1].startswith(f"{subnet}.") for k in off), off
    assert not all_up or set(expected) <= off, f"not listening: {set(expected) - off}"
    for (name, ip, port), kind in expected.items():
        if (name, ip, port) not in off:
            continue
        if kind == "raft":
            assert "secret_file" in deployed.net.hosts[name].path("/etc/raftmq/broker.toml").read_text()
            continue
        ok = deployed.curl(f"https://{ip}:{port}/healthz" if kind == "broker" else f"https://{ip}:{port}/cluster")
        assert ok.returncode == 0, (name, port, ok.stderr)
        plain = deployed.curl(f"http://{ip}:{port}/status")
        assert plain.returncode != 0 or not plain.stdout, f"{name}:{port} answers plain http"
        if kind == "broker":
            admin = deployed.curl(f"https://{ip}:{port}/admin/topics", "-o", "/dev/null",
                                  "-w", "%{http_code}")
            assert admin.stdout == "401", f"{name}: /admin/topics without a token -> {admin.stdout}"


def test_the_super_user_adds_users_and_grants_and_a_normal_user_sends_and_consumes_in_order(
        deployed: Deployment) -> None:
    """docs/SECURITY.md "Setting up users on the 3-host deploy" from the client host: the
    bootstrap super user (``RAFTMQ_CREDENTIALS_FILE``) creates the topic (docs/DEPLOY.md
    "Create a topic"), users ``billing`` and ``shipper`` and the docs' grants; ``shipper``
    sends ordered messages and ``billing`` consumes them (history verifier: none lost or
    duplicated, order held per key)."""
    t0 = time.monotonic()
    subnet = deployed.net.subnet
    deployed.cli("topic", "create", "orders", "--queues", "8", "--namesrv", f"{subnet}.21:9876")
    for user in ("billing", "shipper"):
        out = deployed.cli("user", "add", user, env={"RAFTMQ_NEW_PASSWORD": f"{user}-password"}).stdout
        assert f"user {user} added" in out, out
        deployed.client_file(f"/root/{user}.credentials", f"{user}\n{user}-password\n")
    deployed.cli("acl", "grant", "billing", "topic:orders", "sub,get")
    deployed.cli("acl", "grant", "billing", "group:billing", "sub")
    # the docs' "--source 10.0.1.0/24" is the shippers' network: here the client's /24
    deployed.cli("acl", "grant", "shipper", "topic:orders", "pub", "--source", f"{subnet}.0/24")
    listed = deployed.cli("acl", "list").stdout
    assert "billing" in listed and "shipper" in listed, listed
    result = deployed.ordered_load(min_acked=300)
    assert_history(result)
    assert result["figures"]["acked"] >= 300 and result["send_errors"] == 0, result
    print(f"users, grants, {result['figures']['acked']} ordered sends consumed in "
          f"{time.monotonic() - t0:.1f}s")


def assert_history(result: dict[str, object]) -> None:
    figures = result["figures"]
    assert isinstance(figures, dict)
    assert not result["problems"], result
    assert figures["lost"] == 0 and figures["duplicated"] == 0 and figures["out_of_order"] == 0, result
