"""The producer: ordered, idempotent sends, gathered per queue into records.

    send / send_async / send_oneway (one message) ─┐  _enqueue: validated, copied, given
    send_batch (messages of one topic) ────────────┤  an id, to its queue (shard_queue(key)
    client/sync.py: many threads, one drain per    ┘  or round robin)
    wake-up of the loop ─▶ QueueSender (client/aio/queue_sender.py): the accumulator
    (``linger_ms``, ``batch_bytes``) and up to ``max_in_flight`` requests per queue; each
    record carries (producer id, base sequence, count): the broker stores it if base =
    last+1, answers a resend of a stored one with its original offsets, refuses gaps

A single message goes at once when nothing of its queue is in flight; else it waits for
company until a request of its queue is answered, the waiting messages fill
``batch_bytes``, or ``linger_ms`` (> 0) has passed -- then it goes as another request in
flight (``linger_ms=0``: never before an answer). A ``send_batch`` call goes at once. A
request that fails with a retriable error (NOT_LEADER, NO_LEADER, lost connection,
timeout, unknown outcome) is resent *unchanged* -- same producer id and sequences -- to
the new leader until ``send_timeout``: a message is stored once, in order, whatever
happened to the first attempt.

Unordered sends (no shard key) go round robin over writable queues (single messages:
to one queue until a request of it is sent or it is saturated, then the next) and, when a
group keeps failing, are retried (``retries``, default 2) on a queue of another
group -- at-least-once if the first attempt's outcome was unknown, as in RocketMQ.
``send_timeout`` bounds the whole call: each attempt gets an equal share of what is
left, so a hung group leaves time to try another.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import cast

from client.aio.core import ClientCore
from client.aio.outgoing import check_message, frozen, record_size
from client.aio.queue_sender import BATCH_MAX_BYTES, QueueSender, _Item
from client.aio.routes import PERM_WRITE
from client.aio.send_sinks import (
    CallSink,
    MessageSink,
    SendBuffer,
    SendCallback,
    call_back,
    log_failure,
    settler,
)
from client.backoff import Deadline
from client.credentials import Credentials
from client.errors import (
    BufferFullError,
    ClientClosedError,
    ClientError,
    InvalidNameError,
    broker_error,
)
from client.message import Message, SendResult
from client.queues import MessageQueue, shard_index, shard_queue
from protocol.names import InvalidName, validate_topic
from protocol.remoting import ResponseCode
from protocol.tls import ClientTls

__all__ = ["MAX_MESSAGE_BYTES", "AsyncProducer", "SendCallback"]

log = logging.getLogger("client.producer")

MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # the broker's default limit of an encoded message
#: Defaults of the accumulator: a single message waits this long for company, a request
#: is sent once its messages reach ``batch_bytes``, this many requests per queue in flight.
LINGER_MS = 2.0
BATCH_BYTES = 256 * 1024
MAX_IN_FLIGHT = 5
#: Sends with a callback not answered yet hold at most this many bytes (``buffer_bytes``).
BUFFER_BYTES = 64 * 1024 * 1024


class AsyncProducer:
    def __init__(self, namesrv: str | Sequence[str] | None = None, group: str = "DEFAULT_PRODUCER", *,
                 servers: Sequence[str] | None = None, send_timeout: float = 10.0, retries: int = 2,
                 max_message_bytes: int = MAX_MESSAGE_BYTES, address_map: Mapping[str, str] | None = None,
                 core: ClientCore | None = None, tls: ClientTls | bool | None = None,
                 credentials: Credentials | None = None, linger_ms: float = LINGER_MS,
                 batch_bytes: int = BATCH_BYTES, max_in_flight: int = MAX_IN_FLIGHT,
                 compression: str | None = None, buffer_bytes: int = BUFFER_BYTES) -> None:
        """``tls``: wss:// to the brokers and https:// to the name servers (``ClientCore``);
        ``credentials``: the user it authenticates as (ACLs on). The accumulator: a single
        message goes at once when nothing of its queue is in flight, else waits for company
        up to an answer, ``batch_bytes`` (at most 1 MiB) or ``linger_ms`` (0: an answer or
        ``batch_bytes`` only); ``max_in_flight`` requests per queue; ``compression``: None, "zstd" or
        "lz4" (each record's messages as one block); ``buffer_bytes``: sends with a callback
        (``send_async``, ``send_oneway``, the blocking client's) not answered yet hold at most
        about this many bytes (Kafka's buffer.memory): then they fail with BufferFullError
        (asyncio) or wait for room (blocking client)."""
        if compression not in (None, "zstd", "lz4"):
            raise ValueError(f"compression must be None, 'zstd' or 'lz4', not {compression!r}")
        if linger_ms < 0 or not 1 <= batch_bytes <= BATCH_MAX_BYTES or max_in_flight < 1:
            raise ValueError(f"linger_ms >= 0, 1 <= batch_bytes <= {BATCH_MAX_BYTES}, max_in_flight >= 1")
        self.group = group
        self.core = core or ClientCore(namesrv, servers, address_map=address_map, tls=tls,
                                       credentials=credentials)
        self._own_core = core is None
        self.send_timeout = send_timeout
        self.retries = retries
        self.max_message_bytes = max_message_bytes
        self._sender_options = {"linger_ms": linger_ms, "batch_bytes": batch_bytes,
                                "max_in_flight": max_in_flight, "compression": compression}
        self._base = f"{group}/{os.urandom(6).hex()}"
        self._senders: dict[MessageQueue, QueueSender] = {}
        self._rr = itertools.count()
        self._avoid: dict[str, float] = {}  # group -> until (monotonic): recently failing groups
        self._background: set[asyncio.Future[None]] = set()
        self._valid_topics: set[str] = set()
        self._sticky: dict[str, tuple[MessageQueue, int]] = {}  # topic -> (queue, its requests then)
        self._writable_cache: dict[str, tuple[object, list[MessageQueue]]] = {}
        # topic -> messages waiting for its route, in send order (one task fetches it)
        self._awaiting_route: dict[str, list[tuple[Message, str | None, MessageSink]]] = {}
        self._id_prefix = os.urandom(8)
        self._id_next = int.from_bytes(os.urandom(4), "big") << 16
        self._closed = False
        self.buffer = SendBuffer(buffer_bytes)

    async def start(self) -> AsyncProducer:
        return self

    async def __aenter__(self) -> AsyncProducer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    # -- public API -----------------------------------------------------------------
    async def send(self, message: Message, shard_key: str | None = None) -> SendResult:
        """Send one message and wait until a majority stored it (SEND_OK). With a
        ``shard_key``, messages of the same key are stored in send order, exactly once.
        It may wait up to ``linger_ms`` for other messages to its queue."""
        future: asyncio.Future[SendResult] = asyncio.get_running_loop().create_future()
        await self._warm(message)
        self._enqueue([(message, shard_key, MessageSink(settler(future), future))])
        return await future

    async def send_batch(self, messages: Sequence[Message], shard_key: str | None = None) -> list[SendResult]:
        """Send messages of one topic to one queue, in order, at once; returns their results."""
        if not messages:
            return []
        topic = self._check(messages)
        if shard_key is not None:
            queue = shard_queue(shard_key, await self._writable(topic))
            return await self._submit(queue, messages)
        return await self._send_unordered(messages, Deadline(self.send_timeout), 0, set())

    def send_async(self, message: Message, callback: SendCallback,
                   shard_key: str | None = None) -> asyncio.Future[SendResult]:
        """Send in the background; ``callback(result, None)`` or ``callback(None, error)``
        (on the loop). Returns a future of the result, which nothing needs to await."""
        future: asyncio.Future[SendResult] = asyncio.get_running_loop().create_future()
        settle = settler(future)

        def done(result: SendResult | None, error: BaseException | None) -> None:
            settle(result, error)
            if error is not None:
                future.exception()  # reported to the callback: not "never retrieved"
            callback(result, error)

        self.enqueue(message, shard_key, done)
        return future

    async def send_oneway(self, message: Message, shard_key: str | None = None) -> None:
        """Queue the message and return at once; failures are only logged."""
        self.enqueue(message, shard_key, log_failure)

    def enqueue(self, message: Message, shard_key: str | None, callback: SendCallback) -> None:
        """Event loop only: send ``message`` in the background, ``callback`` gets its outcome
        (also an invalid message's error). No task or future is made while the topic's
        route is known. (``send_async``/``send_oneway``.) BufferFullError, at once, while
        ``buffer_bytes`` of such sends are not answered yet."""
        if self.buffer.full:
            raise BufferFullError(f"the producer holds {self.buffer.held} bytes of sends not answered yet "
                                  f"(buffer_bytes={self.buffer.max_bytes}): await some (their futures) "
                                  "before sending more")
        self.enqueue_many([(message, shard_key, callback)])

    def enqueue_many(self, sends: Sequence[tuple[Message, str | None, SendCallback]]) -> None:
        """``enqueue`` for several messages (one clock reading and one draw of ids), whether
        the buffer is full or not (the blocking client waits for room before it posts)."""
        buffer = self.buffer
        self._enqueue([(m, key, MessageSink(cb, None, buffer)) for m, key, cb in sends])

    async def shutdown(self, timeout: float = 10.0) -> None:
        """Send what is queued (up to ``timeout``), then close the connections."""
        self._closed = True
        if self._background:
            await asyncio.wait(list(self._background), timeout=timeout)
        for sender in self._senders.values():
            await sender.close(timeout)
        unrouted = ClientClosedError("the producer shut down before the topic's route was known")
        for waiting in self._awaiting_route.values():
            for _, _, sink in waiting:
                sink.settle(0, unrouted)
        self._awaiting_route.clear()
        self.buffer.close()
        if self._own_core:
            await self.core.close()

    # -- internals ----------------------------------------------------------------------
    def _enqueue(self, sends: Sequence[tuple[Message, str | None, MessageSink]]) -> None:
        """Each message to its queue's sender, its outcome to its sink. Messages of a topic
        whose route is not known (or being fetched again) wait for it in one list per topic,
        in send order, and any sent meanwhile join that list: one key's order holds."""
        born_ms = int(time.time() * 1000)
        ids = self._ids(len(sends))
        ordered: Deadline | None = None
        whole: Deadline | None = None
        first_share: Deadline | None = None
        by_sender: dict[QueueSender, list[_Item]] = {}
        for i, (m, key, sink) in enumerate(sends):
            try:
                if m.topic in self._valid_topics and not self._closed:
                    size = check_message(m, self.max_message_bytes)
                else:
                    self._check((m,))
                    size = record_size(m)
                if sink.buffer is not None and not sink.size:  # held until the send ends
                    sink.size = size
                    sink.buffer.held += size
                waiting = self._awaiting_route.get(m.topic)
                queues = None if waiting is not None else self._cached_writable(m.topic)
                if queues is None:
                    if waiting is None:
                        waiting = self._awaiting_route[m.topic] = []
                        self._background_task(self._enqueue_when_routed(m.topic))
                    waiting.append((m, key, sink))
                    continue
                if key is None:
                    queue = self._sticky_queue(m.topic, queues)
                    if self.retries:
                        whole = whole or Deadline(self.send_timeout)
                        sink.retry = (self, m, queue.group, whole)
                    deadline = first_share = first_share or Deadline(self.send_timeout / (self.retries + 1))
                else:
                    queue = queues[shard_index(key, len(queues))]
                    deadline = ordered = ordered or Deadline(self.send_timeout)
                item = _Item(frozen(m), sink, deadline, ids[i], born_ms, size)
            except Exception as e:
                sink.settle(0, e)
                continue
            by_sender.setdefault(self._sender(queue), []).append(item)
        for sender, items in by_sender.items():
            sender.submit(items)

    def _sticky_queue(self, topic: str, queues: list[MessageQueue]) -> MessageQueue:
        """The queue of an unordered single message: the same one until a request of it is
        sent or it has ``max_in_flight`` requests in flight, then the next (Kafka's sticky
        partitioner: a drain's or a linger's messages in one request, not one per queue;
        one at a time, they still spread round robin)."""
        stuck = self._sticky.get(topic)
        if stuck is not None:
            queue, sent = stuck
            sender = self._senders.get(queue)
            if (sender is not None and sender.requests_sent == sent and not sender.saturated
                    and (queue.group not in self._avoid or self._avoid[queue.group] < time.monotonic())):
                return queue
        queue = self._round_robin(queues, set())
        self._sticky[topic] = (queue, self._sender(queue).requests_sent)
        return queue

    def _ids(self, n: int) -> list[bytes]:
        """``n`` message ids of 16 bytes: this producer's random 8 bytes and a counter."""
        first = self._id_next
        self._id_next += n
        prefix = self._id_prefix
        return [prefix + (first + i).to_bytes(8, "big") for i in range(n)]

    async def _enqueue_when_routed(self, topic: str) -> None:
        """The messages waiting for ``topic``'s route, enqueued in send order once it is
        known (or each given the error of fetching it)."""
        try:
            await self._writable(topic)
        except Exception as e:
            for _, _, sink in self._awaiting_route.pop(topic):
                sink.settle(0, e)
            return
        self._enqueue(self._awaiting_route.pop(topic))

    def retry_elsewhere(self, message: Message, group: str, whole: Deadline, callback: SendCallback,
                        error: ClientError) -> None:
        """An unordered single send failed retriably on ``group``: its other attempts, on
        other groups, within ``whole``."""
        self._avoid[group] = time.monotonic() + 30.0
        if whole.expired() or self._closed:
            call_back(callback, None, error)
            return

        async def again() -> None:
            try:
                (result,) = await self._send_unordered([message], whole, 1, {group}, error)
            except Exception as e:
                call_back(callback, None, e)
            else:
                call_back(callback, result, None)

        self._background_task(again())

    def _background_task(self, coro: object) -> None:
        task = asyncio.ensure_future(coro)  # type: ignore[arg-type]
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _warm(self, message: Message) -> None:
        """The route of ``message``'s topic, fetched if not known (errors are the send's)."""
        if self._cached_writable(message.topic) is None:
            with contextlib.suppress(Exception):  # _enqueue reports it through the send's sink
                await self._writable(message.topic)

    async def _send_unordered(self, messages: Sequence[Message], whole: Deadline, first_attempt: int,
                              tried_groups: set[str], last: ClientError | None = None) -> list[SendResult]:
        """Attempts ``first_attempt`` .. ``retries`` of an unordered send, each on a group not
        tried yet when there is one, with an equal share of what is left of ``whole``."""
        topic = messages[0].topic
        for attempt in range(first_attempt, self.retries + 1):
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

    def _check(self, messages: Sequence[Message]) -> str:
        """The topic of ``messages``; raises what is wrong with them."""
        if self._closed:
            raise ClientClosedError("the producer was shut down")
        topic = messages[0].topic
        if topic not in self._valid_topics:
            try:
                validate_topic(topic)
            except InvalidName as e:
                raise InvalidNameError(ResponseCode.INVALID_NAME, str(e)) from None
            if len(self._valid_topics) < 10_000:
                self._valid_topics.add(topic)
        for m in messages:
            if m.topic != topic:
                raise ValueError("a batch must be of one topic")
            check_message(m, self.max_message_bytes)
        return topic

    def _cached_writable(self, topic: str) -> list[MessageQueue] | None:
        """The topic's writable queues, sorted, if its route is known and fresh (no await)."""
        route = self.core.routes.fresh(topic)
        if route is None:
            return None
        cached = self._writable_cache.get(topic)
        if cached is None or cached[0] is not route:
            cached = self._writable_cache[topic] = (route, sorted(route.queues(PERM_WRITE)))
        return cached[1] or None

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

    def _sender(self, queue: MessageQueue) -> QueueSender:
        sender = self._senders.get(queue)
        if sender is None:
            sender = self._senders[queue] = QueueSender(self.core, queue, self._base, **self._sender_options)
        return sender

    async def _submit(self, queue: MessageQueue, messages: Sequence[Message],
                      deadline: Deadline | None = None) -> list[SendResult]:
        # one deadline, one future, one clock reading and one draw of ids for the whole call
        call = CallSink(asyncio.get_running_loop().create_future(), len(messages))
        deadline = deadline or Deadline(self.send_timeout)
        born_ms = int(time.time() * 1000)
        ids = self._ids(len(messages))
        items = [_Item(frozen(m), call, deadline, ids[i], born_ms, record_size(m), i)
                 for i, m in enumerate(messages)]
        self._sender(queue).submit(items, flush=True)
        await call.future  # cancelled with its caller: the messages not yet taken are dropped
        for outcome in call.outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return cast("list[SendResult]", call.outcomes)

