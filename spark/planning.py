"""Planning reads of a topic from broker replicas (the driver side) -- Spark-free.

Everything here is plain Python on the client primitives (``ClientCore``, its connection
pool, the SEARCH_OFFSET request) and is tested without Spark; it never imports pyspark.

Planning
    ``plan_batch`` / ``current_offsets`` ask every replica the source would read from
    (``readFrom``, see ``spark.replicas``) for each queue's bounds (SEARCH_OFFSET). A range
    ends at most at the *lowest* end those replicas report, so no partition asks a replica
    for messages it does not have; it starts at least at the *highest* start (what all of
    them still retain). Each queue's range becomes one partition (a :class:`QueueRange`,
    read by ``spark.range_reader``), split when longer than ``maxRecordsPerPartition``;
    the partitions of a group take its followers in turn (``preferred``), so that tasks
    running side by side load different followers.

Topics
    ``topic``, the ``topics`` list, or the topics the cluster holds whose names
    ``topicPattern`` matches in full (``resolve_topics``, asked again at every
    ``queue_bounds``: a topic created while a stream runs joins it; a topic that is gone
    keeps its offsets, as a queue that left the route does).

Streaming offsets
    ``{(topic, group, queue id): next offset}`` (:data:`Offsets`), as JSON in Spark's
    checkpoint (``offsets_to_json`` / ``offsets_from_json``): ``{"<group>": {"<queue id>":
    offset}}`` with the option ``topic`` (the shape of checkpoints written before several
    topics were read), ``{"<topic>": {"<group>": {"<queue id>": offset}}}`` with ``topics``
    / ``topicPattern``; ``initial_offsets`` resolves ``startingOffsets``, ``admit`` applies
    ``maxRecordsPerTrigger``.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from client.aio.admin import AsyncAdmin
from client.aio.core import ClientCore
from client.aio.routes import PERM_READ, GroupRoute
from client.backoff import Deadline
from client.errors import ClientError, TopicNotExistError
from protocol.query import SearchOffsetRequest, SearchOffsetResponse
from spark.errors import DataLossError, ReadError, ReplicaUnavailableError
from spark.options import EARLIEST, LATEST, OffsetSpec, OptionError, SourceOptions
from spark.replicas import no_replica_message, plan_sources, replica_roles

__all__ = [
    "Offsets",
    "QueueBounds",
    "QueueKey",
    "QueueRange",
    "admit",
    "current_offsets",
    "initial_offsets",
    "offsets_from_json",
    "offsets_to_json",
    "plan_batch",
    "plan_ranges",
    "queue_bounds",
    "resolve_topics",
]

log = logging.getLogger("spark.raftmq")

#: a queue of the source: (topic, broker group, queue id)
QueueKey = tuple[str, str, int]


@dataclass(frozen=True, slots=True)
class QueueBounds:
    """What the replicas a read would use hold of one queue."""

    topic: str
    group: str
    queue_id: int
    low: int                        # the highest first offset among them (all still retain it)
    high: int                       # the lowest end offset among them (all have applied it)
    replicas: tuple[str, ...]       # every replica of the group
    sources: tuple[str, ...]        # the replicas the bounds came from (where to read)
    at_time: dict[int, int] = field(default_factory=dict)  # timestamp ms -> first offset at/after

    @property
    def key(self) -> QueueKey:
        return (self.topic, self.group, self.queue_id)


@dataclass(frozen=True, slots=True)
class QueueRange:
    """Messages [start, end) of one queue: one Spark partition."""

    topic: str
    group: str
    queue_id: int
    start: int
    end: int
    replicas: tuple[str, ...]
    preferred: str | None = None

    @property
    def count(self) -> int:
        return self.end - self.start

    def __str__(self) -> str:
        return f"{self.topic}@{self.group}#{self.queue_id}[{self.start}, {self.end})"


async def _search(core: ClientCore, address: str, topic: str, queue_id: int, timestamp_ms: int | None,
                  timeout: float) -> SearchOffsetResponse:
    request = SearchOffsetRequest(topic=topic, queue_id=queue_id, timestamp=timestamp_ms)
    return SearchOffsetResponse.from_frame(await core.pool.request(address, request, timeout=timeout))


async def _group_bounds(core: ClientCore, opts: SourceOptions, topic: str, group: GroupRoute,
                        queue_ids: Sequence[int], timestamps: Sequence[int]) -> list[QueueBounds] | str:
    """The bounds of one group's queues, or why no replica could give them."""
    roles = await replica_roles(core, group.addresses)
    sources = plan_sources(roles, opts.read_from)
    answers: dict[str, dict[int, tuple[int, int, dict[int, int]]]] = {}

    async def ask(address: str, queue_id: int) -> None:
        found = await _search(core, address, topic, queue_id, None, opts.request_timeout_s)
        at = {}
        for ts in timestamps:
            offset = (await _search(core, address, topic, queue_id, ts, opts.request_timeout_s)).offset
            if offset is None:
                raise ReadError(f"{address} answered a search by time without an offset")
            at[ts] = offset
        answers.setdefault(address, {})[queue_id] = (found.min_offset, found.max_offset, at)

    results = await asyncio.gather(*(ask(a, q) for a in sources for q in queue_ids), return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    for e in errors:
        if not isinstance(e, ClientError):
            raise e
    # a replica that failed any query (down, or has not applied the topic yet) is left out
    usable = [a for a in sources if len(answers.get(a, {})) == len(queue_ids)]
    if not usable:
        return no_replica_message(group.group, opts.read_from, roles) + (f"; {errors[0]}" if errors else "")
    out = []
    for q in queue_ids:
        per = [answers[a][q] for a in usable]
        at = {ts: max(p[2][ts] for p in per) for ts in timestamps}
        out.append(QueueBounds(topic, group.group, q, max(p[0] for p in per), min(p[1] for p in per),
                               tuple(group.addresses), tuple(usable), at))
    return out


async def resolve_topics(core: ClientCore, opts: SourceOptions) -> list[str]:
    """The topics the source reads now: ``topic``, ``topics``, or the topics the cluster
    holds whose names ``topicPattern`` matches in full (asked each time)."""
    if opts.topic_pattern is None:
        return list(opts.topics) or [opts.topic]
    held = await AsyncAdmin(core=core, timeout=opts.request_timeout_s).topics()
    return [t for t in held if opts.matches(t)]


async def _topic_bounds(core: ClientCore, opts: SourceOptions, topic: str,
                        timestamps: Sequence[int]) -> list[QueueBounds]:
    try:
        route = await core.routes.route(topic, refresh=True)
    except TopicNotExistError:  # listed by a broker, not routed yet (the name servers hear of it
        if opts.topic_pattern is None:  # within a second), or deleted since
            raise
        log.info("topic %r (topicPattern %r) has no route yet: read from a later planning on", topic,
                 opts.topic_pattern)
        return []
    queues = route.queues(PERM_READ)
    out: list[QueueBounds] = []
    for g in sorted(route.groups, key=lambda g: g.group):
        mine = [q.queue_id for q in queues if q.group == g.group]
        if not mine:
            continue
        deadline = Deadline(opts.follower_wait_s)
        while isinstance(found := await _group_bounds(core, opts, topic, g, mine, timestamps), str):
            if deadline.expired():
                raise ReplicaUnavailableError(f"{found} (waited {opts.follower_wait_s:g} s, followerWaitMs)")
            await asyncio.sleep(min(0.5, deadline.remaining()))
        out += found
    if not out and opts.topic_pattern is None:
        raise ReadError(f"topic {topic!r} has no readable queue")
    return out


async def queue_bounds(core: ClientCore, opts: SourceOptions,
                       timestamps: Sequence[int] = ()) -> list[QueueBounds]:
    """Every readable queue of the source's topics with its bounds on the replicas
    ``readFrom`` reads from; waits up to ``followerWaitMs`` for a group none of whose
    replicas can answer. With ``topicPattern``, the topics are listed again (none matching,
    or a matching topic not routed yet, is no error: a stream reads it once it is there)."""
    out: list[QueueBounds] = []
    for topic in await resolve_topics(core, opts):
        out += await _topic_bounds(core, opts, topic, timestamps)
    return out


def _timestamps(*specs: OffsetSpec | None) -> list[int]:
    found = {s.timestamp_ms for s in specs if s is not None and s.timestamp_ms is not None}
    found |= {ms for s in specs if s is not None and s.kind == "timestamps" for _, ms in s.queues}
    return sorted(found)


def _resolve(spec: OffsetSpec, b: QueueBounds, missing: int, name: str,
             fail_on_data_loss: bool = True) -> tuple[int, bool]:
    """(offset, explicit) of one queue for ``spec``; ``missing`` (EARLIEST/LATEST) when the
    JSON leaves the queue out."""
    if spec.kind == "earliest":
        return b.low, False
    if spec.kind == "latest":
        return b.high, False
    if spec.kind == "timestamp":
        assert spec.timestamp_ms is not None
        return b.at_time[spec.timestamp_ms], False
    given = spec.for_queue(b.topic, b.group, b.queue_id)
    if spec.kind == "timestamps" and given is not None:
        return b.at_time[given], False
    value = missing if given is None else given
    if value == EARLIEST:
        return b.low, False
    if value == LATEST:
        return b.high, False
    if value < b.low and not fail_on_data_loss:
        log.warning("%s: offset %d of queue %s@%s#%d is no longer retained: %d messages skipped from the "
                    "earliest, %d (failOnDataLoss=false)", name, value, b.topic, b.group, b.queue_id,
                    b.low - value, b.low)
        return b.low, True
    if value < b.low:
        raise DataLossError(f"{name}: offset {value} of queue {b.topic}@{b.group}#{b.queue_id} is no "
                            f"longer retained (the earliest is {b.low})")
    return value, True


def plan_ranges(bounds: Sequence[QueueBounds], starts: Mapping[QueueKey, int],
                ends: Mapping[QueueKey, int], max_per_partition: int) -> list[QueueRange]:
    """Partitions for [starts, ends) per queue: empty ranges dropped, long ones split evenly,
    the followers of each group taken in turn as each partition's preferred replica."""
    turn: dict[str, int] = {}
    out: list[QueueRange] = []
    for b in bounds:
        start, end = starts.get(b.key), ends.get(b.key)
        if start is None or end is None or end <= start:
            continue
        pieces = math.ceil((end - start) / max_per_partition)
        size = math.ceil((end - start) / pieces)
        for s in range(start, end, size):
            k = turn.get(b.group, 0)
            turn[b.group] = k + 1
            preferred = b.sources[k % len(b.sources)] if b.sources else None
            out.append(QueueRange(b.topic, b.group, b.queue_id, s, min(end, s + size), b.replicas,
                                  preferred))
    return out


async def _with_core(opts: SourceOptions, body: Any) -> Any:
    core = ClientCore(**opts.client_args(), request_timeout=opts.request_timeout_s)
    try:
        return await body(core)
    finally:
        await core.close()


async def plan_batch_async(opts: SourceOptions) -> list[QueueRange]:
    starting = opts.starting or OffsetSpec("earliest")

    async def plan(core: ClientCore) -> list[QueueRange]:
        bounds = await queue_bounds(core, opts, _timestamps(starting, opts.ending))
        starts, ends = {}, {}
        for b in bounds:
            start, explicit_start = _resolve(starting, b, EARLIEST, "startingOffsets", opts.fail_on_data_loss)
            end, explicit_end = _resolve(opts.ending, b, LATEST, "endingOffsets", opts.fail_on_data_loss)
            if start > end:
                if explicit_start and explicit_end:
                    raise OptionError(f"queue {b.topic}@{b.group}#{b.queue_id}: startingOffsets {start} "
                                      f"is after endingOffsets {end}")
                if explicit_start:
                    raise OptionError(f"queue {b.topic}@{b.group}#{b.queue_id}: startingOffsets {start} "
                                      f"is beyond the end of the queue ({end})")
                start = end  # e.g. a timestamp after the last message: nothing to read
            starts[b.key], ends[b.key] = start, end
        return plan_ranges(bounds, starts, ends, opts.max_records_per_partition)

    result: list[QueueRange] = await _with_core(opts, plan)
    return result


def plan_batch(opts: SourceOptions) -> list[QueueRange]:
    """The partitions of a batch read (``startingOffsets`` default earliest, ``endingOffsets``
    default latest as the followers have it)."""
    return asyncio.run(plan_batch_async(opts))


# -- streaming offsets ---------------------------------------------------------------------
Offsets = dict[QueueKey, int]


def offsets_to_json(offsets: Mapping[QueueKey, int], topic: str | None) -> dict[str, Any]:
    """``{"g1": {"0": 12, ...}}`` for the option ``topic`` (``topic``: that topic), else
    ``{"orders": {"g1": {"0": 12}}}``; topics, groups and queue ids in a fixed order (Spark
    compares offsets by their JSON text)."""
    out: dict[str, Any] = {}
    for (t, group, qid) in sorted(offsets):
        if topic is not None and t != topic:
            raise ReadError(f"offsets of topic {t!r} in a source of the one topic {topic!r}")
        where = out if topic is not None else out.setdefault(t, {})
        where.setdefault(group, {})[str(qid)] = int(offsets[(t, group, qid)])
    return out


def offsets_from_json(doc: Mapping[str, Any], topic: str | None) -> Offsets:
    """The inverse of ``offsets_to_json`` (``topic`` as there). A checkpoint of the other
    shape (a query switched between ``topic`` and ``topics`` / ``topicPattern``) is refused."""
    shape = ("{group: {queue id: offset}} (the option topic)" if topic is not None
             else "{topic: {group: {queue id: offset}}} (the options topics, topicPattern)")
    try:
        by_topic = {topic: doc} if topic is not None else dict(doc)
        out: Offsets = {}
        for t, groups in by_topic.items():
            for g, queues in groups.items():
                for q, o in queues.items():
                    if isinstance(o, (dict, bool)) or not isinstance(o, int):
                        raise TypeError(o)
                    out[(str(t), str(g), int(q))] = o
        return out
    except (AttributeError, TypeError, ValueError):
        raise ReadError(f"not a raftmq offset of this source: {doc!r} (expected {shape}; a query cannot "
                        "change between the option topic and topics / topicPattern: start it with a new "
                        "checkpoint)") from None


def admit(start: Mapping[QueueKey, int], available: Mapping[QueueKey, int], max_rows: int) -> Offsets:
    """End offsets that take at most ``max_rows`` messages in total beyond ``start``,
    shared fairly: every queue with a backlog gets an equal share, and what a queue
    with a smaller backlog leaves goes to the others (deterministic)."""
    backlog = {k: available[k] - start.get(k, available[k]) for k in available}
    end = {k: start.get(k, available[k]) for k in available}
    waiting = sorted((n, k) for k, n in backlog.items() if n > 0)
    budget = max_rows
    for i, (n, k) in enumerate(waiting):
        share = budget // (len(waiting) - i)
        if share == 0:  # fewer rows than queues left: one each, in order
            share = 1 if budget > 0 else 0
        take = min(n, share)
        end[k] += take
        budget -= take
    return end


async def current_offsets_async(opts: SourceOptions) -> list[QueueBounds]:
    result: list[QueueBounds] = await _with_core(opts, lambda core: queue_bounds(core, opts))
    return result


def current_offsets(opts: SourceOptions) -> list[QueueBounds]:
    """Every queue's bounds as the replicas ``readFrom`` reads from have them now."""
    return asyncio.run(current_offsets_async(opts))


def initial_offsets(opts: SourceOptions) -> Offsets:
    """Where a new streaming query starts (``startingOffsets``, default latest)."""
    starting = opts.starting or OffsetSpec("latest")

    async def body(core: ClientCore) -> Offsets:
        bounds = await queue_bounds(core, opts, _timestamps(starting))
        return {b.key: _resolve(starting, b, EARLIEST, "startingOffsets", opts.fail_on_data_loss)[0]
                for b in bounds}

    result: Offsets = asyncio.run(_with_core(opts, body))
    return result

