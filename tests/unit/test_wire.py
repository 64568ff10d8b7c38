"""Typed frame contents (protocol/wire.py and its request families).

Three promises: every class round-trips through a frame's bytes (hypothesis, strategies
made from the classes' own types); every class encodes to exactly the frame the
hand-built dicts of the version before gave (``LEGACY``: old and new peers interoperate);
and decoding refuses what is wrong with FrameError(INVALID_ARGUMENT) naming the field.
"""

from __future__ import annotations

from typing import Any

import msgpack
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import access_keys, acl, consumer, deferred, offset, pop, query, topic
from protocol.catalog import CATALOG, UNSERVED
from protocol.pull import LeaderlessMark, PullRequest, PullResponse, PullRow
from protocol.remoting import Frame, FrameError, RequestCode, ResponseCode, decode_frame
from protocol.send import SendBatchRequest, SendBatchResponse, SendMessageRequest, SendRow, WriteResponse
from protocol.wire import EmptyResponse, NotLeaderResponse, Request, Response

OK, NOT_FOUND, MOVED = ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_OFFSET_MOVED
MSG = b"\x02stored record bytes"
REQUEST = Frame.request(RequestCode.HEARTBEAT, 7)  # what responses below answer
ROUTE = {"topic": "t", "groups": [{"group": "g1", "queues": 8, "perm": 6, "term": 3, "leader": "h:1",
                                   "replicas": {"n1": "h:1", "n2": "h:2"}}]}


def test_every_served_request_code_has_its_classes() -> None:
    assert set(CATALOG) | UNSERVED == set(RequestCode) and not set(CATALOG) & UNSERVED
    for code, (request, _) in CATALOG.items():
        assert code == request.CODE


# -- the bytes of the version before ------------------------------------------------------
def _request(code: int, ext: dict[str, Any] | None = None, body: bytes = b"", oneway: bool = False) -> Frame:
    return Frame.request(code, 7, ext, body, oneway)


def _reply(code: int = OK, ext: dict[str, Any] | None = None, body: bytes = b"") -> Frame:
    return REQUEST.response(code, ext, body)


#: (new, the frame the hand-built code of the version before sent for the same contents)
LEGACY: list[tuple[Request | tuple[Response, int], Frame]] = [
    (SendMessageRequest(message=MSG), _request(10, body=MSG)),
    (SendBatchRequest(records=(MSG, MSG + b"2")), _request(11, body=msgpack.packb([MSG, MSG + b"2"]))),
    ((WriteResponse(queue_id=3, queue_offset=41, position=8192, duplicate=False), OK),
     _reply(ext={"queueId": 3, "queueOffset": 41, "position": 8192, "duplicate": False})),
    ((SendBatchResponse(rows=(SendRow(0, 3, 41, "", 8192), SendRow(16, -1, -1, "gap", -1))), OK),
     _reply(body=msgpack.packb([[0, 3, 41, "", 8192], [16, -1, -1, "gap", -1]]))),
    (PullRequest(topic="t", queue_id=3, offset=40, max_msgs=32, suspend_ms=15_000),
     _request(12, {"topic": "t", "queueId": 3, "offset": 40, "maxMsgs": 32, "suspendMs": 15_000})),
    (PullRequest(topic="t", queue_id=3, offset=40, max_msgs=32, suspend_ms=0, tag_hashes=(-5, 9),
                 sql="a > 1"),
     _request(12, {"topic": "t", "queueId": 3, "offset": 40, "maxMsgs": 32, "suspendMs": 0,
                   "tagHashes": [-5, 9], "sql": "a > 1"})),
    ((PullResponse(next_offset=42, max_offset=50, leaderless=False,
                   rows=(PullRow(40, 8192, 1_795_000_000_123, MSG),
                         PullRow(41, 8300, 1_795_000_000_123, MSG))),
      OK),
     _reply(ext={"nextOffset": 42, "maxOffset": 50, "leaderless": False},
            body=msgpack.packb([[40, 8192, 1_795_000_000_123, MSG, None],
                                [41, 8300, 1_795_000_000_123, MSG, None]]))),
    ((PullResponse(next_offset=40, leaderless=True), NOT_FOUND),
     _reply(NOT_FOUND, {"nextOffset": 40, "leaderless": True})),
    ((PullResponse(next_offset=12, min_offset=12), MOVED),
     _reply(MOVED, {"nextOffset": 12, "minOffset": 12})),
    (query.QueryMessageRequest(key="order-1", begin_ms=0, end_ms=2**62, max_results=32),
     _request(13, {"key": "order-1", "beginMs": 0, "endMs": 2**62, "maxResults": 32})),
    (query.ViewMessageRequest(msg_id="00ff"), _request(14, {"msgId": "00ff"})),
    ((query.QueryResponse(rows=(query.QueryRow(8192, 1_795_000_000_123, MSG),)), OK),
     _reply(body=msgpack.packb([[8192, 1_795_000_000_123, MSG]]))),
    (query.SearchOffsetRequest(topic="t", queue_id=1), _request(16, {"topic": "t", "queueId": 1})),
    (query.SearchOffsetRequest(topic="t", queue_id=1, timestamp=5), _request(16, {"topic": "t", "queueId": 1,
                                                                           "timestamp": 5})),
    ((query.SearchOffsetResponse(min_offset=0, max_offset=9), OK),
     _reply(ext={"minOffset": 0, "maxOffset": 9})),
    ((query.SearchOffsetResponse(min_offset=0, max_offset=9, offset=4), OK),
     _reply(ext={"minOffset": 0, "maxOffset": 9, "offset": 4})),
    (offset.CommitOffsetRequest(group="g", topic="t", queue_id=1, offset=10),
     _request(20, {"group": "g", "topic": "t", "queueId": 1, "offset": 10})),
    (offset.QueryOffsetRequest(group="g", topic="t", queue_id=1), _request(21, {"group": "g", "topic": "t",
                                                                         "queueId": 1})),
    ((offset.QueryOffsetResponse(offset=-1), OK), _reply(ext={"offset": -1})),
    (query.ResetOffsetRequest(group="g", topic="t", timestamp=5), _request(22, {"group": "g", "topic": "t",
                                                                          "timestamp": 5})),
    ((query.ResetOffsetResponse(offsets={0: 3, 1: 4}), OK), _reply(body=msgpack.packb({0: 3, 1: 4}))),
    (consumer.HeartbeatRequest(client_id="c1", subscriptions={"g": ("t", "%RETRY%g")}),
     _request(30, {"clientId": "c1"}, msgpack.packb({"g": ["t", "%RETRY%g"]}))),
    (consumer.HeartbeatRequest(client_id="c1", producer_group="pg"), _request(30, {"clientId": "c1",
                                                                          "producerGroup": "pg"})),
    ((EmptyResponse(), OK), _reply()),
    (consumer.UnregisterRequest(client_id="c1", group="g"), _request(31, {"clientId": "c1", "group": "g"})),
    (consumer.ConsumerListRequest(group="g"), _request(32, {"group": "g"})),
    ((consumer.ConsumerListResponse(client_ids=("a", "b")), OK), _reply(body=msgpack.packb(["a", "b"]))),
    (deferred.SendBackRequest(group="g", position=8192, max_reconsume_times=16),
     _request(33, {"group": "g", "position": 8192, "maxReconsumeTimes": 16})),
    ((deferred.SendBackResponse(queue_id=0, queue_offset=-1, position=9000, duplicate=False, topic="%RETRY%g",
                       reconsume_times=1), OK),
     _reply(ext={"queueId": 0, "queueOffset": -1, "position": 9000, "duplicate": False, "topic": "%RETRY%g",
                 "reconsumeTimes": 1})),
    (offset.LockQueuesRequest(group="g", client_id="c1", topic="t", queues=(0, 2)),
     _request(34, {"group": "g", "clientId": "c1", "topic": "t", "queues": [0, 2]})),
    (offset.UnlockQueuesRequest(group="g", client_id="c1", topic="t", queues=(2,)),
     _request(35, {"group": "g", "clientId": "c1", "topic": "t", "queues": [2]})),
    ((offset.LockQueuesResponse(queue_ids=(0,)), OK), _reply(body=msgpack.packb([0]))),
    (topic.GetRouteRequest(topic="t"), _request(40, {"topic": "t"})),
    ((topic.RouteResponse(route=topic.TopicRouteData("t", (
        topic.GroupRouteData(group="g1", queues=8, perm=6, term=3, leader="h:1",
                             replicas={"n1": "h:1", "n2": "h:2"}),))), OK),
     _reply(body=msgpack.packb(ROUTE))),
    (topic.CreateTopicRequest(topic="t", queues=8, perm=6),
     _request(50, {"topic": "t", "queues": 8, "perm": 6})),
    (topic.DeleteTopicRequest(topic="t"), _request(51, {"topic": "t"})),
    (topic.GetTopicsRequest(), _request(52)),
    ((topic.TopicsResponse(topics={"a": topic.TopicQueues(8, 6), "b": topic.TopicQueues(1, 4)}), OK),
     _reply(body=msgpack.packb({"a": [8, 6], "b": [1, 4]}))),
    (deferred.EndTransactionRequest(position=8192, commit=True),
     _request(60, {"position": 8192, "commit": True})),
    ((deferred.EndTransactionResponse(outcome="committed"), OK), _reply(ext={"outcome": "committed"})),
    (deferred.CheckTransactionRequest(position=8192, group="pg", message=MSG),
     _request(61, {"position": 8192, "group": "pg"}, MSG, oneway=True)),
    (consumer.NotifyConsumersChanged(group="g"), _request(62, {"group": "g"}, oneway=True)),
    # users, policies and SCRAM (protocol.acl): new in issue 15, pinned as first sent
    (acl.AuthStartRequest(mechanism="SCRAM-SHA-256", message="n,,n=alice,r=abc"),
     _request(70, {"mechanism": "SCRAM-SHA-256", "message": "n,,n=alice,r=abc"})),
    (acl.AuthFinishRequest(message="c=biws,r=abcdef,p=xyz"),
     _request(71, {"message": "c=biws,r=abcdef,p=xyz"})),
    ((acl.AuthResponse(message="v=sig", user="alice"), OK),
     _reply(ext={"message": "v=sig", "user": "alice"})),
    (acl.PutUserRequest(user="alice", super=False, salt=b"s" * 16, iterations=4096, stored_key=b"k" * 32,
                    server_key=b"v" * 32),
     _request(72, {"user": "alice", "super": False, "salt": b"s" * 16, "iterations": 4096,
                   "storedKey": b"k" * 32, "serverKey": b"v" * 32})),
    (acl.DeleteUserRequest(user="alice"), _request(73, {"user": "alice"})),
    (acl.ListUsersRequest(), _request(74)),
    ((acl.UsersResponse(users=(acl.UserRow("alice", False),)), OK),
     _reply(body=msgpack.packb([["alice", False]]))),
    (acl.GrantRequest(user="alice", resource="topic:orders*", actions=(acl.Action.PUB, acl.Action.SUB)),
     _request(75, {"user": "alice", "resource": "topic:orders*", "actions": ["pub", "sub"],
                   "decision": "allow", "source": ""})),
    (acl.RevokeRequest(user="alice", resource="cluster", actions=(), decision=acl.Decision.DENY,
                       source="10.0.0.0/8"),
     _request(76, {"user": "alice", "resource": "cluster", "actions": [], "decision": "deny",
                   "source": "10.0.0.0/8"})),
    (acl.ListPoliciesRequest(user="alice"), _request(77, {"user": "alice"})),
    ((acl.PoliciesResponse(policies=(acl.PolicyRow("alice", "topic:*", "allow", "", ("get", "pub")),)), OK),
     _reply(body=msgpack.packb([["alice", "topic:*", "allow", "", ["get", "pub"]]]))),
    # RocketMQ access keys (issue 27: new in this version; the bytes are the layout's)
    (access_keys.PutAccessKeyRequest(access_key="RMQ01234", user="alice", secret_key="s" * 43),
     _request(78, {"accessKey": "RMQ01234", "user": "alice", "secretKey": "s" * 43})),
    (access_keys.RevokeAccessKeyRequest(access_key="RMQ01234"), _request(79, {"accessKey": "RMQ01234"})),
    (access_keys.ListAccessKeysRequest(user="alice"), _request(80, {"user": "alice"})),
    ((access_keys.AccessKeysResponse(access_keys=(access_keys.AccessKeyRow("RMQ01234", "alice", 5),)), OK),
     _reply(body=msgpack.packb([["RMQ01234", "alice", 5]]))),
    # per-message acknowledgement (issue 29: new in this version; the bytes are the layout's)
    (pop.PopRequest(group="g", topic="t", max_msgs=8, invisible_ms=30_000, wait_ms=5_000),
     _request(36, {"group": "g", "topic": "t", "maxMsgs": 8, "invisibleMs": 30_000, "waitMs": 5_000})),
    ((pop.PopResponse(records=(pop.PoppedRecord(1, PullRow(40, 8192, 5, MSG), (pop.Claim(41, 2),)),)), OK),
     _reply(body=msgpack.packb([[1, [40, 8192, 5, MSG, None], [[41, 2]]]]))),
    (pop.AckRequest(group="g", topic="t", queue_id=1, offset=41, delivery=2),
     _request(37, {"group": "g", "topic": "t", "queueId": 1, "offset": 41, "delivery": 2})),
    (pop.ChangeInvisibleRequest(group="g", topic="t", queue_id=1, offset=41, delivery=2, invisible_ms=9),
     _request(38, {"group": "g", "topic": "t", "queueId": 1, "offset": 41, "delivery": 2, "invisibleMs": 9})),
    (pop.NackRequest(group="g", topic="t", queue_id=1, offset=41, delivery=2),
     _request(39, {"group": "g", "topic": "t", "queueId": 1, "offset": 41, "delivery": 2})),
    ((pop.NackResponse(dead_lettered=False, backoff_ms=5_000), OK),
     _reply(ext={"deadLettered": False, "backoffMs": 5_000})),
    (pop.GroupConfigRequest(group="g", backoff_ms=(1_000, 5_000), max_deliveries=16),
     _request(53, {"group": "g", "backoffMs": [1_000, 5_000], "maxDeliveries": 16})),
    ((NotLeaderResponse(leader="n2", leader_address="h:2"), ResponseCode.NOT_LEADER),
     REQUEST.response(ResponseCode.NOT_LEADER, {"leader": "n2", "leaderAddress": "h:2"})),
    ((NotLeaderResponse(leader=None, leader_address=None), ResponseCode.NOT_LEADER),
     REQUEST.response(ResponseCode.NOT_LEADER, {"leader": None, "leaderAddress": None})),
]


def _frame(new: Request | tuple[Response, int]) -> Frame:
    if isinstance(new, Request):
        return new.to_frame(7, oneway=new.CODE in (RequestCode.CHECK_TRANSACTION,
                                                   RequestCode.NOTIFY_CONSUMER_IDS_CHANGED))
    response, code = new
    return response.reply(REQUEST, code)


def _name(sample: object) -> str:
    return type(sample[0] if isinstance(sample, tuple) else sample).__name__


@pytest.mark.parametrize(("new", "legacy"), LEGACY, ids=_name)
def test_the_same_bytes_as_the_hand_built_frames_before(new: Request | tuple[Response, int],
                                                        legacy: Frame) -> None:
    assert _frame(new).encode() == legacy.encode()
    kind = type(new) if isinstance(new, Request) else type(new[0])
    assert kind.from_frame(legacy) == (new if isinstance(new, Request) else new[0])


def test_every_class_has_a_legacy_sample() -> None:
    sampled = {type(n) if isinstance(n, Request) else type(n[0]) for n, _ in LEGACY}
    catalogued = {c for pair in CATALOG.values() for c in pair if c is not None}
    assert catalogued | {NotLeaderResponse} <= sampled


# -- round trips ----------------------------------------------------------------------------
def _strategy(t: msgspec.inspect.Type, *, body: bool = False) -> st.SearchStrategy[Any]:
    """Values of a msgspec type (what a frame can carry: 64-bit ints, short texts)."""
    i = msgspec.inspect
    if isinstance(t, i.IntType):
        low = t.ge if t.ge is not None else -(2**63)
        high = t.le if t.le is not None else (t.lt - 1 if t.lt is not None else 2**63 - 1)
        return st.integers(low, high)
    if isinstance(t, i.StrType):
        return st.text(min_size=t.min_length or 0, max_size=12)
    if isinstance(t, i.BoolType):
        return st.booleans()
    if isinstance(t, i.BytesType):  # a raw body must not be empty: an empty body is no body
        low = max(t.min_length or 0, 1 if body else 0)
        return st.binary(min_size=low, max_size=max(24, low))
    if isinstance(t, i.NoneType):
        return st.none()
    if isinstance(t, i.EnumType):
        return st.sampled_from(list(t.cls))
    if isinstance(t, i.LiteralType):
        return st.sampled_from(t.values)
    if isinstance(t, i.UnionType):
        return st.one_of(*(_strategy(u) for u in t.types))
    if isinstance(t, i.VarTupleType):
        return st.lists(_strategy(t.item_type), min_size=t.min_length or 0, max_size=4).map(tuple)
    if isinstance(t, i.DictType):
        return st.dictionaries(_strategy(t.key_type), _strategy(t.value_type), max_size=4)
    if isinstance(t, i.StructType):
        return _instances(t)
    raise AssertionError(f"no strategy for {t}")


def _instances(info: msgspec.inspect.StructType) -> st.SearchStrategy[Any]:
    body = getattr(info.cls, "BODY", None)
    return st.builds(info.cls, **{f.name: _strategy(f.type, body=f.name == body) for f in info.fields})


WIRE_CLASSES = sorted({c for pair in CATALOG.values() for c in pair if c is not None}
                      | {NotLeaderResponse, LeaderlessMark}, key=lambda c: c.__name__)


@pytest.mark.parametrize("kind", WIRE_CLASSES, ids=lambda c: c.__name__)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_round_trip_through_the_frame_bytes(kind: type[Request] | type[Response],
                                            data: st.DataObject) -> None:
    value = data.draw(_instances(msgspec.inspect.type_info(kind)))  # type: ignore[arg-type]
    frame = value.to_frame(3) if isinstance(value, Request) else value.reply(REQUEST)
    assert kind.from_frame(decode_frame(frame.encode())) == value


# -- refusals -----------------------------------------------------------------------------
@pytest.mark.parametrize(("frame", "kind", "says"), [
    (_request(12, {"queueId": 1, "offset": 0}), PullRequest, "ext field 'topic' is required"),
    (_request(12, {"topic": "t", "queueId": None, "offset": 0}), PullRequest,
     "ext field 'queueId' is required"),
    (_request(12, {"topic": "t", "queueId": "1", "offset": 0}), PullRequest,
     "ext field 'queueId': expected `int`, got `str`"),
    (_request(12, {"topic": "t", "queueId": True, "offset": 0}), PullRequest,
     "ext field 'queueId': expected `int`, got `bool`"),
    (_request(12, {"topic": "t", "queueId": -1, "offset": 0}), PullRequest,
     "ext field 'queueId': expected `int` >= 0"),
    (_request(12, {"topic": "t", "queueId": 1, "offset": 0, "maxMsgs": 1025}), PullRequest,
     "ext field 'maxMsgs': expected `int` <= 1024"),
    (_request(12, {"topic": "t", "queueId": 1, "offset": 0, "tagHashes": [1, "x"]}), PullRequest,
     "ext field 'tagHashes' at [1]: expected `int`, got `str`"),
    (_request(34, {"group": "g", "clientId": "", "topic": "t", "queues": [1]}), offset.LockQueuesRequest,
     "ext field 'clientId': expected `str` of length >= 1"),
    (_request(34, {"group": "g", "clientId": "c", "topic": "t", "queues": []}), offset.LockQueuesRequest,
     "ext field 'queues': expected `array` of length >= 1"),
    (_request(34, {"group": "g", "clientId": "c", "topic": "t", "queues": [1024]}), offset.LockQueuesRequest,
     "ext field 'queues' at [0]: expected `int` <= 1023"),
    (_request(50, {"topic": "t", "perm": 5}), topic.CreateTopicRequest,
     "ext field 'perm': invalid enum value 5"),
    (_request(10), SendMessageRequest, "the body (message) is required"),
    (_request(11, body=b"\x01"), SendBatchRequest, "the body (records) is malformed: expected `array`"),
    (_request(11, body=msgpack.packb([b"a", "b"])), SendBatchRequest,
     "the body (records) is malformed: expected `bytes`, got `str` - at `$[1]`"),
    (_request(30, {"clientId": "c"}, body=b"\x01"), consumer.HeartbeatRequest,
     "the body (subscriptions) is malformed"),
])
def test_a_wrong_field_is_refused_naming_it(frame: Frame, kind: type[Request], says: str) -> None:
    with pytest.raises(FrameError) as caught:
        kind.from_frame(frame)
    assert caught.value.code is ResponseCode.INVALID_ARGUMENT
    assert str(caught.value).startswith(says), str(caught.value)
    reply = caught.value.response()  # the broker answers it as such, to the same opaque
    assert reply is not None and reply.opaque == 7 and reply.code == ResponseCode.INVALID_ARGUMENT


def test_nil_counts_as_absent_and_unknown_keys_are_ignored() -> None:
    req = PullRequest.from_frame(_request(12, {"topic": "t", "queueId": 1, "offset": 0, "maxMsgs": None,
                                               "sql": None, "newerField": 1}))
    assert req == PullRequest(topic="t", queue_id=1, offset=0)
    assert req.max_msgs == 32 and req.sql is None
    # a nullable field sent as nil stays None (it is not "absent, so required")
    nobody = _reply(ResponseCode.NOT_LEADER, {"leader": None, "leaderAddress": None})
    assert NotLeaderResponse.from_frame(nobody) == NotLeaderResponse(leader=None, leader_address=None)


def test_the_body_field_cannot_be_sent_as_an_ext_field() -> None:
    with pytest.raises(FrameError, match=r"the body \(records\) is required"):
        SendBatchRequest.from_frame(_request(11, {"records": [b"smuggled"]}))
    sent = _request(62, {"group": "g", "message": b"x"}, oneway=True)  # a key like another class's body
    assert consumer.NotifyConsumersChanged.from_frame(sent) == consumer.NotifyConsumersChanged(group="g")


def test_a_brokers_send_batch_rows_without_a_position_still_read() -> None:
    rows = SendBatchResponse.from_frame(_reply(body=msgpack.packb([[0, 1, 7, ""]]))).rows
    assert rows == (SendRow(0, 1, 7, "", -1),)


def test_the_leaderless_mark_of_any_read() -> None:
    assert LeaderlessMark.read(_reply(NOT_FOUND, {"nextOffset": 1, "leaderless": True}))
    assert not LeaderlessMark.read(_reply(ext={"minOffset": 0, "maxOffset": 1}))
    assert not LeaderlessMark.read(_reply(ext={"leaderless": "yes"}))  # malformed: not set


def test_the_wire_benchmark_runs() -> None:
    from benchmarks.wire import steps
    for work in steps(4, 16).values():
        work()
