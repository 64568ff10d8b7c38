"""SEND_MESSAGE and SEND_BATCH, and the answer of any one write through the log::

    SEND_MESSAGE (10)  request body: one record of one message (protocol.record_batch), as it is
    SEND_BATCH   (11)  request body: msgpack array of records (protocol.record_batch: 1..N
                       messages of one queue each; one record per queue, or several)
                       +--------------+--------------+-----+
                       | bin record 0 | bin record 1 | ... |
                       +--------------+--------------+-----+
                       response body (SUCCESS): one row per message of the records, in order
                       +------+----------+--------------+--------+----------+
                       | code | queue id | queue offset | reason | position |
                       +------+----------+--------------+--------+----------+
                        int    int        int            str      int (absent from
                        ResponseCode of this message              brokers before it: -1)

    WriteResponse: the answer (SUCCESS) to SEND_MESSAGE, COMMIT_OFFSET, CREATE_TOPIC and
    DELETE_TOPIC -- where the applied record went; an error answer has only a remark
                       ext  queueId  int   the queue (-1: not a message)
                            queueOffset int  its offset (-1: held, e.g. delayed, or not one)
                            position int     its CommitLog position (-1: none)
                            duplicate bool   an idempotent resend of a stored message
"""

from __future__ import annotations

import msgspec

from protocol.remoting import RequestCode
from protocol.wire import Request, Response

__all__ = ["SendBatchRequest", "SendBatchResponse", "SendMessageRequest", "SendRow", "WriteResponse"]


class SendMessageRequest(Request, frozen=True):
    CODE = RequestCode.SEND_MESSAGE
    BODY = "message"

    message: bytes


class SendBatchRequest(Request, frozen=True):
    CODE = RequestCode.SEND_BATCH
    BODY = "records"

    records: tuple[bytes, ...]


class WriteResponse(Response, frozen=True):
    queue_id: int
    queue_offset: int
    position: int
    duplicate: bool


class SendRow(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """One message's outcome in a SEND_BATCH answer (module docstring)."""

    code: int
    queue_id: int
    queue_offset: int
    reason: str
    position: int = -1


class SendBatchResponse(Response, frozen=True):
    BODY = "rows"

    rows: tuple[SendRow, ...]
