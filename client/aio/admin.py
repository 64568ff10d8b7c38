"""Administration and queries: topics, group progress, offset resets, message lookup."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from client.aio.access_admin import AccessAdmin
from client.aio.core import ClientCore
from client.aio.pull_consumer import committed_offset, fetch, queue_offsets
from client.aio.routes import PERM_READ
from client.backoff import Deadline
from client.credentials import Credentials
from client.errors import BrokerError, ClientError
from client.message import ReceivedMessage, received
from client.queues import MessageQueue
from protocol.pop import GroupConfigRequest
from protocol.query import (
    QueryMessageRequest,
    QueryResponse,
    ResetOffsetRequest,
    ResetOffsetResponse,
    ViewMessageRequest,
)
from protocol.remoting import ResponseCode
from protocol.tls import ClientTls
from protocol.topic import CreateTopicRequest, DeleteTopicRequest, GetTopicsRequest, TopicsResponse
from protocol.wire import Request

__all__ = ["AsyncAdmin", "QueueProgress"]


@dataclass(frozen=True, slots=True)
class QueueProgress:
    queue: MessageQueue
    committed: int | None
    max_offset: int
    min_offset: int = 0  # the first message still retained

    @property
    def lag(self) -> int:
        """Retained messages not yet consumed (deleted ones are not counted)."""
        return max(0, self.max_offset - max(self.committed or 0, self.min_offset))


class AsyncAdmin:
    def __init__(self, namesrv: str | Sequence[str] | None = None, *, servers: Sequence[str] | None = None,
                 timeout: float = 10.0, address_map: Mapping[str, str] | None = None,
                 core: ClientCore | None = None, tls: ClientTls | bool | None = None,
                 credentials: Credentials | None = None) -> None:
        self.core = core or ClientCore(namesrv, servers, address_map=address_map, tls=tls,
                                       credentials=credentials)
        self._own_core = core is None
        self.timeout = timeout

    @property
    def access(self) -> AccessAdmin:
        """Users and policies (``client.aio.access_admin``)."""
        return AccessAdmin(self)

    async def close(self) -> None:
        if self._own_core:
            await self.core.close()

    async def __aenter__(self) -> AsyncAdmin:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _groups(self, groups: Sequence[str] | None) -> list[str]:
        known = await self.core.routes.groups()
        for g, addresses in known.items():
            if g:  # "": the static servers' group before its name is known
                self.core.routes.register_group(g, addresses)
        chosen = list(groups) if groups else sorted(known)
        missing = [g for g in chosen if g not in known]
        if missing:
            raise ClientError(f"unknown broker group(s) {missing}; known: {sorted(known)}")
        return chosen

    async def group_config(self, group: str, retry_s: Sequence[float], max_deliveries: int,
                           groups: Sequence[str] | None = None, *, ordered: bool = False) -> list[str]:
        """Set a consumer group's retry policy on each broker group (default: every one),
        through its log: a nacked delivery n of a SimpleConsumer's message comes back after
        ``retry_s[n - 1]`` seconds (the last for every later one); after ``max_deliveries``
        deliveries it goes to %DLQ%group. ``ordered``: a queue's next message is handed out
        only once the one before is settled (each shard key in order). Returns the broker groups."""
        chosen = await self._groups(groups)
        request = GroupConfigRequest(group=group, backoff_ms=tuple(int(s * 1000) for s in retry_s),
                                     max_deliveries=max_deliveries, ordered=ordered or None)
        for g in chosen:
            await self.core.leader_request(g, request, deadline=Deadline(self.timeout))
        return chosen

    async def create_topic(self, topic: str, queues: int = 8, perm: int = 6,
                           groups: Sequence[str] | None = None) -> list[str]:
        """Create (or update) the topic on each group (default: every group). Returns the groups."""
        chosen = await self._groups(groups)
        for g in chosen:
            await self.core.leader_request(g, CreateTopicRequest(topic=topic, queues=queues,
                                                                 perm=perm),  # type: ignore[arg-type]
                                           deadline=Deadline(self.timeout))
        self.core.routes.forget(topic)
        await self._await_route(topic, chosen)
        return chosen

    async def _await_route(self, topic: str, groups: Sequence[str]) -> None:
        """Wait until the topic's route names every group it was created on (name servers
        hear of a new topic within about a second); producers can then use it at once."""
        deadline = Deadline(self.timeout)
        while True:
            try:
                route = await self.core.routes.route(topic, refresh=True)
                if {g.group for g in route.groups} >= set(groups) or not self.core.routes.uses_namesrv:
                    return
            except ClientError:
                if deadline.expired():
                    raise
            if deadline.expired():
                raise ClientError(f"topic {topic!r} was created but the name servers do not list it on "
                                  f"{sorted(groups)} after {self.timeout:.0f} s; are the brokers registered?")
            await asyncio.sleep(0.1)

    async def delete_topic(self, topic: str, groups: Sequence[str] | None = None) -> list[str]:
        """Delete the topic on each group (default: every group). Returns the groups."""
        chosen = await self._groups(groups)
        for g in chosen:
            await self.core.leader_request(g, DeleteTopicRequest(topic=topic),
                                           deadline=Deadline(self.timeout))
        self.core.routes.forget(topic)
        return chosen

    async def topics(self) -> dict[str, dict[str, list[int]]]:
        """topic -> {group: [queues, perm]}."""
        out: dict[str, dict[str, list[int]]] = {}
        for g in await self._groups(None):
            reply = await self.core.read_request(g, GetTopicsRequest(), read_from="any")
            for topic, held in TopicsResponse.from_frame(reply).topics.items():
                out.setdefault(topic, {})[g] = [held.queues, held.perm]
        return dict(sorted(out.items()))

    async def progress(self, group: str, topic: str) -> list[QueueProgress]:
        """Committed offset, max offset and lag of a consumer group on each queue of a topic."""
        route = await self.core.routes.route(topic)
        rows = []
        for q in route.queues(PERM_READ):
            committed = await committed_offset(self.core, group, q)
            low, high, _ = await queue_offsets(self.core, q, read_from="leader")
            rows.append(QueueProgress(q, committed, high, low))
        return rows

    async def reset_offsets(self, group: str, topic: str, timestamp_ms: int) -> dict[MessageQueue, int]:
        """Move the group's offsets on every queue to the first message stored at/after the time."""
        route = await self.core.routes.route(topic)
        out = {}
        for g in route.groups:
            reset = ResetOffsetRequest(group=group, topic=topic, timestamp=timestamp_ms)
            reply = await self.core.leader_request(g.group, reset, deadline=Deadline(self.timeout),
                                                   topic=topic)
            for qid, off in ResetOffsetResponse.from_frame(reply).offsets.items():
                out[MessageQueue(topic, g.group, qid)] = off
        return out

    async def _query(self, topic: str, request: Request, limit: int) -> list[ReceivedMessage]:
        route = await self.core.routes.route(topic)
        found: list[ReceivedMessage] = []
        for g in route.groups:
            try:
                reply = await self.core.read_request(g.group, request, read_from="any")
            except BrokerError as e:
                if e.code == ResponseCode.QUERY_NOT_FOUND:
                    continue
                raise
            for row in QueryResponse.from_frame(reply).rows:
                m = received(row.record(), MessageQueue(topic, g.group, 0), -1, row.position, row.store_ms)
                found.append(m)  # the stored bytes name the queue; not the offset (-1: unknown)
        found.sort(key=lambda m: (m.store_timestamp, m.commit_log_offset))
        return found[:limit]

    async def message_by_id(self, topic: str, msg_id: str) -> ReceivedMessage | None:
        found = await self._query(topic, ViewMessageRequest(msg_id=msg_id), 1)
        return found[0] if found else None

    async def messages_by_key(self, topic: str, key: str, begin_ms: int = 0, end_ms: int = 2**62,
                              max_results: int = 32) -> list[ReceivedMessage]:
        query = QueryMessageRequest(key=key, begin_ms=begin_ms, end_ms=end_ms, max_results=max_results)
        return await self._query(topic, query, max_results)

    async def message_at(self, queue: MessageQueue, offset: int) -> ReceivedMessage | None:
        result = await fetch(self.core, queue, offset, max_msgs=1, read_from="any")
        return result.messages[0] if result.messages and result.messages[0].queue_offset == offset else None
