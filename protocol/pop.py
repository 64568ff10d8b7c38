"""Per-message acknowledgement (RocketMQ 5's POP / SimpleConsumer), all to the leader::

    POP_MESSAGE (36)            ext  group str, topic str,
                                     maxMsgs int 1..MAX_POP          (absent: 16)
                                     invisibleMs int 1000..12 h       how long the messages stay
                                                                      invisible to the group
                                     waitMs int 0..30000             long poll while none is
                                                                      visible (absent: 0)
        response (SUCCESS)      body msgpack array of popped records, one per record holding a
                                     claimed message:
                                     [queue id, row (protocol.pull PullRow: base offset,
                                      position, store ms, record as stored, nil),
                                      [[offset, delivery], ...]]    the claimed messages of
                                                                     the record
    ACK_MESSAGE (37)            ext  group, topic, queueId, offset, delivery   (a receipt
                                     handle: the message and which delivery of it)
        response                     a WriteResponse (protocol.send): its position holds the
                                     delivery; ``duplicate``: it was settled already
    CHANGE_INVISIBLE_DURATION   ext  the receipt handle, invisibleMs int 0..12 h: invisible
      (38)                           from now for that long
        response                     a WriteResponse
    NACK_MESSAGE (39)           ext  the receipt handle: give it back; the group's retry
                                     policy says when it is visible again, or dead-letters it
        response                ext  deadLettered bool, backoffMs int
    UPDATE_GROUP_CONFIG (53)    ext  group str, backoffMs [int 0..12 h] (1..32 steps),
                                     maxDeliveries int 1..1000, ordered bool (absent: false:
                                     a queue's next message waits until the one before is
                                     settled)
        response                     a WriteResponse

A receipt whose delivery the message outlived (its invisibility ended and it went to
another consumer) is refused with INVALID_ARGUMENT; a POP beyond the group's cap of
messages in flight with SYSTEM_BUSY.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from protocol.pull import PullRow
from protocol.remoting import RequestCode
from protocol.wire import Request, Response

__all__ = ["MAX_INVISIBLE_MS", "MAX_POP", "AckRequest", "ChangeInvisibleRequest", "Claim",
           "GroupConfigRequest", "NackRequest", "NackResponse", "PopRequest", "PopResponse", "PoppedRecord"]

#: Most messages one POP returns.
MAX_POP = 32
#: Longest invisibility (RocketMQ 5 allows 12 h).
MAX_INVISIBLE_MS = 12 * 3600 * 1000

_NonNegative = Annotated[int, msgspec.Meta(ge=0)]
_Invisible = Annotated[int, msgspec.Meta(ge=0, le=MAX_INVISIBLE_MS)]


class PopRequest(Request, frozen=True):
    CODE = RequestCode.POP_MESSAGE

    group: str
    topic: str
    max_msgs: Annotated[int, msgspec.Meta(ge=1, le=MAX_POP)] = 16
    invisible_ms: Annotated[int, msgspec.Meta(ge=1000, le=MAX_INVISIBLE_MS)] = 30_000
    wait_ms: Annotated[int, msgspec.Meta(ge=0, le=30_000)] = 0


class Claim(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """A claimed message of a record: its queue offset, and which delivery of it this is."""

    offset: int
    delivery: int


class PoppedRecord(msgspec.Struct, array_like=True, frozen=True):
    """A record holding claimed messages: which of its offsets, each with its delivery."""

    queue_id: int
    row: PullRow
    claimed: tuple[Claim, ...]


class PopResponse(Response, frozen=True):
    BODY = "records"

    records: tuple[PoppedRecord, ...] | None = None


class AckRequest(Request, frozen=True):
    CODE = RequestCode.ACK_MESSAGE

    group: str
    topic: str
    queue_id: Annotated[int, msgspec.Meta(ge=0, lt=1024)]
    offset: _NonNegative
    delivery: Annotated[int, msgspec.Meta(ge=1)]


class ChangeInvisibleRequest(AckRequest, frozen=True):
    CODE = RequestCode.CHANGE_INVISIBLE_DURATION

    invisible_ms: _Invisible = 0


class NackRequest(AckRequest, frozen=True):
    CODE = RequestCode.NACK_MESSAGE


class NackResponse(Response, frozen=True):
    dead_lettered: bool
    backoff_ms: int


class GroupConfigRequest(Request, frozen=True):
    CODE = RequestCode.UPDATE_GROUP_CONFIG

    group: str
    backoff_ms: Annotated[tuple[_Invisible, ...], msgspec.Meta(min_length=1, max_length=32)]
    max_deliveries: Annotated[int, msgspec.Meta(ge=1, le=1000)]
    ordered: bool | None = None
