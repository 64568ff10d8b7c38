"""Planning and reading queue ranges from broker replicas -- the ``raftmq`` source without Spark.

Everything here is plain Python on the client primitives (``ClientCore``, its connection
pool, the PULL_MESSAGE / SEARCH_OFFSET requests) and is tested without Spark.

Which replica serves (``readFrom``)
    A replica's role comes from its own ``/status``, asked when a plan is made and
    whenever a partition (re)chooses its replica -- not from a route that may be up to
    30 s old. ``follower``: followers only, never the leader; ``any``: followers, and the
    leader only when no follower answers; ``leader``: the leader, followers when it is
    down. A follower's ConsumeQueues hold only applied -- hence committed -- messages.

Planning (driver)
    ``plan_batch`` / ``current_offsets`` ask every replica the source would read from for
    each queue's bounds (SEARCH_OFFSET). A range ends at most at the *lowest* end those
    replicas report, so no partition asks a replica for messages it does not have; it
    starts at least at the *highest* start (what all of them still retain). Each queue's
    range becomes one partition, split when longer than ``maxRecordsPerPartition``; the
    partitions of a group take its followers in turn (``preferred``), so that tasks
    running side by side load different followers.

Reading (worker, ``RangeReader``)
    Pages of up to 256 messages (msgpack rows ``[queue_offset, commitlog_position,
    store_ms, message_bytes]``), ``pipeline`` requests in flight. Every page must start
    at the cursor and be contiguous; the range must come back exactly (``end - start``
    messages, or a gap-free chain of pages when a tag filter makes the broker skip
    some). A replica that fails is left for the next one; a replica that does not have
    the range yet is long-polled, then another one is tried, for up to
    ``followerWaitMs`` -- after that, or on any mismatch, the read fails with an error
    that names the queue, the range and the replica.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import logging
import math
import zlib
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgpack

from broker.remoting import Frame, RequestCode, ResponseCode
from client.aio.core import ClientCore
from client.aio.routes import PERM_READ, GroupRoute
from client.backoff import Deadline
from client.errors import ClientError
from client.message import FLAG_COMPRESSED
from spark.options import EARLIEST, LATEST, OffsetSpec, OptionError, SourceOptions

__all__ = [
    "Columns",
    "DataLossError",
    "Offsets",
    "QueueBounds",
    "QueueRange",
    "RangeMismatchError",
    "RangeReader",
    "ReadError",
    "ReplicaUnavailableError",
    "admit",
    "current_offsets",
    "initial_offsets",
    "offsets_from_json",
    "offsets_to_json",
    "plan_batch",
    "plan_ranges",
    "read_columns",
    "read_order",
    "replica_roles",
]

log = logging.getLogger("spark.raftmq")

_PULL_OK = (ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_OFFSET_MOVED,
            ResponseCode.PULL_RETRY_IMMEDIATELY, ResponseCode.TOPIC_NOT_EXIST)
_MESSAGE_FIELDS = 14
_STATUS_TIMEOUT_S = 2.0
_LONG_POLL_S = 1.0
#: a replica that keeps not having the range is left for another after this long
_SWITCH_LAGGING_AFTER_S = 5.0
_GC_GEN0_THRESHOLD = 20_000


class ReadError(RuntimeError):
    """Reading a queue range failed; the message names the queue, the range and the replica."""


class ReplicaUnavailableError(ReadError):
    """No replica allowed by ``readFrom`` answered in time."""


class RangeMismatchError(ReadError):
    """A replica returned something other than exactly the requested range."""


class DataLossError(ReadError):
    """Messages of the range are no longer retained (retention deleted them)."""


# -- replicas ----------------------------------------------------------------------------
async def replica_roles(core: ClientCore, addresses: Sequence[str],
                        timeout: float = _STATUS_TIMEOUT_S) -> dict[str, str | None]:
    """Each replica's role from its ``/status`` ("leader", "follower", "candidate"); None
    for one that does not answer."""
    async def one(address: str) -> tuple[str, str | None]:
        try:
            async with core.pool.session.get(f"http://{address}/status",
                                             timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                if resp.status != 200:
                    return address, None
                doc = await resp.json()
                return address, str(doc.get("role"))
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
            return address, None

    return dict(await asyncio.gather(*(one(a) for a in addresses)))


def read_order(roles: Mapping[str, str | None], read_from: str, preferred: str | None = None) -> list[str]:
    """The replicas that may serve a read, best first (module docstring): live ones only,
    ``preferred`` first among the followers."""
    up = sorted(a for a, role in roles.items() if role is not None)
    leaders = [a for a in up if roles[a] == "leader"]
    followers = [a for a in up if roles[a] != "leader"]
    if preferred in followers:
        followers.remove(preferred)
        followers.insert(0, preferred)
    if read_from == "follower":
        return followers
    if read_from == "any":
        return followers + leaders
    return leaders + followers


def _sources(roles: Mapping[str, str | None], read_from: str) -> list[str]:
    """The replicas a plan takes bounds from: the ones its partitions will read from."""
    up = sorted(a for a, role in roles.items() if role is not None)
    leaders = [a for a in up if roles[a] == "leader"]
    followers = [a for a in up if roles[a] != "leader"]
    if read_from == "follower":
        return followers
    if read_from == "any":
        return followers or leaders
    return leaders or followers


def _no_replica(group: str, read_from: str, roles: Mapping[str, str | None]) -> str:
    seen = ", ".join(f"{a} {role or 'down'}" for a, role in sorted(roles.items()))
    hint = " (readFrom=any lets the leader serve when no follower can)" if read_from == "follower" else ""
    return f"no replica of group {group!r} can serve readFrom={read_from}: {seen or 'none known'}{hint}"


# -- planning ----------------------------------------------------------------------------
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
    def key(self) -> tuple[str, int]:
        return (self.group, self.queue_id)


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
                  timeout: float) -> Frame:
    ext: dict[str, object] = {"topic": topic, "queueId": queue_id}
    if timestamp_ms is not None:
        ext["timestamp"] = timestamp_ms
    return await core.pool.request(address, RequestCode.SEARCH_OFFSET, ext, timeout=timeout)


async def _group_bounds(core: ClientCore, opts: SourceOptions, group: GroupRoute, queue_ids: Sequence[int],
                        timestamps: Sequence[int]) -> list[QueueBounds] | str:
    """The bounds of one group's queues, or why no replica could give them."""
    roles = await replica_roles(core, group.addresses)
    sources = _sources(roles, opts.read_from)
    answers: dict[str, dict[int, tuple[int, int, dict[int, int]]]] = {}

    async def ask(address: str, queue_id: int) -> None:
        frame = await _search(core, address, opts.topic, queue_id, None, opts.request_timeout_s)
        at = {}
        for ts in timestamps:
            reply = await _search(core, address, opts.topic, queue_id, ts, opts.request_timeout_s)
            at[ts] = int(reply.ext["offset"])
        answers.setdefault(address, {})[queue_id] = (int(frame.ext["minOffset"]), int(frame.ext["maxOffset"]),
                                                     at)

    results = await asyncio.gather(*(ask(a, q) for a in sources for q in queue_ids), return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    for e in errors:
        if not isinstance(e, ClientError):
            raise e
    # a replica that failed any query (down, or has not applied the topic yet) is left out
    usable = [a for a in sources if len(answers.get(a, {})) == len(queue_ids)]
    if not usable:
        return _no_replica(group.group, opts.read_from, roles) + (f"; {errors[0]}" if errors else "")
    out = []
    for q in queue_ids:
        per = [answers[a][q] for a in usable]
        at = {ts: max(p[2][ts] for p in per) for ts in timestamps}
        out.append(QueueBounds(opts.topic, group.group, q, max(p[0] for p in per), min(p[1] for p in per),
                               tuple(group.addresses), tuple(usable), at))
    return out


async def queue_bounds(core: ClientCore, opts: SourceOptions,
                       timestamps: Sequence[int] = ()) -> list[QueueBounds]:
    """Every readable queue of the topic with its bounds on the replicas ``readFrom`` reads
    from; waits up to ``followerWaitMs`` for a group none of whose replicas can answer."""
    route = await core.routes.route(opts.topic, refresh=True)
    queues = route.queues(PERM_READ)
    out: list[QueueBounds] = []
    for g in sorted(route.groups, key=lambda g: g.group):
        mine = [q.queue_id for q in queues if q.group == g.group]
        if not mine:
            continue
        deadline = Deadline(opts.follower_wait_s)
        while isinstance(found := await _group_bounds(core, opts, g, mine, timestamps), str):
            if deadline.expired():
                raise ReplicaUnavailableError(f"{found} (waited {opts.follower_wait_s:g} s, followerWaitMs)")
            await asyncio.sleep(min(0.5, deadline.remaining()))
        out += found
    if not out:
        raise ReadError(f"topic {opts.topic!r} has no readable queue")
    return out


def _timestamps(*specs: OffsetSpec | None) -> list[int]:
    return sorted({s.timestamp_ms for s in specs if s is not None and s.timestamp_ms is not None})


def _resolve(spec: OffsetSpec, b: QueueBounds, missing: int, name: str) -> tuple[int, bool]:
    """(offset, explicit) of one queue for ``spec``; ``missing`` (EARLIEST/LATEST) when the
    JSON leaves the queue out."""
    if spec.kind == "earliest":
        return b.low, False
    if spec.kind == "latest":
        return b.high, False
    if spec.kind == "timestamp":
        assert spec.timestamp_ms is not None
        return b.at_time[spec.timestamp_ms], False
    given = spec.for_queue(b.group, b.queue_id)
    value = missing if given is None else given
    if value == EARLIEST:
        return b.low, False
    if value == LATEST:
        return b.high, False
    if value < b.low:
        raise DataLossError(f"{name}: offset {value} of queue {b.topic}@{b.group}#{b.queue_id} is no "
                            f"longer retained (the earliest is {b.low})")
    return value, True


def plan_ranges(bounds: Sequence[QueueBounds], starts: Mapping[tuple[str, int], int],
                ends: Mapping[tuple[str, int], int], max_per_partition: int) -> list[QueueRange]:
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
            start, explicit_start = _resolve(starting, b, EARLIEST, "startingOffsets")
            end, explicit_end = _resolve(opts.ending, b, LATEST, "endingOffsets")
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
Offsets = dict[tuple[str, int], int]


def offsets_to_json(offsets: Mapping[tuple[str, int], int]) -> dict[str, dict[str, int]]:
    """``{"g1": {"0": 12, ...}}``, groups and queue ids in a fixed order (Spark compares
    offsets by their JSON text)."""
    out: dict[str, dict[str, int]] = {}
    for (group, qid) in sorted(offsets):
        out.setdefault(group, {})[str(qid)] = int(offsets[(group, qid)])
    return out


def offsets_from_json(doc: Mapping[str, Any]) -> Offsets:
    try:
        return {(str(g), int(q)): int(o) for g, queues in doc.items() for q, o in queues.items()}
    except (AttributeError, TypeError, ValueError):
        raise ReadError(f"not a raftmq offset: {doc!r} (expected {{group: {{queue id: offset}}}})") from None


def admit(start: Mapping[tuple[str, int], int], available: Mapping[tuple[str, int], int],
          max_rows: int) -> Offsets:
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
        return {b.key: _resolve(starting, b, EARLIEST, "startingOffsets")[0] for b in bounds}

    result: Offsets = asyncio.run(_with_core(opts, body))
    return result


# -- decoded pages ---------------------------------------------------------------------
@dataclass(slots=True)
class Columns:
    """Decoded messages of one queue, column by column (what becomes an Arrow batch)."""

    topic: str
    group: str
    queue_id: int
    queue_offset: list[int] = field(default_factory=list)
    commit_log_offset: list[int] = field(default_factory=list)
    store_ms: list[int] = field(default_factory=list)
    msg_id: list[str] = field(default_factory=list)
    born_ms: list[int] = field(default_factory=list)
    keys: list[tuple[str, ...]] = field(default_factory=list)
    tags: list[str | None] = field(default_factory=list)
    properties: list[dict[str, str]] = field(default_factory=list)
    body: list[bytes] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.queue_offset)

    def extend(self, other: Columns) -> None:
        self.queue_offset += other.queue_offset
        self.commit_log_offset += other.commit_log_offset
        self.store_ms += other.store_ms
        self.msg_id += other.msg_id
        self.born_ms += other.born_ms
        self.keys += other.keys
        self.tags += other.tags
        self.properties += other.properties
        self.body += other.body

    def rows(self) -> list[tuple[Any, ...]]:
        """Plain tuples in the source's column order (times still in ms)."""
        n = len(self)
        return list(zip([self.topic] * n, [self.group] * n, [self.queue_id] * n, self.queue_offset,
                        self.commit_log_offset, self.msg_id, self.store_ms, self.born_ms, self.keys,
                        self.tags, self.properties, self.body, strict=True))


def decode_page(raw: list[Any], rng: QueueRange, wanted_tags: frozenset[str] | None) -> Columns:
    """Columns from one PULL_MESSAGE body's rows; checks every message is of ``rng``'s queue."""
    cols = Columns(rng.topic, rng.group, rng.queue_id)
    if not raw:
        return cols
    offsets, positions, stamps, datas = zip(*raw, strict=True)
    try:
        msgs = [msgpack.unpackb(d, use_list=False) for d in datas]
        (versions, ids, topics, qids, flags, tags, keys, props, born, _host, _pid, _seq, _re,
         bodies) = zip(*msgs, strict=True)
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise RangeMismatchError(f"{rng}: a replica returned bytes that are not messages ({e})") from None
    if set(versions) != {1} or set(map(len, msgs)) != {_MESSAGE_FIELDS}:
        raise RangeMismatchError(f"{rng}: a replica returned messages of an unknown format")
    if set(topics) != {rng.topic} or set(qids) != {rng.queue_id}:
        raise RangeMismatchError(f"{rng}: a replica returned messages of {sorted(set(topics))} "
                                 f"queue(s) {sorted(set(qids))}")
    if any(flags):
        bodies = tuple(zlib.decompress(b) if f & FLAG_COMPRESSED else b for b, f in zip(bodies, flags,
                                                                                        strict=True))
    if wanted_tags is not None:
        keep = [i for i, t in enumerate(tags) if t in wanted_tags]
        if len(keep) != len(tags):
            def pick(seq: Sequence[Any]) -> list[Any]:
                return [seq[i] for i in keep]
            offsets, positions, stamps, ids, born, keys, tags, props, bodies = (
                pick(offsets), pick(positions), pick(stamps), pick(ids), pick(born), pick(keys), pick(tags),
                pick(props), pick(bodies))
    cols.queue_offset = list(offsets)
    cols.commit_log_offset = list(positions)
    cols.store_ms = list(stamps)
    cols.msg_id = [i.hex() for i in ids]
    cols.born_ms = list(born)
    cols.keys = list(keys)
    cols.tags = list(tags)
    cols.properties = list(props)
    cols.body = list(bodies)
    return cols


# -- reading one range -----------------------------------------------------------------------
class RangeReader:
    """Reads one :class:`QueueRange` (module docstring). Use ``next_page`` until it returns
    None, then ``close``; one asyncio loop for its whole life."""

    def __init__(self, opts: SourceOptions, rng: QueueRange) -> None:
        self.opts = opts
        self.rng = rng
        selector = opts.selector()
        self._wanted = selector.tags
        self._hashes = selector.hashes()
        self.cursor = rng.start          # every message before it was received
        self.received = 0                # messages returned (after the tag filter)
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

    @property
    def filtered(self) -> bool:
        return self._hashes is not None

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
                    f"{self.rng}: {_no_replica(self.rng.group, self.opts.read_from, roles)}; waited "
                    f"{self.opts.follower_wait_s:g} s (followerWaitMs) after {why}; read up to offset "
                    f"{self.cursor}")
            await asyncio.sleep(min(0.5, self._unavailable.remaining()))

    def _request(self, offset: int, count: int, suspend_s: float) -> asyncio.Task[Frame]:
        assert self._core is not None and self.address is not None
        ext: dict[str, object] = {"topic": self.rng.topic, "queueId": self.rng.queue_id, "offset": offset,
                                  "maxMsgs": count, "suspendMs": int(suspend_s * 1000)}
        if self._hashes is not None:
            ext["tagHashes"] = self._hashes
        return asyncio.create_task(self._core.pool.request(
            self.address, RequestCode.PULL_MESSAGE, ext, timeout=suspend_s + self.opts.request_timeout_s,
            ok=_PULL_OK))

    def _fill(self) -> None:
        if self._lag_since is not None or self.filtered:  # one request at a time, from the cursor
            if not self._inflight:
                suspend = _LONG_POLL_S if self._lag_since is not None else 0.0
                count = self.opts.pull_batch if self.filtered else min(self.opts.pull_batch,
                                                                        self.rng.end - self.cursor)
                self._inflight.append((self.cursor, count, self._request(self.cursor, count, suspend)))
            return
        while len(self._inflight) < self.opts.pipeline and self._next < self.rng.end:
            count = min(self.opts.pull_batch, self.rng.end - self._next)
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
            self._core = ClientCore(servers=list(self.rng.replicas),
                                    request_timeout=self.opts.request_timeout_s)
            await self._choose("start")
        while self.cursor < self.rng.end:
            self._fill()
            offset, count, task = self._inflight[0]
            try:
                reply = await task
            except ClientError as e:
                self._inflight.popleft()
                self._drop_inflight()
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
        if offset != self.cursor:  # a speculative request made stale by a short page
            return None
        if reply.code != ResponseCode.SUCCESS:
            next_offset = reply.ext.get("nextOffset")
            if reply.code == ResponseCode.PULL_OFFSET_MOVED and isinstance(next_offset, int) \
                    and next_offset > offset:
                raise DataLossError(f"{self.rng}: messages [{offset}, {next_offset}) are no longer retained "
                                    f"by {self.address} (retention removed them)")
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
        raw = msgpack.unpackb(reply.body)
        next_offset = reply.ext.get("nextOffset")
        if not isinstance(next_offset, int):
            raise RangeMismatchError(f"{self.rng}: {self.address} answered a pull without nextOffset")
        assert self.address is not None
        self.served_by.add(self.address)
        if self.filtered:
            return self._accept_filtered(offset, raw, next_offset)
        n = len(raw)
        page = decode_page(raw, self.rng, None)
        if n == 0 or n > count or next_offset != offset + n or page.queue_offset != list(range(offset,
                                                                                               offset + n)):
            shown = f"{page.queue_offset[0]}..{page.queue_offset[-1]}" if n else "nothing"
            raise RangeMismatchError(
                f"{self.rng}: asked {self.address} for {count} messages from offset {offset}, got {n} "
                f"({shown}, next offset {next_offset}): not the contiguous range asked for")
        self.cursor += n
        self.received += n
        if n < count:  # a short page (size cap, or the replica has no more yet): re-plan requests
            self._drop_inflight()
        return page

    def _accept_filtered(self, offset: int, raw: list[Any], next_offset: int) -> Columns | None:
        got = [r[0] for r in raw]
        if next_offset <= offset or any(not offset <= o < next_offset for o in got) \
                or any(a >= b for a, b in itertools.pairwise(got)):
            raise RangeMismatchError(f"{self.rng}: {self.address} answered offsets {got[:3]}... with next "
                                     f"offset {next_offset} to a pull at {offset}: not a gap-free page")
        raw = [r for r in raw if r[0] < self.rng.end]
        self.cursor = min(next_offset, self.rng.end)
        page = decode_page(raw, self.rng, self._wanted)
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
        if self.cursor != self.rng.end or (not self.filtered and self.received != self.rng.count):
            raise RangeMismatchError(f"{self.rng}: received {self.received} messages up to offset "
                                     f"{self.cursor}, expected exactly {self.rng.count}")

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
        log.info("%s: %d messages from %s", rng, reader.received, ", ".join(sorted(reader.served_by)))
    finally:
        try:
            loop.run_until_complete(reader.close())
        finally:
            loop.close()
            gc.set_threshold(*thresholds)
