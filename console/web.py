"""The console's HTTP server (aiohttp): the page and its assets from ``console/static``
(shipped in the package; no CDN), and the JSON API the page calls::

    GET  /api/overview                         sampled series (rates, send p99) and leader history
    GET  /api/cluster                          every replica's status, by broker group, and the
                                               group's last comparison (`raftmq cluster verify`)
    GET  /api/topics                           topics with queues, offsets and produce rate
    POST /api/topics         {topic, queues, perm}      create or update
    POST /api/topics/delete  {topic}
    GET  /api/groups                           consumer groups: members, topics, lag, consume rate
    GET  /api/group?name=G                     lag per queue; SimpleConsumer messages in flight
    POST /api/group/reset    {group, topic, timestamp}  offsets to the first message at/after it
    GET  /api/messages?topic=T&id=I | &key=K | &begin=MS&end=MS
    GET  /api/message?topic=T&id=I             one message and which replicas hold it
    POST /api/message/resend {topic, id, group}         deliver again to one consumer group
    GET  /api/dlq?group=G                      dead letters of a consumer group
    POST /api/dlq/resend     {group, broker_group, queue_id, offset}
    POST /api/login          {user, password}   sign this session in (checked with a replica)
    POST /api/logout
    GET  /api/whoami                           {"user": the signed-in user or null}

Sessions (``console.sessions``): a cookie names the session (a new id at sign-in; ended
after 30 min idle or 12 h); each session acts through the ``ClusterGateway`` of its
``Credentials`` (``session_credentials``: ``None`` until it signs in), so with ACLs on the
brokers decide what the signed-in user sees and may do. Web pages of other sites cannot
drive it: every POST needs the session's CSRF token in ``X-CSRF-Token`` (the page reads it
from ``/api/whoami``; another origin cannot read that answer), a JSON body sent as
``application/json`` (415) and no foreign ``Origin`` (403); over plain http the ``Host``
must be an IP address or ``localhost`` (a DNS name could be rebound to this host). Client errors are answered
``400 {"error": ...}``; a refused authentication ``401`` (the page then asks to sign in), a
refused right ``403`` -- the remark names the user, the action and the resource.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from client.credentials import Credentials
from client.errors import AuthFailedError, ClientError, NoPermissionError
from client.queues import MessageQueue
from common.http_errors import literal_host
from console.gateway import ClusterGateway, message_json
from console.sampler import Sampler
from console.sessions import Session, Sessions
from protocol.login_throttle import LoginThrottle
from protocol.tls import ClientTls

__all__ = ["STATIC", "Console"]

STATIC = Path(__file__).parent / "static"
_COOKIE = "raftmq_console"
_SESSION = web.RequestKey("session", Session)
#: what a console that serves signed-in users only (``sign_in_only``) answers anyone
_ANONYMOUS = frozenset({"/", "/api/login", "/api/logout", "/api/whoami"})


def _anonymous(path: str) -> bool:
    return path in _ANONYMOUS or path.startswith("/static/")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_AUDIT = logging.getLogger("raftmq.audit")


class Console:
    """The console of one cluster: sessions, their gateways, the sampler, the routes."""

    def __init__(self, namesrv: list[str], sample_interval_s: float = 1.0,
                 tls: ClientTls | bool | None = None, sign_in_only: bool = False) -> None:
        """``tls``: how to reach a cluster serving TLS (``ClusterGateway``); ``sign_in_only``:
        the API answers signed-in sessions only (a console reachable from other hosts)."""
        self.sign_in_only = sign_in_only
        self.namesrv = namesrv
        self.tls = tls
        self._gateways: dict[Credentials | None, ClusterGateway] = {}
        self.sessions = Sessions()
        self.throttle = LoginThrottle()  # sign-ins by user and by the browser's address
        self.sampler = Sampler(self.gateway_for(None), sample_interval_s)

    def gateway_for(self, credentials: Credentials | None) -> ClusterGateway:
        gateway = self._gateways.get(credentials)
        if gateway is None:
            gateway = self._gateways[credentials] = ClusterGateway(self.namesrv, credentials, self.tls)
        return gateway

    def session_credentials(self, request: web.Request) -> Credentials | None:
        """The signed-in user of the request's session (None: no users in the cluster yet)."""
        return request[_SESSION].credentials

    def gateway(self, request: web.Request) -> ClusterGateway:
        return self.gateway_for(self.session_credentials(request))

    def app(self) -> web.Application:
        app = web.Application(middlewares=[_browser_middleware, self._session_middleware, _errors_middleware])
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
        session = self.sessions.get(request.cookies.get(_COOKIE))
        fresh = session is None
        if session is None:
            session = self.sessions.open()
        request[_SESSION] = session
        if request.method == "POST" and not session.csrf_ok(request.headers.get("X-CSRF-Token")):
            response: web.StreamResponse = web.json_response(
                {"error": "missing or wrong CSRF token (X-CSRF-Token): reload the page"}, status=403)
        elif self.sign_in_only and session.credentials is None and not _anonymous(request.path):
            response = web.json_response({"error": "sign in: this console is reachable from other hosts",
                                          "login": True}, status=401)
        else:
            response = await handler(request)
        if fresh and _COOKIE not in response.cookies:  # login sets its own
            _set_cookie(response, request, session.id)
        return response

    # -- sign in -----------------------------------------------------------------------
    async def login(self, request: web.Request) -> web.Response:
        doc = await _body(request, "user", "password")
        credentials = Credentials(str(doc["user"]), str(doc["password"]))
        # begin: a sign-in awaiting its verdict counts as a failure until it ends, so sign-ins
        # sent together get no more verifications than sign-ins sent one after another
        refused = self.throttle.begin(credentials.user, request.remote)
        if refused is not None:
            _AUDIT.warning("throttled console sign-in user=%s from=%s: %s", credentials.user,
                           request.remote or "-", refused.message("sign-ins"))
            return web.json_response({"error": refused.message("sign-ins"), "login": True}, status=429,
                                     headers={"Retry-After": str(max(1, round(refused.retry_after_s)))})
        ok: bool | None = None  # no verdict on the password (the cluster down): counts nothing
        try:
            gateway = self.gateway_for(credentials)
            await gateway.verify()
            ok = True
        except ClientError as e:
            self._gateways.pop(credentials, None)
            await gateway.close()
            if isinstance(e, AuthFailedError):
                ok = False
                _AUDIT.warning("denied console sign-in user=%s from=%s: %s", credentials.user,
                               request.remote or "-", e)
            raise
        finally:
            self.throttle.end(credentials.user, request.remote, ok=ok)
        session = self.sessions.sign_in(request[_SESSION].id, credentials)  # a new id: no fixation
        response = web.json_response({"user": credentials.user, "csrf": session.csrf})
        _set_cookie(response, request, session.id)
        return response

    async def logout(self, request: web.Request) -> web.Response:
        self.sessions.close(request[_SESSION].id)
        session = self.sessions.open()
        response = web.json_response({"user": None, "csrf": session.csrf})
        _set_cookie(response, request, session.id)
        return response

    async def whoami(self, request: web.Request) -> web.Response:
        session = request[_SESSION]
        user = session.credentials.user if session.credentials else None
        return web.json_response({"user": user, "csrf": session.csrf})

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
        gateway = self.gateway(request)
        return web.json_response({"group": name, "queues": await gateway.lag_rows(name),
                                  "in_flight": await gateway.in_flight(name)})

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


def _set_cookie(response: web.StreamResponse, request: web.Request, sid: str) -> None:
    response.set_cookie(_COOKIE, sid, httponly=True, samesite="Strict", secure=request.secure)


async def _body(request: web.Request, *required: str) -> dict[str, Any]:
    if request.content_type != "application/json":
        raise web.HTTPUnsupportedMediaType(text=json.dumps(
            {"error": f"send the body as Content-Type: application/json, not {request.content_type}"}),
            content_type="application/json")
    try:
        doc = await request.json()
    except ValueError:
        raise ClientError("the body must be JSON") from None
    missing = [k for k in required if not isinstance(doc, dict) or doc.get(k) in (None, "")]
    if missing:
        raise ClientError(f"missing {', '.join(missing)}")
    return dict(doc)


def foreign_request(request: web.Request) -> str | None:
    """Why a request must be refused as a web page's of another site (None: it may go on):
    a POST whose ``Origin`` is not the console's own, or a ``Host`` that is a DNS name on
    plain http (the same rule as ``common.http_errors.browser_guard``, which the console
    may not import)."""
    if not request.secure and not literal_host(request.host):
        return (f"the console on plain http answers only at an IP address or localhost, not "
                f"{request.host!r} (a DNS name could be rebound to this host)")
    origin = request.headers.get("Origin")
    changes = request.method not in ("GET", "HEAD", "OPTIONS")
    if changes and origin is not None and origin.rstrip("/").lower() != f"{request.scheme}://{request.host}".lower():
        return f"requests from the web page of {origin} are refused"
    return None


@web.middleware
async def _browser_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    why = foreign_request(request)
    if why is not None:
        return web.json_response({"error": why}, status=403)
    return await handler(request)


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
