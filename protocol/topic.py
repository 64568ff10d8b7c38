"""Topics and routes::

    CREATE_TOPIC (50)  ext  topic str, queues int 1..1024 (absent: 8), perm 2|4|6 (absent: 6)
    DELETE_TOPIC (51)  ext  topic str
        response: a WriteResponse (protocol.send)
    GET_TOPICS (52)    no ext
        response body: msgpack map {topic: [queues, perm]}
    GET_ROUTE (40)     ext  topic str
        response body: msgpack map, a TopicRouteData -- the shape the name server's
                       ``GET /route/{topic}`` answers in JSON (without ``term``):
            {"topic": str,
             "groups": [{"group": str, "queues": int, "perm": int,
                         "term": int,                   GET_ROUTE only: the answering replica's
                         "leader": str | nil,           the leader's client address
                         "replicas": {node: address}}]}

Permissions are RocketMQ's (``Perm``): 2 write, 4 read, 6 both.
"""

from __future__ import annotations

import enum
from typing import Annotated, Literal

import msgspec

from protocol.remoting import RequestCode
from protocol.wire import Request, Response

__all__ = ["CreateTopicRequest", "DeleteTopicRequest", "GetRouteRequest", "GetTopicsRequest",
           "GroupRouteData", "Perm", "RouteResponse", "TopicQueues", "TopicRouteData", "TopicsResponse"]


class Perm(enum.IntFlag):
    """Topic permissions, as RocketMQ's (2 = write, 4 = read)."""

    WRITE = 2
    READ = 4
    READ_WRITE = 6


class CreateTopicRequest(Request, frozen=True):
    CODE = RequestCode.CREATE_TOPIC

    topic: str
    queues: Annotated[int, msgspec.Meta(ge=1, le=1024)] = 8
    perm: Literal[2, 4, 6] = 6


class DeleteTopicRequest(Request, frozen=True):
    CODE = RequestCode.DELETE_TOPIC

    topic: str


class GetTopicsRequest(Request, frozen=True):
    CODE = RequestCode.GET_TOPICS


class TopicQueues(msgspec.Struct, array_like=True, frozen=True, gc=False):
    queues: int
    perm: int


class TopicsResponse(Response, frozen=True):
    BODY = "topics"

    topics: dict[str, TopicQueues]


class GetRouteRequest(Request, frozen=True):
    CODE = RequestCode.GET_ROUTE

    topic: str


class GroupRouteData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One group's part of a topic's route (module docstring); ``term`` is sent only when set."""

    group: str
    queues: int
    perm: int
    term: int | None = None
    leader: str | None
    replicas: dict[str, str]


class TopicRouteData(msgspec.Struct, frozen=True):
    """A topic's route: every group that holds its queues."""

    topic: str
    groups: tuple[GroupRouteData, ...]


class RouteResponse(Response, frozen=True):
    BODY = "route"

    route: TopicRouteData
