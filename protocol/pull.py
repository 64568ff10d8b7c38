"""PULL_MESSAGE (12): a page of one queue's messages from any replica::

    request ext  topic      str
                 queueId    int >= 0
                 offset     int >= 0      the first queue offset wanted
                 maxMsgs    int 1..256    (absent: 32)
                 suspendMs  int 0..30000  long poll while nothing is there (absent: 0)
                 tagHashes  [int]         optional: only messages with one of these tag hashes
                 sql        str           optional: SQL92 on the messages' properties

    response (SUCCESS, PULL_NOT_FOUND, PULL_OFFSET_MOVED: ``PULL_ANSWERS``)
            ext  nextOffset int           where the next pull starts
                 maxOffset  int           SUCCESS: the queue's end on this replica
                 minOffset  int           MOVED by retention: the first message kept
                 leaderless bool          the replica knows no leader (absent: false)
           body  SUCCESS only: msgpack array of rows, in queue order
                 +--------------+--------------------+----------+-------------+
                 | queue offset | CommitLog position | store ms | message bin |
                 +--------------+--------------------+----------+-------------+
                  int            int                  int        the stored message's bytes
                                                                 (protocol.message_format)

``PullRow.record`` decodes a row's message (``decode_record``): the one decoder the
client's consumers and the Spark reader use.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from protocol.message_format import MessageRecord, decode_record
from protocol.remoting import Frame, FrameError, RequestCode, ResponseCode
from protocol.wire import Request, Response

__all__ = ["MAX_PULL", "MAX_SUSPEND_MS", "PULL_ANSWERS", "LeaderlessMark", "PullRequest", "PullResponse",
           "PullRow"]

#: Most messages one pull returns.
MAX_PULL = 256
#: Longest long poll a pull may ask for.
MAX_SUSPEND_MS = 30_000
#: The response codes whose frame carries a PullResponse (others have only a remark).
PULL_ANSWERS = frozenset({ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_OFFSET_MOVED})


class PullRequest(Request, frozen=True):
    CODE = RequestCode.PULL_MESSAGE

    topic: str
    queue_id: Annotated[int, msgspec.Meta(ge=0)]
    offset: Annotated[int, msgspec.Meta(ge=0)]
    max_msgs: Annotated[int, msgspec.Meta(ge=1, le=MAX_PULL)] = 32
    suspend_ms: Annotated[int, msgspec.Meta(ge=0, le=MAX_SUSPEND_MS)] = 0
    tag_hashes: tuple[int, ...] | None = None
    sql: str | None = None


class PullRow(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """One message of a page (module docstring)."""

    offset: int
    position: int
    store_ms: int
    message: bytes

    def record(self) -> MessageRecord:
        """The stored message's fields; MessageFormatError if the bytes are not one."""
        return decode_record(self.message)


class PullResponse(Response, frozen=True):
    BODY = "rows"

    next_offset: int
    max_offset: int | None = None
    min_offset: int | None = None
    leaderless: bool | None = None
    rows: tuple[PullRow, ...] | None = None


class LeaderlessMark(Response, frozen=True):
    """The one field of any read's answer a client's choice of replica looks at: the
    replica knew no leader (pull answers set it; nothing else does yet)."""

    leaderless: bool | None = None

    @classmethod
    def read(cls, frame: Frame) -> bool:
        """Whether ``frame`` says so; a malformed mark counts as not set."""
        try:
            return bool(cls.from_frame(frame).leaderless)
        except FrameError:
            return False
