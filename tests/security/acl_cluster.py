"""Broker processes with ACLs on for the security tests: a group whose bootstrap super user
is ``root``, raw WebSocket clients that authenticate by SCRAM by hand (so a test can replay
or break an exchange), and one sample request per request type with the grants it needs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from client import Admin, Credentials
from client.credentials import scram_record
from protocol.access_keys import ListAccessKeysRequest, PutAccessKeyRequest, RevokeAccessKeyRequest
from protocol.acl import (
    DeleteUserRequest,
    GrantRequest,
    ListPoliciesRequest,
    ListUsersRequest,
    PutUserRequest,
    RevokeRequest,
)
from protocol.consumer import ConsumerListRequest, HeartbeatRequest, UnregisterRequest
from protocol.deferred import EndTransactionRequest, SendBackRequest
from protocol.message_format import Message, encode_message
from protocol.offset import CommitOffsetRequest, LockQueuesRequest, QueryOffsetRequest, UnlockQueuesRequest
from protocol.pop import AckRequest, ChangeInvisibleRequest, GroupConfigRequest, NackRequest, PopRequest
from protocol.pull import PullRequest
from protocol.query import QueryMessageRequest, ResetOffsetRequest, SearchOffsetRequest, ViewMessageRequest
from protocol.remoting import Frame, RequestCode, ResponseCode
from protocol.send import SendBatchRequest, SendMessageRequest
from protocol.tls import ClientTls
from protocol.topic import CreateTopicRequest, DeleteTopicRequest, GetRouteRequest, GetTopicsRequest
from protocol.wire import Request
from raftmq.local_group import LocalGroup
from tests.support.broker_client import FrameClient, client_session
from tests.support.broker_group import running_brokers, servers
from tests.support.procs import wait_until

__all__ = ["ROOT", "Sample", "acl_brokers", "leader_address", "login", "prepared_acl_brokers", "run",
           "samples", "session_call"]

ROOT = Credentials("root", "root-password")


@contextmanager
def acl_brokers(base: Path, tls: bool = False, **broker: Any) -> Iterator[LocalGroup]:
    """Three broker processes with ``acl = true`` and ``root`` bootstrapped (``tls``: their
    client ports serve TLS, clients need ``group.client_tls``); waits until root can list
    topics. Stopped by PID on exit."""
    base.mkdir(parents=True, exist_ok=True)
    record = scram_record(ROOT.password)
    (base / "root.scram").write_text(json.dumps({
        "user": ROOT.user, "salt": record.salt.hex(), "iterations": record.iterations,
        "stored_key": record.stored_key.hex(), "server_key": record.server_key.hex()}))
    with running_brokers(base, tls=tls, acl=True, acl_bootstrap_file="root.scram", **broker) as group:
        admin = Admin(servers=servers(group), credentials=ROOT, tls=group.client_tls or False)
        try:
            wait_until(lambda: admin.topics() is not None, 20, what="the bootstrap super user")
        finally:
            admin.close()
        yield group


Grants = Sequence[tuple[str, Sequence[str]]]  # (resource, actions) of one user


@contextmanager
def prepared_acl_brokers(base: Path, topics: Sequence[str],
                         users: Sequence[tuple[Credentials, Grants]]) -> Iterator[LocalGroup]:
    """``acl_brokers`` with ``topics`` created (one queue each) and each user made, with its
    grants, by root."""
    with acl_brokers(base) as group:
        admin = Admin(servers=servers(group), credentials=ROOT)
        try:
            for topic in topics:
                admin.create_topic(topic, queues=1)
            for who, grants in users:
                admin.put_user(who.user, who.password)
                for resource, actions in grants:
                    admin.grant(who.user, resource, list(actions))
        finally:
            admin.close()
        yield group


def leader_address(group: LocalGroup) -> str:
    name = group.wait_leader(timeout=30)
    return group.nodes[name].http


async def login(conn: FrameClient, credentials: Credentials) -> tuple[str, str, Frame]:
    """A SCRAM exchange by hand: (client-first, client-final, the AUTH_FINISH answer)."""
    return await conn.login(credentials.user, credentials.password)


async def session_call(address: str, credentials: Credentials | None, requests: list[Request],
                       tls: ClientTls | None = None) -> list[Frame]:
    """One connection to ``address`` (wss:// with ``tls``; authenticated unless
    ``credentials`` is None): each request's answer."""
    async with client_session(tls) as session:
        conn = await FrameClient.connect(session, address, tls=tls is not None)
        try:
            if credentials is not None:
                _, _, answer = await login(conn, credentials)
                assert answer.code == ResponseCode.SUCCESS, answer.remark
            out = []
            for i, request in enumerate(requests):
                out.append(await conn.raw(request.to_frame(1000 + i).encode(), timeout=15))
            return out
        finally:
            await conn.close()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@dataclass(frozen=True)
class Sample:
    """A request of one type, what a user must be granted for it, and the need its refusal
    names (``protocol.acl`` texts)."""

    request: Request
    grants: tuple[tuple[str, str], ...]  # (resource, comma-separated actions)
    refused_need: str  # "pub on topic:orders", or "only super users"


def _message(topic: str) -> bytes:
    return encode_message(Message(topic=topic, body=b"probe"))


def samples(position: int) -> dict[RequestCode, Sample]:
    """One sample per request type a client sends; ``position`` is a stored message's of
    topic ``orders`` (send-backs and transactions name one)."""
    o, g = ("topic:orders", "pub,sub,get"), ("group:g1", "sub,update")
    return {
        RequestCode.SEND_MESSAGE: Sample(SendMessageRequest(message=_message("orders")), (o,),
                                         "pub on topic:orders"),
        RequestCode.SEND_BATCH: Sample(SendBatchRequest(records=(_message("orders"),)), (o,),
                                       "pub on topic:orders"),
        RequestCode.PULL_MESSAGE: Sample(PullRequest(topic="orders", queue_id=0, offset=0), (o,),
                                         "sub on topic:orders"),
        RequestCode.POP_MESSAGE: Sample(PopRequest(group="g1", topic="orders"), (o, g), "sub on group:g1"),
        RequestCode.ACK_MESSAGE: Sample(
            AckRequest(group="g1", topic="orders", queue_id=0, offset=0, delivery=1),
            (o, g), "sub on group:g1"),
        RequestCode.CHANGE_INVISIBLE_DURATION: Sample(
            ChangeInvisibleRequest(group="g1", topic="orders", queue_id=0, offset=0, delivery=1,
                                   invisible_ms=5_000), (o, g), "sub on group:g1"),
        RequestCode.NACK_MESSAGE: Sample(
            NackRequest(group="g1", topic="orders", queue_id=0, offset=0, delivery=1),
            (o, g), "sub on group:g1"),
        RequestCode.UPDATE_GROUP_CONFIG: Sample(
            GroupConfigRequest(group="g1", backoff_ms=(1_000,), max_deliveries=3),
            (g,), "update on group:g1"),
        RequestCode.SEARCH_OFFSET: Sample(SearchOffsetRequest(topic="orders", queue_id=0), (o,),
                                          "sub|get on topic:orders"),
        RequestCode.QUERY_MESSAGE: Sample(QueryMessageRequest(key="k"), (("cluster", "get"),),
                                          "get on cluster"),
        RequestCode.VIEW_MESSAGE_BY_ID: Sample(ViewMessageRequest(msg_id="00" * 16), (("cluster", "get"),),
                                               "get on cluster"),
        RequestCode.COMMIT_OFFSET: Sample(CommitOffsetRequest(group="g1", topic="orders", queue_id=0,
                                                              offset=0), (o, g), "sub on group:g1"),
        RequestCode.QUERY_OFFSET: Sample(QueryOffsetRequest(group="g1", topic="orders", queue_id=0),
                                         (o, g), "sub on group:g1"),
        RequestCode.RESET_OFFSET: Sample(ResetOffsetRequest(group="g1", topic="orders", timestamp=0), (o, g),
                                         "update on group:g1"),
        RequestCode.LOCK_BATCH_MQ: Sample(LockQueuesRequest(group="g1", client_id="c1", topic="orders",
                                                            queues=(0,)), (o, g), "sub on group:g1"),
        RequestCode.UNLOCK_BATCH_MQ: Sample(UnlockQueuesRequest(group="g1", client_id="c1", topic="orders",
                                                                queues=(0,)), (o, g), "sub on group:g1"),
        RequestCode.HEARTBEAT: Sample(HeartbeatRequest(client_id="c1", subscriptions={"g1": ("orders",)}),
                                      (o, g), "sub on group:g1"),
        RequestCode.UNREGISTER_CLIENT: Sample(UnregisterRequest(client_id="c1", group="g1"), (g,),
                                              "sub on group:g1"),
        RequestCode.GET_CONSUMER_LIST: Sample(ConsumerListRequest(group="g1"), (g,), "sub on group:g1"),
        RequestCode.CONSUMER_SEND_MSG_BACK: Sample(SendBackRequest(group="g1", position=position), (o, g),
                                                   "sub on group:g1"),
        RequestCode.END_TRANSACTION: Sample(EndTransactionRequest(position=position, commit=False),
                                            (o, ("cluster", "update")),  # no half there: operators only
                                            "pending half's producer group"),
        RequestCode.GET_ROUTE: Sample(GetRouteRequest(topic="orders"), (o,), "pub|sub|get on topic:orders"),
        RequestCode.CREATE_TOPIC: Sample(CreateTopicRequest(topic="made-by-user"),
                                         (("topic:made-by-user", "create"),), "create on topic:made-by-user"),
        RequestCode.DELETE_TOPIC: Sample(DeleteTopicRequest(topic="made-by-user"),
                                         (("topic:made-by-user", "delete"),), "delete on topic:made-by-user"),
        RequestCode.GET_TOPICS: Sample(GetTopicsRequest(), (("cluster", "list"),), "list on cluster"),
        RequestCode.PUT_USER: Sample(PutUserRequest(user="eve", super=True, salt=b"s" * 16, iterations=4096,
                                                    stored_key=b"k" * 32, server_key=b"v" * 32), (),
                                     "only super users"),
        RequestCode.DELETE_USER: Sample(DeleteUserRequest(user="root"), (), "only super users"),
        RequestCode.LIST_USERS: Sample(ListUsersRequest(), (), "only super users"),
        RequestCode.GRANT: Sample(GrantRequest(user="mallory", resource="cluster", actions=()), (),
                                  "only super users"),
        RequestCode.REVOKE: Sample(RevokeRequest(user="alice", resource="topic:*", actions=()), (),
                                   "only super users"),
        RequestCode.LIST_POLICIES: Sample(ListPoliciesRequest(), (), "only super users"),
        RequestCode.PUT_ACCESS_KEY: Sample(PutAccessKeyRequest(access_key="RMQ-mallory-key", user="mallory",
                                                               secret_key="m" * 40), (), "only super users"),
        RequestCode.REVOKE_ACCESS_KEY: Sample(RevokeAccessKeyRequest(access_key="RMQ-alice-key"), (),
                                              "only super users"),
        RequestCode.LIST_ACCESS_KEYS: Sample(ListAccessKeysRequest(), (), "only super users"),
    }
