"""Pulling messages from a queue, and the pull consumer built on it.

``fetch`` is the one pull primitive (the push consumer uses it too): a long poll on
a replica chosen by ``read_from`` -- followers by default, so consumers do not load
the leader and keep reading while the group elects one. A replica only ever
returns what it applied, hence committed. Replicas apply at slightly different
times, so an answer "your offset is beyond my queue" from a lagging replica means
*not yet*, never *go back*: the offset only moves forward. An answer "retention deleted
those" moves it forward for good, so it is taken from the leader only: a follower's is
checked by pulling from the leader (no leader: nothing is skipped yet). A record that cannot be read
(stored before leaders checked records' messages) is skipped with a WARNING naming its
queue and offsets, never raised to the consumer.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from client.aio.core import READ_FROM, ClientCore
from client.aio.routes import PERM_READ
from client.backoff import Deadline
from client.credentials import Credentials
from client.errors import ClientError
from client.message import ReceivedMessage, received_all
from client.queues import MessageQueue
from client.tag_filter import TagSelector, parse_tags
from protocol.offset import CommitOffsetRequest, QueryOffsetRequest, QueryOffsetResponse
from protocol.pull import PULL_ANSWERS, PullRequest, PullResponse, PullRow
from protocol.query import SearchOffsetRequest, SearchOffsetResponse
from protocol.record_batch import MessageFormatError, record_count
from protocol.remoting import ResponseCode
from protocol.tls import ClientTls

__all__ = ["AsyncPullConsumer", "PullResult", "fetch", "queue_offsets"]

log = logging.getLogger("client.pull")

_PULL_OK = (ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_OFFSET_MOVED,
            ResponseCode.PULL_RETRY_IMMEDIATELY)


@dataclass(frozen=True, slots=True)
class PullResult:
    messages: list[ReceivedMessage]   # those the selector matched, in queue order (<= max_msgs
                                      # unless fetched with whole_records)
    next_offset: int                  # where the next pull starts (past filtered-out ones too)
    max_offset: int | None            # the replica's queue end, when it said


async def fetch(core: ClientCore, queue: MessageQueue, offset: int, *, max_msgs: int = 32,
                suspend_s: float = 0.0, selector: TagSelector | None = None,
                read_from: str = "follower", sql: str | None = None,
                whole_records: bool = False) -> PullResult:
    """One pull of ``queue`` from ``offset``. A page is whole records: its messages beyond
    ``max_msgs`` are dropped (and pulled again next time) unless ``whole_records``, where
    every message of the page comes back (the push consumer's process queue takes them)."""
    hashes = selector.hashes() if selector is not None else None
    request = PullRequest(topic=queue.topic, queue_id=queue.queue_id, offset=offset, max_msgs=max_msgs,
                          suspend_ms=int(suspend_s * 1000),
                          tag_hashes=None if hashes is None else tuple(hashes),
                          sql=sql)  # SQL92 on properties, evaluated by the broker
    reply = await core.read_request(queue.group, request, read_from=read_from, affinity=str(queue),
                                    timeout=suspend_s + core.request_timeout, ok=_PULL_OK,
                                    hold_s=suspend_s, topic=queue.topic)  # held past it: the next one too
    pulled = (PullResponse.from_frame(reply) if reply.code in PULL_ANSWERS
              else PullResponse(next_offset=offset))  # PULL_RETRY_IMMEDIATELY: nothing, go on
    if reply.code == ResponseCode.PULL_OFFSET_MOVED and pulled.next_offset > offset and read_from != "leader":
        # "retention deleted them": skipping is for good, so the leader's word stands, not
        # one replica's (a replica whose log was cut by repair once said it of messages it
        # merely did not hold yet); no leader now: nothing is skipped yet
        try:
            return await fetch(core, queue, offset, max_msgs=max_msgs, suspend_s=0.0, selector=selector,
                               read_from="leader", sql=sql, whole_records=whole_records)
        except ClientError as e:
            log.info("%s: a replica says messages from %d are no longer retained; not skipping them "
                     "before the leader confirms (%s)", queue, offset, e)
            return PullResult([], offset, pulled.max_offset)
    max_offset, next_offset = pulled.max_offset, pulled.next_offset
    if reply.code == ResponseCode.PULL_OFFSET_MOVED and next_offset < offset:
        next_offset = offset  # a lagging replica: not yet there; never move back
    elif reply.code == ResponseCode.PULL_OFFSET_MOVED and next_offset > offset:
        log.warning("%s: messages %d..%d are no longer retained (retention deleted them); "
                    "%d skipped, going on at %d", queue, offset, next_offset - 1, next_offset - offset,
                    next_offset)
    if reply.code != ResponseCode.SUCCESS:
        return PullResult([], max(next_offset, offset), max_offset)
    messages: list[ReceivedMessage] = []
    counted = not whole_records and selector is None  # only the first max_msgs are made
    for row in pulled.rows or ():  # records as stored: split here
        try:
            got = received_all(row.record, queue, row.offset, row.position, row.store_ms, offset,
                               row.selected, max_msgs - len(messages) if counted else None)
        except MessageFormatError as e:  # stored before leaders checked records: skip, say so
            _report_malformed(queue, row, offset, e)
            continue
        messages.extend(got if selector is None else [m for m in got if selector.matches(m.tags)])
        if len(messages) >= max_msgs and not whole_records:  # the rest is pulled again next time
            next_offset = min(next_offset, messages[max_msgs - 1].queue_offset + 1)
            del messages[max_msgs:]
            break
    return PullResult(messages, next_offset, max_offset)


def _report_malformed(queue: MessageQueue, row: PullRow, offset: int, error: MessageFormatError) -> None:
    first, count = max(row.offset, offset), record_count(row.record)
    log.warning("%s (topic %r queue %d): the record at queue offsets %d..%d (CommitLog position %d) "
                "cannot be read (%s): %d messages skipped", queue, queue.topic, queue.queue_id, first,
                row.offset + count - 1, row.position, error, row.offset + count - first)


async def queue_offsets(core: ClientCore, queue: MessageQueue, timestamp_ms: int | None = None,
                        read_from: str = "any") -> tuple[int, int, int | None]:
    """(min offset, max offset, first offset stored at/after ``timestamp_ms``)."""
    request = SearchOffsetRequest(topic=queue.topic, queue_id=queue.queue_id, timestamp=timestamp_ms)
    found = SearchOffsetResponse.from_frame(await core.read_request(queue.group, request, read_from=read_from,
                                                                    affinity=str(queue), hold_s=0.0))
    return found.min_offset, found.max_offset, found.offset


async def committed_offset(core: ClientCore, group: str, queue: MessageQueue) -> int | None:
    """The group's committed offset of ``queue`` (the leader's view when it can be reached)."""
    reply = await core.read_request(queue.group, QueryOffsetRequest(group=group, topic=queue.topic,
                                                                    queue_id=queue.queue_id),
                                    read_from="leader", hold_s=0.0)
    offset = QueryOffsetResponse.from_frame(reply).offset
    return offset if offset >= 0 else None


async def commit_offset(core: ClientCore, group: str, queue: MessageQueue, offset: int,
                        timeout: float = 5.0) -> None:
    await core.leader_request(queue.group, CommitOffsetRequest(group=group, topic=queue.topic,
                                                               queue_id=queue.queue_id, offset=offset),
                              deadline=Deadline(timeout), topic=queue.topic)


class AsyncPullConsumer:
    """Explicit assignment, seek and commit: you decide which queues and offsets.

    ``poll`` long-polls the assigned queues in turn from the position of each; ``commit``
    stores positions as the group's offsets (through the log: every replica agrees).
    """

    def __init__(self, namesrv: str | Sequence[str] | None = None, group: str = "DEFAULT_CONSUMER", *,
                 servers: Sequence[str] | None = None, read_from: str = "follower",
                 selector: str | None = None, address_map: Mapping[str, str] | None = None,
                 core: ClientCore | None = None, tls: ClientTls | bool | None = None,
                 credentials: Credentials | None = None) -> None:
        if read_from not in READ_FROM:
            raise ValueError(f"read_from must be one of {READ_FROM}, got {read_from!r}")
        self.group = group
        self.read_from = read_from
        self.selector = parse_tags(selector)
        self.core = core or ClientCore(namesrv, servers, address_map=address_map, tls=tls,
                                       credentials=credentials)
        self._own_core = core is None
        self._positions: dict[MessageQueue, int] = {}
        self._turn = 0

    async def start(self) -> AsyncPullConsumer:
        return self

    async def __aenter__(self) -> AsyncPullConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def queues(self, topic: str) -> list[MessageQueue]:
        return (await self.core.routes.route(topic)).queues(PERM_READ)

    async def assign(self, queues: Sequence[MessageQueue], from_where: str | int = "committed") -> None:
        """Take these queues; start each at the group's committed offset (else the first
        message), or at "first", "last", or a store timestamp in ms."""
        self._positions = {}
        for q in queues:
            self._positions[q] = await self._start_offset(q, from_where)

    async def _start_offset(self, q: MessageQueue, from_where: str | int) -> int:
        if from_where == "committed":
            committed = await committed_offset(self.core, self.group, q)
            if committed is not None:
                return committed
            from_where = "first"
        low, high, at = await queue_offsets(self.core, q, from_where if isinstance(from_where, int) else None)
        if from_where == "first":
            return low
        if from_where == "last":
            return high
        if isinstance(from_where, int):
            return at if at is not None else high
        raise ValueError("from_where must be 'committed', 'first', 'last' or a timestamp in ms, "
                         f"got {from_where!r}")

    def assignment(self) -> dict[MessageQueue, int]:
        return dict(self._positions)

    def seek(self, queue: MessageQueue, offset: int) -> None:
        if queue not in self._positions:
            raise KeyError(f"{queue} is not assigned")
        self._positions[queue] = offset

    async def seek_to(self, queue: MessageQueue, where: str | int) -> None:
        self.seek(queue, await self._start_offset(queue, where))

    async def pull(self, queue: MessageQueue, offset: int, max_msgs: int = 32,
                   timeout: float = 0.0) -> PullResult:
        """One pull at an explicit offset (no position kept)."""
        return await fetch(self.core, queue, offset, max_msgs=max_msgs, suspend_s=timeout,
                           selector=self.selector, read_from=self.read_from)

    async def poll(self, max_msgs: int = 32, timeout: float = 1.0) -> list[ReceivedMessage]:
        """Messages from the next assigned queue that has some, advancing its position;
        [] if none arrived within ``timeout``."""
        if not self._positions:
            raise ClientError("assign queues first")
        queues = sorted(self._positions)
        deadline = Deadline(timeout)
        while True:
            for i in range(len(queues)):
                q = queues[(self._turn + i) % len(queues)]
                result = await fetch(self.core, q, self._positions[q], max_msgs=max_msgs,
                                     selector=self.selector, read_from=self.read_from)
                self._positions[q] = result.next_offset
                if result.messages:
                    self._turn = (self._turn + i + 1) % len(queues)
                    return result.messages
            if deadline.expired():
                return []
            # nothing anywhere: long-poll the next queue for the rest of the time
            q = queues[self._turn % len(queues)]
            self._turn += 1
            result = await fetch(self.core, q, self._positions[q], max_msgs=max_msgs,
                                 suspend_s=min(deadline.remaining(), 0.5), selector=self.selector,
                                 read_from=self.read_from)
            self._positions[q] = result.next_offset
            if result.messages:
                return result.messages

    async def commit(self, offsets: dict[MessageQueue, int] | None = None) -> None:
        """Store offsets (default: the current positions) as the group's committed offsets."""
        for q, off in (offsets or self._positions).items():
            await commit_offset(self.core, self.group, q, off)

    async def close(self) -> None:
        if self._own_core:
            await self.core.close()


