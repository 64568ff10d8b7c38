"""The JSON bodies served and read, as RocketMQ 4.9.7's classes write them with fastjson
(``protocol.rocketmq.fastjson``: beans in field-name order, HashMap/HashSet iteration order,
bare ``Long`` map keys)::

    TopicRouteData   {"brokerDatas":[BrokerData],"filterServerTable":{},"queueDatas":[QueueData]}
                     (+ "orderTopicConf" when set)
    BrokerData       {"brokerAddrs":{0:"ip:port",1:...},"brokerName":..,"cluster":..}
                     brokerId 0 is the master (RaftMQ: the group's leader), others slaves
    QueueData        {"brokerName":..,"perm":6,"readQueueNums":N,"topicSysFlag":0,"writeQueueNums":N}
    ClusterInfo      {"brokerAddrTable":{name: BrokerData},"clusterAddrTable":{cluster:[names]}}
    TopicList        {"topicList":[names]}                    (a HashSet)
    HeartbeatData    {"clientID":..,"consumerDataSet":[ConsumerData],"producerDataSet":[{"groupName":..}]}
    ConsumerData     {"consumeFromWhere":..,"consumeType":..,"groupName":..,"messageModel":..,
                      "subscriptionDataSet":[{"topic":..,"subString":..,"expressionType":..,
                      "tagsSet":[..],"codeSet":[..],"subVersion":..,"classFilterMode":..}],"unitMode":..}
    CheckClientRequestBody {"clientId":..,"group":..,"subscriptionData":{SubscriptionData}}
    LockBatchRequestBody  {"clientId":..,"consumerGroup":..,"mqSet":[MessageQueue]}
                          (UnlockBatchRequestBody the same, + "oneway")
    LockBatchResponseBody {"lockOKMQSet":[MessageQueue]}
    TopicStatsTable  {"offsetTable":{MessageQueue:{"lastUpdateTimestamp":..,"maxOffset":..,"minOffset":..}}}
    ConsumeStats     {"consumeTps":..,"offsetTable":{MessageQueue:{"brokerOffset":..,"consumerOffset":..,
                      "lastTimestamp":..}}}                   (objects as map keys: fastjson's)
    KVTable          {"table":{name: value}}
    MessageQueue     {"brokerName":..,"queueId":N,"topic":..}
    GetConsumerListByGroupResponseBody {"consumerIdList":[ids]}

A route for a client of 4.9.4 or later (request version >= 401) or one that asks with
``acceptStandardJsonOnly`` is standard JSON (``standard=True``: quoted keys, sorted maps).
Decoders raise ``BodyError`` for a body that is not what its request needs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from protocol.rocketmq import fastjson
from protocol.rocketmq.fastjson import Bean, JavaMap

__all__ = [
    "V4_9_4",
    "BodyError",
    "BrokerData",
    "ConsumerData",
    "Heartbeat",
    "LockBatchRequest",
    "MessageQueue",
    "QueueData",
    "QueueStats",
    "Subscription",
    "cluster_info",
    "consume_stats",
    "consumer_list",
    "decode_check_client",
    "decode_heartbeat",
    "decode_lock_batch",
    "kv_table",
    "lock_batch_response",
    "topic_list",
    "topic_route",
    "topic_stats",
]

#: ``MQVersion.Version.V4_9_4.ordinal()``: from this request version on, routes are standard JSON
V4_9_4 = 401
#: ``PermName.PERM_READ | PERM_WRITE``
PERM_READ_WRITE = 6


class BodyError(ValueError):
    """A request body that is not the JSON its code needs."""


@dataclass(frozen=True, slots=True)
class BrokerData:
    cluster: str
    broker_name: str
    addresses: Mapping[int, str]  # brokerId -> ip:port, in put order

    def bean(self) -> Bean:
        addresses = JavaMap({int(k): v for k, v in self.addresses.items()})
        return Bean({"brokerAddrs": addresses, "brokerName": self.broker_name, "cluster": self.cluster})


@dataclass(frozen=True, slots=True)
class QueueData:
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int = PERM_READ_WRITE
    topic_sys_flag: int = 0

    def bean(self) -> Bean:
        return Bean({"brokerName": self.broker_name, "perm": self.perm, "readQueueNums": self.read_queue_nums,
                     "topicSysFlag": self.topic_sys_flag, "writeQueueNums": self.write_queue_nums})


def topic_route(queues: Sequence[QueueData], brokers: Sequence[BrokerData], *,
                standard: bool = False, order_topic_conf: str | None = None) -> bytes:
    doc = Bean({"brokerDatas": [b.bean() for b in brokers], "filterServerTable": JavaMap({}),
                "orderTopicConf": order_topic_conf, "queueDatas": [q.bean() for q in queues]})
    return fastjson.dumps(doc, standard=standard).encode("utf-8")


def cluster_info(brokers: Sequence[BrokerData]) -> bytes:
    clusters: dict[str | int, list[str]] = {}
    for b in brokers:
        clusters.setdefault(b.cluster, []).append(b.broker_name)
    doc = Bean({"brokerAddrTable": JavaMap({b.broker_name: b.bean() for b in brokers}),
                "clusterAddrTable": JavaMap({c: JavaMap.set(names) for c, names in clusters.items()})})
    return fastjson.dumps(doc).encode("utf-8")


def topic_list(topics: Sequence[str]) -> bytes:
    return fastjson.dumps(Bean({"topicList": JavaMap.set(topics)})).encode("utf-8")


def consumer_list(client_ids: Sequence[str]) -> bytes:
    return fastjson.dumps(Bean({"consumerIdList": list(client_ids)})).encode("utf-8")


@dataclass(frozen=True, slots=True)
class MessageQueue:
    topic: str
    broker_name: str
    queue_id: int

    def bean(self) -> Bean:
        return Bean({"brokerName": self.broker_name, "queueId": self.queue_id, "topic": self.topic})


@dataclass(frozen=True, slots=True)
class QueueStats:
    """One queue's row of a TopicStatsTable (``TopicOffset``) or ConsumeStats (``OffsetWrapper``)."""

    queue: MessageQueue
    min_offset: int
    max_offset: int
    last_update_ms: int
    consumer_offset: int = 0


def topic_stats(rows: Sequence[QueueStats]) -> bytes:
    """``TopicStatsTable`` (GET_TOPIC_STATS_INFO): ``{"offsetTable":{MessageQueue:{..}}}``."""
    table = fastjson.ObjectKeyMap(tuple((r.queue.bean(), Bean({
        "lastUpdateTimestamp": r.last_update_ms, "maxOffset": r.max_offset, "minOffset": r.min_offset}))
        for r in rows))
    return fastjson.dumps(Bean({"offsetTable": table})).encode("utf-8")


def consume_stats(rows: Sequence[QueueStats], consume_tps: float = 0.0) -> bytes:
    """``ConsumeStats`` (GET_CONSUME_STATS): broker and consumer offsets per queue."""
    table = fastjson.ObjectKeyMap(tuple((r.queue.bean(), Bean({
        "brokerOffset": r.max_offset, "consumerOffset": r.consumer_offset,
        "lastTimestamp": r.last_update_ms})) for r in rows))
    return fastjson.dumps(Bean({"consumeTps": consume_tps, "offsetTable": table})).encode("utf-8")


def kv_table(table: Mapping[str, str]) -> bytes:
    """``KVTable`` (GET_BROKER_RUNTIME_INFO): ``{"table":{name: value}}``."""
    items: dict[str | int, str] = dict(table.items())
    return fastjson.dumps(Bean({"table": JavaMap(items)})).encode("utf-8")


def lock_batch_response(queues: Sequence[MessageQueue]) -> bytes:
    """``LockBatchResponseBody``: the queues locked (a HashSet: order is not Java's here)."""
    return fastjson.dumps(Bean({"lockOKMQSet": [q.bean() for q in queues]})).encode("utf-8")


@dataclass(frozen=True, slots=True)
class Subscription:
    topic: str
    expression: str
    expression_type: str  # TAG or SQL92
    sub_version: int


@dataclass(frozen=True, slots=True)
class ConsumerData:
    group: str
    consume_type: str  # CONSUME_ACTIVELY (pull) or CONSUME_PASSIVELY (push)
    message_model: str  # CLUSTERING or BROADCASTING
    consume_from_where: str
    subscriptions: tuple[Subscription, ...]


@dataclass(frozen=True, slots=True)
class Heartbeat:
    client_id: str
    producer_groups: tuple[str, ...]
    consumers: tuple[ConsumerData, ...]


@dataclass(frozen=True, slots=True)
class LockBatchRequest:
    group: str
    client_id: str
    queues: tuple[MessageQueue, ...]


def _doc(body: bytes, what: str) -> dict[str, object]:
    try:
        doc = fastjson.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise BodyError(f"the {what} body is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise BodyError(f"the {what} body is not a JSON object")
    return doc


def _list(doc: Mapping[str, object], key: str, what: str) -> list[dict[str, object]]:
    items = doc.get(key) or []
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise BodyError(f"{what}: {key} is not a list of objects")
    return items


def _text(doc: Mapping[str, object], key: str, what: str, default: str | None = None) -> str:
    value = doc.get(key, default)
    if not isinstance(value, str):
        raise BodyError(f"{what}: {key} is missing or not a string")
    return value


def decode_heartbeat(body: bytes) -> Heartbeat:
    doc = _doc(body, "heartbeat")
    consumers = []
    for c in _list(doc, "consumerDataSet", "heartbeat"):
        subs = tuple(_subscription(s) for s in _list(c, "subscriptionDataSet", "consumer"))
        consumers.append(ConsumerData(_text(c, "groupName", "consumer"),
                                      _text(c, "consumeType", "consumer", "CONSUME_PASSIVELY"),
                                      _text(c, "messageModel", "consumer", "CLUSTERING"),
                                      _text(c, "consumeFromWhere", "consumer", "CONSUME_FROM_LAST_OFFSET"),
                                      subs))
    producers = tuple(_text(p, "groupName", "producer") for p in _list(doc, "producerDataSet", "heartbeat"))
    return Heartbeat(_text(doc, "clientID", "heartbeat"), producers, tuple(consumers))


def _subscription(s: Mapping[str, object]) -> Subscription:
    version = s.get("subVersion") or 0
    if isinstance(version, bool) or not isinstance(version, int):
        raise BodyError("subscription: subVersion is not an integer")
    return Subscription(_text(s, "topic", "subscription"), _text(s, "subString", "subscription", "*"),
                        _text(s, "expressionType", "subscription", "TAG"), version)


def decode_check_client(body: bytes) -> Subscription | None:
    """``CheckClientRequestBody``: the subscription a consumer checks at start (None: none)."""
    doc = _doc(body, "check client")
    sub = doc.get("subscriptionData")
    if sub is None:
        return None
    if not isinstance(sub, dict):
        raise BodyError("check client: subscriptionData is not an object")
    return _subscription(sub)


def decode_lock_batch(body: bytes) -> LockBatchRequest:
    doc = _doc(body, "lock batch")
    queues = []
    for q in _list(doc, "mqSet", "lock batch"):
        qid = q.get("queueId")
        if isinstance(qid, bool) or not isinstance(qid, int):
            raise BodyError("lock batch: a queue's queueId is not an integer")
        queues.append(MessageQueue(_text(q, "topic", "queue"), _text(q, "brokerName", "queue"), qid))
    return LockBatchRequest(_text(doc, "consumerGroup", "lock batch"), _text(doc, "clientId", "lock batch"),
                            tuple(queues))
