"""PULL_MESSAGE: a page of one queue's records, served by any replica from applied --
hence committed -- state, with a long poll, tag-hash and SQL92 filters::

    PullRequest: topic, queue id, offset, max messages (<= MAX_PULL), long poll (<= 30 s),
                 tag hashes (optional), SQL92 on properties (optional)
    SUCCESS             PullResponse: rows (base offset, CommitLog position, store ms, record
                        as stored, SQL92 matches), next offset, max offset, leaderless
    PULL_NOT_FOUND      nothing at ``offset`` yet (after the long poll); next offset
    PULL_OFFSET_MOVED   ``offset`` is past the end, or below what retention kept: next offset
                        (and min offset) say where to go on

(the layout: ``protocol.pull``)

A page is whole records, from the one holding the offset asked for; it stops at the record
that brings ``max messages`` from that offset, or at ``PULL_BODY_BYTES`` of rows, and
holds at least one record (a *stripe* pull leaves out the record holding the offset when
it starts before it, and may be empty: ``protocol.pull``). Records are never decoded here:
a tag filter keeps a record when its unit's tag summary and then its tag-hash array say a
message may match (the client drops the messages that do not); an SQL92 filter decodes only properties and
lists the messages that matched (a record it cannot read -- stored before leaders checked
records -- is left out with a WARNING naming its queue and offsets), on an inflating thread
and answering once it decompressed ``MAX_INFLATED_PER_PULL`` (``broker.store.inflation``). Records the
ConsumeQueue lists one after the other mostly share an entry, which is read once
(``_EntryWindow``). A replica that knows no leader marks its answers ``leaderless`` and
holds long polls at most ``LEADERLESS_SUSPEND_S``, so clients try another replica first.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Protocol

from broker.processors.context import CONNECTION, ProcessorMetrics
from broker.processors.long_polls import ParkedPulls
from broker.security.access_control import current_user
from broker.state.machine import BrokerStateMachine
from broker.store.consume_queue_layout import TAG_BLOOM, CqUnit, bloom_bits, summary_may_match
from broker.store.fragments import MessageGone, read_message
from broker.store.inflation import MAX_INFLATED_PER_PULL, inflate
from common.refusal_log import RefusalLog
from dledger.log import Log
from protocol.pull import MAX_PULL, MAX_SUSPEND_MS, PullRequest, PullResponse, PullRow
from protocol.record_batch import MessageFormatError, read_header, record_properties
from protocol.remoting import Frame, FrameError, ResponseCode
from protocol.sql_filter import FilterSyntaxError, SqlFilter, compile_filter

if TYPE_CHECKING:
    from broker.store.consume_queue import ConsumeQueue
    from dledger.log_reader import LogReader

__all__ = ["LEADERLESS_SUSPEND_S", "MAX_FILTER_SCAN", "MAX_PULL", "MAX_SUSPEND_MS", "PULL_BODY_BYTES",
           "PullProcessor"]

log = logging.getLogger("broker.pull")
#: a record a filter could not read (stored before leaders checked records): once a minute each
_UNREADABLE = RefusalLog(log, "a filtered pull skipped a record it cannot read:")

#: Longest long poll a replica that knows no leader holds (module docstring).
LEADERLESS_SUSPEND_S = 0.5
#: Most ConsumeQueue units (records) one filtered pull looks at before answering (an empty page).
MAX_FILTER_SCAN = 1024
#: A pull stops adding rows past this many body bytes (it always returns one message):
#: with the largest default message, the response frame stays within DEFAULT_MAX_FRAME,
#: which is what clients accept by default.
PULL_BODY_BYTES = 4 * 1024 * 1024
_ROW_OVERHEAD = 48  # msgpack of [offset, position, stamp, bin header, selected]


class QueueWaiter(Protocol):
    async def wait(self, queue: tuple[str, int], timeout: float) -> None:
        """Return when ``queue`` (topic, queue id) grew, or after ``timeout`` seconds."""


class PullProcessor:
    def __init__(self, machine: BrokerStateMachine, rlog: Log, signal: QueueWaiter,
                 metrics: ProcessorMetrics, parked: ParkedPulls | None = None) -> None:
        self._machine = machine
        self._parked = parked or ParkedPulls()
        self._rlog = rlog
        self._signal = signal
        self._metrics = metrics
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
        low = self._machine.retained_min_offset(cq, self._rlog.reader.start_position)
        if offset < low:  # retention deleted those messages: the first one kept
            return PullResponse(next_offset=low, min_offset=low).reply(frame, ResponseCode.PULL_OFFSET_MOVED)
        filtered = wanted_set is not None or sql is not None
        read = cq.read(offset, MAX_FILTER_SCAN) if filtered else cq.read(offset, max_msgs, max_msgs)
        page = _Page(topic, queue_id, offset, max_msgs, wanted_set, sql, bool(req.stripe) and not filtered)
        if sql is not None:  # properties of compressed records inflate: off the event loop
            rows, next_offset, gone_at = await inflate(self._rows, read.units, read.next_offset, page)
        else:
            rows, next_offset, gone_at = self._rows(read.units, read.next_offset, page)
        if gone_at is not None:  # retention deleted the first message while this pull read the queue
            low = self._machine.retained_min_offset(cq, self._rlog.reader.start_position)
            return PullResponse(next_offset=max(low, gone_at), min_offset=low).reply(
                frame, ResponseCode.PULL_OFFSET_MOVED)
        self._metrics.pulled.inc(page.got)
        self._metrics.pull_serve.observe(loop.time() - served_from)
        return PullResponse(next_offset=next_offset, max_offset=max_offset, leaderless=leaderless,
                            rows=rows).reply(frame)

    async def _await_messages(self, topic: str, queue_id: int, offset: int,
                              deadline: float) -> tuple[ConsumeQueue | None, int]:
        """The long poll: the queue and its end once it holds ``offset`` or at ``deadline``,
        parked on this queue only (``broker.processors.long_polls``). FrameError SYSTEM_BUSY when it
        would park beyond a cap."""
        loop = asyncio.get_running_loop()
        cq = self._machine.queue(topic, queue_id)
        max_offset = cq.max_offset if cq is not None else 0
        if offset < max_offset or loop.time() >= deadline:
            return cq, max_offset
        with self._parked.slot(CONNECTION.get(), current_user()):
            while True:
                await self._signal.wait((topic, queue_id), deadline - loop.time())
                cq = self._machine.queue(topic, queue_id)
                max_offset = cq.max_offset if cq is not None else 0
                if offset < max_offset or loop.time() >= deadline:
                    return cq, max_offset

    def _rows(self, units: list[CqUnit], next_offset: int,
              page: _Page) -> tuple[list[PullRow], int, int | None]:
        """The page's rows within PULL_BODY_BYTES, the offset to pull next, and the offset
        after a record retention deleted before any row was read (None: none)."""
        rows: list[PullRow] = []
        size = 0
        entry = _EntryWindow(self._rlog.reader)  # consecutive records share an entry: one read
        for unit in units:
            if page.stripe and unit.base < page.offset:
                continue  # the record holding the offset: the pull before this stripe has it
            if rows and size + unit.size + _ROW_OVERHEAD > PULL_BODY_BYTES:
                return rows, unit.base, None  # the rest on the next pull
            if page.wanted is not None and not summary_may_match(unit.tag_kind, unit.tag, page.wanted,
                                                                  page.wanted_bits):
                continue
            try:
                data = entry.slice(unit.position, unit.size)
                if data is None:  # a record chained over several entries
                    data = read_message(self._rlog.reader, unit.position, unit.size)
            except MessageGone:  # retention deleted it while this pull read the queue
                return (rows, unit.base, None) if rows else (rows, unit.base, unit.end)
            row = page.row(unit, data)
            if page.inflated >= MAX_INFLATED_PER_PULL:  # enough decompressed: the rest next pull
                if row is not None:
                    rows.append(row)
                return rows, unit.end, None
            if row is None:
                continue
            rows.append(row)
            size += unit.size + _ROW_OVERHEAD
            if page.full():
                return rows, unit.end, None
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


class _Page:
    """What one pull wants: messages from ``offset``, at most about ``max_msgs``, those a tag
    filter (``wanted`` hashes) or an SQL92 filter keeps; only records that start at or after
    ``offset`` for a ``stripe``."""

    __slots__ = ("got", "inflated", "max_msgs", "offset", "queue_id", "sql", "stripe", "topic", "wanted",
                 "wanted_bits")

    def __init__(self, topic: str, queue_id: int, offset: int, max_msgs: int,
                 wanted: frozenset[int] | None, sql: SqlFilter | None, stripe: bool = False) -> None:
        self.topic, self.queue_id = topic, queue_id
        self.offset, self.max_msgs, self.wanted, self.sql = offset, max_msgs, wanted, sql
        self.stripe = stripe
        self.wanted_bits = [] if wanted is None else [bloom_bits(h) for h in wanted]
        self.got = 0
        self.inflated = 0  # bytes decompressed to read properties (MAX_INFLATED_PER_PULL)

    def row(self, unit: CqUnit, data: bytes) -> PullRow | None:
        """The row of ``unit``'s record ``data``, or None when no message of it is wanted."""
        skip = max(0, self.offset - unit.base)  # a page may start inside its first record
        selected = None
        try:
            if self.wanted is not None and (unit.tag_kind == TAG_BLOOM or skip):
                header = read_header(data)
                hashes = header.tag_hashes(data)[skip:]
                if not any(h in self.wanted for h in hashes):
                    return None
            if self.sql is not None:
                header = read_header(data)
                if header.codec:
                    self.inflated += header.raw_length
                props = record_properties(data)
                matches = self.sql.matches
                selected = tuple(i for i in range(skip, unit.count) if matches(props[i]))
                if not selected:
                    return None
        except MessageFormatError as e:  # left out, and said so: its consumer never sees it
            where = f"topic {self.topic!r} queue {self.queue_id}"
            _UNREADABLE.note(where, where,  # once a minute a queue (a key a record would grow without end)
                             f"the record at queue offsets {unit.base}..{unit.end - 1} (CommitLog position "
                             f"{unit.position}): {e}")
            return None
        self.got += unit.count - skip if selected is None else len(selected)
        return PullRow(unit.base, unit.position, unit.store_ms, data, selected)

    def full(self) -> bool:
        return self.got >= self.max_msgs


class _EntryWindow:
    """The last entry record a pull read: the records a ConsumeQueue lists one after the
    other mostly sit in the same entry, so each entry is read once, not once per record."""

    __slots__ = ("_data", "_end", "_reader", "_start")

    def __init__(self, reader: LogReader) -> None:
        self._reader = reader
        self._start, self._end, self._data = -1, -1, b""

    def slice(self, position: int, size: int) -> bytes | None:
        """The ``size`` bytes at ``position`` if they lie inside one entry record, else None."""
        if not (self._start <= position and position + size <= self._end):
            found = self._reader.entry_containing(position)
            if found is None:
                return None
            index, start = found
            self._data = self._reader.read_at(start, self._reader.record_size_of(index))
            self._start, self._end = start, start + len(self._data)
            if position + size > self._end:
                return None
        offset = position - self._start
        return self._data[offset:offset + size]
