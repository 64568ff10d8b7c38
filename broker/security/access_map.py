"""What every request needs: the one table from each request type -- WebSocket request
codes and admin HTTP routes -- to the (resource, actions) it must be allowed
(``broker.security.authorizer``). ``tests/unit/test_access_map.py`` fails if the server dispatches
a code or serves an admin route that has no row here.

    request                          needs (any one action of a row suffices; every row)
    -------------------------------  -----------------------------------------------------
    SEND_MESSAGE, SEND_BATCH         pub on each message's topic
    PULL_MESSAGE                     sub on the topic; a group's %RETRY%/%DLQ% topic: sub
                                     on the group
    SEARCH_OFFSET                    sub|get on the topic
    QUERY_MESSAGE, VIEW_MESSAGE_BY_ID  get on the cluster (a key or id spans every topic)
    COMMIT_OFFSET, QUERY_OFFSET      sub on the group, sub on the topic
    RESET_OFFSET                     update on the group, sub|get on the topic
    LOCK/UNLOCK_BATCH_MQ             sub on the group, sub on the topic
    POP_MESSAGE, ACK_MESSAGE,        sub on the group, sub on the topic
    CHANGE_INVISIBLE_DURATION,
    NACK_MESSAGE
    UPDATE_GROUP_CONFIG              update on the group
    HEARTBEAT                        sub on each consumer group and each topic it names;
                                     pub on the producer group (at most 64 groups of 256
                                     topics: INVALID_ARGUMENT before any check)
    UNREGISTER_CLIENT                sub on the group (if named); only this connection's
                                     registrations go (broker.clients.registry)
    GET_CONSUMER_LIST                sub on the group
    CONSUMER_SEND_MSG_BACK           sub on the group, sub on the topic of the message sent
                                     back (read at its position)
    END_TRANSACTION                  pub on the pending half's topic and on its producer group
                                     (no half pending there: update on the cluster); refused
                                     with one remark whatever is at the position
    GET_ROUTE                        pub|sub|get on the topic
    CREATE_TOPIC / DELETE_TOPIC      create / delete on the topic; deleting a group's
                                     %RETRY%/%DLQ% topic: update on the group
    GET_TOPICS                       list on the cluster
    AUTH_START, AUTH_FINISH          nothing (they are how one authenticates)
    PUT_USER, DELETE_USER, GRANT,    a super user (SUPER_ONLY); PUT_USER of one's own name
    REVOKE, LIST_USERS, LIST_POLICIES  without ``super`` is a password change, allowed
    PUT/REVOKE_ACCESS_KEY,           a super user (SUPER_ONLY): RocketMQ access keys act as
    LIST_ACCESS_KEYS                 their user (broker.security.access_keys)
    HTTP GET /admin/topics, /admin/cluster, /admin/members   get on the cluster
    HTTP GET /admin/groups           list on the cluster
    HTTP GET /admin/groups/{g}/offsets, /admin/groups/{g}/in-flight  get on the group
    HTTP GET /admin/verify/{index}   get on the cluster
    HTTP POST /admin/leader/transfer, /admin/members, /admin/verify   update on the cluster
    HTTP POST /admin/topics, GET /admin/messages   as CREATE_TOPIC, QUERY/VIEW (through the
                                     frame handlers: their rows above)
    HTTP /healthz, /status, /metrics, /auth/...    open (no message data; see docs/SECURITY.md)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Protocol

from broker.clients.registry import check_subscriptions
from broker.security.authorizer import Need
from protocol.acl import Action, ResourceType
from protocol.consumer import ConsumerListRequest, HeartbeatRequest, UnregisterRequest
from protocol.deferred import EndTransactionRequest, SendBackRequest
from protocol.message_format import peek_topic
from protocol.names import DLQ_PREFIX, RETRY_PREFIX
from protocol.offset import CommitOffsetRequest, LockQueuesRequest, QueryOffsetRequest
from protocol.pop import AckRequest, ChangeInvisibleRequest, GroupConfigRequest, NackRequest, PopRequest
from protocol.pull import PullRequest
from protocol.query import ResetOffsetRequest, SearchOffsetRequest
from protocol.remoting import Frame, FrameError, RequestCode, ResponseCode
from protocol.send import SendBatchRequest, SendMessageRequest
from protocol.topic import CreateTopicRequest, DeleteTopicRequest, GetRouteRequest

__all__ = ["ACCESS", "HTTP_ACCESS", "OPEN", "SUPER_ONLY", "Positions", "needs"]


class Positions(Protocol):
    """What a request naming a CommitLog position needs looked up."""

    def topic_at(self, position: int) -> str | None:
        """The topic of the message stored at ``position`` (None: there is none)."""

    def half_at(self, position: int) -> tuple[str, str] | None:
        """(topic, producer group) of the transaction half pending at ``position``."""


NeedsOf = Callable[[Frame, Positions], Sequence[Need]]

PUB, SUB, CREATE, UPDATE, DELETE, GET, LIST = (Action.PUB,), (Action.SUB,), (Action.CREATE,), \
    (Action.UPDATE,), (Action.DELETE,), (Action.GET,), (Action.LIST,)
TOPIC, GROUP, CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER

#: Requests anyone may send: they are how one authenticates.
OPEN = frozenset({RequestCode.AUTH_START, RequestCode.AUTH_FINISH})
#: Requests only a super user may send (user and policy management).
SUPER_ONLY = frozenset({RequestCode.PUT_USER, RequestCode.DELETE_USER, RequestCode.LIST_USERS,
                        RequestCode.GRANT, RequestCode.REVOKE, RequestCode.LIST_POLICIES,
                        RequestCode.PUT_ACCESS_KEY, RequestCode.REVOKE_ACCESS_KEY,
                        RequestCode.LIST_ACCESS_KEYS})


def _topic(name: str, actions: tuple[Action, ...]) -> Need:
    """A topic's need; a group's retry or dead-letter topic is that group's."""
    for prefix in (RETRY_PREFIX, DLQ_PREFIX):
        if name.startswith(prefix):
            return Need(GROUP, name[len(prefix):], actions)
    return Need(TOPIC, name, actions)


def _send(frame: Frame, _: Positions) -> Sequence[Need]:
    if frame.code == RequestCode.SEND_MESSAGE:
        records: Sequence[bytes] = (SendMessageRequest.from_frame(frame).message,)
    else:
        records = SendBatchRequest.from_frame(frame).records
    topics = {peek_topic(r) for r in records}
    if None in topics:
        raise FrameError(ResponseCode.INVALID_ARGUMENT, "a record of the request is not one (no topic)")
    return [Need(TOPIC, t, PUB) for t in sorted(topics)]  # type: ignore[arg-type]


def _group_and_topic(request: type[CommitOffsetRequest] | type[QueryOffsetRequest] | type[LockQueuesRequest]
                     | type[PopRequest] | type[AckRequest]) -> NeedsOf:
    def needs_of(frame: Frame, _: Positions) -> Sequence[Need]:
        req = request.from_frame(frame)
        return [Need(GROUP, req.group, SUB), _topic(req.topic, SUB)]
    return needs_of


def _deleted(name: str) -> Need:
    """DELETE_TOPIC's need: a group's retry or dead-letter topic is the group's (update)."""
    need = _topic(name, DELETE)
    return Need(GROUP, need.name, UPDATE) if need.kind == GROUP else need


def _heartbeat(frame: Frame, _: Positions) -> Sequence[Need]:
    req = HeartbeatRequest.from_frame(frame)
    try:  # bounded before its needs are listed (its handler refuses it the same way)
        check_subscriptions(req.subscriptions or {})
    except ValueError as e:
        raise FrameError(ResponseCode.INVALID_ARGUMENT, str(e)) from None
    out = [Need(GROUP, req.producer_group, PUB)] if req.producer_group else []
    for group, topics in sorted((req.subscriptions or {}).items()):
        out.append(Need(GROUP, group, SUB))
        out.extend(_topic(t, SUB) for t in topics)
    return out


def _reset(frame: Frame, _: Positions) -> Sequence[Need]:
    req = ResetOffsetRequest.from_frame(frame)
    return [Need(GROUP, req.group, UPDATE), _topic(req.topic, (Action.SUB, Action.GET))]


def _unregister(frame: Frame, _: Positions) -> Sequence[Need]:
    group = UnregisterRequest.from_frame(frame).group
    return [Need(GROUP, group, SUB)] if group else []


def _send_back(frame: Frame, positions: Positions) -> Sequence[Need]:
    req = SendBackRequest.from_frame(frame)
    topic = positions.topic_at(req.position)
    return [Need(GROUP, req.group, SUB), *([_topic(topic, SUB)] if topic is not None else [])]


def _end_transaction(frame: Frame, positions: Positions) -> Sequence[Need]:
    half = positions.half_at(EndTransactionRequest.from_frame(frame).position)
    if half is None:  # resolved already, or never a half: only an operator learns which
        return [Need(CLUSTER, "", UPDATE)]
    topic, group = half
    return [_topic(topic, PUB), Need(GROUP, group, PUB)]


def _fixed(*needs: Need) -> NeedsOf:
    return lambda _frame, _topic_at: needs


def _nothing(frame: Frame, _: Positions) -> Sequence[Need]:
    return ()


ACCESS: Mapping[RequestCode, NeedsOf] = MappingProxyType({
    RequestCode.SEND_MESSAGE: _send,
    RequestCode.SEND_BATCH: _send,
    RequestCode.PULL_MESSAGE: lambda f, _: [_topic(PullRequest.from_frame(f).topic, SUB)],
    RequestCode.SEARCH_OFFSET: lambda f, _: [_topic(SearchOffsetRequest.from_frame(f).topic,
                                                    (Action.SUB, Action.GET))],
    RequestCode.QUERY_MESSAGE: _fixed(Need(CLUSTER, "", GET)),
    RequestCode.VIEW_MESSAGE_BY_ID: _fixed(Need(CLUSTER, "", GET)),
    RequestCode.COMMIT_OFFSET: _group_and_topic(CommitOffsetRequest),
    RequestCode.QUERY_OFFSET: _group_and_topic(QueryOffsetRequest),
    RequestCode.RESET_OFFSET: _reset,
    RequestCode.LOCK_BATCH_MQ: _group_and_topic(LockQueuesRequest),
    RequestCode.UNLOCK_BATCH_MQ: _group_and_topic(LockQueuesRequest),
    RequestCode.POP_MESSAGE: _group_and_topic(PopRequest),
    RequestCode.ACK_MESSAGE: _group_and_topic(AckRequest),
    RequestCode.CHANGE_INVISIBLE_DURATION: _group_and_topic(ChangeInvisibleRequest),
    RequestCode.NACK_MESSAGE: _group_and_topic(NackRequest),
    RequestCode.UPDATE_GROUP_CONFIG: lambda f, _: [
        Need(GROUP, GroupConfigRequest.from_frame(f).group, UPDATE)],
    RequestCode.HEARTBEAT: _heartbeat,
    RequestCode.UNREGISTER_CLIENT: _unregister,
    RequestCode.GET_CONSUMER_LIST: lambda f, _: [Need(GROUP, ConsumerListRequest.from_frame(f).group, SUB)],
    RequestCode.CONSUMER_SEND_MSG_BACK: _send_back,
    RequestCode.END_TRANSACTION: _end_transaction,
    RequestCode.GET_ROUTE: lambda f, _: [_topic(GetRouteRequest.from_frame(f).topic,
                                                (Action.PUB, Action.SUB, Action.GET))],
    RequestCode.CREATE_TOPIC: lambda f, _: [Need(TOPIC, CreateTopicRequest.from_frame(f).topic, CREATE)],
    RequestCode.DELETE_TOPIC: lambda f, _: [_deleted(DeleteTopicRequest.from_frame(f).topic)],
    RequestCode.GET_TOPICS: _fixed(Need(CLUSTER, "", LIST)),
    **{code: _nothing for code in OPEN | SUPER_ONLY},  # SUPER_ONLY: checked before the table
})

#: Admin HTTP routes (method, aiohttp's canonical path) -> what they need, given the
#: route's match info. Routes that go through the frame handlers need only to be
#: authenticated here: the frame's row above is checked there.
HTTP_ACCESS: Mapping[tuple[str, str], Callable[[Mapping[str, str]], Sequence[Need]]] = MappingProxyType({
    ("GET", "/admin/topics"): lambda _m: [Need(CLUSTER, "", GET)],
    ("POST", "/admin/topics"): lambda _m: [],  # CREATE_TOPIC's row
    ("GET", "/admin/cluster"): lambda _m: [Need(CLUSTER, "", GET)],
    ("GET", "/admin/groups"): lambda _m: [Need(CLUSTER, "", LIST)],
    ("GET", "/admin/groups/{group}/offsets"): lambda m: [Need(GROUP, m["group"], GET)],
    ("GET", "/admin/groups/{group}/in-flight"): lambda m: [Need(GROUP, m["group"], GET)],
    ("GET", "/admin/messages"): lambda _m: [],  # QUERY_MESSAGE's or VIEW_MESSAGE_BY_ID's row
    ("POST", "/admin/leader/transfer"): lambda _m: [Need(CLUSTER, "", UPDATE)],
    ("GET", "/admin/members"): lambda _m: [Need(CLUSTER, "", GET)],
    ("POST", "/admin/members"): lambda _m: [Need(CLUSTER, "", UPDATE)],
    ("POST", "/admin/verify"): lambda _m: [Need(CLUSTER, "", UPDATE)],  # proposes a marker
    ("GET", "/admin/verify/{index}"): lambda _m: [Need(CLUSTER, "", GET)],
})


def needs(frame: Frame, positions: Positions) -> Sequence[Need]:
    """What ``frame`` needs (KeyError for a code without a row; FrameError if its contents
    cannot be read -- the handler would refuse it the same way)."""
    return ACCESS[frame.code](frame, positions)
