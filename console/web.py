"""The console's HTTP server (aiohttp): the page and its assets from ``console/static``
(shipped in the package; no CDN), and the JSON API the page calls::

    GET  /api/overview                         sampled series (rates, send p99) and leader history
    GET  /api/cluster                          every replica's status, by broker group, and the
                                               group's last comparison (`raftmq cluster verify`)
    GET  /api/topics                           topics with queues, offsets and produce rate
    POST /api/topics         {topic, queues, perm}      create or update
    POST /api/topics/delete  {topic}
    GET  /api/groups                           consumer groups: members, topics, lag, consume rate
    GET  /api/group?name=G                     lag per queue
    POST /api/group/reset    {group, topic, timestamp}  offsets to the first message at/after it
    GET  /api/messages?topic=T&id=I | &key=K | &begin=MS&end=MS
    GET  /api/message?topic=T&id=I             one message and which replicas hold it
    POST /api/message/resend {topic, id, group}         deliver again to one consumer group
    GET  /api/dlq?group=G                      dead letters of a consumer group
    POST /api/dlq/resend     {group, broker_group, queue_id, offset}
    POST /api/login          {user, password}   sign this session in (checked with a replica)
    POST /api/logout
    GET  /api/whoami                           {"user": the signed-in user or null}

Sessions: a cookie names the session; each session acts through the ``ClusterGateway`` of
its ``Credentials`` (``session_credentials``: ``None`` until it signs in), so with ACLs on
the brokers decide what the signed-in user sees and may do. Client errors are answered
``400 {"error": ...}``; a refused authentication ``401`` (the page then asks to sign in), a
refused right ``403`` -- the remark names the user, the action and the resource.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from client.credentials import Credentials
from client.errors import AuthFailedError, ClientError, NoPermissionError
from client.queues import MessageQueue
from console.gateway import ClusterGateway, message_json
from console.sampler import Sampler
from protocol.tls import ClientTls

__all__ = ["STATIC", "Console"]

STATIC = Path(__file__).parent / "static"
_COOKIE = "raftmq_console"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Console:
    """The console of one cluster: sessions, their gateways, the sampler, the routes."""

    def __init__(self, namesrv: list[str], sample_interval_s: float = 1.0,
                 tls: ClientTls | bool | None = None) -> None:
        """``tls``: how to reach a cluster serving TLS (``ClusterGateway``)."""
        self.namesrv = namesrv
        self.tls = tls
        self._gateways: dict[Credentials | None, ClusterGateway] = {}
        self._sessions: dict[str, Credentials | None] = {}
        self.sampler = Sampler(self.gateway_for(None), sample_interval_s)

    def gateway_for(self, credentials: Credentials | None) -> ClusterGateway:
        gateway = self._gateways.get(credentials)
        if gateway is None:
            gateway = self._gateways[credentials] = ClusterGateway(self.namesrv, credentials, self.tls)
        return gateway

    def session_credentials(self, request: web.Request) -> Credentials | None:
        """The signed-in user of the request's session (None: no users in the cluster yet)."""
        return self._sessions.get(request.cookies.get(_COOKIE, ""))

    def gateway(self, request: web.Request) -> ClusterGateway:
        return self.gateway_for(self.session_credentials(request))

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._session_middleware, _errors_middleware])
        get, post = web.get, web.post
        app.add_routes([
            get("/", self.index), web.static("/static", STATIC),
            get("/api/overview", self.overview), get("/api/cluster", self.cluster),
            get("/api/topics", self.topics), post("/api/topics", self.save_topic),
            post("/api/topics/delete", self.delete_topic),
            get("/api/groups", self.groups), get("/api/group", self.group),
            post("/api/group/reset", self.reset_group),
            get("/api/messages", self.messages), get("/api/message", self.message),
            post("/api/message/resend", self.resend_message),
            get("/api/dlq", self.dead_letters), post("/api/dlq/resend", self.resend_dead_letter),
            post("/api/login", self.login), post("/api/logout", self.logout),
            get("/api/whoami", self.whoami)])
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, app: web.Application) -> None:
        self.sampler.start()

    async def _stop(self, app: web.Application) -> None:
        await self.sampler.stop()
        for gateway in self._gateways.values():
            await gateway.close()

    @web.middleware
    async def _session_middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await handler(request)
        if _COOKIE not in request.cookies and _COOKIE not in response.cookies:  # login sets its own
            response.set_cookie(_COOKIE, secrets.token_urlsafe(24), httponly=True, samesite="Strict",
                                secure=request.secure)
        return response

    # -- sign in -----------------------------------------------------------------------
    async def login(self, request: web.Request) -> web.Response:
        doc = await _body(request, "user", "password")
        credentials = Credentials(str(doc["user"]), str(doc["password"]))
        gateway = self.gateway_for(credentials)
        try:
            await gateway.verify()
        except ClientError:
            self._gateways.pop(credentials, None)
            await gateway.close()
            raise
        session = request.cookies.get(_COOKIE) or secrets.token_urlsafe(24)
        self._sessions[session] = credentials
        response = web.json_response({"user": credentials.user})
        response.set_cookie(_COOKIE, session, httponly=True, samesite="Strict", secure=request.secure)
        return response

    async def logout(self, request: web.Request) -> web.Response:
        self._sessions.pop(request.cookies.get(_COOKIE, ""), None)
        return web.json_response({"user": None})

    async def whoami(self, request: web.Request) -> web.Response:
        credentials = self.session_credentials(request)
        return web.json_response({"user": credentials.user if credentials else None})

    # -- pages -------------------------------------------------------------------------
    async def index(self, request: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC / "index.html")

    async def overview(self, request: web.Request) -> web.Response:
        return web.json_response(self.sampler.snapshot())

    async def cluster(self, request: web.Request) -> web.Response:
        now = time.time()
        out = []
        for group, nodes in (await self.gateway(request).statuses()).items():
            replicas = [_replica_row(node, address, s, now) for node, (address, s) in nodes.items()]
            leader = next((r for r in replicas if r["role"] == "leader"), None)
            if leader is not None:
                for r in replicas:
                    r["lag"] = leader["lag_of"].get(r["node"], 0 if r is leader else None)
            out.append({"group": group, "leader": leader and leader["node"], "replicas": replicas,
                        "leader_history": self.sampler.leaders.get(group, []),
                        "last_verify": last_verify([s for _, s in nodes.values()])})
        return web.json_response({"groups": out, "now": now})

    async def topics(self, request: web.Request) -> web.Response:
        rates = self.sampler.topic_rates
        rows = [{"topic": t, "groups": by_group, "rate": rates.get(t, 0.0)}
                for t, by_group in (await self.gateway(request).topics()).items()]
        return web.json_response(rows)

    async def save_topic(self, request: web.Request) -> web.Response:
        doc = await _body(request, "topic")
        groups = await self.gateway(request).save_topic(str(doc["topic"]), int(doc.get("queues", 8)),
                                                       int(doc.get("perm", 6)))
        return web.json_response({"topic": doc["topic"], "groups": groups})

    async def delete_topic(self, request: web.Request) -> web.Response:
        doc = await _body(request, "topic")
        return web.json_response({"deleted": await self.gateway(request).delete_topic(str(doc["topic"]))})

    async def groups(self, request: web.Request) -> web.Response:
        gateway, rates = self.gateway(request), self.sampler.group_rates
        rows = []
        for name, info in (await gateway.consumer_groups()).items():
            lag = sum(r["lag"] for r in await gateway.lag_rows(name))
            rows.append({"group": name, **info, "lag": lag, "rate": rates.get(name, 0.0)})
        return web.json_response(rows)

    async def group(self, request: web.Request) -> web.Response:
        name = _query(request, "name")
        return web.json_response({"group": name, "queues": await self.gateway(request).lag_rows(name)})

    async def reset_group(self, request: web.Request) -> web.Response:
        doc = await _body(request, "group", "topic", "timestamp")
        offsets = await self.gateway(request).reset_offsets(str(doc["group"]), str(doc["topic"]),
                                                            int(doc["timestamp"]))
        return web.json_response({"offsets": offsets})

    async def messages(self, request: web.Request) -> web.Response:
        gateway, q = self.gateway(request), request.query
        topic = _query(request, "topic")
        if q.get("id"):
            found = await gateway.by_id(topic, q["id"])
        elif q.get("key"):
            found = await gateway.by_key(topic, q["key"])
        elif q.get("begin") or q.get("end"):
            found = await gateway.by_time(topic, int(q.get("begin") or 0), int(q.get("end") or 2**62))
        else:
            raise web.HTTPBadRequest(text='{"error": "give id, key, or begin and end"}',
                                     content_type="application/json")
        return web.json_response([message_json(m) for m in found])

    async def message(self, request: web.Request) -> web.Response:
        gateway = self.gateway(request)
        found = await gateway.by_id(_query(request, "topic"), _query(request, "id"))
        if not found:
            raise web.HTTPNotFound(text='{"error": "no such message"}', content_type="application/json")
        return web.json_response({**message_json(found[0]), "held_by": await gateway.holders(found[0])})

    async def resend_message(self, request: web.Request) -> web.Response:
        doc = await _body(request, "topic", "id", "group")
        gateway = self.gateway(request)
        found = await gateway.by_id(str(doc["topic"]), str(doc["id"]))
        if not found:
            raise ClientError(f"no message {doc['id']} in topic {doc['topic']}")
        return web.json_response(await gateway.resend_to_group(found[0], str(doc["group"])))

    async def dead_letters(self, request: web.Request) -> web.Response:
        found = await self.gateway(request).dead_letters(_query(request, "group"))
        return web.json_response([message_json(m) for m in found])

    async def resend_dead_letter(self, request: web.Request) -> web.Response:
        doc = await _body(request, "group", "broker_group", "queue_id", "offset")
        queue = MessageQueue(f"%DLQ%{doc['group']}", str(doc["broker_group"]), int(doc["queue_id"]))
        return web.json_response(await self.gateway(request).resend_dead_letter(
            str(doc["group"]), queue, int(doc["offset"])))


def _replica_row(node: str, address: str, s: dict[str, Any] | None, now: float) -> dict[str, Any]:
    if s is None:
        return {"node": node, "address": address, "role": "down", "lag_of": {}}
    last = s.get("last_index", 0)
    disk = s.get("disk", {})
    return {"node": node, "address": address, "role": s["role"], "term": s["term"],
            "commit_index": s["commit_index"], "applied_index": s.get("applied_index"),
            "lag_of": {f: max(0, last - i) for f, i in (s.get("follower_match_index") or {}).items()},
            "free_bytes": disk.get("free_bytes"), "commitlog_bytes": disk.get("commitlog_bytes"),
            "disk_full": bool(disk.get("full")),
            "version": s.get("version"), "healthy": s.get("healthy", True),
            "uptime_s": now - s["started_at"] if s.get("started_at") else None}


def last_verify(statuses: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The group's last comparison of its replicas (``raftmq cluster verify``): the newest
    ``last_verify`` its replicas' ``/status`` show (the replica that led then made it)."""
    made = [s["last_verify"] for s in statuses if s is not None and isinstance(s.get("last_verify"), dict)]
    return max(made, key=lambda v: (v.get("at_ms", 0), v.get("index", 0)), default=None)


def _query(request: web.Request, name: str) -> str:
    value = request.query.get(name)
    if not value:
        raise ClientError(f"give {name}=...")
    return value


async def _body(request: web.Request, *required: str) -> dict[str, Any]:
    try:
        doc = await request.json()
    except ValueError:
        raise ClientError("the body must be JSON") from None
    missing = [k for k in required if not isinstance(doc, dict) or doc.get(k) in (None, "")]
    if missing:
        raise ClientError(f"missing {', '.join(missing)}")
    return dict(doc)


@web.middleware
async def _errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except AuthFailedError as e:
        return web.json_response({"error": str(e), "login": True}, status=401)
    except NoPermissionError as e:
        return web.json_response({"error": str(e)}, status=403)
    except (ClientError, ValueError) as e:
        return web.json_response({"error": str(e)}, status=400)
