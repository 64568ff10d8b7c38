"""TLS on every client-facing port, against real processes (issue 15, build items 1 and 8).

A local cluster started with ``raftmq cluster up --tls`` (a name server and three brokers
serving https and wss with certificates of a local CA; the brokers register with the name
server over https) serves clients given its CA and refuses the others: no CA, another CA,
plain ws:// and http://. Under ``--mutual-tls`` a client must also present a certificate of
that CA, and the replicas present theirs to each other (a replica added through the
membership catch-up check) and to the name server. A broker or name server bound to
0.0.0.0 refuses to start without its protections, and starts with ``--insecure`` saying so
(connected to only through 127.0.0.1); with TLS and ACLs it starts and enforces both. A
cluster up with ``--tls --acl`` serves the client and operator commands a user from the
environment, over TLS. Every process is stopped by PID.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.security.registration_auth import registration_key
from client import Admin, ClientTls, Message, Producer, PullConsumer
from client.errors import AuthFailedError, ClientError, TlsError
from raftmq.cluster_http import ClusterHttp
from raftmq.local_acl import acl_broker_options, local_credentials
from raftmq.local_group import LocalGroup
from raftmq.local_tls import LocalCA
from tests.security.namesrv_cluster import Cluster, http_json, local_cluster, raftmq
from tests.support.procs import ProcessGroup, free_ports, wait_until

pytestmark = [pytest.mark.cluster]


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with local_cluster(tmp_path_factory.mktemp("tls") / "c", "--tls") as c:
        made = raftmq("topic", "create", "orders", "--queues", "2", "--dir", str(c.root))
        assert made.returncode == 0, made.stderr
        yield c


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> LocalCA:
    """A CA the clusters do not trust, with its own client certificate."""
    return LocalCA(tmp_path_factory.mktemp("other-ca")).ensure()


def ca_of(c: Cluster, with_cert: bool = False) -> ClientTls:
    return LocalCA(c.root / "tls").client_tls(with_cert)


def a_broker(c: Cluster) -> str:
    return str(c.nodes()["n1"]["address"])


def refused_at_once(call: object, error: type[ClientError], match: str, client_timeout: float) -> ClientError:
    """``call()``, of a client whose timeout is ``client_timeout`` (at least 10 s), raises ``error``
    matching ``match`` before half of that timeout passed: the refusal is not retried until the
    timeout runs out (a bound below the client's own timeout, which a retried call would meet)."""
    assert client_timeout >= 10, "a short client timeout would end a retried call in time too"
    started = time.monotonic()
    with pytest.raises(error, match=match) as e:
        call()  # type: ignore[operator]
    took = time.monotonic() - started
    print(f"refused after {took:.2f}s ({error.__name__}; the client's timeout {client_timeout:g}s)")
    assert took < client_timeout / 2, \
        f"refused after {took:.1f}s of the client's {client_timeout:g}s timeout: retried until it ran out"
    return e.value


def topics_refused(broker: str, tls: ClientTls | bool, match: str, error: type[ClientError] = ClientError,
                   timeout: float = 20.0) -> None:
    """Listing topics at ``broker`` with ``tls`` fails at once (``refused_at_once``): ``error``
    matching ``match``."""
    admin = Admin(servers=[broker], tls=tls, timeout=timeout)
    try:
        refused_at_once(admin.topics, error, match, timeout)
    finally:
        admin.close()


def test_clients_with_the_ca_send_and_consume_through_the_name_server_over_https(
        tls_cluster: Cluster) -> None:
    c, tls = tls_cluster, ca_of(tls_cluster)
    registered = ClusterHttp.with_tls(tls).get(c.ns, "/cluster")  # the registrars reached it over https
    assert set(registered["g1"]) == {"n1", "n2", "n3"}, registered
    with Producer(namesrv=c.ns, group="tls-producer", tls=tls) as p:
        sent = [p.send(Message("orders", f"m{i}".encode()), shard_key="k") for i in range(20)]
    queue, first = sent[0].queue, sent[0].queue_offset
    consumer = PullConsumer(namesrv=c.ns, group="tls-reader", tls=tls)  # from a follower, over wss
    assert queue in consumer.queues("orders")  # the route, over https

    def all_read() -> list[bytes] | None:
        got = [m.body for m in consumer.pull(queue, first, max_msgs=32).messages]
        return got if len(got) == 20 else None

    try:
        assert wait_until(all_read, 20, what="the 20 messages on a follower") == [
            f"m{i}".encode() for i in range(20)]
    finally:
        consumer.shutdown()
    sent_by_cli = raftmq("send", "orders", "from the cli", "--dir", str(c.root))  # CA from cluster.json
    assert sent_by_cli.returncode == 0 and "SEND_OK" in sent_by_cli.stdout, sent_by_cli.stderr
    verified = raftmq("cluster", "verify", "--dir", str(c.root))
    assert verified.returncode == 0 and "verify: OK" in verified.stdout, verified.stdout + verified.stderr


def test_a_client_without_the_ca_cannot_connect(tls_cluster: Cluster) -> None:
    c = tls_cluster
    with Producer(namesrv=c.ns, tls=True, send_timeout=10) as p:  # the system's CAs only
        error = refused_at_once(lambda: p.send(Message("orders", b"x")), TlsError,
                                rf"name server {c.ns}: its certificate was refused \(.*VERIFY_FAILED", 10)
    assert not error.retriable
    topics_refused(a_broker(c), True, rf"broker {a_broker(c)}: its certificate was refused", TlsError, 10)
    with pytest.raises(OSError, match="CERTIFICATE_VERIFY_FAILED"):
        urllib.request.urlopen(f"https://{c.ns}/cluster", timeout=5)


def test_a_client_with_another_ca_is_refused(tls_cluster: Cluster, other_ca: LocalCA) -> None:
    c = tls_cluster
    with Producer(namesrv=c.ns, tls=other_ca.client_tls(), send_timeout=10) as p:
        refused_at_once(lambda: p.send(Message("orders", b"x")), TlsError, "certificate was refused", 10)
    topics_refused(a_broker(c), other_ca.client_tls(), "certificate was refused", TlsError, 10)


def test_plain_websocket_and_http_to_the_tls_ports_fail_saying_why(tls_cluster: Cluster) -> None:
    c = tls_cluster
    topics_refused(a_broker(c), False, r"Server disconnected \(does it serve TLS\? then give the client "
                                      r"tls= with its CA\)")
    with Producer(namesrv=c.ns, tls=False, send_timeout=3) as p, \
            pytest.raises(ClientError, match=rf"{c.ns}: Server disconnected \(does it serve TLS\?"):
        p.send(Message("orders", b"x"))
    for address in (c.ns, a_broker(c)):
        with pytest.raises(OSError):  # closed without an answer: nothing is served in clear
            urllib.request.urlopen(f"http://{address}/healthz", timeout=5)


def test_the_commands_against_a_cluster_with_tls_and_acls(tmp_path: Path) -> None:
    """``raftmq cluster up --tls --acl`` (what the deploy has): the client and operator
    commands find the CA through ``--dir`` and take the user from the environment only --
    the SCRAM logins and the admin tokens over TLS; without a user they are refused."""
    with local_cluster(tmp_path / "c", "--tls", "--acl") as c:
        where = ("--dir", str(c.root))
        anonymous = raftmq("topic", "create", "orders", *where, env={"RAFTMQ_CREDENTIALS_FILE": ""})
        assert anonymous.returncode != 0 and "authentication required" in anonymous.stderr, anonymous.stderr
        admin = {"RAFTMQ_CREDENTIALS_FILE": str(c.root / "admin.credentials")}
        for argv in (("topic", "create", "orders", "--queues", "2"), ("send", "orders", "over tls")):
            done = raftmq(*argv, *where, env=admin)
            assert done.returncode == 0, done.stdout + done.stderr
        members = raftmq("replica", "list", *where, env=admin)  # GET /admin/members with a token
        assert members.returncode == 0 and "(leader)" in members.stdout, members.stdout + members.stderr
        refused = raftmq("replica", "list", *where, "--timeout", "60", env={"RAFTMQ_CREDENTIALS_FILE": ""})
        assert refused.returncode == 1 and "authentication required" in refused.stderr, refused.stderr
        moved = raftmq("leader", "transfer", *where, env=admin)
        assert moved.returncode == 0 and "leader is now" in moved.stdout, moved.stdout + moved.stderr
        verified = raftmq("cluster", "verify", *where, env=admin)
        assert verified.returncode == 0 and "verify: OK" in verified.stdout, verified.stdout + verified.stderr


# -- mutual TLS ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mtls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with local_cluster(tmp_path_factory.mktemp("mtls") / "c", "--mutual-tls") as c:
        yield c


def test_mutual_tls_refuses_a_client_without_a_certificate_of_the_ca(mtls_cluster: Cluster,
                                                                     other_ca: LocalCA) -> None:
    c = mtls_cluster
    ca = str(c.root / "tls" / "ca.pem")
    strangers = {"no certificate": ClientTls(ca),
                 "another CA's certificate": ClientTls(ca, *map(str, (other_ca.dir / "client.pem",
                                                                       other_ca.dir / "client.key")))}
    for why, tls in strangers.items():
        topics_refused(a_broker(c), tls, "cannot connect to broker")
        with pytest.raises(OSError):
            ClusterHttp.with_tls(tls).get(c.ns, "/cluster")
        print(f"refused: {why}")
    topics_refused(a_broker(c), ClientTls(ca), r"does it require mutual TLS\? then give the client a "
                                               r"certificate in tls=")
    with_cert = ca_of(c, with_cert=True)
    admin = Admin(namesrv=c.ns, tls=with_cert, timeout=10)
    try:
        admin.create_topic("mtls", queues=1)
        assert "mtls" in admin.topics()
    finally:
        admin.close()
    registered = ClusterHttp.with_tls(with_cert).get(c.ns, "/cluster")  # brokers presented theirs
    assert set(registered["g1"]) == {"n1", "n2", "n3"}, registered


def test_a_replica_is_added_and_removed_with_every_call_over_mutual_tls(mtls_cluster: Cluster) -> None:
    """``raftmq replica add`` asks the leader, which checks the learner's catch-up at its
    ``/status`` (``broker.http_api.membership``): both calls present certificates."""
    c = mtls_cluster
    group = LocalGroup(c.root / "g1", 3, module="broker", group="g1", broker={"namesrv": [c.ns]},
                       log_level="WARNING", tls=LocalCA(c.root / "tls"), mutual_tls=True)
    n4 = group.add_node("n4", ["n1", "n2", "n3"])
    try:
        group.start_node("n4")
        wait_until(lambda: group.status("n4"), 60, what="n4's /status over mutual TLS")
        added = raftmq("replica", "add", "n4", "--raft", n4.raft, "--client", n4.http, "--dir", str(c.root),
                       "--timeout", "60")
        assert added.returncode == 0 and "n4 is a member" in added.stdout, added.stdout + added.stderr
        removed = raftmq("replica", "remove", "n4", "--dir", str(c.root), "--timeout", "60")
        assert removed.returncode == 0, removed.stdout + removed.stderr
    finally:
        group.terminate("n4")


# -- secure by default off loopback ------------------------------------------------------------
def _healthz(url: str, tls: ClientTls | None = None) -> bool:
    with urllib.request.urlopen(url, timeout=2, context=tls.context() if tls else None) as resp:
        return resp.status == 200


def test_a_broker_bound_to_all_interfaces_needs_tls_and_acls_or_insecure(tmp_path: Path) -> None:
    raft, port = free_ports(2)
    config = tmp_path / "n1.toml"
    plain = (f'[node]\nname = "n1"\ndata_dir = "n1"\n[group]\nname = "g1"\n'
             f'peers = {{ n1 = "127.0.0.1:{raft}" }}\nsecret_file = "secret"\n'
             f'[broker]\nlisten = "0.0.0.0:{port}"\n')
    (tmp_path / "secret").write_text("a-cluster-secret-of-the-test")  # every Raft port needs one
    config.write_text(plain)
    argv = [sys.executable, "-m", "broker", "--config", str(config)]
    with ProcessGroup(tmp_path / "logs") as procs:
        refused = procs.start("refused", argv)
        assert refused.wait(60) == 2
        assert (f"error: the broker listens on 0.0.0.0:{port}, which other hosts can reach, without TLS and "
                "ACLs") in refused.log_tail()
        assert not (tmp_path / "n1").exists(), "refused before the replica opened its log"
        # a new group of one: formed as docs/DEPLOY.md says, before its first start
        subprocess.run([sys.executable, "-m", "raftmq", "replica", "init", "--config", str(config)],
                       check=True, capture_output=True, timeout=60)
        insecure = procs.start("insecure", [*argv, "--insecure"])
        wait_until(lambda: _healthz(f"http://127.0.0.1:{port}/healthz"), 60, what="the insecure broker")
        assert (f"WARNING broker.node: INSECURE (--insecure): the broker listens on 0.0.0.0:{port} without "
                "TLS and ACLs") in insecure.log_tail(200)
        insecure.stop(10)
        ca = LocalCA(tmp_path / "tls").ensure()
        tls = ca.server_tls()
        access = acl_broker_options(tmp_path)  # a bootstrap super user, as cluster up --acl makes
        config.write_text(plain + f'acl = true\nacl_bootstrap_file = "{access["acl_bootstrap_file"]}"\n'
                                  f'[broker.tls]\ncert_file = "{tls.cert_file}"\n'
                                  f'key_file = "{tls.key_file}"\n')
        secured = procs.start("secured", argv)
        wait_until(lambda: _healthz(f"https://127.0.0.1:{port}/healthz", ca.client_tls()), 60,
                   what="the broker with TLS and ACLs")
        assert "INSECURE" not in secured.log_tail(200)
        topics_refused(f"127.0.0.1:{port}", ca.client_tls(), "authentication required", AuthFailedError)
        admin = Admin(servers=[f"127.0.0.1:{port}"], tls=ca.client_tls(),
                      credentials=local_credentials(tmp_path))
        try:  # both protections at work: the super user over TLS (once the leader added it)
            wait_until(lambda: admin.topics() is not None, 30, what="the super user listing topics")
        finally:
            admin.close()


def test_a_name_server_bound_to_all_interfaces_needs_tls_or_insecure(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    key = registration_key("a secret", "g1")
    (tmp_path / "g1.key").write_text(key.hex())
    config = tmp_path / "namesrv.toml"
    config.write_text(f'[namesrv]\nlisten = "0.0.0.0:{port}"\n[groups.g1]\nkey_file = "g1.key"\n')
    argv = [sys.executable, "-m", "broker.namesrv.server", "--config", str(config)]
    with ProcessGroup(tmp_path / "logs") as procs:
        refused = procs.start("refused", argv)
        assert refused.wait(60) == 2
        assert (f"error: the name server listens on 0.0.0.0:{port}, which other hosts can reach, without TLS"
                in refused.log_tail())
        insecure = procs.start("insecure", [*argv, "--insecure"])
        wait_until(lambda: _healthz(f"http://127.0.0.1:{port}/healthz"), 60, what="the insecure name server")
        assert (f"WARNING broker.namesrv: INSECURE (--insecure): the name server listens on 0.0.0.0:{port} "
                "without TLS") in insecure.log_tail()
        code, answer = http_json(f"http://127.0.0.1:{port}/register", {"group": "g1"})
        assert code == 401, answer  # --insecure waived TLS only: registrations are still signed
