"""``ClusterGateway``: everything the console reads from or does to a cluster, on behalf of
one signed-in user, through the client (``client.aio``) and the brokers' HTTP admin API
(``/status``, ``/admin/...``) -- the console holds no broker code and no state of its own
beyond what it samples (``console.sampler``).

Where the cluster is: the name servers' ``GET /cluster`` (group -> node -> address). A
cluster serving TLS: ``tls`` as the client takes it (``protocol.tls``); every call -- the
client's WebSockets, ``/status``, ``/metrics``, ``/admin/...`` and the tokens' SCRAM --
goes through the client's connection pool, https and wss verified against its CA.

Credentials: every gateway is made for one ``Credentials`` (``None``: anonymous, enough
while the cluster has ACLs off) and every request it sends is that user's: the client
authenticates its connections, and ``/admin/...`` reads carry an admin token (SCRAM over
``POST /auth/scram``, one per replica, renewed when refused), so the brokers' ACLs decide
what the signed-in user sees and may do (docs/SECURITY.md).
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import aiohttp

from client.aio import AsyncAdmin, AsyncProducer
from client.aio.auth import admin_token
from client.aio.pull_consumer import fetch, queue_offsets
from client.backoff import Deadline
from client.credentials import Credentials
from client.dead_letters import resend_copy
from client.errors import AuthFailedError, ClientError, TopicNotExistError
from client.message import ReceivedMessage
from client.queues import MessageQueue
from protocol.deferred import SendBackRequest, SendBackResponse
from protocol.remoting import ResponseCode
from protocol.tls import ClientTls

__all__ = ["HTTP_TIMEOUT", "ClusterGateway", "Credentials", "message_json"]

#: each HTTP call to a replica or name server (a replica that does not answer is shown down)
HTTP_TIMEOUT = aiohttp.ClientTimeout(total=2)


def message_json(m: ReceivedMessage) -> dict[str, Any]:
    """A message as the console's pages show it (body in base64: the page decodes it)."""
    return {"msg_id": m.msg_id, "topic": m.topic, "stored_in": m.queue.topic, "group": m.queue.group,
            "queue_id": m.queue_id, "queue_offset": m.queue_offset, "position": m.commit_log_offset,
            "tags": m.tags, "keys": list(m.keys), "properties": dict(m.properties),
            "store_timestamp": m.store_timestamp, "born_timestamp": m.born_timestamp,
            "born_host": m.born_host, "reconsume_times": m.reconsume_times, "size": len(m.body),
            "body_base64": base64.b64encode(m.body).decode()}


class ClusterGateway:
    """One user's view of the cluster. Coroutines run on the console's event loop;
    ``close()`` releases the client's connections."""

    def __init__(self, namesrv: list[str], credentials: Credentials | None = None,
                 tls: ClientTls | bool | None = None) -> None:
        self.namesrv = namesrv
        self.credentials = credentials  # the brokers check them (module docstring)
        self.tls = tls
        self.admin = AsyncAdmin(namesrv, credentials=credentials, tls=tls)
        self._tokens: dict[str, str] = {}  # replica address -> admin token
        self._producer: AsyncProducer | None = None

    async def close(self) -> None:
        if self._producer is not None:
            await self._producer.close()
        await self.admin.close()  # its pool's session is ``http``

    # -- HTTP admin API -------------------------------------------------------------
    @property
    def http(self) -> aiohttp.ClientSession:
        """The client's HTTP(S) session (its TLS); give each request ``timeout=HTTP_TIMEOUT``."""
        return self.admin.core.pool.session

    def url(self, address: str, path: str) -> str:
        """``path`` at ``address``: https when the client speaks TLS."""
        return self.admin.core.pool.url(address, path)

    async def get_json(self, address: str, path: str, **query: str) -> Any:
        """GET http(s)://address/path; None when the replica does not answer or says no
        (AuthFailedError when it refuses this user's credentials)."""
        for attempt in range(2):
            try:
                headers = await self._auth_headers(address) if path.startswith("/admin") else {}
                async with self.http.get(self.url(address, path), params=query, headers=headers,
                                         timeout=HTTP_TIMEOUT) as resp:
                    if resp.status == 401 and attempt == 0 and self._tokens.pop(address, None):
                        continue  # the token expired: a new one, once
                    if resp.status == 401:  # ACLs on and no user signed in (or it was deleted)
                        doc = await resp.json()
                        raise AuthFailedError(ResponseCode.AUTH_FAILED, str(doc.get("error", "")), address)
                    return await resp.json() if resp.status == 200 else None
            except (aiohttp.ClientError, TimeoutError, ValueError):
                return None
        return None

    async def _auth_headers(self, address: str) -> dict[str, str]:
        if self.credentials is None:
            return {}
        token = self._tokens.get(address)
        if token is None:
            try:
                token = self._tokens[address] = await admin_token(self.http, self.url(address, ""),
                                                                  self.credentials)
            except AuthFailedError:
                raise
            except ClientError:
                return {}  # the replica does not answer: the GET says so
        return {"Authorization": f"Bearer {token}"}

    async def verify(self) -> None:
        """Check the credentials with a replica (AuthFailedError if wrong)."""
        if self.credentials is None:
            return
        for group in (await self.replicas()).values():
            for address in group.values():
                await self._auth_headers(address)
                if address in self._tokens:
                    return
        raise ClientError("no replica answers")

    async def replicas(self) -> dict[str, dict[str, str]]:
        """group -> node -> broker address, from the first name server that answers."""
        for ns in self.namesrv:
            doc = await self.get_json(ns, "/cluster")
            if isinstance(doc, dict):
                return {g: {n: info["address"] for n, info in sorted(nodes.items())}
                        for g, nodes in sorted(doc.items())}
        raise ClientError(f"no name server answers ({', '.join(self.namesrv)})")

    async def acl_enforced(self) -> bool | None:
        """Whether the cluster refuses an anonymous admin read (its ACLs are on); None when
        no name server or replica answers."""
        try:
            groups = await self.replicas()
        except ClientError:
            return None
        for nodes in groups.values():
            for address in nodes.values():
                try:
                    doc = await self.get_json(address, "/admin/topics")
                except AuthFailedError:
                    return True
                if doc is not None:
                    return False
        return None

    async def statuses(self) -> dict[str, dict[str, tuple[str, dict[str, Any] | None]]]:
        """group -> node -> (address, its /status or None when down), asked at once."""
        groups = await self.replicas()
        pairs = [(g, n, a) for g, nodes in groups.items() for n, a in nodes.items()]
        answers = await asyncio.gather(*(self.get_json(a, "/status") for _, _, a in pairs))
        out: dict[str, dict[str, tuple[str, dict[str, Any] | None]]] = {}
        for (g, n, a), s in zip(pairs, answers, strict=True):
            out.setdefault(g, {})[n] = (a, s)
        return out

    async def on_any_replica(self, group: str, path: str, **query: str) -> Any:
        """``path`` from the group's leader if it answers, else from any replica."""
        statuses = (await self.statuses()).get(group, {})
        ranked = sorted(statuses.values(), key=lambda p: (p[1] or {}).get("role") != "leader")
        for address, _ in ranked:
            doc = await self.get_json(address, path, **query)
            if doc is not None:
                return doc
        return None

    # -- topics --------------------------------------------------------------------------
    async def topics(self) -> dict[str, dict[str, Any]]:
        """topic -> group -> {queues, perm, min_offsets, max_offsets}."""
        out: dict[str, dict[str, Any]] = {}
        for group in await self.replicas():
            doc = await self.on_any_replica(group, "/admin/topics") or {}
            for topic, info in doc.items():
                out.setdefault(topic, {})[group] = info
        return dict(sorted(out.items()))

    async def save_topic(self, topic: str, queues: int, perm: int) -> list[str]:
        return await self.admin.create_topic(topic, queues, perm)

    async def delete_topic(self, topic: str) -> list[str]:
        return await self.admin.delete_topic(topic)

    # -- consumer groups --------------------------------------------------------------
    async def consumer_groups(self) -> dict[str, dict[str, Any]]:
        """consumer group -> {"members": [...], "topics": [...]} over every broker group."""
        out: dict[str, dict[str, Any]] = {}
        for group in await self.replicas():
            doc = await self.on_any_replica(group, "/admin/groups") or {}
            for name, info in doc.items():
                entry = out.setdefault(name, {"members": set(), "topics": set()})
                entry["members"].update(info["members"])
                entry["topics"].update(info["topics"])
        return {g: {"members": sorted(e["members"]), "topics": sorted(e["topics"])}
                for g, e in sorted(out.items())}

    async def lag_rows(self, consumer_group: str) -> list[dict[str, Any]]:
        """Per queue: committed offset, retained range and lag (every broker group)."""
        rows = []
        for group in await self.replicas():
            doc = await self.on_any_replica(group, f"/admin/groups/{consumer_group}/offsets") or {}
            rows += [{**r, "group": group} for r in doc.get("queues", [])]
        return sorted(rows, key=lambda r: (r["topic"], r["group"], r["queue"]))

    async def in_flight(self, consumer_group: str) -> dict[str, Any]:
        """A SimpleConsumer group's messages in flight (every broker group) and its retry
        policy per broker group."""
        rows: list[dict[str, Any]] = []
        policies: dict[str, Any] = {}
        count = 0
        for group in await self.replicas():
            doc = await self.on_any_replica(group, f"/admin/groups/{consumer_group}/in-flight") or {}
            rows += [{**r, "group": group} for r in doc.get("in_flight", [])]
            count += doc.get("count", 0)
            if "policy" in doc:
                policies[group] = doc["policy"]
        return {"count": count, "policies": policies,
                "rows": sorted(rows, key=lambda r: (r["deadline_ms"], r["topic"], r["group"], r["queue"]))}

    async def reset_offsets(self, consumer_group: str, topic: str, timestamp_ms: int) -> dict[str, int]:
        offsets = await self.admin.reset_offsets(consumer_group, topic, timestamp_ms)
        return {str(q): o for q, o in sorted(offsets.items())}

    # -- messages ----------------------------------------------------------------------
    async def by_id(self, topic: str, msg_id: str) -> list[ReceivedMessage]:
        found = await self.admin.message_by_id(topic, msg_id)
        return [found] if found else []

    async def by_key(self, topic: str, key: str, limit: int = 64) -> list[ReceivedMessage]:
        return await self.admin.messages_by_key(topic, key, max_results=limit)

    async def by_time(self, topic: str, begin_ms: int, end_ms: int, limit: int = 64) -> list[ReceivedMessage]:
        """Messages stored in [begin_ms, end_ms], oldest first, from every queue."""
        route = await self.admin.core.routes.route(topic)
        found: list[ReceivedMessage] = []
        for q in route.queues():
            _, high, start = await queue_offsets(self.admin.core, q, begin_ms)
            offset = start if start is not None else high
            while offset < high and len(found) < limit:
                page = await fetch(self.admin.core, q, offset, max_msgs=32, read_from="any")
                if not page.messages or page.next_offset <= offset:
                    break
                inside = [m for m in page.messages if m.store_timestamp <= end_ms]
                found += inside
                if len(inside) < len(page.messages):
                    break
                offset = page.next_offset
        found.sort(key=lambda m: (m.store_timestamp, m.commit_log_offset))
        return found[:limit]

    async def holders(self, m: ReceivedMessage) -> dict[str, bool]:
        """node -> whether that replica of the message's group holds it (asked each one)."""
        nodes = (await self.replicas()).get(m.queue.group, {})
        answers = await asyncio.gather(*(self.get_json(a, "/admin/messages", msgId=m.msg_id)
                                         for a in nodes.values()))
        return {n: bool(rows) and any(r.get("position") == m.commit_log_offset for r in rows)
                for n, rows in zip(nodes, answers, strict=True)}

    async def resend_to_group(self, m: ReceivedMessage, consumer_group: str) -> dict[str, Any]:
        """Deliver ``m`` again to ``consumer_group`` alone: the broker stores a copy in the
        group's retry topic (RocketMQ's send-back), due after the first retry delay."""
        reply = await self.admin.core.leader_request(
            m.queue.group, SendBackRequest(group=consumer_group, position=m.commit_log_offset,
                                           max_reconsume_times=10_000),
            deadline=Deadline(10.0), topic=m.queue.topic)
        answer = SendBackResponse.from_frame(reply)
        return {"stored_in": answer.topic, "reconsume_times": answer.reconsume_times}

    # -- dead letters ------------------------------------------------------------------
    async def dead_letters(self, consumer_group: str, limit: int = 200) -> list[ReceivedMessage]:
        """The messages of ``%DLQ%<group>``, oldest first (none if it does not exist)."""
        try:
            route = await self.admin.core.routes.route(f"%DLQ%{consumer_group}", refresh=True)
        except (TopicNotExistError, ClientError):
            return []
        found: list[ReceivedMessage] = []
        for q in route.queues():
            low, high, _ = await queue_offsets(self.admin.core, q)
            offset = low
            while offset < high and len(found) < limit:
                page = await fetch(self.admin.core, q, offset, max_msgs=32, read_from="any")
                if page.next_offset <= offset:
                    break
                found += page.messages
                offset = page.next_offset
        return found[:limit]

    async def resend_dead_letter(self, consumer_group: str, queue: MessageQueue,
                                 offset: int) -> dict[str, Any]:
        """Send the dead letter at (queue, offset) again to the topic it was first sent to."""
        m = await self.admin.message_at(queue, offset)
        if m is None:
            raise ClientError(f"no dead letter at {queue}@{offset}")
        if self._producer is None:
            self._producer = AsyncProducer(self.namesrv, group="raftmq-console", credentials=self.credentials,
                                           tls=self.tls)
        r = await self._producer.send(resend_copy(m))
        return {"msg_id": r.msg_id, "topic": r.queue.topic, "queue": str(r.queue), "offset": r.queue_offset}
