"""The ``raftmq`` sink's partition writer: Arrow batches of rows to idempotent records,
sent to each queue's leader, on a Python worker. Pure asyncio + pyarrow (no pyspark).

    rows (Arrow) ─▶ Message + queue: shard_key ─▶ its queue (client.queues.shard_index,
    │                                 the same as AsyncProducer.send(shard_key=...)),
    │                                 no key ─▶ runs of ``request_messages`` rows per queue,
    │                                 in turn over the topic's writable queues
    └▶ per queue: requests of ``request_messages`` messages or ~1 MiB, cut into records of
       <= RECORD_BYTES (a delayed message alone), producer id ``producer_id``, sequences
       0, 1, 2 ... per queue ─▶ SEND_BATCH to the group's leader (ClientCore.leader_request:
       redirects and retriable failures resent unchanged until ``writeTimeoutMs``)

Everything sent is a function of the rows and their order only: the queue of each row,
the records' boundaries, their sequences and the message ids (hashed from the producer
id, the queue and the sequence). So a second write of the same rows in the same order
under the same producer id -- a task re-attempt, a speculative copy, a replayed
micro-batch -- sends byte-for-byte the same records, and the brokers' producer table
(broker/state/producers.py) answers each stored one DUPLICATE instead of storing it
again. One request per queue is in flight at a time, so a record is sent only after the
one before it on its queue was answered: never a sequence gap, even beside a concurrent
copy of the same write.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from client.aio.core import ClientCore
from client.aio.outgoing import record_size
from client.aio.queue_sender import BATCH_MAX_BYTES, RECORD_BYTES
from client.aio.routes import PERM_WRITE
from client.backoff import Deadline
from client.errors import ClientError, broker_error
from client.message import Message, encode_batch
from client.queues import MessageQueue, shard_index
from protocol.record_batch import is_special
from protocol.remoting import ResponseCode
from protocol.send import SendBatchRequest, SendBatchResponse
from spark.sink_options import SinkOptions

__all__ = ["SINK_COLUMNS", "WriteSummary", "rows_of", "write_partition"]

#: The columns the sink reads (others are ignored); ``body`` is required, ``topic`` unless
#: the option gives it.
SINK_COLUMNS = ("topic", "body", "tags", "keys", "properties", "shard_key", "deliver_at_ms", "delay_level")
_SUCCESS = int(ResponseCode.SUCCESS)
#: A request is sent once its messages reach this many bytes (or ``requestMessages``).
_REQUEST_BYTES = BATCH_MAX_BYTES - RECORD_BYTES


@dataclass
class WriteSummary:
    """What one partition's write did: rows written, how many of them the brokers already
    held (a replay), requests sent, per queue "group#id" the message count."""

    rows: int = 0
    duplicates: int = 0
    requests: int = 0
    by_queue: dict[str, int] = field(default_factory=dict)


def rows_of(batch: pa.RecordBatch, topic: str | None) -> Iterator[tuple[Message, str | None]]:
    """The messages of ``batch`` and their shard keys, in row order. ``topic`` (the
    option), when given, wins over the column."""
    cols = {name: batch.column(i).to_pylist() for i, name in enumerate(batch.schema.names)
            if name in SINK_COLUMNS}
    n = batch.num_rows
    none = [None] * n
    bodies = cols.get("body")
    if bodies is None:
        raise ValueError("the raftmq sink needs a column body (binary or string)")
    topics = [topic] * n if topic else cols.get("topic")
    if topics is None:
        raise ValueError("the raftmq sink needs a column topic or the option topic")
    tags, keys, props = cols.get("tags", none), cols.get("keys", none), cols.get("properties", none)
    shard, at = cols.get("shard_key", none), cols.get("deliver_at_ms", none)
    level = cols.get("delay_level", none)
    for i in range(n):
        body, t = bodies[i], topics[i]
        if body is None or not t:
            raise ValueError(f"row {i} of a batch has no {'body' if body is None else 'topic'}")
        p = props[i]
        yield (Message(t, body.encode() if isinstance(body, str) else body, tags[i] or None,
                       tuple(keys[i] or ()), dict(p) if p else {}, level[i], at[i]), shard[i])


def _id_prefix(producer_id: str, queue: MessageQueue) -> bytes:
    """The first 8 bytes of the ids of ``producer_id``'s messages on ``queue`` (then the sequence)."""
    return hashlib.blake2b(f"{producer_id}\0{queue.topic}\0{queue.group}\0{queue.queue_id}".encode(),
                           digest_size=8).digest()


class _QueueLine:
    """One queue's pending messages, next sequence and last request (sequence order)."""

    def __init__(self, queue: MessageQueue, producer_id: str) -> None:
        self.queue = queue
        self.id_prefix = _id_prefix(producer_id, queue)
        self.pending: list[Message] = []
        self.pending_bytes = 0
        self.next_seq = 0
        self.tail: asyncio.Task[None] | None = None


class _PartitionWriter:
    def __init__(self, core: ClientCore, opts: SinkOptions, producer_id: str) -> None:
        self.core, self.opts, self.producer_id = core, opts, producer_id
        self.summary = WriteSummary()
        self._lines: dict[MessageQueue, _QueueLine] = {}
        self._queues: dict[str, list[MessageQueue]] = {}  # topic -> writable queues, fixed for the write
        self._unkeyed = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def queues(self, topic: str) -> list[MessageQueue]:
        found = self._queues.get(topic)
        if found is None:
            route = await self.core.routes.route(topic)
            found = sorted(route.queues(PERM_WRITE)) or sorted((await self.core.routes.route(
                topic, refresh=True)).queues(PERM_WRITE))
            if not found:
                raise broker_error(int(ResponseCode.NO_PERMISSION), f"topic {topic!r} has no writable queue")
            self._queues[topic] = found
        return found

    async def add(self, message: Message, shard_key: str | None) -> None:
        queues = await self.queues(message.topic)
        if shard_key is not None:
            queue = queues[shard_index(shard_key, len(queues))]
        else:
            queue = queues[(self._unkeyed // self.opts.request_messages) % len(queues)]
            self._unkeyed += 1
        line = self._lines.get(queue)
        if line is None:
            line = self._lines[queue] = _QueueLine(queue, self.producer_id)
        line.pending.append(message)
        line.pending_bytes += record_size(message)
        self.summary.rows += 1
        if len(line.pending) >= self.opts.request_messages or line.pending_bytes >= _REQUEST_BYTES:
            await self._flush(line)

    async def _flush(self, line: _QueueLine) -> None:
        if not line.pending:
            return
        while len(self._tasks) >= self.opts.in_flight:
            done, _ = await asyncio.wait(self._tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # a failed request fails the write now
        records, count = self._records(line), len(line.pending)
        line.pending, line.pending_bytes = [], 0
        task = asyncio.get_running_loop().create_task(self._send(line.tail, line.queue, records, count))
        line.tail = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _records(self, line: _QueueLine) -> list[bytes]:
        """Records of <= RECORD_BYTES of ``line.pending`` taking its next sequences; a delayed
        message (a property the broker acts on) is a record of its own."""
        records: list[bytes] = []
        run: list[Message] = []
        size = 0

        def cut() -> None:
            nonlocal run, size
            if run:
                base = line.next_seq
                ids = [line.id_prefix + (base + i).to_bytes(8, "big") for i in range(len(run))]
                records.append(encode_batch(run, line.queue.queue_id, ids, int(time.time() * 1000),
                                            self.producer_id, base))
                line.next_seq += len(run)
            run, size = [], 0

        for m in line.pending:
            special = (m.delay_level is not None or m.deliver_at_ms is not None
                       or bool(m.properties and is_special(m.properties)))
            n = record_size(m)
            if special or (run and size + n > RECORD_BYTES):
                cut()
            run.append(m)
            size += n
            if special:
                cut()
        cut()
        return records

    async def _send(self, before: asyncio.Task[None] | None, queue: MessageQueue, records: list[bytes],
                    count: int) -> None:
        if before is not None:
            await before  # its failure fails this one: nothing after a hole
        request = SendBatchRequest(records=tuple(records))
        deadline = Deadline(self.opts.write_timeout_s)
        frame = await self.core.leader_request(queue.group, request, deadline=deadline,
                                               topic=queue.topic)
        rows = SendBatchResponse.from_frame(frame).rows
        if len(rows) != count:
            raise ClientError(f"{queue}: {len(rows)} answers for {count} messages")
        for row in rows:
            if row.code != _SUCCESS:
                raise broker_error(row.code, f"{queue}: {row.reason}", queue.group)
            if "already" in row.reason:
                self.summary.duplicates += 1
        self.summary.requests += 1
        name = f"{queue.group}#{queue.queue_id}"
        self.summary.by_queue[name] = self.summary.by_queue.get(name, 0) + count

    async def finish(self) -> None:
        for line in self._lines.values():
            await self._flush(line)
        if self._tasks:
            await asyncio.gather(*list(self._tasks))


async def write_async(opts: SinkOptions, producer_id: str, batches: Iterable[pa.RecordBatch]) -> WriteSummary:
    core = ClientCore(**opts.client_args(), request_timeout=opts.request_timeout_s)
    writer = _PartitionWriter(core, opts, producer_id)
    try:
        for batch in batches:
            for message, key in rows_of(batch, opts.topic):
                await writer.add(message, key)
        await writer.finish()
    finally:
        for task in list(writer._tasks):
            task.cancel()
        await core.close()
    return writer.summary


def write_partition(opts: SinkOptions, producer_id: str, batches: Iterable[Any]) -> WriteSummary:
    """Write one partition's Arrow batches, in order, as producer ``producer_id``; returns
    what it did once every message is stored (or was already). Raises the first failure
    (a ClientError naming the queue), after which nothing later of that queue was sent."""
    return asyncio.run(write_async(opts, producer_id, batches))
