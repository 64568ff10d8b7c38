"""Who is connected: heartbeats, membership and its change notices::

    HEARTBEAT (30)                    ext  clientId str (absent: ""), producerGroup str (optional:
                                           a transaction producer's group, for check-backs)
                                      body optional: msgpack map {consumer group: [topics]}
        response: nothing (SUCCESS)
    UNREGISTER_CLIENT (31)            ext  clientId str, group str (optional: every group)
        response: nothing (SUCCESS)
    GET_CONSUMER_LIST (32)            ext  group str
        response                      body msgpack array of the members' client ids
    NOTIFY_CONSUMER_IDS_CHANGED (62)  broker -> client, oneway; ext group str
"""

from __future__ import annotations

from protocol.remoting import RequestCode
from protocol.wire import Request, Response

__all__ = ["ConsumerListRequest", "ConsumerListResponse", "HeartbeatRequest", "NotifyConsumersChanged",
           "UnregisterRequest"]


class HeartbeatRequest(Request, frozen=True):
    CODE = RequestCode.HEARTBEAT
    BODY = "subscriptions"

    client_id: str = ""
    producer_group: str | None = None
    subscriptions: dict[str, tuple[str, ...]] | None = None


class UnregisterRequest(Request, frozen=True):
    CODE = RequestCode.UNREGISTER_CLIENT

    client_id: str
    group: str | None = None


class ConsumerListRequest(Request, frozen=True):
    CODE = RequestCode.GET_CONSUMER_LIST

    group: str


class ConsumerListResponse(Response, frozen=True):
    BODY = "client_ids"

    client_ids: tuple[str, ...]


class NotifyConsumersChanged(Request, frozen=True):
    CODE = RequestCode.NOTIFY_CONSUMER_IDS_CHANGED

    group: str
