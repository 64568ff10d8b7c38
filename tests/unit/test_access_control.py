"""Users, SCRAM authentication and policies on a one-node broker served in process with
``acl`` on and a bootstrap super user; the access map's coverage; the rules alone."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
import scramp

from broker.remoting.server import AppliedSignal, BrokerServer
from broker.security.access_map import ACCESS, HTTP_ACCESS, OPEN, SUPER_ONLY
from broker.security.authorizer import Need, allowed
from broker.security.scram_auth import AdminTokens, AuthFailed
from broker.state.access import AccessTables
from broker.store.commands import DeleteUser, Grant, PutUser, Revoke, decode_admin, encode_admin
from client import Admin, Credentials, Message, Producer, PullConsumer, SimpleConsumer
from client.aio.auth import admin_token
from client.credentials import scram_record
from client.errors import AuthFailedError, NoPermissionError
from client.queues import MessageQueue
from protocol.acl import Action, ResourceType, parse_resource
from protocol.remoting import RequestCode, ResponseCode
from tests.support.broker_client import FrameClient
from tests.support.procs import wait_until

ADMIN = Credentials("root", "root-secret")
_ROOT = scram_record(ADMIN.password)
BROKER_OPTIONS = {"acl": True, "acl_bootstrap": PutUser("root", True, _ROOT.salt, _ROOT.iterations,
                                                          _ROOT.stored_key, _ROOT.server_key)}


def _admin(broker: str, credentials: Credentials | None = ADMIN) -> Admin:
    admin = Admin(servers=[broker], credentials=credentials)
    wait_until(lambda: _can_list(admin), 10, what="the bootstrap super user to be added")
    return admin


def _as(broker: str, credentials: Credentials | None, call: Callable[[Admin], object]) -> object:
    """``call`` on an Admin of ``credentials`` (closed after)."""
    admin = Admin(servers=[broker], credentials=credentials)
    try:
        return call(admin)
    finally:
        admin.close()


def _can_list(admin: Admin) -> bool:
    try:
        admin.topics()
        return True
    except AuthFailedError:
        return False


# -- the table covers everything --------------------------------------------------------------
def test_every_dispatched_code_and_admin_route_has_a_row(one_node_broker) -> None:  # type: ignore[no-untyped-def]
    rlog, machine, applier = one_node_broker
    server = BrokerServer(rlog, machine, applier, AppliedSignal(asyncio.new_event_loop()), lambda _n: None)
    assert set(server._handlers) <= set(ACCESS), set(server._handlers) - set(ACCESS)
    assert set(server._handlers) >= OPEN | SUPER_ONLY
    admin_routes = {("GET" if r.method == "HEAD" else r.method, r.resource.canonical)  # HEAD: as GET
                    for r in server.app().router.routes()
                    if r.resource is not None and r.resource.canonical.startswith("/admin")}
    assert admin_routes and admin_routes <= set(HTTP_ACCESS), admin_routes - set(HTTP_ACCESS)


# -- the rules --------------------------------------------------------------------------------
def _tables(*records: PutUser | DeleteUser | Grant) -> AccessTables:
    tables = AccessTables()
    for r in records:
        assert tables.apply(decode_admin(encode_admin(r))) is None  # type: ignore[arg-type]
    return tables


def _user(name: str, is_super: bool = False) -> PutUser:
    return PutUser(name, is_super, b"s" * 16, 4096, b"k" * 32, b"v" * 32)


def test_deny_wins_prefixes_match_and_sources_restrict() -> None:
    t = _tables(_user("alice"), Grant("alice", "topic:ord*", "allow", "", ("pub", "sub")),
                Grant("alice", "topic:orders-secret", "deny", "", ("sub",)),
                Grant("alice", "group:g1", "allow", "10.0.0.0/8", ("sub",)))
    ip = __import__("ipaddress").ip_address
    pub, sub = (Action.PUB,), (Action.SUB,)
    assert allowed(t, "alice", None, Need(ResourceType.TOPIC, "orders", pub))
    assert allowed(t, "alice", None, Need(ResourceType.TOPIC, "orders-secret", pub))
    assert not allowed(t, "alice", None, Need(ResourceType.TOPIC, "orders-secret", sub))  # deny wins
    assert not allowed(t, "alice", None, Need(ResourceType.TOPIC, "audit", pub))  # default deny
    assert not allowed(t, "alice", None, Need(ResourceType.TOPIC, "orders", (Action.DELETE,)))
    assert allowed(t, "alice", ip("10.1.2.3"), Need(ResourceType.GROUP, "g1", sub))
    assert not allowed(t, "alice", ip("192.168.1.1"), Need(ResourceType.GROUP, "g1", sub))
    assert not allowed(t, "alice", None, Need(ResourceType.GROUP, "g1", sub))
    assert not allowed(t, "bob", None, Need(ResourceType.TOPIC, "orders", pub))  # no such user
    t.apply(DeleteUser("alice"))
    assert not allowed(t, "alice", None, Need(ResourceType.TOPIC, "orders", pub))
    assert t.state() == {}


def test_super_users_bypass_and_revoke_takes_actions_away() -> None:
    t = _tables(_user("root", True), _user("bob"), Grant("bob", "topic:*", "allow", "", ("pub", "get")))
    assert allowed(t, "root", None, Need(ResourceType.CLUSTER, "", (Action.UPDATE,)))
    assert t.apply(Revoke("bob", "topic:*", "allow", "", ("pub",))) is None
    assert not allowed(t, "bob", None, Need(ResourceType.TOPIC, "x", (Action.PUB,)))
    assert allowed(t, "bob", None, Need(ResourceType.TOPIC, "x", (Action.GET,)))
    assert t.apply(Revoke("bob", "topic:*", "allow", "", ())) is None and t.statements() == []
    assert t.apply(Grant("nobody", "topic:*", "allow", "", ("pub",))) == "no user 'nobody': add it first"


def test_resources_parse_and_print_canonically() -> None:
    for text in ("cluster", "topic:orders", "topic:ord*", "topic:*", "group:g1", "group:bill*"):
        assert str(parse_resource(text)) == text
    assert str(parse_resource("cluster:*")) == "cluster"
    for bad in ("topic:", "queue:x", "topic:a*b", "orders"):
        with pytest.raises(ValueError):
            parse_resource(bad)


def test_admin_tokens_expire_and_die_with_a_password_change() -> None:
    now = [1_000_000.0]
    tables = _tables(_user("alice"))
    tokens = AdminTokens("secret", "g1", lambda: tables, ttl_s=60, clock=lambda: now[0])
    token, expires = tokens.issue("alice")
    assert tokens.check(token) == "alice" and expires == int((now[0] + 60) * 1000)
    now[0] += 61
    with pytest.raises(AuthFailed, match="expired"):
        tokens.check(token)
    now[0] -= 61
    other = AdminTokens("secret", "g2", lambda: tables, clock=lambda: now[0])
    with pytest.raises(AuthFailed, match="bad signature"):
        other.check(token)  # another group's key
    tables.apply(PutUser("alice", False, b"t" * 16, 4096, b"K" * 32, b"V" * 32))
    with pytest.raises(AuthFailed, match="no longer valid"):
        tokens.check(token)


# -- over the wire ------------------------------------------------------------------------------
@pytest.mark.sockets
def test_anonymous_requests_are_refused_and_users_get_only_their_rights(
        broker: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "raftmq.audit")
    admin = _admin(broker)
    try:
        admin.create_topic("orders", queues=2)
        admin.create_topic("audit", queues=1)
        admin.put_user("alice", "alice-pw")
        admin.grant("alice", "topic:orders", ["pub", "sub", "get"])
        admin.grant("alice", "topic:audit", ["get"])  # it may route to it, not send or pull
        with pytest.raises(AuthFailedError):
            _as(broker, None, Admin.topics)  # anonymous
        with pytest.raises(AuthFailedError, match="wrong user name or password"):
            _as(broker, Credentials("alice", "nope"), Admin.topics)
        alice = Credentials("alice", "alice-pw")
        with Producer(servers=[broker], group="p", credentials=alice) as p:
            r = p.send(Message("orders", b"hello"))
            with pytest.raises(NoPermissionError, match=r"user 'alice' may not pub on topic:audit"):
                p.send(Message("audit", b"x"))
        c = PullConsumer(servers=[broker], group="g", read_from="any", credentials=alice)
        try:
            page = c.pull(MessageQueue("orders", r.queue.group, r.queue.queue_id), 0)
            assert [m.body for m in page.messages] == [b"hello"]
            with pytest.raises(NoPermissionError, match="sub on topic:audit"):
                c.pull(MessageQueue("audit", r.queue.group, 0), 0)
        finally:
            c.shutdown()
        with pytest.raises(NoPermissionError, match="only super users"):
            _as(broker, alice, lambda a: a.put_user("mallory", "x", super_user=True))
        _as(broker, alice, lambda a: a.put_user("alice", "new-pw"))  # one's own password
        with pytest.raises(AuthFailedError):
            _as(broker, alice, lambda a: a.delete_topic("orders"))
        with pytest.raises(NoPermissionError, match="delete on topic:orders"):
            _as(broker, Credentials("alice", "new-pw"), lambda a: a.delete_topic("orders"))
    finally:
        admin.close()
    audit = [r.getMessage() for r in caplog.records if r.name == "raftmq.audit"]
    assert any("denied user=alice" in line and "pub on topic:audit" in line for line in audit), audit
    assert any("change by user=root" in line and "user 'alice' added" in line for line in audit), audit


@pytest.mark.sockets
def test_a_replayed_scram_exchange_is_refused(broker: str) -> None:
    _admin(broker).close()

    async def exchange(client: scramp.ScramClient | None,
                       replay: tuple[str, str] | None) -> tuple[str, str, int]:
        async with aiohttp.ClientSession() as session:
            conn = await FrameClient.connect(session, broker)
            first = client.get_client_first() if client else replay[0]  # type: ignore[index]
            r1 = await conn.call(RequestCode.AUTH_START, {"mechanism": "SCRAM-SHA-256", "message": first})
            assert r1.code == ResponseCode.SUCCESS, r1.remark
            if client is not None:
                client.set_server_first(str(r1.ext["message"]))
            final = client.get_client_final() if client else replay[1]  # type: ignore[index]
            r2 = await conn.call(RequestCode.AUTH_FINISH, {"message": final})
            await conn.close()
            return first, final, r2.code

    first, final, code = asyncio.run(exchange(scramp.ScramClient(["SCRAM-SHA-256"], "root", "root-secret"),
                                              None))
    assert code == ResponseCode.SUCCESS
    assert asyncio.run(exchange(None, (first, final)))[2] == ResponseCode.AUTH_FAILED


@pytest.mark.sockets
def test_admin_http_needs_a_token_and_the_right(broker: str) -> None:
    admin = _admin(broker)
    try:
        admin.put_user("viewer", "viewer-pw")
        admin.grant("viewer", "group:*", ["get"])
    finally:
        admin.close()

    async def scenario() -> None:
        base = f"http://{broker}"
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{base}/admin/topics") as resp:
                assert resp.status == 401
            for path in ("/healthz", "/status", "/metrics"):
                async with s.get(f"{base}{path}") as resp:
                    assert resp.status == 200, path
            token = await admin_token(s, base, Credentials("viewer", "viewer-pw"))
            auth = {"Authorization": f"Bearer {token}"}
            async with s.get(f"{base}/admin/groups/g1/offsets", headers=auth) as resp:
                assert resp.status == 200
            async with s.get(f"{base}/admin/messages?key=k", headers=auth) as resp:
                assert resp.status == 403 and "may not get on cluster" in (await resp.json())["message"]
            async with s.get(f"{base}/admin/topics", headers={"Authorization": "Bearer x.y"}) as resp:
                assert resp.status == 401
            with pytest.raises(AuthFailedError):
                await admin_token(s, base, Credentials("viewer", "wrong"))

    asyncio.run(scenario())


def test_users_are_in_the_checkpoint_and_digest_and_leave_no_trace_when_gone(tmp_path: Path) -> None:
    from broker.state.machine import BrokerStateMachine
    from broker.state.snapshot import Snapshot
    from tests.unit.test_state_machine import Log

    log, sm = Log(), BrokerStateMachine(tmp_path / "s", index_slots=8, index_entries=32)
    empty = Snapshot.of(0, sm._canonical_state()).digest
    sm.apply([log.add([encode_admin(_user("alice")),
                       encode_admin(Grant("alice", "topic:*", "allow", "", ("pub",)))])])
    assert Snapshot.of(0, sm._canonical_state()).digest != empty
    sm.close()
    again = BrokerStateMachine(tmp_path / "s", index_slots=8, index_entries=32)
    try:
        assert set(again.access.users) == {"alice"}
        assert [(s.resource, set(s.actions)) for s in again.access.statements()] == [("topic:*", {"pub"})]
        again.apply([log.add([encode_admin(DeleteUser("alice"))])])
        state = again._canonical_state()
        assert "users" not in state and "policies" not in state  # the form of a state never with users
    finally:
        again.close()


def test_a_replica_installing_a_snapshot_gets_the_users_and_policies(tmp_path: Path) -> None:
    from broker.state.machine import BrokerStateMachine
    from broker.state.snapshot import Snapshot
    from tests.unit.test_state_machine import Log

    log = Log()
    source = BrokerStateMachine(tmp_path / "a", index_slots=8, index_entries=32)
    target = BrokerStateMachine(tmp_path / "b", index_slots=8, index_entries=32)
    try:
        source.apply([log.add([encode_admin(_user("alice")),
                               encode_admin(Grant("alice", "group:g1", "deny", "10.0.0.0/8", ("sub",)))])])
        snap = Snapshot.of(source.applied_index(), source._canonical_state())
        target.install_snapshot(snap.index, snap.encode())
        assert set(target.access.users) == {"alice"}
        assert [(s.resource, s.decision, s.source) for s in target.access.statements()] == [
            ("group:g1", "deny", "10.0.0.0/8")]
        assert Snapshot.of(snap.index, target._canonical_state()).digest == snap.digest
    finally:
        source.close()
        target.close()


@pytest.mark.sockets
def test_a_simple_consumer_needs_sub_on_its_group_and_topic_and_a_policy_update_on_the_group(
        broker: str) -> None:
    admin = _admin(broker)
    try:
        admin.create_topic("work", queues=1)
        admin.put_user("bob", "bob-pw")
        admin.grant("bob", "topic:work", ["pub", "sub"])
        admin.grant("bob", "group:workers", ["sub"])
        bob = Credentials("bob", "bob-pw")
        with Producer(servers=[broker], group="p", credentials=bob) as p:
            p.send(Message("work", b"job"))
        with SimpleConsumer(servers=[broker], group="workers", topic="work", credentials=bob) as c:
            (m,) = c.receive(wait_s=5)
            c.ack(m)
        with SimpleConsumer(servers=[broker], group="others", topic="work", credentials=bob) as c, \
                pytest.raises(NoPermissionError, match="sub on group:others"):
            c.receive()
        with pytest.raises(NoPermissionError, match="update on group:workers"):
            _as(broker, bob, lambda a: a.group_config("workers", (1.0,), 3))
        admin.group_config("workers", (1.0,), 3)  # a super user may
    finally:
        admin.close()
