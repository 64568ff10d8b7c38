"""Redeliveries and transactions::

    CONSUMER_SEND_MSG_BACK (33)  ext  group str, position int >= 0 (the message's CommitLog
                                      position), maxReconsumeTimes int 0..10000 (absent: 16)
        response                 ext  a WriteResponse's fields, then
                                      topic str            where the copy went (%RETRY% or %DLQ%)
                                      reconsumeTimes int   the copy's redelivery count
    END_TRANSACTION (60)         ext  position int >= 0 (the half message's), commit bool
        response                 ext  outcome str   what happened (committed, rolled back, ...)
    CHECK_TRANSACTION (61)       broker -> client, oneway: ext position int, group str (the
                                 producer group); body the half message's bytes
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from protocol.remoting import RequestCode
from protocol.send import WriteResponse
from protocol.wire import Request, Response

__all__ = ["DEFAULT_MAX_RECONSUME", "CheckTransactionRequest", "EndTransactionRequest",
           "EndTransactionResponse", "SendBackRequest", "SendBackResponse"]

#: Redeliveries of a message before it is dead-lettered, when a send-back does not say.
DEFAULT_MAX_RECONSUME = 16

_NonNegative = Annotated[int, msgspec.Meta(ge=0)]


class SendBackRequest(Request, frozen=True):
    CODE = RequestCode.CONSUMER_SEND_MSG_BACK

    group: str
    position: _NonNegative
    max_reconsume_times: Annotated[int, msgspec.Meta(ge=0, le=10_000)] = DEFAULT_MAX_RECONSUME


class SendBackResponse(WriteResponse, frozen=True):
    topic: str
    reconsume_times: int


class EndTransactionRequest(Request, frozen=True):
    CODE = RequestCode.END_TRANSACTION

    position: _NonNegative
    commit: bool


class EndTransactionResponse(Response, frozen=True):
    outcome: str


class CheckTransactionRequest(Request, frozen=True):
    CODE = RequestCode.CHECK_TRANSACTION
    BODY = "message"

    position: int
    group: str
    message: bytes
