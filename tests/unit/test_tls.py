"""TLS on the client port in one process: the config's [broker.tls], the contexts, the local
CA, the exposure check, and the client against a broker serving wss:// (``conftest.broker``
with ``broker_ssl_context``). The same against real processes: tests/security/test_tls.py."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import stat
import time
import urllib.request
from pathlib import Path

import pytest

from broker.config import read_broker_section
from broker.http_api.membership import _learner_lag
from broker.namesrv.config import read_namesrv_config, write_namesrv_config
from broker.node_tls import read_serving
from broker.remoting import guarded_site
from broker.remoting.server import AppliedSignal, BrokerServer
from broker.security.exposure import check_exposure
from broker.security.tls import TlsSection, server_context
from broker.security.tls import peer_tls as peer_tls_of
from broker.state.machine import BrokerStateMachine
from client import Admin, ClientTls, Message, Producer, PullConsumer
from client.errors import ClientError, ConnectionLostError, TlsError
from common.toml_config import ConfigError
from dledger.applier import Applier
from dledger.log import Log
from dledger.membership import Member
from protocol.exposure import is_loopback, missing_protections
from protocol.tls import http_url, resolve_tls, ws_url
from raftmq.local_tls import LocalCA
from spark.options import OptionError, parse_options
from spark.planning import plan_batch
from spark.range_reader import read_columns


@pytest.fixture
def local_ca(tmp_path: Path) -> LocalCA:
    return LocalCA(tmp_path / "tls").ensure()


@pytest.fixture
def broker_ssl_context(local_ca: LocalCA) -> ssl.SSLContext:
    return server_context(local_ca.server_tls(), "broker.tls")


# -- settings ------------------------------------------------------------------------------
def test_client_tls_comes_from_the_option_else_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("RAFTMQ_TLS", "RAFTMQ_CA_FILE", "RAFTMQ_CERT_FILE", "RAFTMQ_KEY_FILE"):
        monkeypatch.delenv(var, raising=False)
    assert resolve_tls(None) is None and resolve_tls(False) is None
    assert resolve_tls(True) == ClientTls()
    monkeypatch.setenv("RAFTMQ_CA_FILE", "/ca.pem")
    assert resolve_tls(None) == ClientTls("/ca.pem")
    assert resolve_tls(False) is None  # an explicit "plain" wins over the environment
    monkeypatch.setenv("RAFTMQ_CERT_FILE", "/c.pem")
    monkeypatch.setenv("RAFTMQ_KEY_FILE", "/c.key")
    assert resolve_tls(None) == ClientTls("/ca.pem", "/c.pem", "/c.key")
    assert ClientTls.from_env({"RAFTMQ_TLS": "1"}) == ClientTls()
    assert ClientTls.from_env({"RAFTMQ_TLS": "0"}) is None
    assert (http_url("h:1", "/status", True), ws_url("h:1", "/ws", False)) == ("https://h:1/status",
                                                                                "ws://h:1/ws")


def test_the_tls_tables_are_typed_strict_and_relative_to_their_file(tmp_path: Path) -> None:
    path = tmp_path / "n1.toml"
    path.write_text('[broker]\nlisten = "127.0.0.1:1"\n[broker.tls]\ncert_file = "tls/s.pem"\n'
                    'key_file = "/abs/s.key"\nca_file = "tls/ca.pem"\nclient_auth = true\n')
    assert read_broker_section(path).tls == TlsSection(str(tmp_path / "tls/s.pem"), "/abs/s.key",
                                                       str(tmp_path / "tls/ca.pem"), True)
    path.write_text('[broker]\nlisten = "127.0.0.1:1"\n[broker.tls]\ncert_file = "a"\nkey_file = "b"\n'
                    'verify = false\n')
    with pytest.raises(ConfigError, match=r"\[broker\.tls\] has no key 'verify' \(the keys of \[broker"
                                          r"\.tls\] are: cert_file, key_file, ca_file, client_auth\)"):
        read_broker_section(path)
    path.write_text('[broker]\nlisten = "127.0.0.1:1"\n[broker.tls]\ncert_file = "a"\n')
    with pytest.raises(ConfigError, match="key_file"):
        read_broker_section(path)
    ns = write_namesrv_config(tmp_path / "namesrv.toml", "127.0.0.1:2", {},
                              TlsSection("s.pem", "s.key", "ca.pem"))
    assert read_namesrv_config(ns).tls == TlsSection(str(tmp_path / "s.pem"), str(tmp_path / "s.key"),
                                                     str(tmp_path / "ca.pem"))


def test_a_server_context_refuses_files_it_cannot_use(local_ca: LocalCA, tmp_path: Path) -> None:
    good = local_ca.server_tls(client_auth=True)
    ctx = server_context(good, "broker.tls")
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    assert server_context(local_ca.server_tls(), "x").verify_mode == ssl.CERT_NONE
    with pytest.raises(ConfigError, match=r"broker\.tls: cannot use cert_file .*missing\.pem"):
        server_context(TlsSection(str(tmp_path / "missing.pem"), good.key_file), "broker.tls")
    with pytest.raises(ConfigError, match=r"broker\.tls: cannot use"):  # a key that is not the cert's
        server_context(TlsSection(good.cert_file, str(local_ca.dir / "client.key")), "broker.tls")
    with pytest.raises(ConfigError, match=r"namesrv\.tls\.client_auth = true needs namesrv\.tls\.ca_file"):
        server_context(TlsSection(good.cert_file, good.key_file, client_auth=True), "namesrv.tls")


def test_the_local_ca_keeps_its_keys_private_and_signs_for_localhost(local_ca: LocalCA) -> None:
    for key in ("ca.key", "server.key", "client.key"):
        assert stat.S_IMODE((local_ca.dir / key).stat().st_mode) == 0o600, key
    before = (local_ca.dir / "ca.pem").read_bytes()
    assert local_ca.ensure().ca_file.read_bytes() == before  # made once, reused
    client = local_ca.client_tls(with_cert=True)
    assert client.cert_file is not None and client.cert_file.endswith("client.pem")
    client.context()  # loads: the client certificate matches its key
    other = LocalCA(local_ca.dir.parent / "other").ensure()
    assert other.ca_file.read_bytes() != before


# -- secure by default off loopback --------------------------------------------------------------
@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("0.0.0.0", False), ("::", False), ("", False), ("10.0.0.11", False), ("192.168.1.5", False),
    ("no-such-host.invalid", False)])
def test_only_loopback_addresses_are_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_off_loopback_a_broker_needs_tls_and_acls_and_a_name_server_tls() -> None:
    assert missing_protections("127.0.0.1:10911", tls=False, acl=False) == []
    assert missing_protections("0.0.0.0:10911", tls=False, acl=False) == ["TLS", "ACLs"]
    assert missing_protections("10.0.0.11:10911", tls=True, acl=False) == ["ACLs"]
    assert missing_protections("10.0.0.11:10911", tls=True, acl=True) == []
    assert missing_protections("0.0.0.0:9876", tls=False, acl=None) == ["TLS"]  # a name server


def test_insecure_starts_anyway_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("test.exposure")
    with pytest.raises(ConfigError, match=r"listens on 0\.0\.0\.0:1, which other hosts can reach, "
                                          r"without TLS and ACLs: configure X, .*--insecure"):
        check_exposure("the broker", "0.0.0.0:1", tls=False, acl=False, insecure=False, how="X", log=log)
    with caplog.at_level(logging.WARNING):
        check_exposure("the broker", "0.0.0.0:1", tls=False, acl=False, insecure=True, how="X", log=log)
        check_exposure("the broker", "127.0.0.1:1", tls=False, acl=False, insecure=True, how="X", log=log)
    assert [r.levelname for r in caplog.records] == ["WARNING"]  # loopback: nothing to waive
    assert "INSECURE (--insecure): the broker listens on 0.0.0.0:1 without TLS and ACLs" in caplog.text


def test_a_broker_config_is_checked_before_the_replica_opens(local_ca: LocalCA, tmp_path: Path) -> None:
    path = tmp_path / "n1.toml"
    tls = local_ca.server_tls()
    tls_table = f'[broker.tls]\ncert_file = "{tls.cert_file}"\nkey_file = "{tls.key_file}"\n'
    path.write_text('[broker]\nlisten = "0.0.0.0:10911"\n')
    with pytest.raises(ConfigError, match="without TLS and ACLs"):
        read_serving(path, insecure=False)
    path.write_text('[broker]\nlisten = "0.0.0.0:10911"\nacl = true\n' + tls_table)
    _, serving = read_serving(path, insecure=False)
    assert serving is not None and serving.peer == ClientTls(None, tls.cert_file, tls.key_file)
    path.write_text('[broker]\nlisten = "127.0.0.1:10911"\n')
    assert read_serving(path, insecure=False)[1] is None


def test_spark_tls_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAFTMQ_CA_FILE", raising=False)
    base = {"topic": "t", "servers": "a:1"}
    assert parse_options(base).tls is None
    assert parse_options({**base, "caFile": "/ca.pem"}).tls == ClientTls("/ca.pem")
    assert parse_options({**base, "tls": "true"}).tls == ClientTls()
    opts = parse_options({**base, "caFile": "/ca.pem", "certFile": "/c.pem", "keyFile": "/c.key"})
    assert opts.client_args() == {"servers": ["a:1"], "tls": ClientTls("/ca.pem", "/c.pem", "/c.key"),
                                  "credentials": None}
    with pytest.raises(OptionError, match="keyFile needs certFile"):
        parse_options({**base, "keyFile": "/c.key"})
    with pytest.raises(OptionError, match="tls must be true or false"):
        parse_options({**base, "tls": "maybe"})
    monkeypatch.setenv("RAFTMQ_CA_FILE", "/env.pem")  # read on the driver, shipped in the options
    assert parse_options(base).tls == ClientTls("/env.pem")
    assert parse_options({**base, "tls": "false"}).tls is None


# -- the client against a broker serving TLS ----------------------------------------------------
@pytest.mark.sockets
def test_a_client_with_the_ca_works_over_wss_and_https(broker: str, broker_ssl_context: ssl.SSLContext,
                                                       local_ca: LocalCA) -> None:
    tls = local_ca.client_tls()
    admin = Admin(servers=[broker], tls=tls)
    try:
        admin.create_topic("secure", queues=2)
        with Producer(servers=[broker], tls=tls) as p:
            sent = p.send(Message("secure", b"over tls"), shard_key="k")
        c = PullConsumer(servers=[broker], tls=tls, read_from="any")
        try:
            got = c.pull(sent.queue, sent.queue_offset).messages
            assert [m.body for m in got] == [b"over tls"]
        finally:
            c.shutdown()
    finally:
        admin.close()
    with urllib.request.urlopen(f"https://{broker}/status", context=tls.context(), timeout=5) as resp:
        assert resp.status == 200
    with pytest.raises(OSError):  # plain HTTP to the TLS port: no answer
        urllib.request.urlopen(f"http://{broker}/status", timeout=5)


@pytest.mark.sockets
def test_a_stalled_tls_handshake_is_cut_and_the_port_serves_on(
        broker: str, broker_ssl_context: ssl.SSLContext, local_ca: LocalCA,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The TLS port is served by the guarded accept loop (``broker.remoting.guarded_site``): a client
    that connects and never starts its handshake is closed after the handshake timeout (10 s;
    0.5 s here) instead of holding a descriptor, and others are served meanwhile."""
    monkeypatch.setattr(guarded_site, "HANDSHAKE_TIMEOUT_S", 0.5)
    host, port = broker.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as silent:
        with urllib.request.urlopen(f"https://{broker}/healthz", context=local_ca.client_tls().context(),
                                    timeout=5) as resp:
            assert resp.status == 200
        started = time.monotonic()
        silent.settimeout(5)
        assert silent.recv(1) == b"", "closed by the broker, nothing sent"
        assert time.monotonic() - started < 4


@pytest.mark.sockets
def test_a_client_without_the_ca_is_refused_at_once(broker: str, broker_ssl_context: ssl.SSLContext,
                                                     local_ca: LocalCA) -> None:
    other = LocalCA(local_ca.dir.parent / "other").ensure()
    for tls in (True, other.client_tls()):  # the system's CAs; another CA
        admin = Admin(servers=[broker], tls=tls, timeout=10)
        started = time.monotonic()
        try:
            with pytest.raises(TlsError, match=r"certificate was refused .*CERTIFICATE_VERIFY_FAILED") as e:
                admin.topics()
        finally:
            admin.close()
        assert not e.value.retriable
        assert time.monotonic() - started < 5, "a certificate refusal is not retried until the timeout"


@pytest.mark.sockets
def test_plain_websocket_to_a_tls_port_fails_saying_so(broker: str,
                                                       broker_ssl_context: ssl.SSLContext) -> None:
    with Producer(servers=[broker], tls=False, send_timeout=2) as p, \
            pytest.raises(ClientError, match=r"Server disconnected \(does it serve TLS\? then give the "
                                             r"client tls= with its CA\)"):
        p.send(Message("t", b"x"))


@pytest.mark.sockets
def test_tls_to_a_plain_port_fails_saying_so(broker: str, local_ca: LocalCA) -> None:
    admin = Admin(servers=[broker], tls=local_ca.client_tls(), timeout=2)
    try:
        with pytest.raises(ConnectionLostError, match="it does not serve TLS"):
            admin.topics()
    finally:
        admin.close()


@pytest.mark.sockets
def test_the_broker_calls_its_peers_over_https_with_its_certificate(
        broker: str, broker_ssl_context: ssl.SSLContext, local_ca: LocalCA,
        one_node_broker: tuple[Log, BrokerStateMachine, Applier]) -> None:
    """The divergence check's digests and the membership catch-up check read a peer's
    ``/status`` through ``BrokerServer.http_session``/``peer_url``."""
    rlog, machine, applier = one_node_broker
    tls = local_ca.server_tls()

    async def main() -> None:
        signal = AppliedSignal(asyncio.get_running_loop())
        for peer_tls, answers in ((peer_tls_of(tls), True), (None, False)):
            caller = BrokerServer(rlog, machine, applier, signal, lambda _n: None, peer_tls=peer_tls)
            try:
                assert (await caller._peer_digests(broker) is not None) is answers
                behind, why, _storage = await _learner_lag(caller, Member("n1", "127.0.0.1:1", broker))
                assert (behind is not None) is answers, why
            finally:
                await caller.http_session().close()

    asyncio.run(main())


@pytest.mark.sockets
def test_the_spark_reader_plans_and_reads_over_wss(broker: str, broker_ssl_context: ssl.SSLContext,
                                                   local_ca: LocalCA) -> None:
    """The Spark-free planner and partition reader with ``caFile`` (the role check over https,
    pulls over wss); without it the plan fails."""
    admin = Admin(servers=[broker], tls=local_ca.client_tls())
    try:
        admin.create_topic("spark-tls", queues=1)
    finally:
        admin.close()
    with Producer(servers=[broker], tls=local_ca.client_tls()) as p:
        p.send_batch([Message("spark-tls", f"row {i}".encode()) for i in range(5)], shard_key="k")
    options = {"topic": "spark-tls", "servers": broker, "readFrom": "leader"}  # a one-node group
    opts = parse_options({**options, "caFile": str(local_ca.ca_file)})
    (rng,) = plan_batch(opts)
    read = [body for cols in read_columns(opts, rng) for body in cols.body]
    assert read == [f"row {i}".encode() for i in range(5)]
    with pytest.raises(TlsError, match="certificate was refused"):
        plan_batch(parse_options({**options, "tls": "true"}))


@pytest.mark.parametrize("closed", [
    "server disconnected", "connection reset", "certificate required alert"])
def test_a_mutual_tls_refusal_is_explained_however_the_close_arrives(closed: str) -> None:
    """A broker requiring client certificates closes a TLS 1.3 connection after the client's
    handshake: the client sees its alert, the server going away, or -- as CI did -- a reset
    (Errno 104), depending on timing. Each gets the same hint."""
    import errno

    import aiohttp

    from client.aio.connection import tls_hint
    from protocol.tls import ClientTls

    error: BaseException = {
        "server disconnected": aiohttp.ServerDisconnectedError(),
        "connection reset": aiohttp.ClientOSError(errno.ECONNRESET, "Connection reset by peer"),
        "certificate required alert": aiohttp.ClientOSError(
            1, "[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] tlsv13 alert certificate required"),
    }[closed]
    assert "does it require mutual TLS?" in tls_hint(error, ClientTls("ca.pem"))
    assert tls_hint(error, ClientTls("ca.pem", "client.pem", "client.key")) == ""
