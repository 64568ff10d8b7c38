"""Reading one queue range from broker replicas (the worker side) -- Spark-free.

``RangeReader`` reads a :class:`~spark.planning.QueueRange` in pages of up to 1024
messages (``spark.pages``), ``pipeline`` requests in flight; ``read_columns`` drives it
in a private asyncio loop. The pull at the cursor is an ordinary one; those pipelined past
it are *stripes* (``protocol.pull``), so that a record spanning two requests is shipped
once. Every page must start at the cursor and be contiguous; the
range must come back exactly (``end - start`` messages, or a gap-free chain of pages
when a tag filter makes the broker skip some). The replica comes from ``readFrom``
(``spark.replicas``); one that fails is left for the next one; a replica that does not
have the range yet is long-polled, then another one is tried, for up to
``followerWaitMs`` -- after that, or on any mismatch, the read fails with an error
(``spark.errors``) that names the queue, the range and the replica. The messages of a
record that cannot be read are skipped and reported (``spark.pages``), and count toward
the range.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import logging
import re
from collections import deque
from collections.abc import Iterator, Sequence

from client.aio.core import ClientCore
from client.backoff import Deadline
from client.errors import BrokerError, ClientError
from protocol.pull import PULL_ANSWERS, PullRequest, PullResponse, PullRow
from protocol.record_batch import record_count
from protocol.remoting import Frame, FrameError, ResponseCode
from spark.errors import DataLossError, RangeMismatchError, ReadError, ReplicaUnavailableError
from spark.options import SourceOptions
from spark.pages import Columns, decode_page
from spark.planning import QueueRange
from spark.replicas import no_replica_message, read_order, replica_roles

__all__ = ["RangeReader", "read_columns"]

log = logging.getLogger("spark.raftmq")

#: How a broker refuses a pull larger than it serves (brokers before 2026-11-25 took at most
#: 256 messages a pull; the reader asks for 1,024 by default).
_PULL_LIMIT = re.compile(r"'maxMsgs': expected `int` <= (\d+)")

_PULL_OK = (ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_OFFSET_MOVED,
            ResponseCode.PULL_RETRY_IMMEDIATELY, ResponseCode.TOPIC_NOT_EXIST)
_LONG_POLL_S = 1.0
#: a replica that keeps not having the range is left for another after this long
_SWITCH_LAGGING_AFTER_S = 5.0
_GC_GEN0_THRESHOLD = 20_000


class RangeReader:
    """Reads one :class:`QueueRange` (module docstring). Use ``next_page`` until it returns
    None, then ``close``; one asyncio loop for its whole life."""

    def __init__(self, opts: SourceOptions, rng: QueueRange) -> None:
        self.opts = opts
        self.rng = rng
        selector = opts.selector()
        self._wanted = selector.tags
        hashes = selector.hashes()
        self._hashes = None if hashes is None else tuple(hashes)
        self._sql = opts.sql_filter  # the brokers answer the messages it selects in each record
        self.cursor = rng.start          # every message before it was received
        self.received = 0                # messages returned (after the tag filter)
        self.skipped = 0                 # messages of records that could not be read (pages.py)
        self.lost = 0                    # messages retention removed (failOnDataLoss=false)
        self.address: str | None = None  # the replica being read
        self.served_by: set[str] = set()
        self._core: ClientCore | None = None
        self._next = rng.start           # where the next request starts
        self._inflight: deque[tuple[int, int, asyncio.Task[Frame]]] = deque()
        self._failed: set[str] = set()
        self._lag_since: float | None = None
        self._lag_on_replica_since: float | None = None
        self._lag_detail = ""
        self._failing_since: float | None = None
        self._unavailable: Deadline | None = None
        self._pull_batch = opts.pull_batch  # lowered to a replica's limit if it refuses it

    @property
    def filtered(self) -> bool:
        return self._hashes is not None or self._sql is not None

    def _loop_time(self) -> float:
        return asyncio.get_running_loop().time()

    async def _choose(self, why: str) -> None:
        """Pick the replica to read from: the best live one allowed by readFrom that has not
        failed; waits (up to followerWaitMs) while there is none."""
        assert self._core is not None
        if self._unavailable is None:
            self._unavailable = Deadline(self.opts.follower_wait_s)
        while True:
            roles = await replica_roles(self._core, self.rng.replicas)
            order = read_order(roles, self.opts.read_from, self.rng.preferred)
            fresh = [a for a in order if a not in self._failed]
            if not fresh and order:  # every live one failed once: try them again
                self._failed.clear()
                fresh = order
            if fresh:
                if self.address is not None and fresh[0] != self.address:
                    log.warning("%s: reading from %s instead of %s (%s)", self.rng, fresh[0],
                                self.address, why)
                self.address = fresh[0]
                self._unavailable = None
                return
            if self._unavailable.expired():
                raise ReplicaUnavailableError(
                    f"{self.rng}: {no_replica_message(self.rng.group, self.opts.read_from, roles)}; waited "
                    f"{self.opts.follower_wait_s:g} s (followerWaitMs) after {why}; read up to offset "
                    f"{self.cursor}")
            await asyncio.sleep(min(0.5, self._unavailable.remaining()))

    def _request(self, offset: int, count: int, suspend_s: float) -> asyncio.Task[Frame]:
        """A pull of ``count`` from ``offset``: an ordinary one at the cursor, a stripe past it
        (``protocol.pull``: the records that start in [offset, offset + count), so that no
        record comes in two pages)."""
        assert self._core is not None and self.address is not None
        stripe = True if offset > self.cursor and not self.filtered else None
        request = PullRequest(topic=self.rng.topic, queue_id=self.rng.queue_id, offset=offset,
                              max_msgs=count, suspend_ms=int(suspend_s * 1000), tag_hashes=self._hashes,
                              sql=self._sql, stripe=stripe)
        return asyncio.create_task(self._core.pool.request(
            self.address, request, timeout=suspend_s + self.opts.request_timeout_s, ok=_PULL_OK))

    def _fill(self) -> None:
        if self._lag_since is not None or self.filtered:  # one request at a time, from the cursor
            if not self._inflight:
                suspend = _LONG_POLL_S if self._lag_since is not None else 0.0
                count = self._pull_batch if self.filtered else min(self._pull_batch,
                                                                        self.rng.end - self.cursor)
                self._inflight.append((self.cursor, count, self._request(self.cursor, count, suspend)))
            return
        self._next = max(self._next, self.cursor)  # a page of whole records may reach past its count
        while len(self._inflight) < self.opts.pipeline and self._next < self.rng.end:
            count = min(self._pull_batch, self.rng.end - self._next)
            self._inflight.append((self._next, count, self._request(self._next, count, 0.0)))
            self._next += count

    def _drop_inflight(self) -> None:
        for _, _, task in self._inflight:
            if task.done():
                if not task.cancelled():
                    task.exception()  # retrieved: no "never retrieved" warning
            else:
                task.cancel()
        self._inflight.clear()
        self._next = self.cursor

    async def next_page(self) -> Columns | None:
        """The next messages of the range (never empty), or None when the range is complete."""
        if self._core is None:
            self._core = ClientCore(servers=list(self.rng.replicas), tls=self.opts.tls or False,
                                    request_timeout=self.opts.request_timeout_s,
                                    credentials=self.opts.credentials())
            await self._choose("start")
        while self.cursor < self.rng.end:
            self._fill()
            offset, count, task = self._inflight[0]
            try:
                reply = await task
            except ClientError as e:
                self._inflight.popleft()
                self._drop_inflight()
                if not self._took_pull_limit(e):
                    await self._replica_failed(e)
                continue
            self._inflight.popleft()
            page = self._accept(offset, count, reply)
            if page is not None:
                return page
            if self._lag_since is not None:
                await self._check_lag()
        self._drop_inflight()
        self._check_complete()
        return None

    def _took_pull_limit(self, error: ClientError) -> bool:
        """Whether ``error`` is a replica refusing pulls as large as ours (an older broker):
        if so the reader asks for at most its limit from now on and says so once."""
        found = _PULL_LIMIT.search(error.remark) if isinstance(error, BrokerError) \
            and error.code == ResponseCode.INVALID_ARGUMENT else None
        if found is None or not 0 < int(found.group(1)) < self._pull_batch:
            return False
        log.warning("%s: %s takes pulls of at most %s messages (an older broker); pulling %s at a "
                    "time instead of %s (set pullBatch to choose)", self.rng, self.address,
                    found.group(1), found.group(1), self._pull_batch)
        self._pull_batch = int(found.group(1))
        return True

    async def _replica_failed(self, error: ClientError) -> None:
        """Leave the replica that failed (lost, timed out, answered an error) for the next
        one; fail the read when no replica has worked for followerWaitMs."""
        now = self._loop_time()
        if self._failing_since is None:
            self._failing_since = now
        elif now - self._failing_since >= self.opts.follower_wait_s:
            raise ReadError(f"{self.rng}: no replica served a pull for {self.opts.follower_wait_s:g} s "
                            f"(followerWaitMs), read up to offset {self.cursor}; last: {error}") from error
        failed = self.address
        assert failed is not None
        self._failed.add(failed)
        await self._choose(f"{failed} failed: {error}")
        if self.address == failed:  # nothing else to try: do not spin
            await asyncio.sleep(0.2)

    def _accept(self, offset: int, count: int, reply: Frame) -> Columns | None:
        """Take one answer; returns the page, or None when it brought nothing (lagging replica,
        a filtered page without matches, a stale speculative request)."""
        if offset > self.cursor:  # a speculative request made stale by a short page
            return None
        pulled = self._decode(reply)
        if reply.code != ResponseCode.SUCCESS:
            next_offset = None if pulled is None else pulled.next_offset
            if reply.code == ResponseCode.PULL_OFFSET_MOVED and next_offset is not None \
                    and next_offset > offset:
                what = (f"{self.rng}: messages [{offset}, {next_offset}) are no longer retained by "
                        f"{self.address} (retention removed them)")
                if self.opts.fail_on_data_loss:
                    raise DataLossError(f"{what}; failOnDataLoss=false skips them")
                lost = min(next_offset, self.rng.end) - offset
                log.warning("%s: %d messages skipped (failOnDataLoss=false)", what, lost)
                self.lost += lost
                self.cursor = min(next_offset, self.rng.end)
                self._drop_inflight()
                return None
            # PULL_NOT_FOUND / moved back / no topic yet: this replica has not applied the range yet
            self._drop_inflight()
            now = self._loop_time()
            if self._lag_since is None:
                self._lag_since = now
                self._lag_on_replica_since = now
            self._lag_detail = (f"{self.address} answered {ResponseCode(reply.code).name} at offset {offset}"
                                + (f" (its queue ends at {next_offset})" if isinstance(next_offset, int)
                                   and next_offset < offset else ""))
            return None
        self._lag_since = None
        self._failing_since = None
        assert pulled is not None and self.address is not None
        raw, next_offset = pulled.rows or (), pulled.next_offset
        self.served_by.add(self.address)
        if self.filtered:
            return self._accept_filtered(offset, raw, next_offset)
        if not _chained(raw, next_offset):
            raise RangeMismatchError(f"{self.rng}: {self.address} answered a pull at {offset} with records "
                                     f"that do not follow one another up to next offset {next_offset}")
        fresh = _not_held(raw, self.cursor)
        if not fresh:  # a stripe in which no record starts, or only records already held
            if offset == self.cursor:  # a pull at the cursor always brings the record holding it
                raise RangeMismatchError(
                    f"{self.rng}: asked {self.address} for {count} messages from offset {offset}, got none "
                    f"(next offset {next_offset}): not the contiguous range asked for")
            if self.cursor < min(offset + count, self.rng.end):  # the replica ends inside the stripe
                self._drop_inflight()  # ask again at the cursor (a lagging replica is waited for)
            return None
        page = decode_page(fresh, self.rng, None, self.cursor)
        n, skipped = len(page), page.skipped_count()
        expected = _expected(self.cursor, n + skipped, page.skipped)
        if n + skipped == 0 or fresh[0].offset > self.cursor or page.queue_offset != expected:
            shown = f"{page.queue_offset[0]}..{page.queue_offset[-1]}" if n else "nothing"
            raise RangeMismatchError(
                f"{self.rng}: asked {self.address} for {count} messages from offset {offset}, got {n} "
                f"from {self.cursor} ({shown}, next offset {next_offset}): not the contiguous range "
                "asked for")
        self.cursor = min(next_offset, self.rng.end)
        self.received += n
        self.skipped += skipped
        if self.cursor < min(offset + count, self.rng.end):  # a short page: re-plan requests
            self._drop_inflight()
        return page if n else None

    def _decode(self, reply: Frame) -> PullResponse | None:
        """The answer's PullResponse (None for a code that carries none); RangeMismatchError
        when a replica answers something else."""
        if reply.code not in PULL_ANSWERS:
            return None
        try:
            return PullResponse.from_frame(reply)
        except FrameError as e:
            raise RangeMismatchError(f"{self.rng}: {self.address} answered a pull with {e}") from None

    def _accept_filtered(self, offset: int, raw: Sequence[PullRow], next_offset: int) -> Columns | None:
        got = [r.offset for r in raw]
        if next_offset <= offset or any(not o < next_offset for o in got) \
                or any(a >= b for a, b in itertools.pairwise(got)):
            raise RangeMismatchError(f"{self.rng}: {self.address} answered offsets {got[:3]}... with next "
                                     f"offset {next_offset} to a pull at {offset}: not a gap-free page")
        raw = [r for r in raw if r.offset < self.rng.end]
        page = decode_page(raw, self.rng, self._wanted, self.cursor)
        self.cursor = min(next_offset, self.rng.end)
        self.received += len(page)
        return page if len(page) else None

    async def _check_lag(self) -> None:
        now = self._loop_time()
        assert self._lag_since is not None and self._lag_on_replica_since is not None
        if now - self._lag_since >= self.opts.follower_wait_s:
            raise ReplicaUnavailableError(
                f"{self.rng}: no replica had offset {self.cursor} within {self.opts.follower_wait_s:g} s "
                f"(followerWaitMs): {self._lag_detail}. The plan took its end offsets from the replicas "
                "then; a replica that fell behind or was replaced has not caught up")
        if now - self._lag_on_replica_since >= _SWITCH_LAGGING_AFTER_S:
            assert self.address is not None
            self._failed.add(self.address)
            self._lag_on_replica_since = now
            await self._choose(f"{self.address} is behind")

    def _check_complete(self) -> None:
        got = self.received + self.skipped + self.lost
        if self.cursor != self.rng.end or (not self.filtered and got != self.rng.count):
            raise RangeMismatchError(f"{self.rng}: received {self.received} messages (and skipped "
                                     f"{self.skipped}) up to offset {self.cursor}, expected exactly "
                                     f"{self.rng.count}")

    async def close(self) -> None:
        self._drop_inflight()
        if self._core is not None:
            await self._core.close()
            self._core = None


def read_columns(opts: SourceOptions, rng: QueueRange, batch_rows: int | None = None) -> Iterator[Columns]:
    """Read ``rng`` in a private asyncio loop, yielding Columns of about ``batch_rows``
    messages (every page alone when None). Raises ReadError unless exactly the range came."""
    loop = asyncio.new_event_loop()
    reader = RangeReader(opts, rng)
    pending: Columns | None = None
    # Decoding allocates millions of short-lived containers; with the default gen0 threshold
    # (700) the collector keeps rescanning the batch being built (measured: ~20 % of the
    # reader's CPU). Nothing here makes cycles: collect less often while the range is read.
    thresholds = gc.get_threshold()
    gc.set_threshold(max(thresholds[0], _GC_GEN0_THRESHOLD), *thresholds[1:])
    try:
        while True:
            page = loop.run_until_complete(reader.next_page())
            if page is None:
                break
            if batch_rows is None:
                yield page
                continue
            if pending is None:
                pending = page
            else:
                pending.extend(page)
            if len(pending) >= batch_rows:
                yield pending
                pending = None
        if pending is not None and len(pending):
            yield pending
        log.info("%s: %d messages from %s%s", rng, reader.received, ", ".join(sorted(reader.served_by)),
                 f" ({reader.skipped} skipped: unreadable records)" if reader.skipped else "")
    finally:
        try:
            loop.run_until_complete(reader.close())
        finally:
            loop.close()
            gc.set_threshold(*thresholds)


def _expected(start: int, count: int, skipped: Sequence[tuple[int, int]]) -> list[int]:
    """The offsets a page of ``count`` messages from ``start`` holds, but for ``skipped``."""
    if not skipped:
        return list(range(start, start + count))
    return [o for o in range(start, start + count) if not any(a <= o < b for a, b in skipped)]


def _chained(rows: Sequence[PullRow], next_offset: int) -> bool:
    """Whether the records of ``rows`` follow one another up to ``next_offset`` (each
    record's message count is in its header)."""
    if not rows:
        return True
    at = rows[0].offset
    for row in rows:
        if row.offset != at:
            return False
        at += record_count(row.record)
    return at == next_offset


def _not_held(rows: Sequence[PullRow], cursor: int) -> Sequence[PullRow]:
    """``rows`` from the first record that ends past ``cursor`` (the ones before it were
    received already: an ordinary pull's first record, or a broker that ignored a stripe)."""
    for i, row in enumerate(rows):
        if row.offset + record_count(row.record) > cursor:
            return rows[i:]
    return ()
