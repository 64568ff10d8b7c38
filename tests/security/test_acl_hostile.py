"""Issue 15 row 2 and the hostile-client suite for users and ACLs, against real broker
processes -- serving TLS, as a group reachable from other hosts must (``broker.security.exposure``).

Row 2 as found: with no ACLs (today's default, and still the default on loopback) an
anonymous client produces, pulls, creates and deletes topics, commits and resets another
group's offsets, takes another client's orderly locks, unregisters other clients and reads
message bodies from ``/admin/messages``. ``test_row2_...without_acls`` reproduces that
against one broker process; with ``acl = true`` every one of them is refused.

Hostile clients: a wrong password, a replayed SCRAM exchange, an expired admin token, and
a user without rights sending each request type (table-driven: every code a client sends
has a sample in ``acl_cluster.samples``) -- refused with NO_PERMISSION naming the user,
the resource and the action, while a user holding exactly the sample's grants is not
refused. The rights hold on a new leader after the old one is killed. Every call of the
suite (WebSocket, admin HTTP and its tokens, the operator commands) goes over TLS.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.security.access_map import ACCESS, OPEN
from client import Admin, Credentials, Message, Producer
from client.aio.auth import admin_token
from client.errors import AuthFailedError
from protocol.acl import AuthFinishRequest, AuthStartRequest
from protocol.remoting import RequestCode, ResponseCode
from protocol.tls import http_url
from protocol.wire import Request
from raftmq.local_group import LocalGroup
from tests.security.acl_cluster import ROOT, acl_brokers, leader_address, login, run, samples, session_call
from tests.security.namesrv_cluster import http_json
from tests.support.broker_client import FrameClient, client_session
from tests.support.broker_group import servers
from tests.support.procs import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

ALICE, MALLORY = Credentials("alice", "alice-password"), Credentials("mallory", "mallory-password")


def _https(address: str, path: str) -> str:
    return http_url(address, path, True)


def _row2_requests(position: int) -> list[Request]:
    """Row 2's list, as requests (another group's offsets, another client's lock and membership)."""
    s, c = samples(position), RequestCode
    codes = (c.SEND_MESSAGE, c.PULL_MESSAGE, c.CREATE_TOPIC, c.DELETE_TOPIC, c.COMMIT_OFFSET, c.RESET_OFFSET,
             c.LOCK_BATCH_MQ, c.UNREGISTER_CLIENT)
    return [s[code].request for code in codes]


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalGroup, int]]:
    """A 3-node group with TLS and ACLs on (admin tokens live 3 s), topic ``orders`` with one
    message (its position returned), users alice (the union of every sample's grants) and
    mallory (no rights)."""
    with acl_brokers(tmp_path_factory.mktemp("acl"), tls=True, acl_token_ttl_s=3) as g:
        admin = Admin(servers=servers(g), credentials=ROOT, tls=g.client_tls)
        try:
            admin.create_topic("orders", queues=1)
            with Producer(servers=servers(g), group="p", credentials=ROOT, tls=g.client_tls) as p:
                position = p.send(Message("orders", b"stored")).position
            admin.put_user(ALICE.user, ALICE.password)
            admin.put_user(MALLORY.user, MALLORY.password)
            grants = {grant for sample in samples(position).values() for grant in sample.grants}
            for resource, actions in sorted(grants):
                admin.grant(ALICE.user, resource, actions.split(","))
        finally:
            admin.close()
        yield g, position


def test_row2_without_acls_an_anonymous_client_may_do_everything(tmp_path: Path) -> None:
    """The finding reproduced: one broker process with ACLs off (the default)."""
    single = LocalGroup(tmp_path / "open", 1, module="broker")
    try:
        single.start()
        address = single.nodes[single.wait_leader(timeout=30)].http
        admin = Admin(servers=[address])
        try:
            admin.create_topic("orders", queues=1)
            with Producer(servers=[address], group="p") as p:
                position = p.send(Message("orders", b"secret body", keys=["k"])).position
        finally:
            admin.close()
        answers = run(session_call(address, None, _row2_requests(position)))
        assert [ResponseCode(a.code).name for a in answers] == ["SUCCESS"] * len(answers)
        status, found = http_json(f"http://{address}/admin/messages?key=k")
        assert status == 200 and found[0]["body_base64"]  # bodies to anyone
    finally:
        single.stop()


def test_row2_with_acls_an_anonymous_client_is_refused_everything(group: tuple[LocalGroup, int]) -> None:
    g, position = group
    address = leader_address(g)
    answers = run(session_call(address, None, _row2_requests(position), g.client_tls))
    assert {ResponseCode(a.code).name for a in answers} == {"AUTH_FAILED"}, [a.remark for a in answers]
    assert all("authentication required" in a.remark for a in answers)
    status, body = http_json(_https(address, "/admin/messages?key=k"), tls=g.client_tls)
    assert status == 401 and "body_base64" not in str(body)


def test_every_request_type_is_refused_to_a_user_without_the_right(group: tuple[LocalGroup, int]) -> None:
    g, position = group
    table = samples(position)
    client_codes = set(ACCESS) - OPEN
    assert client_codes <= set(table), client_codes - set(table)  # a new request type needs a sample
    codes = sorted(table)
    address = leader_address(g)
    refused = run(session_call(address, MALLORY, [table[c].request for c in codes], g.client_tls))
    for code, answer in zip(codes, refused, strict=True):
        assert answer.code == ResponseCode.NO_PERMISSION, (code.name, answer.code, answer.remark)
        assert "'mallory'" in answer.remark and table[code].refused_need in answer.remark, (code.name,
                                                                                          answer.remark)
    granted = run(session_call(address, ALICE, [table[c].request for c in codes if table[c].grants],
                               g.client_tls))
    for code, answer in zip([c for c in codes if table[c].grants], granted, strict=True):
        assert answer.code not in (ResponseCode.NO_PERMISSION, ResponseCode.AUTH_FAILED), (code.name,
                                                                                           answer.remark)


def test_a_wrong_password_and_a_replayed_exchange_are_refused(group: tuple[LocalGroup, int]) -> None:
    g, _ = group
    address = leader_address(g)
    wrong = run(session_call(address, None, [AuthStartRequest(mechanism="SCRAM-SHA-256",
                                                              message="n,,n=alice,r=abcdefghijklmnop")],
                             g.client_tls))
    assert wrong[0].code == ResponseCode.SUCCESS  # a salt is given to anyone, real or not

    async def exchange() -> tuple[str, str]:
        async with client_session(g.client_tls) as s:
            conn = await FrameClient.connect(s, address, tls=True)
            first, final, answer = await login(conn, ALICE)
            await conn.close()
            assert answer.code == ResponseCode.SUCCESS, answer.remark
            return first, final

    first, final = run(exchange())
    replayed = run(session_call(address, None, [AuthStartRequest(mechanism="SCRAM-SHA-256", message=first),
                                                AuthFinishRequest(message=final)], g.client_tls))
    assert replayed[0].code == ResponseCode.SUCCESS and replayed[1].code == ResponseCode.AUTH_FAILED
    wrong_client = Admin(servers=[address], credentials=Credentials("alice", "not-her-password"),
                         tls=g.client_tls)
    try:
        with pytest.raises(AuthFailedError, match="wrong user name or password") as refused:
            wrong_client.topics()
        assert not refused.value.retriable
    finally:
        wrong_client.close()


def test_an_expired_admin_token_is_refused(group: tuple[LocalGroup, int]) -> None:
    g, _ = group
    replicas = [n.http for n in g.nodes.values()]

    async def token() -> str:
        async with client_session(g.client_tls) as s:
            return await admin_token(s, _https(replicas[0], ""), ROOT)

    bearer = {"Authorization": f"Bearer {asyncio.run(token())}"}
    for address in replicas:  # any replica of the group takes it
        assert http_json(_https(address, "/admin/cluster"), headers=bearer, tls=g.client_tls)[0] == 200
    started = time.monotonic()
    wait_until(lambda: http_json(_https(replicas[1], "/admin/cluster"), headers=bearer,
                                 tls=g.client_tls)[0] == 401, 10, what="the token to expire")
    status, body = http_json(_https(replicas[1], "/admin/cluster"), headers=bearer, tls=g.client_tls)
    assert status == 401 and "expired" in body["error"] and time.monotonic() - started < 10


def test_rights_hold_on_a_new_leader(group: tuple[LocalGroup, int]) -> None:
    g, position = group
    old = g.wait_leader(timeout=30)
    g.kill(old)
    try:
        new = g.wait_leader(timeout=30, among=[n for n in g.nodes if n != old])
        address = g.nodes[new].http
        request = samples(position)[RequestCode.SEND_MESSAGE].request
        wait_until(lambda: run(session_call(address, ALICE, [request], g.client_tls))[0].code
                   == ResponseCode.SUCCESS, 20, what="the new leader to take alice's send")
        refused = run(session_call(address, MALLORY, [request], g.client_tls))
        assert refused[0].code == ResponseCode.NO_PERMISSION
    finally:
        g.start_node(old)


def test_operator_commands_authenticate_from_the_environment(group: tuple[LocalGroup, int]) -> None:
    """``raftmq leader transfer`` (admin HTTP over https, its token fetched over https)
    refused without credentials, done with them -- read from the environment, never from argv."""
    g, _ = group
    assert g.client_tls is not None
    where = ["--servers", ",".join(servers(g)), "--ca-file", str(g.client_tls.ca_file)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAFTMQ_")}
    refused = subprocess.run([sys.executable, "-m", "raftmq", "leader", "transfer", *where], env=env,
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "authentication required" in refused.stderr, refused.stderr
    env |= {"RAFTMQ_USER": ROOT.user, "RAFTMQ_PASSWORD": ROOT.password}
    done = subprocess.run([sys.executable, "-m", "raftmq", "leader", "transfer", *where], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "leader is now" in done.stdout, done.stdout + done.stderr


def test_a_live_client_id_is_its_users_another_user_of_the_group_can_neither_take_it_nor_its_locks(
        group: tuple[LocalGroup, int]) -> None:
    """Left open at the trust boundary's first landing: bob, with sub on group g1 as alice has,
    could heartbeat as alice's live client id (taking over its membership) and take or give
    back its orderly locks. The client id is now the registering user's while it lives."""
    from protocol.consumer import HeartbeatRequest
    from protocol.offset import LockQueuesRequest

    g, _ = group
    bob = Credentials("bob", "bob-password")
    admin = Admin(servers=servers(g), credentials=ROOT, tls=g.client_tls)
    try:
        admin.put_user(bob.user, bob.password)
        for resource, actions in (("topic:orders", "pub,sub,get"), ("group:g1", "sub,update")):
            admin.grant(bob.user, resource, actions.split(","))
    finally:
        admin.close()
    address = leader_address(g)

    def beat(client_id: str) -> bytes:
        return HeartbeatRequest(client_id=client_id, subscriptions={"g1": ("orders",)}).to_frame(1).encode()

    def lock(client_id: str) -> bytes:
        request = LockQueuesRequest(group="g1", client_id=client_id, topic="orders", queues=(0,))
        return request.to_frame(2).encode()

    async def scenario() -> list[Any]:
        async with client_session(g.client_tls) as session:
            a = await FrameClient.connect(session, address, tls=True)
            b = await FrameClient.connect(session, address, tls=True)
            try:
                for conn, who in ((a, ALICE), (b, bob)):
                    _, _, answer = await login(conn, who)
                    assert answer.code == ResponseCode.SUCCESS, answer.remark
                assert (await a.raw(beat("c-alice"))).code == ResponseCode.SUCCESS
                return [await b.raw(beat("c-alice")), await b.raw(lock("c-alice")),
                        await b.raw(beat("c-bob")), await b.raw(lock("c-bob")), await a.raw(lock("c-alice"))]
            finally:
                await a.close()
                await b.close()

    taken, locked, own_beat, own_lock, alices_lock = run(scenario())
    assert taken.code == ResponseCode.NO_PERMISSION, taken.remark
    assert "client id 'c-alice' of group 'g1' is registered by another user" in taken.remark
    assert locked.code == ResponseCode.NO_PERMISSION and "its locks are its own" in locked.remark
    for answer in (own_beat, own_lock, alices_lock):  # each user's own client id works
        assert answer.code == ResponseCode.SUCCESS, answer.remark
