"""The name server's RocketMQ codes (RocketMQ's DefaultRequestProcessor), answered from its
route table -- on the name server's own port, told apart from HTTP by the first byte
(``common.protocol_sniffer``), so a RocketMQ client given ``127.0.0.1:9876`` finds its
routes where RaftMQ's clients do.

    GET_ROUTEINFO_BY_TOPIC      TopicRouteData: per RaftMQ group one RocketMQ broker (its
                                name is the group's), the leader as brokerId 0 (master),
                                the followers as 1, 2, ... (slaves, by node name); a group
                                with no leader has no master until it elects one
                                (standard JSON for clients of 4.9.4 and later, or when
                                asked: ``acceptStandardJsonOnly``; fastjson's otherwise)
    GET_BROKER_CLUSTER_INFO     ClusterInfo: every group, in cluster ``DefaultCluster``
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER, GET_TOPICS_BY_CLUSTER   TopicList: every topic
    GET_KV_CONFIG, GET_KVLIST_BY_NAMESPACE   QUERY_NOT_FOUND (no KV configuration is kept)
    anything else (REGISTER_BROKER included: RaftMQ brokers register over signed HTTP)
                                REQUEST_CODE_NOT_SUPPORTED naming the code

Routes are read-only and public, as on the name server's HTTP port. Imports nothing that
loads a broker's storage or Raft (the name server stays light).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from broker.rocketmq.connection import RocketConnection, RocketLimits
from protocol.rocketmq.bodies import V4_9_4, BrokerData, QueueData, cluster_info, topic_list, topic_route
from protocol.rocketmq.codes import RequestCode, ResponseCode
from protocol.rocketmq.frame import RemotingFrame
from protocol.rocketmq.headers import GetRouteInfoRequestHeader, HeaderError, reply
from protocol.topic import TopicRouteData

__all__ = ["CLUSTER", "NameServerFrontEnd", "RouteView", "brokers_of"]

#: RocketMQ's default cluster name: what mqadmin's ``-c`` is given
CLUSTER = "DefaultCluster"
_TOPIC_LISTS = (RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, RequestCode.GET_TOPICS_BY_CLUSTER)


class Registered(Protocol):
    @property
    def group(self) -> str: ...
    @property
    def node(self) -> str: ...
    @property
    def role(self) -> str: ...
    @property
    def address(self) -> str: ...


class RouteView(Protocol):
    """What is read of ``broker.namesrv.route_table.RouteTable``."""

    def route(self, topic: str) -> TopicRouteData: ...
    def live(self) -> Sequence[Registered]: ...
    def topics_of(self, group: str, node: str) -> dict[str, tuple[int, int]]: ...


def brokers_of(group: str, leader: str | None, replicas: dict[str, str]) -> BrokerData:
    """One group as a RocketMQ broker: the leader id 0, the others 1.. by node name."""
    addresses: dict[int, str] = {}
    if leader:
        addresses[0] = leader
    followers = [address for _node, address in sorted(replicas.items()) if address != leader]
    for i, address in enumerate(followers, start=1):
        addresses[i] = address
    return BrokerData(CLUSTER, group, addresses)


class NameServerFrontEnd:
    def __init__(self, table: RouteView, limits: RocketLimits | None = None) -> None:
        self._table = table
        self.limits = limits or RocketLimits(max_frame_bytes=1 << 20)

    def protocol(self) -> RocketConnection:
        return RocketConnection(self.serve, self.limits)

    async def serve(self, conn: RocketConnection, frame: RemotingFrame) -> RemotingFrame:
        try:
            if frame.code == RequestCode.GET_ROUTEINFO_BY_TOPIC:
                return self._route(frame)
            if frame.code == RequestCode.GET_BROKER_CLUSTER_INFO:
                return reply(frame, ResponseCode.SUCCESS, body=cluster_info(self._brokers()))
            if frame.code in _TOPIC_LISTS:
                return reply(frame, ResponseCode.SUCCESS, body=topic_list(sorted(self._topics())))
            if frame.code in (RequestCode.GET_KV_CONFIG, RequestCode.GET_KVLIST_BY_NAMESPACE):
                return frame.response(ResponseCode.QUERY_NOT_FOUND, remark="RaftMQ keeps no KV configuration")
        except HeaderError as e:
            return frame.response(ResponseCode.SYSTEM_ERROR, remark=f"RaftMQ: {e}")
        try:
            name = f"{RequestCode(frame.code).name} ({frame.code})"
        except ValueError:
            name = str(frame.code)
        return frame.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                              remark=f"RaftMQ name server: request code {name} is not supported")

    def _route(self, frame: RemotingFrame) -> RemotingFrame:
        h = GetRouteInfoRequestHeader.of(frame)
        found = self._table.route(h.topic)
        if not found.groups:
            return frame.response(ResponseCode.TOPIC_NOT_EXIST,
                                  remark=f"No topic route info in name server for the topic: {h.topic}")
        queues = [QueueData(g.group, g.queues, g.queues, g.perm) for g in found.groups]
        brokers = [brokers_of(g.group, g.leader, g.replicas) for g in found.groups]
        standard = frame.version >= V4_9_4 or bool(h.accept_standard_json_only)
        return reply(frame, ResponseCode.SUCCESS, body=topic_route(queues, brokers, standard=standard))

    def _brokers(self) -> list[BrokerData]:
        groups: dict[str, tuple[str | None, dict[str, str]]] = {}
        for reg in self._table.live():
            leader, replicas = groups.get(reg.group, (None, {}))
            replicas[reg.node] = reg.address
            groups[reg.group] = (reg.address if reg.role == "leader" else leader, replicas)
        return [brokers_of(g, leader, replicas) for g, (leader, replicas) in sorted(groups.items())]

    def _topics(self) -> Iterable[str]:
        topics: set[str] = set()
        for reg in self._table.live():
            topics.update(self._table.topics_of(reg.group, reg.node))
        return topics
