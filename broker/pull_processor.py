"""PULL_MESSAGE: a page of one queue's messages, served by any replica from applied --
hence committed -- state, with a long poll, tag-hash and SQL92 filters::

    PullRequest: topic, queue id, offset, max messages (<= MAX_PULL), long poll (<= 30 s),
                 tag hashes (optional), SQL92 on properties (optional)
    SUCCESS             PullResponse: rows (offset, CommitLog position, store ms, message),
                        next offset, max offset, leaderless
    PULL_NOT_FOUND      nothing at ``offset`` yet (after the long poll); next offset
    PULL_OFFSET_MOVED   ``offset`` is past the end, or below what retention kept: next offset
                        (and min offset) say where to go on

(the layout: ``protocol.pull``)

A page stops at ``PULL_BODY_BYTES`` of rows but holds at least one message. Messages the
ConsumeQueue lists one after the other mostly share an entry, which is read once
(``_EntryWindow``). A replica that knows no leader marks its answers ``leaderless`` and
holds long polls at most ``LEADERLESS_SUSPEND_S``, so clients try another replica first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from broker.consumer_processor import CONNECTION
from broker.entry_batch import read_stamp
from broker.fragments import MessageGone, read_message
from broker.long_polls import ParkedPulls
from broker.metrics import BrokerMetrics
from broker.state_machine import BrokerStateMachine
from dledger.commitlog import CommitLog
from dledger.entry_format import HEADER_SIZE
from dledger.log import Log
from protocol.message_format import MessageFormatError, decode_record
from protocol.pull import MAX_PULL, MAX_SUSPEND_MS, PullRequest, PullResponse, PullRow
from protocol.remoting import Frame, FrameError, ResponseCode
from protocol.sql_filter import FilterSyntaxError, SqlFilter, compile_filter

if TYPE_CHECKING:
    from broker.consume_queue import ConsumeQueue

__all__ = ["LEADERLESS_SUSPEND_S", "MAX_FILTER_SCAN", "MAX_PULL", "MAX_SUSPEND_MS", "PULL_BODY_BYTES",
           "PullProcessor"]

#: Longest long poll a replica that knows no leader holds (module docstring).
LEADERLESS_SUSPEND_S = 0.5
#: Most ConsumeQueue units one filtered pull looks at before answering (an empty page).
MAX_FILTER_SCAN = 4096
#: A pull stops adding rows past this many body bytes (it always returns one message):
#: with the largest default message, the response frame stays within DEFAULT_MAX_FRAME,
#: which is what clients accept by default.
PULL_BODY_BYTES = 4 * 1024 * 1024
_ROW_OVERHEAD = 40  # msgpack of [offset, position, stamp, bin header]


class QueueWaiter(Protocol):
    async def wait(self, queue: tuple[str, int], timeout: float) -> None:
        """Return when ``queue`` (topic, queue id) grew, or after ``timeout`` seconds."""


class PullProcessor:
    def __init__(self, machine: BrokerStateMachine, rlog: Log, signal: QueueWaiter,
                 metrics: BrokerMetrics, store_time: Callable[[int], int],
                 parked: ParkedPulls | None = None) -> None:
        self._machine = machine
        self._parked = parked or ParkedPulls()
        self._rlog = rlog
        self._signal = signal
        self._metrics = metrics
        self._store_time = store_time
        self._filters: dict[str, SqlFilter] = {}

    async def pull(self, frame: Frame) -> Frame:
        """PULL_MESSAGE (module docstring)."""
        req = PullRequest.from_frame(frame)
        topic, queue_id, offset, max_msgs = req.topic, req.queue_id, req.offset, req.max_msgs
        suspend_s = req.suspend_ms / 1000
        wanted_set = None if req.tag_hashes is None else frozenset(req.tag_hashes)
        sql = self._sql_filter(req.sql)
        if topic not in self._machine.topics:
            raise FrameError(ResponseCode.TOPIC_NOT_EXIST, f"topic {topic!r} does not exist")
        loop = asyncio.get_running_loop()
        # A replica that knows no leader may be cut off and fall behind: it says so
        # ("leaderless") and holds a long poll briefly, so clients try another replica
        # first -- and still read here when it is the only one left (no leader anywhere).
        leaderless = self._rlog.leader is None
        if leaderless:
            suspend_s = min(suspend_s, LEADERLESS_SUSPEND_S)
        cq, max_offset = await self._await_messages(topic, queue_id, offset, loop.time() + suspend_s)
        if cq is None or offset >= max_offset:
            if offset > max_offset:
                return PullResponse(next_offset=max_offset, leaderless=leaderless).reply(
                    frame, ResponseCode.PULL_OFFSET_MOVED)
            return PullResponse(next_offset=offset, leaderless=leaderless).reply(
                frame, ResponseCode.PULL_NOT_FOUND)
        served_from = loop.time()
        low = self._machine.retained_min_offset(cq, self._rlog.commitlog.start_position)
        if offset < low:  # retention deleted those messages: the first one kept
            return PullResponse(next_offset=low, min_offset=low).reply(frame, ResponseCode.PULL_OFFSET_MOVED)
        filtered = wanted_set is not None or sql is not None
        read = cq.read(offset, MAX_FILTER_SCAN if filtered else max_msgs)
        units = read.units
        if wanted_set is not None:
            units = [(off, u) for off, u in units if u.tag_hash in wanted_set]
        rows, next_offset, gone_at = self._rows(units, read.next_offset, max_msgs, sql, filtered)
        if gone_at is not None:  # retention deleted the first message while this pull read the queue
            low = self._machine.retained_min_offset(cq, self._rlog.commitlog.start_position)
            return PullResponse(next_offset=max(low, gone_at + 1), min_offset=low).reply(
                frame, ResponseCode.PULL_OFFSET_MOVED)
        self._metrics.pulled.inc(len(rows))
        self._metrics.pull_serve.observe(loop.time() - served_from)
        return PullResponse(next_offset=next_offset, max_offset=max_offset, leaderless=leaderless,
                            rows=rows).reply(frame)

    async def _await_messages(self, topic: str, queue_id: int, offset: int,
                              deadline: float) -> tuple[ConsumeQueue | None, int]:
        """The long poll: the queue and its end once it holds ``offset`` or at ``deadline``,
        parked on this queue only (``broker.long_polls``). FrameError SYSTEM_BUSY when it
        would park beyond a cap."""
        loop = asyncio.get_running_loop()
        cq = self._machine.queue(topic, queue_id)
        max_offset = cq.max_offset if cq is not None else 0
        if offset < max_offset or loop.time() >= deadline:
            return cq, max_offset
        with self._parked.slot(CONNECTION.get()):
            while True:
                await self._signal.wait((topic, queue_id), deadline - loop.time())
                cq = self._machine.queue(topic, queue_id)
                max_offset = cq.max_offset if cq is not None else 0
                if offset < max_offset or loop.time() >= deadline:
                    return cq, max_offset

    def _rows(self, units: list[tuple[int, Any]], next_offset: int, max_msgs: int,
              sql: SqlFilter | None, filtered: bool) -> tuple[list[PullRow], int, int | None]:
        """The page's rows (offset, position, store time, message bytes) within
        PULL_BODY_BYTES, the offset to pull next, and the offset of a message retention
        deleted before any row was read (None: none)."""
        rows: list[PullRow] = []
        size = 0
        entry = _EntryWindow(self._rlog.commitlog)  # consecutive messages share an entry: one read
        for off, unit in units:
            if rows and size + unit.size + _ROW_OVERHEAD > PULL_BODY_BYTES:
                return rows, off, None  # the rest on the next pull
            try:
                data = entry.slice(unit.position, unit.size)
                stamp = entry.stamp
                if data is None:  # a message chained over several entries
                    data = read_message(self._rlog.commitlog, unit.position, unit.size)
                    stamp = self._store_time(unit.position)
            except MessageGone:  # retention deleted it while this pull read the queue
                return (rows, off, None) if rows else (rows, off, off)
            if sql is not None and not sql.matches(_properties(data)):
                continue
            rows.append(PullRow(off, unit.position, stamp, data))
            size += unit.size + _ROW_OVERHEAD
            if len(rows) == max_msgs and filtered:
                return rows, off + 1, None
        return rows, next_offset, None

    def _sql_filter(self, expression: str | None) -> SqlFilter | None:
        if expression is None:
            return None
        found = self._filters.get(expression)
        if found is None:
            try:
                found = compile_filter(expression)
            except FilterSyntaxError as e:
                raise FrameError(ResponseCode.SUBSCRIPTION_INVALID, str(e)) from None
            if len(self._filters) > 1024:
                self._filters.clear()
            self._filters[expression] = found
        return found


def _properties(data: bytes) -> dict[str, str]:
    try:
        return decode_record(data).properties
    except MessageFormatError:
        return {}


class _EntryWindow:
    """The last entry record a pull read: the messages a ConsumeQueue lists one after the
    other mostly sit in the same entry, so each entry is read (and its store time parsed)
    once, not once per message."""

    __slots__ = ("_commitlog", "_data", "_end", "_start", "stamp")

    def __init__(self, commitlog: CommitLog) -> None:
        self._commitlog = commitlog
        self._start, self._end, self._data = -1, -1, b""
        self.stamp = -1  # the store time of the entry last sliced

    def slice(self, position: int, size: int) -> bytes | None:
        """The ``size`` bytes at ``position`` if they lie inside one entry record, else None."""
        if not (self._start <= position and position + size <= self._end):
            found = self._commitlog.entry_containing(position)
            if found is None:
                return None
            index, start = found
            self._data = self._commitlog.read_at(start, self._commitlog.record_size_of(index))
            self._start, self._end = start, start + len(self._data)
            self.stamp = read_stamp(self._data[HEADER_SIZE:HEADER_SIZE + 16])
            if position + size > self._end:
                return None
        offset = position - self._start
        return self._data[offset:offset + size]
