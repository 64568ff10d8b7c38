"""Reads by key, id and time, and resets by time (RocketMQ's QueryMessageProcessor and
the offset-by-time requests)::

    QUERY_MESSAGE        QueryMessageRequest (key, time range, limit) -> QueryResponse (rows:
                         position, store ms, message; at most QUERY_BODY_BYTES of messages,
                         newest first)
    VIEW_MESSAGE_BY_ID   ViewMessageRequest (message id)         -> the same, one row
    SEARCH_OFFSET        SearchOffsetRequest (topic, queue, time?) -> SearchOffsetResponse (min,
                         max, and the first offset at/after the time)
    RESET_OFFSET         ResetOffsetRequest (group, topic, time; leader) -> ResetOffsetResponse
                         ({queue id: offset})

(their layouts: ``protocol.query``)

Keys come from the IndexFile, which may hold hash collisions and whole-second times: every
row is checked against the message. A row is the message found as a record of one (its
position is its record's plus its index there). Time searches bisect the ConsumeQueue
units' store times. ``store_time`` (the store time of the entry holding a
position, cached: committed entries never change) dates the rows found by key or id.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.processors.base import Processor
from broker.processors.outcomes import OUTCOME_CODE
from broker.state.machine import Outcome
from broker.store.commands import CommitOffset, encode_admin
from broker.store.consume_queue import CqUnit
from broker.store.entry_batch import read_stamp
from broker.store.fragments import MessageGone, read_message_at
from dledger.storage.entry_format import HEADER_SIZE
from protocol.message_format import Message, MessageFormatError, encode_message, message_at
from protocol.names import validate_group
from protocol.query import (
    QueryMessageRequest,
    QueryResponse,
    QueryRow,
    ResetOffsetRequest,
    ResetOffsetResponse,
    SearchOffsetRequest,
    SearchOffsetResponse,
    ViewMessageRequest,
)
from protocol.remoting import Frame, FrameError, ResponseCode

if TYPE_CHECKING:
    from broker.processors.context import BrokerContext

__all__ = ["QUERY_BODY_BYTES", "QueryProcessor"]

#: The rows of one QUERY_MESSAGE answer stop at this many message bytes (the first row always
#: goes); the candidates read for them at four times as many (issue 25, row 9).
QUERY_BODY_BYTES = 4 << 20


class QueryProcessor(Processor):
    def __init__(self, server: BrokerContext) -> None:
        super().__init__(server)
        self._stamps: dict[int, int] = {}  # entry record position -> store time (committed: immutable)

    def store_time(self, position: int) -> int:
        """The store time of the entry holding ``position`` (messages of one entry share it;
        a chained message's position is in its first fragment's entry, whose stamp it has)."""
        found = self._server.rlog.reader.entry_containing(position)
        if found is None:
            return -1
        index, start = found
        stamp = self._stamps.get(start)
        if stamp is None:
            size = self._server.rlog.reader.record_size_of(index) - HEADER_SIZE
            stamp = read_stamp(self._server.rlog.reader.read_at(start + HEADER_SIZE, min(16, size)))
            if len(self._stamps) >= 4096:
                self._stamps.clear()
            self._stamps[start] = stamp
        return stamp

    def message_at(self, position: int) -> tuple[Message, int]:
        """The message at ``position`` and its store time (the RocketMQ front end's view by
        id); FrameError QUERY_NOT_FOUND when there is none."""
        return self._message_at(position)

    def queue_offset_of(self, topic: str, queue_id: int, position: int) -> int:
        """The queue offset of the message at CommitLog ``position`` (a record's position
        plus the message's index in it) in ``topic``'s queue ``queue_id``; -1 when that
        queue holds no record there (trimmed, or another queue's)."""
        machine = self._server.machine
        cq = machine.queue(topic, queue_id) if topic in machine.topics else None
        if cq is None:
            return -1
        try:
            _, record_at = read_message_at(self._server.rlog.reader, position)
            unit = cq.get(cq.offset_for_position(record_at))
        except (MessageGone, ValueError):  # OffsetOutOfRange is a ValueError
            return -1
        index = position - record_at
        return unit.base + index if unit.position == record_at and index < unit.count else -1

    def _message_at(self, position: int) -> tuple[Message, int]:
        """The message at ``position`` (of its record, read whole if chained) and its store time;
        only of an entry this replica applied (committed): a RocketMQ msgId names any position."""
        held = self._server.rlog.reader.entry_containing(position)
        if held is not None and held[0] > self._server.machine.applied_index():
            raise FrameError(ResponseCode.QUERY_NOT_FOUND,
                             f"no applied message at position {position} (not committed here yet)")
        try:
            record, at = read_message_at(self._server.rlog.reader, position)
            return message_at(record, position - at), self.store_time(at)
        except MessageGone:
            raise FrameError(ResponseCode.QUERY_NOT_FOUND, f"position {position} is not retained") from None
        except (ValueError, MessageFormatError) as e:
            raise FrameError(ResponseCode.QUERY_NOT_FOUND,
                             f"no message at position {position}: {e}") from None

    async def query_by_key(self, frame: Frame) -> Frame:
        req = QueryMessageRequest.from_frame(frame)
        return self._query_rows(frame, req.key, req.begin_ms, req.end_ms, req.max_results, by_id=False)

    async def view_by_id(self, frame: Frame) -> Frame:
        return self._query_rows(frame, ViewMessageRequest.from_frame(frame).msg_id, 0, 2**62, 1,
                                by_id=True)

    def _query_rows(self, frame: Frame, key: str, begin: int, end: int, limit: int,
                    by_id: bool) -> Frame:
        rows: list[QueryRow] = []
        answered = read = 0
        for position in self._server.machine.query_key(key, begin, end, limit * 4):
            m, stamp = self._message_at(position)
            encoded = encode_message(m)
            read += len(encoded)
            real = m.msg_id.hex() == key if by_id else key in m.keys
            if real and begin <= stamp <= end:  # hash collisions and second-granular times
                if rows and answered + len(encoded) > QUERY_BODY_BYTES:
                    break  # bounded in bytes: narrow the time range for the rest
                rows.append(QueryRow(position, stamp, encoded))
                answered += len(encoded)
            if len(rows) >= limit or read >= 4 * QUERY_BODY_BYTES:
                break
        if not rows:
            return frame.response(ResponseCode.QUERY_NOT_FOUND, remark=f"no message for {key!r}")
        return QueryResponse(rows=rows).reply(frame)

    async def search_offset(self, frame: Frame) -> Frame:
        """A queue's min and max offsets and, with a timestamp (ms), the first offset stored at
        or after it (the max offset if none)."""
        req = SearchOffsetRequest.from_frame(frame)
        if req.topic not in self._server.machine.topics:
            raise FrameError(ResponseCode.TOPIC_NOT_EXIST, f"topic {req.topic!r} does not exist")
        machine = self._server.machine
        cq = machine.queue(req.topic, req.queue_id)
        low, high = (0, 0) if cq is None else (
            machine.retained_min_offset(cq, self._server.rlog.reader.start_position), cq.max_offset)
        at = None
        if req.timestamp is not None:
            at = 0 if cq is None else cq.bisect(_stored_at, req.timestamp)
        return SearchOffsetResponse(min_offset=low, max_offset=high, offset=at).reply(frame)

    async def reset_offset(self, frame: Frame) -> Frame:
        """Set a group's offsets on every queue of a topic to the first message stored at
        or after ``timestamp`` (ms); binary search on store time per queue."""
        self._server.require_leader()
        req = ResetOffsetRequest.from_frame(frame)
        group, topic, ts = validate_group(req.group), req.topic, req.timestamp
        config = self._server.machine.topics.get(topic)
        if config is None:
            raise FrameError(ResponseCode.TOPIC_NOT_EXIST, f"topic {topic!r} does not exist")
        offsets = {}
        for qid in range(config.queues):
            cq = self._server.machine.queue(topic, qid)
            offsets[qid] = 0 if cq is None else cq.bisect(_stored_at, ts)
        records = [encode_admin(CommitOffset(group, topic, q, o)) for q, o in offsets.items()]
        outcomes = await self._server.write.send(records)
        bad = [a for a in outcomes if a.outcome != Outcome.DONE]
        if bad:
            return frame.response(OUTCOME_CODE[bad[0].outcome], remark=bad[0].reason)
        return ResetOffsetResponse(offsets=offsets).reply(frame)


def _stored_at(unit: CqUnit) -> int:
    return unit.store_ms
