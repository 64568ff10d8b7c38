"""RocketMQ's AK/SK with ACLs on, over a broker on the memory log (a cluster secret set), no
sockets: a super user gives a user an access key through the native admin requests; a
RocketMQ request signed as AclClientRPCHook signs is served as that user, through the
broker's own access check; what is not signed by a held key is refused; the secret key is
never in the log or the broker's files."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.remoting.server import AppliedSignal, BrokerServer
from broker.rocketmq import client_link
from broker.rocketmq.front_end import RocketFrontEnd
from broker.security.access_control import CONNECTION_AUTH, ConnectionAuth
from broker.security.access_key_seal import AccessKeySeal
from broker.security.authorizer import Principal
from broker.state.machine import BrokerStateMachine
from broker.store.commands import CreateTopic, Grant, PutUser, encode_admin
from dledger.applier import Applier
from dledger.local_log import LocalLog
from protocol.access_keys import (
    AccessKeysResponse,
    ListAccessKeysRequest,
    PutAccessKeyRequest,
    RevokeAccessKeyRequest,
    new_access_key,
    new_secret_key,
)
from protocol.remoting import Frame
from protocol.remoting import ResponseCode as Native
from protocol.rocketmq import signature
from protocol.rocketmq.codes import RequestCode, ResponseCode
from protocol.rocketmq.headers import ViewMessageRequestHeader
from protocol.wire import Request
from tests.support.one_node import one_node_group
from tests.unit.test_rocketmq_front_end import STORE_HOST, Rocket, heartbeat

SECRET = "the-cluster-secret-of-g1-0123456789"
_KEYS = (b"s" * 16, 4096, b"k" * 32, b"v" * 32)


@pytest.fixture
def sealed_broker(tmp_path: Path) -> Iterator[tuple[LocalLog, BrokerStateMachine, Applier]]:
    """A one-replica group with a cluster secret (access keys are sealed with it)."""
    with one_node_group(tmp_path, SECRET) as group:
        yield group


def signer(access_key: str, secret_key: str):  # type: ignore[no-untyped-def]
    """AclClientRPCHook's doBeforeRequest: AccessKey added, then every field and the body signed."""
    def sign(ext: dict[str, str], body: bytes) -> dict[str, str]:
        ext = {**ext, signature.ACCESS_KEY: access_key}
        return {**ext, signature.SIGNATURE: signature.sign(signature.signed_content(ext, body), secret_key)}
    return sign


async def as_user(server: BrokerServer, user: str, request: Request) -> Frame:
    """``request`` on the native port from a connection authenticated as ``user``."""
    CONNECTION_AUTH.set(ConnectionAuth("127.0.0.1", principal=Principal.of(user, "127.0.0.1")))
    return await server.handle(request.to_frame(1))


async def set_up(server: BrokerServer) -> None:
    """root (super) and alice, who may pub and sub on topic:orders and sub on group:billing;
    topics orders and audit (as the bootstrap user would be: through the log)."""
    records = [PutUser("root", True, *_KEYS), PutUser("alice", False, *_KEYS),
               Grant("alice", "topic:orders", "allow", "", ("pub", "sub")),
               Grant("alice", "group:billing", "allow", "", ("sub",)),
               CreateTopic("orders", 4), CreateTopic("audit", 4)]
    await server.write.send([encode_admin(r) for r in records])


def run(broker: tuple[LocalLog, BrokerStateMachine, Applier], scenario) -> None:  # type: ignore[no-untyped-def]
    rlog, machine, applier = broker

    async def main() -> None:
        server = BrokerServer(rlog, machine, applier, AppliedSignal(asyncio.get_running_loop()),
                              lambda _n: STORE_HOST, addresses={"n1": STORE_HOST}, acl=True)
        await set_up(server)
        await scenario(server, RocketFrontEnd(server, STORE_HOST))

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_signed_client_acts_as_its_user_and_is_refused_what_the_user_may_not(sealed_broker) -> None:  # type: ignore[no-untyped-def]
    access_key, secret_key = new_access_key(), new_secret_key()

    async def scenario(server: BrokerServer, front: RocketFrontEnd) -> None:
        refused = await as_user(server, "alice", PutAccessKeyRequest(access_key=access_key, user="alice",
                                                                     secret_key=secret_key))
        assert refused.code == Native.NO_PERMISSION  # only super users give keys
        made = await as_user(server, "root", PutAccessKeyRequest(access_key=access_key, user="alice",
                                                                 secret_key=secret_key))
        assert made.code == Native.SUCCESS, made.remark
        alice = Rocket(front, sign=signer(access_key, secret_key))
        sent = await alice.send("orders", 1, b"paid")
        assert sent.code == ResponseCode.SUCCESS, sent.remark
        pulled, messages = await alice.pull("orders", 1, 0)
        assert pulled.code == ResponseCode.SUCCESS and [m.body for m in messages] == [b"paid"]
        audit = await alice.send("audit", 0, b"x")
        assert audit.code == ResponseCode.NO_PERMISSION
        assert "user 'alice' may not pub on topic:audit" in (audit.remark or "")
        view = await alice.ask(RequestCode.VIEW_MESSAGE_BY_ID, ViewMessageRequestHeader(
            offset=messages[0].commit_log_offset))  # answered from state: the same need (get on the cluster)
        assert view.code == ResponseCode.NO_PERMISSION and "get on cluster" in (view.remark or "")
        forged = await Rocket(front, sign=signer(access_key, "not-" + secret_key)).send("orders", 1, b"x")
        assert forged.code == ResponseCode.NO_PERMISSION and "does not match" in (forged.remark or "")
        unsigned = await Rocket(front).send("orders", 1, b"x")
        assert unsigned.code == ResponseCode.NO_PERMISSION and "sign requests" in (unsigned.remark or "")

    run(sealed_broker, scenario)


def test_a_revoked_key_is_refused_and_keys_are_listed_without_secrets(sealed_broker) -> None:  # type: ignore[no-untyped-def]
    access_key, secret_key = new_access_key(), new_secret_key()

    async def scenario(server: BrokerServer, front: RocketFrontEnd) -> None:
        await as_user(server, "root", PutAccessKeyRequest(access_key=access_key, user="alice",
                                                          secret_key=secret_key))
        listed = await as_user(server, "root", ListAccessKeysRequest(user="alice"))
        rows = AccessKeysResponse.from_frame(listed).access_keys
        assert [(r.access_key, r.user) for r in rows] == [(access_key, "alice")]
        assert secret_key.encode() not in listed.encode()
        alice = Rocket(front, sign=signer(access_key, secret_key))
        assert (await alice.send("orders", 0, b"before")).code == ResponseCode.SUCCESS
        revoked = await as_user(server, "root", RevokeAccessKeyRequest(access_key=access_key))
        assert revoked.code == Native.SUCCESS, revoked.remark
        after = await alice.send("orders", 0, b"after")
        assert after.code == ResponseCode.NO_PERMISSION and "unknown or revoked" in (after.remark or "")

    run(sealed_broker, scenario)


def test_the_secret_key_is_never_in_the_log_a_checkpoint_or_a_snapshot(sealed_broker, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    access_key, secret_key = new_access_key(), new_secret_key()
    _, machine, _ = sealed_broker

    async def scenario(server: BrokerServer, _front: RocketFrontEnd) -> None:
        made = await as_user(server, "root", PutAccessKeyRequest(access_key=access_key, user="alice",
                                                                 secret_key=secret_key))
        assert made.code == Native.SUCCESS, made.remark

    run(sealed_broker, scenario)
    machine.checkpoint()
    index = machine.applied_index()
    machine._take_snapshot(index)  # as before a segment: what a lagging replica gets
    files = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert any(access_key.encode() in data for data in files.values())  # the record is there ...
    assert any(b"access_keys" in data for p, data in files.items() if "snapshots" in p.parts)
    assert not [p for p, data in files.items() if secret_key.encode() in data]  # ... its secret never
    # a replica installing that snapshot holds the key and unseals it with the same cluster secret
    snapshot = machine.snapshot_bytes(index)
    assert snapshot is not None
    lagging = BrokerStateMachine(tmp_path / "lagging", index_slots=64, index_entries=4096)
    try:
        lagging.install_snapshot(index, snapshot)
        row = lagging.access.access_keys.get(access_key)
        assert row is not None and row.user == "alice"
        assert AccessKeySeal(SECRET, "g1").unseal(access_key, "alice", row.sealed) == secret_key
    finally:
        lagging.close()


def test_a_connections_repeated_heartbeat_stops_when_its_key_is_revoked(sealed_broker, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(client_link, "KEEPALIVE_S", 0.02)
    access_key, secret_key = new_access_key(), new_secret_key()

    async def scenario(server: BrokerServer, front: RocketFrontEnd) -> None:
        await as_user(server, "root", PutAccessKeyRequest(access_key=access_key, user="alice",
                                                          secret_key=secret_key))
        alice = Rocket(front, sign=signer(access_key, secret_key))
        beat = await alice.ask(RequestCode.HEART_BEAT, None, heartbeat("c1"))
        assert beat.code == ResponseCode.SUCCESS, beat.remark
        (client,) = front.connections.values()
        keepalive = client._keepalive
        assert keepalive is not None
        await asyncio.sleep(0.1)
        assert not keepalive.done()  # repeating alice's heartbeat
        await as_user(server, "root", RevokeAccessKeyRequest(access_key=access_key))
        await asyncio.wait_for(asyncio.shield(keepalive), 5)  # ... and no longer once her key is gone

    run(sealed_broker, scenario)
