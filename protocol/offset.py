"""Consumer offsets and orderly-consumption locks::

    COMMIT_OFFSET (20)    ext  group str, topic str, queueId int >= 0, offset int >= 0
        response: a WriteResponse (protocol.send)
    QUERY_OFFSET (21)     ext  group str, topic str, queueId int >= 0
        response          ext  offset int   the group's committed offset (-1: none)
    LOCK_BATCH_MQ (34)    ext  group str, clientId str (not empty), topic str,
    UNLOCK_BATCH_MQ (35)       queues [int 0..1023] (not empty)
        response          body msgpack array of the queue ids this client now holds (lock)
                               or gave back (unlock)
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from protocol.remoting import RequestCode
from protocol.wire import Request, Response

__all__ = ["CommitOffsetRequest", "LockQueuesRequest", "LockQueuesResponse", "QueryOffsetRequest",
           "QueryOffsetResponse", "UnlockQueuesRequest"]

_NonNegative = Annotated[int, msgspec.Meta(ge=0)]
_QueueId = Annotated[int, msgspec.Meta(ge=0, lt=1024)]


class CommitOffsetRequest(Request, frozen=True):
    CODE = RequestCode.COMMIT_OFFSET

    group: str
    topic: str
    queue_id: _NonNegative
    offset: _NonNegative


class QueryOffsetRequest(Request, frozen=True):
    CODE = RequestCode.QUERY_OFFSET

    group: str
    topic: str
    queue_id: _NonNegative


class QueryOffsetResponse(Response, frozen=True):
    offset: int


class LockQueuesRequest(Request, frozen=True):
    CODE = RequestCode.LOCK_BATCH_MQ

    group: str
    client_id: Annotated[str, msgspec.Meta(min_length=1)]
    topic: str
    queues: Annotated[tuple[_QueueId, ...], msgspec.Meta(min_length=1)]


class UnlockQueuesRequest(LockQueuesRequest, frozen=True):
    CODE = RequestCode.UNLOCK_BATCH_MQ


class LockQueuesResponse(Response, frozen=True):
    BODY = "queue_ids"

    queue_ids: tuple[int, ...]
