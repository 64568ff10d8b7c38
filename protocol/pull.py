"""PULL_MESSAGE (12): a page of one queue's records from any replica::

    request ext  topic      str
                 queueId    int >= 0
                 offset     int >= 0      the first queue offset wanted
                 maxMsgs    int 1..1024   (absent: 32) the page stops at the record that
                                          reaches it
                 suspendMs  int 0..30000  long poll while nothing is there (absent: 0)
                 tagHashes  [int]         optional: only messages with one of these tag hashes
                 sql        str           optional: SQL92 on the messages' properties
                 stripe     bool          optional: only the records that start in
                                          [offset, offset + maxMsgs) (below)

    response (SUCCESS, PULL_NOT_FOUND, PULL_OFFSET_MOVED: ``PULL_ANSWERS``)
            ext  nextOffset int           where the next pull starts
                 maxOffset  int           SUCCESS: the queue's end on this replica
                 minOffset  int           MOVED by retention: the first message kept
                 leaderless bool          the replica knows no leader (absent: false)
           body  SUCCESS only: msgpack array of rows, one per record, in queue order
                 +-------------+--------------------+----------+------------+----------+
                 | base offset | CommitLog position | store ms | record bin | selected |
                 +-------------+--------------------+----------+------------+----------+
                  int            int                 int        the stored   [int] | nil
                  the record's first message's                  record, as   (SQL92: the
                  queue offset                                  stored       indexes that
                                                                (protocol.   matched; nil:
                                                                record_batch) every one)

Records ship as stored; the client splits them (``PullRow.messages``). A page may start
inside its first record (a pull at an offset past the record's base): the messages below
the offset asked for are the client's to skip, as are those a tag filter does not want
(the broker chose records by their tag summaries and tag-hash arrays, never bodies).
Message i of a row has queue offset ``offset + i`` and CommitLog position ``position + i``.

A *stripe* (``stripe`` true, no filter) leaves out the record holding ``offset`` when that
record starts before it: a reader that pipelines pulls over a range asks first at its
cursor (an ordinary pull: the record holding it, then every record that starts before
``offset + maxMsgs``) and then for the stripes that follow, and so gets every record of
the range exactly once, whatever the records' sizes -- a record is never shipped by two
pulls. A stripe in which no record starts is an empty SUCCESS page whose next offset is
the end of the record holding ``offset``. A broker that does not know stripes ignores the
key and answers an ordinary pull (the reader drops the records it already holds).
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from protocol.record_batch import MessageRecord, decode_messages
from protocol.remoting import Frame, FrameError, RequestCode, ResponseCode
from protocol.wire import Request, Response

__all__ = ["MAX_PULL", "MAX_SUSPEND_MS", "PULL_ANSWERS", "LeaderlessMark", "PullRequest", "PullResponse",
           "PullRow"]

#: Most messages one pull returns (a page of 1,024 messages of 256 B is ~350 KB; the broker's
#: PULL_BODY_BYTES bounds pages of big ones). 1,024 rather than 256 halves what a follower
#: and a Spark reader spend per message on pulls (docs/SPARK.md, Benchmark).
MAX_PULL = 1024
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
    stripe: bool | None = None


class PullRow(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """One record of a page (module docstring)."""

    offset: int
    position: int
    store_ms: int
    record: bytes
    selected: tuple[int, ...] | None = None

    def messages(self) -> list[MessageRecord]:
        """The record's messages; MessageFormatError if the bytes are not a record."""
        return decode_messages(self.record)


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
