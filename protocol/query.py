"""Reads by key, id and time, and resets by time::

    QUERY_MESSAGE (13)       ext  key str, beginMs int (absent: 0), endMs int (absent: 2**62),
                                  maxResults int 1..256 (absent: 32)
    VIEW_MESSAGE_BY_ID (14)  ext  msgId str (the id in hex)
        response (SUCCESS) body: msgpack array of rows (QUERY_NOT_FOUND: none)
                 +--------------------+----------+-------------+
                 | CommitLog position | store ms | message bin |   (a record of one)
                 +--------------------+----------+-------------+

    SEARCH_OFFSET (16)       ext  topic str, queueId int >= 0, timestamp int >= 0 (optional, ms)
        response             ext  minOffset int   the first message still retained
                                  maxOffset int   the queue's end
                                  offset    int   with a timestamp: the first message stored
                                                  at or after it (maxOffset if none)

    RESET_OFFSET (22)        ext  group str, topic str, timestamp int >= 0 (ms)
        response             body msgpack map {queue id: the group's offset now}

QUERY_BY_TIME (15) is a reserved code: no broker serves it (REQUEST_CODE_NOT_SUPPORTED).
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from protocol.message_format import MessageRecord, decode_record
from protocol.remoting import RequestCode
from protocol.wire import Request, Response

__all__ = ["QueryMessageRequest", "QueryResponse", "QueryRow", "ResetOffsetRequest", "ResetOffsetResponse",
           "SearchOffsetRequest", "SearchOffsetResponse", "ViewMessageRequest"]

_NonNegative = Annotated[int, msgspec.Meta(ge=0)]


class QueryMessageRequest(Request, frozen=True):
    CODE = RequestCode.QUERY_MESSAGE

    key: str
    begin_ms: int = 0
    end_ms: int = 2**62
    max_results: Annotated[int, msgspec.Meta(ge=1, le=256)] = 32


class ViewMessageRequest(Request, frozen=True):
    CODE = RequestCode.VIEW_MESSAGE_BY_ID

    msg_id: str


class QueryRow(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """One message found (module docstring)."""

    position: int
    store_ms: int
    message: bytes

    def record(self) -> MessageRecord:
        """The stored message's fields; MessageFormatError if the bytes are not one."""
        return decode_record(self.message)


class QueryResponse(Response, frozen=True):
    """The answer to QUERY_MESSAGE and VIEW_MESSAGE_BY_ID."""

    BODY = "rows"

    rows: tuple[QueryRow, ...]


class SearchOffsetRequest(Request, frozen=True):
    CODE = RequestCode.SEARCH_OFFSET

    topic: str
    queue_id: _NonNegative
    timestamp: _NonNegative | None = None


class SearchOffsetResponse(Response, frozen=True):
    min_offset: int
    max_offset: int
    offset: int | None = None


class ResetOffsetRequest(Request, frozen=True):
    CODE = RequestCode.RESET_OFFSET

    group: str
    topic: str
    timestamp: _NonNegative


class ResetOffsetResponse(Response, frozen=True):
    BODY = "offsets"

    offsets: dict[int, int]
