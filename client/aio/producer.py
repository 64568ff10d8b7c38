"""The producer: ordered, idempotent sends with one request in flight per queue.

    send(msg, shard_key) ─▶ queue (shard_queue(key) or round robin) ─▶ QueueSender
    QueueSender: pending ─▶ batch (≤ 2048 msgs / 1 MiB) ─▶ records (≤ RECORD_BYTES each:
                 protocol.record_batch) ─▶ SEND_BATCH to the group's leader
                 each record carries (producer id, base sequence, count): the broker stores
                 it if base = last+1, answers a resend of a stored one with its original
                 offsets, refuses gaps

One batch per queue is in flight at a time, so the broker never sees a gap it
would have to refuse, and messages queued meanwhile ride in the next batch
(pipelining by batching). A batch that fails with a retriable error (NOT_LEADER,
NO_LEADER, lost connection, timeout, unknown outcome) is resent *unchanged* --
same producer id and sequences -- to the new leader until ``send_timeout``: a
message is stored once, in order, whatever happened to the first attempt.

When a batch ends without an answer (deadline) or a message in it is refused
(e.g. its topic was deleted), the queue starts a new *epoch*: a fresh producer id
whose sequences begin at 0, so later messages are not refused as gaps.

Unordered sends (no shard key) go round robin over writable queues and, when a
group keeps failing, are retried (``retries``, default 2) on a queue of another
group -- at-least-once if the first attempt's outcome was unknown, as in RocketMQ.
``send_timeout`` bounds the whole call: each attempt gets an equal share of what is
left, so a hung group leaves time to try another.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

from client.aio.core import ClientCore
from client.aio.routes import PERM_WRITE
from client.backoff import Deadline
from client.credentials import Credentials
from client.errors import (
    ClientClosedError,
    ClientError,
    InvalidNameError,
    MessageTooLargeError,
    broker_error,
)
from client.message import Message, SendResult, SendStatus, encode_batch, new_msg_id
from client.queues import MessageQueue, shard_queue
from protocol.names import InvalidName, validate_topic
from protocol.remoting import ResponseCode
from protocol.send import SendBatchRequest, SendBatchResponse
from protocol.tls import ClientTls

__all__ = ["MAX_MESSAGE_BYTES", "AsyncProducer"]

log = logging.getLogger("client.producer")

MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # the broker's default limit of an encoded message
_ENVELOPE = 128  # the encoded message's fixed fields, generously (ids, times, host, sequence)
#: One request per queue is in flight: a batch is up to this many messages in records of up
#: to RECORD_BYTES (the broker answers a resend with every record's original offsets for the
#: last 256 records of a producer and queue: more than a batch ever holds).
BATCH_MAX_MESSAGES = 2048
BATCH_MAX_BYTES = 1024 * 1024
#: A record's messages, about (a record this size fits one Raft entry; a larger message is
#: a record of its own, stored as a chain of fragments).
RECORD_BYTES = 48 * 1024
_PER_MESSAGE = 40  # a message's bytes in a record besides body, tags, keys and properties
_BODY_TYPES = (bytes, bytearray, memoryview)

_Outcome = SendResult | BaseException


class _Call:
    """One ``send_batch`` call: an outcome per message and the one future its caller awaits,
    done once every message has its outcome (a future per message costs more than the rest
    of its send). Cancelling the future abandons the messages not yet sent."""

    __slots__ = ("_left", "future", "outcomes")

    def __init__(self, future: asyncio.Future[None], count: int) -> None:
        self.future = future
        self.outcomes: list[_Outcome | None] = [None] * count
        self._left = count

    def settle(self, index: int, outcome: _Outcome) -> None:
        if self.outcomes[index] is None and not self.future.done():
            self.outcomes[index] = outcome
            self._left -= 1
            if not self._left:
                self.future.set_result(None)


@dataclass(slots=True)
class _Item:
    """One message in a queue's sender. Its outcome is set on its own ``future``; or, when
    ``call`` is set, stored at ``index`` in that call, and ``future`` is the call's (shared)."""

    message: Message
    future: asyncio.Future[SendResult] | asyncio.Future[None]  # done: nothing more to do for it
    deadline: Deadline
    msg_id: bytes = field(default_factory=new_msg_id)
    born_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    size: int = 0  # about its bytes in a record
    call: _Call | None = None
    index: int = 0

    def settle(self, outcome: _Outcome) -> None:
        """Its outcome, unless it has one already or its caller gave up."""
        if self.call is not None:
            self.call.settle(self.index, outcome)
        elif not self.future.done():
            if isinstance(outcome, BaseException):
                self.future.set_exception(outcome)
            else:
                cast("asyncio.Future[SendResult]", self.future).set_result(outcome)


class QueueSender:
    """Sends one queue's messages in order, one batch in flight."""

    def __init__(self, core: ClientCore, queue: MessageQueue, producer_base: str) -> None:
        self.core = core
        self.queue = queue
        self._base = producer_base
        self._epoch = 0
        self._next_seq = 0
        self._pending: deque[_Item] = deque()
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._run())
        self._closing = False

    @property
    def producer_id(self) -> str:
        return f"{self._base}.{self._epoch}"

    def submit(self, items: Sequence[_Item]) -> None:
        self._pending.extend(items)
        self._wake.set()

    async def _run(self) -> None:
        while True:
            if not self._pending:
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            batch, records = self._take()
            if not batch:
                continue
            try:
                await self._send(batch, records)
            except Exception as e:  # never let one batch kill the queue's sender
                log.exception("send to %s failed", self.queue)
                self._fail(batch, e if isinstance(e, ClientError) else ClientError(str(e)))

    def _take(self) -> tuple[list[_Item], list[bytes]]:
        """The next batch and its records (sequences taken from the producer's next);
        messages that cannot be encoded are settled with the error."""
        batch: list[_Item] = []
        size = 0
        pending = self._pending
        while pending and len(batch) < BATCH_MAX_MESSAGES:
            item = pending[0]
            if item.future.done():  # cancelled by its caller before it was sent
                pending.popleft()
                continue
            if batch and size + item.size > BATCH_MAX_BYTES:
                break
            batch.append(pending.popleft())
            size += item.size
        records: list[bytes] = []
        start, size = 0, 0
        try:
            for i, item in enumerate(batch):
                if i > start and size + item.size > RECORD_BYTES:
                    records.append(self._record(batch[start:i]))
                    start, size = i, 0
                size += item.size
            if batch:
                records.append(self._record(batch[start:]))
        except (TypeError, ValueError, OverflowError) as e:  # what _check cannot foresee
            self._fail(batch, ClientError(f"the messages cannot be encoded: {e}"))
            return [], []
        return batch, records

    def _record(self, items: Sequence[_Item]) -> bytes:
        record = encode_batch([item.message for item in items], self.queue.queue_id,
                              [item.msg_id for item in items], items[0].born_ms, self.producer_id,
                              self._next_seq)
        self._next_seq += len(items)
        return record

    def _new_epoch(self, resend: Sequence[_Item] = ()) -> None:
        """Start a fresh producer id; ``resend`` (refused as gaps: never stored) goes first."""
        self._epoch += 1
        self._next_seq = 0
        self._pending.extendleft(reversed(resend))

    def _fail(self, batch: Sequence[_Item], error: BaseException) -> None:
        for item in batch:
            item.settle(error)
        self._new_epoch()

    async def _send(self, batch: list[_Item], records: list[bytes]) -> None:
        request = SendBatchRequest(records=tuple(records))
        # the earliest deadline; the messages of one send call share theirs
        deadline = min(dict.fromkeys(item.deadline for item in batch), key=Deadline.remaining)
        try:
            reply = await self.core.leader_request(self.queue.group, request, deadline=deadline,
                                                   topic=self.queue.topic)
        except ClientError as e:
            self._fail(batch, e)
            return
        rows = SendBatchResponse.from_frame(reply).rows
        refused_as_gap: list[_Item] = []
        broken = False
        if rows and rows[0].code == ResponseCode.SEQUENCE_GAP:
            # the broker forgot this producer (silent for a day): nothing was stored;
            # start a new epoch and send them again
            log.info("%s: the broker no longer knows producer %s; new epoch", self.queue, self.producer_id)
            self._new_epoch(batch)
            return
        queue, success, gap = self.queue, int(ResponseCode.SUCCESS), int(ResponseCode.SEQUENCE_GAP)
        for item, row in zip(batch, rows, strict=True):
            code, reason = row.code, row.reason
            if code == success:
                item.settle(SendResult(SendStatus.SEND_OK, item.msg_id.hex(), queue, row.queue_offset,
                                       bool(reason) and "already" in reason, row.position))
            elif code == gap and broken:
                refused_as_gap.append(item)  # only because an earlier one was refused
            else:
                broken = True
                item.settle(broker_error(code, reason, queue.group))
        if broken:
            self._new_epoch(refused_as_gap)

    async def close(self, timeout: float) -> None:
        self._closing = True
        self._wake.set()
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout)
        except TimeoutError:
            self._task.cancel()
        for item in self._pending:
            item.settle(ClientClosedError("the producer shut down before sending"))


class AsyncProducer:
    def __init__(self, namesrv: str | Sequence[str] | None = None, group: str = "DEFAULT_PRODUCER", *,
                 servers: Sequence[str] | None = None, send_timeout: float = 10.0, retries: int = 2,
                 max_message_bytes: int = MAX_MESSAGE_BYTES, address_map: Mapping[str, str] | None = None,
                 core: ClientCore | None = None, tls: ClientTls | bool | None = None,
                 credentials: Credentials | None = None) -> None:
        """``tls``: wss:// to the brokers and https:// to the name servers (``ClientCore``);
        ``credentials``: the user it authenticates as (ACLs on)."""
        self.group = group
        self.core = core or ClientCore(namesrv, servers, address_map=address_map, tls=tls,
                                       credentials=credentials)
        self._own_core = core is None
        self.send_timeout = send_timeout
        self.retries = retries
        self.max_message_bytes = max_message_bytes
        self._base = f"{group}/{os.urandom(6).hex()}"
        self._senders: dict[MessageQueue, QueueSender] = {}
        self._rr = itertools.count()
        self._avoid: dict[str, float] = {}  # group -> until (monotonic): recently failing groups
        self._oneway: set[asyncio.Future[SendResult]] = set()
        self._closed = False

    async def start(self) -> AsyncProducer:
        return self

    async def __aenter__(self) -> AsyncProducer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    # -- public API -----------------------------------------------------------------
    async def send(self, message: Message, shard_key: str | None = None) -> SendResult:
        """Send one message and wait until a majority stored it (SEND_OK). With a
        ``shard_key``, messages of the same key are stored in send order, exactly once."""
        (result,) = await self.send_batch([message], shard_key)
        return result

    async def send_batch(self, messages: Sequence[Message], shard_key: str | None = None) -> list[SendResult]:
        """Send messages of one topic to one queue, in order; returns their results."""
        if not messages:
            return []
        topic = self._check(messages)
        if shard_key is not None:
            queue = shard_queue(shard_key, await self._writable(topic))
            return await self._submit(queue, messages)
        last: ClientError | None = None
        tried_groups: set[str] = set()
        whole = Deadline(self.send_timeout)
        for attempt in range(self.retries + 1):
            if last is not None and whole.expired():
                break
            queue = self._round_robin(await self._writable(topic), tried_groups)
            try:
                share = Deadline(whole.remaining() / (self.retries + 1 - attempt))
                return await self._submit(queue, messages, share)
            except ClientError as e:
                if not e.retriable:
                    raise
                last = e
                tried_groups.add(queue.group)
                self._avoid[queue.group] = time.monotonic() + 30.0
        assert last is not None
        raise last

    def send_async(self, message: Message,
                   callback: Callable[[SendResult | None, BaseException | None], None],
                   shard_key: str | None = None) -> asyncio.Task[SendResult]:
        """Send in the background; ``callback(result, None)`` or ``callback(None, error)``."""
        task = asyncio.create_task(self.send(message, shard_key))

        def done(t: asyncio.Task[SendResult]) -> None:
            if t.cancelled():
                callback(None, ClientClosedError("the send was cancelled"))
            elif t.exception() is not None:
                callback(None, t.exception())
            else:
                callback(t.result(), None)

        task.add_done_callback(done)
        return task

    async def send_oneway(self, message: Message, shard_key: str | None = None) -> None:
        """Queue the message and return at once; failures are only logged."""
        task: asyncio.Future[SendResult] = asyncio.ensure_future(self.send(message, shard_key))
        self._oneway.add(task)
        task.add_done_callback(self._oneway_done)

    def _oneway_done(self, task: asyncio.Future[SendResult]) -> None:
        self._oneway.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("oneway send failed: %s", task.exception())

    async def shutdown(self, timeout: float = 10.0) -> None:
        """Send what is queued (up to ``timeout``), then close the connections."""
        self._closed = True
        if self._oneway:
            await asyncio.wait(list(self._oneway), timeout=timeout)
        for sender in self._senders.values():
            await sender.close(timeout)
        if self._own_core:
            await self.core.close()

    # -- internals ----------------------------------------------------------------------
    def _check(self, messages: Sequence[Message]) -> str:
        if self._closed:
            raise ClientClosedError("the producer was shut down")
        topic = messages[0].topic
        try:
            validate_topic(topic)
        except InvalidName as e:
            raise InvalidNameError(ResponseCode.INVALID_NAME, str(e)) from None
        for m in messages:
            if m.topic != topic:
                raise ValueError("a batch must be of one topic")
            if not isinstance(m.body, _BODY_TYPES):
                raise TypeError(f"a message body must be bytes, not {type(m.body).__name__}")
            if not (m.tags is None or isinstance(m.tags, str)):
                raise TypeError(f"tags must be a string, not {type(m.tags).__name__}")
            size = _ENVELOPE + len(m.topic) + len(m.tags or "")
            if m.keys:
                if isinstance(m.keys, str) or not all(isinstance(k, str) for k in m.keys):
                    raise TypeError("keys must be a sequence of strings, e.g. keys=['order-42']")
                size += sum(len(k) + 2 for k in m.keys)
            if m.properties:
                if not all(isinstance(k, str) and isinstance(v, str) for k, v in m.properties.items()):
                    raise TypeError("properties must map strings to strings")
                size += sum(len(k) + len(v) + 4 for k, v in m.properties.items())
            size += len(m.body)  # the broker limits the record: a message this large is one alone
            if size > self.max_message_bytes:
                raise MessageTooLargeError(
                    ResponseCode.MESSAGE_TOO_LARGE,
                    f"message of about {size} bytes (encoded) exceeds max_message_bytes="
                    f"{self.max_message_bytes}; split it or store the payload elsewhere")
        return topic

    async def _writable(self, topic: str) -> list[MessageQueue]:
        route = await self.core.routes.route(topic)
        queues = route.queues(PERM_WRITE)
        if not queues:
            route = await self.core.routes.route(topic, refresh=True)
            queues = route.queues(PERM_WRITE)
        if not queues:
            raise broker_error(ResponseCode.NO_PERMISSION, f"topic {topic!r} has no writable queue")
        return queues

    def _round_robin(self, queues: list[MessageQueue], tried_groups: set[str]) -> MessageQueue:
        now = time.monotonic()
        good = [q for q in queues if q.group not in tried_groups and self._avoid.get(q.group, 0) < now]
        pool = good or [q for q in queues if q.group not in tried_groups] or queues
        return pool[next(self._rr) % len(pool)]

    async def _submit(self, queue: MessageQueue, messages: Sequence[Message],
                      deadline: Deadline | None = None) -> list[SendResult]:
        sender = self._senders.get(queue)
        if sender is None:
            sender = self._senders[queue] = QueueSender(self.core, queue, self._base)
        # one deadline, one future, one clock reading and one draw of ids for the whole call
        call = _Call(asyncio.get_running_loop().create_future(), len(messages))
        deadline = deadline or Deadline(self.send_timeout)
        born_ms = int(time.time() * 1000)
        ids = os.urandom(16 * len(messages))
        sender.submit([_Item(Message(m.topic, bytes(m.body), m.tags, tuple(m.keys), dict(m.properties),
                                     m.delay_level, m.deliver_at_ms),
                             call.future, deadline, ids[16 * i:16 * i + 16], born_ms, _size(m), call, i)
                       for i, m in enumerate(messages)])
        await call.future  # cancelled with its caller: the messages not yet taken are dropped
        for outcome in call.outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return cast("list[SendResult]", call.outcomes)


def _size(m: Message) -> int:
    """About the bytes of ``m`` in a record."""
    size = _PER_MESSAGE + len(m.body) + len(m.tags or "")
    if m.keys:
        size += sum(len(k) + 2 for k in m.keys)
    if m.properties:
        size += sum(len(k) + len(v) + 4 for k, v in m.properties.items())
    return size
