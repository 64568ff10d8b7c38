"""Administration and queries: topics, group progress, offset resets, message lookup."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import msgpack

from client.aio.core import ClientCore
from client.aio.pull_consumer import committed_offset, fetch, queue_offsets
from client.aio.routes import PERM_READ
from client.backoff import Deadline
from client.errors import BrokerError, ClientError
from client.message import ReceivedMessage, decode_received
from client.queues import MessageQueue
from protocol.remoting import RequestCode

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
                 core: ClientCore | None = None) -> None:
        self.core = core or ClientCore(namesrv, servers, address_map=address_map)
        self._own_core = core is None
        self.timeout = timeout

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

    async def create_topic(self, topic: str, queues: int = 8, perm: int = 6,
                           groups: Sequence[str] | None = None) -> list[str]:
        """Create (or update) the topic on each group (default: every group). Returns the groups."""
        chosen = await self._groups(groups)
        for g in chosen:
            await self.core.leader_request(g, RequestCode.CREATE_TOPIC,
                                           {"topic": topic, "queues": queues, "perm": perm},
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
            await self.core.leader_request(g, RequestCode.DELETE_TOPIC, {"topic": topic},
                                           deadline=Deadline(self.timeout))
        self.core.routes.forget(topic)
        return chosen

    async def topics(self) -> dict[str, dict[str, list[int]]]:
        """topic -> {group: [queues, perm]}."""
        out: dict[str, dict[str, list[int]]] = {}
        for g in await self._groups(None):
            reply = await self.core.read_request(g, RequestCode.GET_TOPICS, read_from="any")
            for topic, (queues, perm) in msgpack.unpackb(reply.body).items():
                out.setdefault(topic, {})[g] = [queues, perm]
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
            ext = {"group": group, "topic": topic, "timestamp": timestamp_ms}
            reply = await self.core.leader_request(g.group, RequestCode.RESET_OFFSET, ext,
                                                   deadline=Deadline(self.timeout), topic=topic)
            for qid, off in msgpack.unpackb(reply.body, strict_map_key=False).items():
                out[MessageQueue(topic, g.group, int(qid))] = off
        return out

    async def _query(self, topic: str, code: int, ext: dict[str, object],
                     limit: int) -> list[ReceivedMessage]:
        route = await self.core.routes.route(topic)
        found: list[ReceivedMessage] = []
        for g in route.groups:
            try:
                reply = await self.core.read_request(g.group, code, ext, read_from="any")
            except BrokerError as e:
                if e.code == 17:  # QUERY_NOT_FOUND
                    continue
                raise
            for position, stamp, data in msgpack.unpackb(reply.body):
                m = decode_received(data, MessageQueue(topic, g.group, 0), -1, position, stamp)
                found.append(m)  # the stored bytes name the queue; not the offset (-1: unknown)
        found.sort(key=lambda m: (m.store_timestamp, m.commit_log_offset))
        return found[:limit]

    async def message_by_id(self, topic: str, msg_id: str) -> ReceivedMessage | None:
        found = await self._query(topic, RequestCode.VIEW_MESSAGE_BY_ID, {"msgId": msg_id}, 1)
        return found[0] if found else None

    async def messages_by_key(self, topic: str, key: str, begin_ms: int = 0, end_ms: int = 2**62,
                              max_results: int = 32) -> list[ReceivedMessage]:
        return await self._query(topic, RequestCode.QUERY_MESSAGE,
                                 {"key": key, "beginMs": begin_ms, "endMs": end_ms,
                                  "maxResults": max_results}, max_results)

    async def message_at(self, queue: MessageQueue, offset: int) -> ReceivedMessage | None:
        result = await fetch(self.core, queue, offset, max_msgs=1, read_from="any")
        return result.messages[0] if result.messages and result.messages[0].queue_offset == offset else None
