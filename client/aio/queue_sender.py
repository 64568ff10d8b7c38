"""One queue's accumulator and sender: messages gathered into records, several requests in
flight, sequence gaps resent in order.

    submit(items) ─▶ pending ─(ready: nothing in flight, batch_bytes full, a flush, or
                     linger_ms (> 0) passed)─▶ request: records (≤ RECORD_BYTES each,
                     protocol.record_batch) of sequences next .. next+n-1 of producer id
                     "<base>.<epoch>" ─▶ SEND_BATCH to the group's leader (core.leader_request)
    in flight: up to max_in_flight requests, in sequence order; answers are handled in that
               order (a later answer waits for the earlier ones)

The broker stores a record only if its base sequence is the producer's last + 1 on that
queue, answers a resend of a stored record with its original offsets, and refuses a gap
(SEQUENCE_GAP). So request k+1 may go before k is answered: if k's first attempt failed
(NOT_LEADER, a lost connection, an unknown outcome) and ``leader_request``'s retry of k
reaches the new leader after k+1, k+1 is refused as a gap. An answer handled at the head
of the line whose first row is a gap, sent while an earlier request of its epoch was still
unanswered, is sent again *unchanged* (same producer id, same sequences, same bytes) once
it is at the head: never reordered, never stored twice.

A gap in a request sent when every earlier one had been answered means the broker no
longer knows the producer (silent for a day): its messages go again in a new *epoch* (a
fresh producer id whose sequences begin at 0). So do the messages behind a request that
ended without an answer (its deadline) or a message refused for itself (its topic
deleted): those get the error, the epoch ends, and nothing of the new epoch is sent until
every request of the old one is answered (the old one's gaps go first in the new epoch).

Event loop only. Items are settled through their sink (``_Sink``): a future of a whole
call, or a callback per message (``client.aio.send_sinks``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Sequence
from typing import Protocol

from client.aio.core import ClientCore
from client.backoff import Deadline
from client.errors import ClientClosedError, ClientError, broker_error
from client.message import Message, SendResult, SendStatus, encode_batch
from client.queues import MessageQueue
from protocol.remoting import Frame, ResponseCode
from protocol.send import SendBatchRequest, SendBatchResponse

__all__ = ["BATCH_MAX_BYTES", "BATCH_MAX_MESSAGES", "RECORD_BYTES", "QueueSender", "_Item"]

log = logging.getLogger("client.producer")

#: A request holds at most this many messages and bytes. The broker answers a resend with
#: each record's original offsets for the last 256 records of a producer and queue (about 11
#: requests of 1 MiB in 48 KiB records, more of smaller ones); a resend of an older record is
#: answered DUPLICATE without its offset (nothing stored twice, the offset unknown).
BATCH_MAX_MESSAGES = 2048
BATCH_MAX_BYTES = 1024 * 1024
#: A record's messages, about (a record this size fits one Raft entry; a larger message is
#: a record of its own, stored as a chain of fragments).
RECORD_BYTES = 48 * 1024

Outcome = SendResult | BaseException
_SUCCESS, _GAP = int(ResponseCode.SUCCESS), int(ResponseCode.SEQUENCE_GAP)


class _Sink(Protocol):
    """Where the outcomes of items go (``index``: the item's place in its call)."""

    @property
    def abandoned(self) -> bool: ...
    def settle(self, index: int, outcome: Outcome) -> None: ...


class _Item:
    """One message in a queue's sender; its outcome goes to ``sink`` at ``index``."""

    __slots__ = ("born_ms", "deadline", "index", "message", "msg_id", "sink", "size")

    def __init__(self, message: Message, sink: _Sink, deadline: Deadline, msg_id: bytes, born_ms: int,
                 size: int, index: int = 0) -> None:
        self.message, self.sink, self.deadline = message, sink, deadline
        self.msg_id, self.born_ms, self.size, self.index = msg_id, born_ms, size, index

    def settle(self, outcome: Outcome) -> None:
        self.sink.settle(self.index, outcome)


class _Request:
    """One SEND_BATCH of a queue: its items, their records (bytes fixed once made: a resend
    is the same bytes), and its answer once it has one."""

    __slots__ = ("clean", "deadline", "epoch", "items", "outcome", "records", "task")

    def __init__(self, items: list[_Item], records: list[bytes], epoch: int, clean: bool) -> None:
        self.items, self.records, self.epoch = items, records, epoch
        self.clean = clean  # sent when every earlier request was answered: a gap is real
        # the earliest deadline; the messages of one call share theirs
        self.deadline = min(dict.fromkeys(i.deadline for i in items), key=Deadline.remaining)
        self.outcome: Frame | ClientError | None = None
        self.task: asyncio.Task[None] | None = None


class QueueSender:
    """Sends one queue's messages in order, up to ``max_in_flight`` requests at a time."""

    def __init__(self, core: ClientCore, queue: MessageQueue, producer_base: str, *, linger_ms: float = 0.0,
                 batch_bytes: int = BATCH_MAX_BYTES, max_in_flight: int = 1,
                 compression: str | None = None) -> None:
        """``compression``: None, "zstd" or "lz4", each record's message section."""
        if linger_ms < 0 or batch_bytes < 1 or max_in_flight < 1:
            raise ValueError("linger_ms >= 0, batch_bytes >= 1 and max_in_flight >= 1, please")
        self.core = core
        self.queue = queue
        self._base = producer_base
        self._linger = linger_ms / 1000
        self._batch_bytes = batch_bytes
        self._max_in_flight = max_in_flight
        self._compression = compression
        self._epoch = 0
        self._next_seq = 0
        self._pending: deque[_Item] = deque()
        self._pending_bytes = 0
        self._urgent = 0  # items at the head of pending that go without lingering
        self._first_at = 0.0  # loop time the oldest pending item came
        self._timer: asyncio.TimerHandle | None = None
        self._in_flight: deque[_Request] = deque()
        self._requeued: list[_Item] = []  # refused as gaps of an ended epoch: first in the next
        self._closing = False
        self.requests_sent = 0  # requests made (not counting resends)
        self.gap_resends = 0  # requests sent again unchanged after overtaking a retried one
        self._idle = asyncio.Event()
        self._idle.set()
        self._loop = asyncio.get_running_loop()

    @property
    def producer_id(self) -> str:
        return f"{self._base}.{self._epoch}"

    @property
    def saturated(self) -> bool:
        """Whether it has all the requests in flight it may have."""
        return len(self._in_flight) >= self._max_in_flight

    def submit(self, items: Sequence[_Item], flush: bool = False) -> None:
        """Queue ``items`` (in order, after those queued before); ``flush``: send them
        without lingering."""
        if not self._pending:
            self._first_at = self._loop.time()
        self._pending.extend(items)
        self._pending_bytes += sum(i.size for i in items)
        if flush:
            self._urgent = len(self._pending)
        self._idle.clear()
        self._pump()

    # -- sending ----------------------------------------------------------------------------
    def _pump(self) -> None:
        """Send what is ready while there is room; else wake up when the linger ends."""
        while self._pending and self._may_send():
            if not self._ready():
                if self._linger and self._timer is None:  # linger 0: an answer wakes it
                    self._timer = self._loop.call_at(self._first_at + self._linger, self._linger_ended)
                return
            self._send_next()
        self._check_idle()

    def _linger_ended(self) -> None:
        self._timer = None
        self._pump()

    def _may_send(self) -> bool:
        flight = self._in_flight
        # a new epoch waits for every request of the old one (its gaps go first)
        return len(flight) < self._max_in_flight and not (flight and flight[0].epoch != self._epoch)

    def _ready(self) -> bool:
        """Whether the pending messages go now: nothing is in flight (company comes while
        one request is), they fill a request, a flush, or ``linger_ms`` (> 0) has passed
        since the oldest came (another request in flight beside those)."""
        if not self._in_flight or self._urgent or self._closing:
            return True
        if self._pending_bytes >= self._batch_bytes or len(self._pending) >= BATCH_MAX_MESSAGES:
            return True
        return bool(self._linger) and self._loop.time() >= self._first_at + self._linger

    def _send_next(self) -> None:
        items = self._take()
        if not items:
            return
        try:
            records = self._records(items)
        except (TypeError, ValueError, OverflowError) as e:  # what the producer's checks cannot foresee
            for item in items:
                item.settle(ClientError(f"the messages cannot be encoded: {e}"))
            return
        request = _Request(items, records, self._epoch, clean=not self._in_flight)
        self._in_flight.append(request)
        self.requests_sent += 1
        self._start(request)

    def _take(self) -> list[_Item]:
        """The next request's items (cancelled ones dropped), at most BATCH_MAX_MESSAGES and
        about ``batch_bytes``."""
        batch: list[_Item] = []
        size = 0
        pending = self._pending
        while pending and len(batch) < BATCH_MAX_MESSAGES:
            item = pending[0]
            if batch and size + item.size > self._batch_bytes:
                break
            pending.popleft()
            self._pending_bytes -= item.size
            if not item.sink.abandoned:  # its caller gave up before it was sent
                batch.append(item)
                size += item.size
        self._urgent = max(0, self._urgent - len(batch))
        if not pending:
            self._urgent = 0
        return batch

    def _records(self, items: list[_Item]) -> list[bytes]:
        """Records of ``items`` (≤ RECORD_BYTES each) taking the next sequences; none are
        taken if one cannot be encoded."""
        records: list[bytes] = []
        seq, start, size = self._next_seq, 0, 0
        for i, item in enumerate(items):
            if i > start and size + item.size > RECORD_BYTES:
                records.append(self._record(items[start:i], seq))
                seq += i - start
                start, size = i, 0
            size += item.size
        records.append(self._record(items[start:], seq))
        self._next_seq = seq + len(items) - start
        return records

    def _record(self, items: Sequence[_Item], base: int) -> bytes:
        return encode_batch([item.message for item in items], self.queue.queue_id,
                            [item.msg_id for item in items], items[0].born_ms, self.producer_id, base,
                            self._compression)

    def _start(self, request: _Request) -> None:
        request.outcome = None
        request.task = self._loop.create_task(self._attempt(request))

    async def _attempt(self, request: _Request) -> None:
        try:
            request.outcome = await self.core.leader_request(
                self.queue.group, SendBatchRequest(records=tuple(request.records)), deadline=request.deadline,
                topic=self.queue.topic)
        except ClientError as e:
            request.outcome = e
        except Exception as e:  # never let one request stop the queue
            log.exception("send to %s failed", self.queue)
            request.outcome = ClientError(str(e))
        self._answered()

    # -- answers, in sequence order --------------------------------------------------------------
    def _answered(self) -> None:
        flight = self._in_flight
        while flight and flight[0].outcome is not None:
            request = flight.popleft()
            if self._handle(request):  # sent again: still the head
                flight.appendleft(request)
                self._start(request)
                break
        if self._requeued and not (flight and flight[0].epoch != self._epoch):
            self._pending.extendleft(reversed(self._requeued))
            self._pending_bytes += sum(i.size for i in self._requeued)
            self._urgent += len(self._requeued)
            self._requeued = []
        self._pump()

    def _handle(self, request: _Request) -> bool:
        """Settle ``request``'s items from its answer; True if it is to be sent again as it is."""
        outcome = request.outcome
        current = request.epoch == self._epoch
        if isinstance(outcome, BaseException):
            for item in request.items:
                item.settle(outcome)
            if current:
                self._new_epoch()
            return False
        try:
            rows = SendBatchResponse.from_frame(outcome).rows  # type: ignore[arg-type]
            if len(rows) != len(request.items):
                raise ValueError(f"{len(rows)} rows for {len(request.items)} messages")
        except Exception as e:
            log.warning("%s: an answer this client cannot read: %s", self.queue, e)
            for item in request.items:
                item.settle(ClientError(f"an answer this client cannot read: {e}"))
            if current:
                self._new_epoch()
            return False
        if rows and rows[0].code == _GAP:
            if current and not request.clean:  # overtook an earlier request (retried): send again
                request.clean = True
                self.gap_resends += 1
                return True
            if current:  # the broker forgot this producer (silent for a day): nothing was stored
                log.info("%s: the broker no longer knows producer %s; new epoch", self.queue,
                         self.producer_id)
                self._new_epoch()
            self._requeued.extend(request.items)
            return False
        queue, broken, gapped = self.queue, False, []
        for item, row in zip(request.items, rows, strict=True):
            code, reason = row.code, row.reason
            if code == _SUCCESS:
                result = SendResult(SendStatus.SEND_OK, item.msg_id.hex(), queue, row.queue_offset,
                                    bool(reason) and "already" in reason, row.position)
                item.sink.settle(item.index, result)
            elif code == _GAP and broken:
                gapped.append(item)  # only because an earlier one was refused
            else:
                broken = True
                item.settle(broker_error(code, reason, queue.group))
        if broken and current:
            self._new_epoch()
        self._requeued.extend(gapped)
        return False

    def _new_epoch(self) -> None:
        """A fresh producer id whose sequences start at 0."""
        self._epoch += 1
        self._next_seq = 0

    def _check_idle(self) -> None:
        if not (self._pending or self._in_flight or self._requeued):
            self._idle.set()

    # -- closing ---------------------------------------------------------------------------------
    async def close(self, timeout: float) -> None:
        """Send what is queued (without lingering), up to ``timeout``; then give up on the rest:
        what was answered is settled from its answer, what was sent and not answered fails
        saying it may be stored, what was never sent (or refused unstored) that it was not."""
        self._closing = True
        self._pump()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout)
        if self._timer is not None:
            self._timer.cancel()
        unsent = ClientClosedError("the producer shut down before sending")
        unanswered = ClientClosedError("the producer shut down before the broker answered: the message "
                                       "may or may not be stored")
        for request in self._in_flight:  # in order; an answer behind an unanswered one is used
            if request.outcome is None:
                if request.task is not None:
                    request.task.cancel()
                for item in request.items:
                    item.settle(unanswered)
            elif self._handle(request):  # to be sent again (it overtook one): nothing was stored
                for item in request.items:
                    item.settle(unsent)
        for item in [*self._requeued, *self._pending]:
            item.settle(unsent)
        self._in_flight.clear()
        self._pending.clear()
        self._requeued = []
