"""The broker's HTTP admin API and ``/metrics`` (``raftmq`` and operators use it)::

    GET  /metrics                          Prometheus text (``broker.http_api.metrics``)
    GET  /admin/topics                     {topic: {queues, perm, min_offsets, max_offsets}}
    POST /admin/topics                     {"topic", "queues", "perm"} (on the leader)
    GET  /admin/cluster                    this group as this replica sees it
    GET  /admin/groups                     {group: {"members": [client ids], "topics": [...]}}: every
                                           group with committed offsets or a live member here
    GET  /admin/groups/{group}/offsets     committed offset, retained range and lag per queue
    GET  /admin/groups/{group}/in-flight   a SimpleConsumer group's retry policy and the messages
                                           it holds: topic, queue, offset, deadline, delivery
                                           (the first IN_FLIGHT_ROWS by deadline; "count": all)
    GET  /admin/messages?key=K | ?msgId=I  messages with their properties and body (base64)
    POST /admin/leader/transfer            {"to": node} or empty (on the leader)

Requests that change state go through the same frame handlers as the WebSocket
(``ServerView.handle``); ``http_reply`` maps their response codes to HTTP statuses.
The group's members: ``broker.http_api.membership``.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING

import msgspec
from aiohttp import web

from broker.http_api.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from broker.store.commands import Perm
from common.http_errors import read_json
from dledger.errors import NoLeader, NotLeader
from protocol.message_format import decode_record
from protocol.query import QueryMessageRequest, QueryResponse, ViewMessageRequest
from protocol.remoting import Frame, ResponseCode
from protocol.send import WriteResponse
from protocol.topic import CreateTopicRequest
from protocol.wire import NotLeaderResponse, Request, Response

if TYPE_CHECKING:
    from broker.http_api.server_view import ServerView

__all__ = ["IN_FLIGHT_ROWS", "admin_routes", "http_reply"]

#: Most in-flight messages ``/admin/groups/{group}/in-flight`` lists.
IN_FLIGHT_ROWS = 1000


class _CreateTopicDoc(msgspec.Struct):
    topic: str
    queues: int = 8
    perm: int = int(Perm.READ_WRITE)


class _TransferDoc(msgspec.Struct):
    to: str | None = None


def http_reply(reply: Frame, success: type[Response] | None = None) -> web.Response:
    """The JSON of a request's answer: code, message (the remark) and the answer's fields --
    a ``success`` on SUCCESS, the leader on NOT_LEADER."""
    status = {ResponseCode.SUCCESS: 200, ResponseCode.NOT_LEADER: 421, ResponseCode.NO_LEADER: 503,
              ResponseCode.QUERY_NOT_FOUND: 404, ResponseCode.TOPIC_NOT_EXIST: 404,
              ResponseCode.OUTCOME_UNKNOWN: 409, ResponseCode.AUTH_FAILED: 401,
              ResponseCode.NO_PERMISSION: 403}.get(reply.code, 400)
    fields: type[Response] | None = {ResponseCode.SUCCESS: success,
                                     ResponseCode.NOT_LEADER: NotLeaderResponse}.get(reply.code)
    body: dict[str, object] = {"code": reply.code, "message": reply.remark,
                               **(fields.from_frame(reply).to_ext() if fields is not None else {})}
    return web.json_response(body, status=status)


def admin_routes(server: ServerView) -> list[web.RouteDef]:
    return AdminApi(server).routes()


class AdminApi:
    """One handler per admin route (module docstring), over one ``ServerView``."""

    def __init__(self, server: ServerView) -> None:
        self._server = server

    def routes(self) -> list[web.RouteDef]:
        return [web.get("/metrics", self.metrics), web.get("/admin/topics", self.admin_topics),
                web.post("/admin/topics", self.admin_create_topic),
                web.get("/admin/cluster", self.admin_cluster),
                web.get("/admin/groups", self.admin_groups),
                web.get("/admin/groups/{group}/offsets", self.admin_group),
                web.get("/admin/groups/{group}/in-flight", self.admin_in_flight),
                web.get("/admin/messages", self.admin_messages),
                web.post("/admin/leader/transfer", self.admin_transfer)]

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self._server.metrics.exposition(), content_type=METRICS_CONTENT_TYPE,
                            charset="utf-8")

    async def admin_topics(self, request: web.Request) -> web.Response:
        out = {}
        machine, log_start = self._server.machine, self._server.rlog.reader.start_position
        for topic, cfg in sorted(machine.topics.items()):
            queues = [machine.queue(topic, q) for q in range(cfg.queues)]
            lows = [machine.retained_min_offset(q, log_start) if q else 0 for q in queues]
            out[topic] = {"queues": cfg.queues, "perm": cfg.perm, "min_offsets": lows,
                          "max_offsets": [q.max_offset if q else 0 for q in queues]}
        return web.json_response(out)

    async def admin_groups(self, request: web.Request) -> web.Response:
        """Consumer groups known here: with offsets committed through the log (every
        replica) or members connected to this replica."""
        offsets = self._server.machine.offsets
        live = self._server.consumers.groups()
        return web.json_response({g: {"members": sorted(m.client_id for m in live.get(g, ())),
                                      "topics": sorted(offsets.of_group(g))}
                                  for g in sorted(set(offsets.groups()) | set(live))})

    async def admin_cluster(self, request: web.Request) -> web.Response:
        """This group as this replica sees it: replicas, leader, Raft status, consumers."""
        server = self._server
        status = server.rlog.status()
        leader = server.rlog.leader
        machine = server.machine
        return web.json_response({
            "group": server.rlog.config.group, "node": server.rlog.config.node,
            "leader": leader, "leader_address": server.addresses.get(leader) if leader else None,
            "replicas": server.addresses,
            "status": {**status.to_json(), "applied_index": machine.applied_index()},
            "consumers": {g: [m.client_id for m in members]
                          for g, members in server.consumers.groups().items()},
            "held": {"delayed": len(machine.timers), "transaction_halves": len(machine.halves)}})

    async def admin_create_topic(self, request: web.Request) -> web.Response:
        doc = await read_json(request, _CreateTopicDoc)
        create = CreateTopicRequest(topic=doc.topic, queues=doc.queues, perm=doc.perm)  # type: ignore[arg-type]
        return http_reply(await self._handle(create), WriteResponse)

    async def _handle(self, request: Request) -> Frame:
        """``request`` through the frame handlers, as if it came over a WebSocket."""
        return await self._server.handle(request.to_frame(0))

    async def admin_transfer(self, request: web.Request) -> web.Response:
        """POST /admin/leader/transfer {"to": node (optional)} on the leader."""
        to = (await read_json(request, _TransferDoc)).to if request.can_read_body else None
        try:
            new = await self._server.transfer_leadership(to)
        except ValueError as e:
            return web.json_response({"error": str(e)}, status=400)
        except (NotLeader, NoLeader) as e:
            leader = self._server.rlog.leader
            return web.json_response({"error": str(e), "leader": leader,
                                      "leader_address": self._server.addresses.get(leader or "")}, status=421)
        if new is None:
            return web.json_response({"error": "the leadership did not move within 3 s (is the target "
                                               "up and caught up?); this node still leads"}, status=503)
        return web.json_response({"leader": new, "leader_address": self._server.addresses.get(new)})

    async def admin_group(self, request: web.Request) -> web.Response:
        return web.json_response({"group": request.match_info["group"],
                                  "queues": self._server.lag_rows(request.match_info["group"])})

    async def admin_in_flight(self, request: web.Request) -> web.Response:
        group = request.match_info["group"]
        pops = self._server.machine.pops
        policy, held = pops.policy(group), pops.held_by(group)
        return web.json_response({
            "group": group,
            "policy": {"retry_ms": list(policy.backoff_ms), "max_deliveries": policy.max_deliveries,
                       "ordered": policy.ordered, "set": pops.explicit_policy(group) is not None},
            "count": len(held),
            "in_flight": [{"topic": topic, "queue": m.queue_id, "offset": m.offset,
                           "deadline_ms": m.deadline_ms, "delivery": m.delivery}
                          for topic, m in held[:IN_FLIGHT_ROWS]]})

    async def admin_messages(self, request: web.Request) -> web.Response:
        query: Request
        if "msgId" in request.query:
            query = ViewMessageRequest(msg_id=request.query["msgId"])
        elif "key" in request.query:
            query = QueryMessageRequest(key=request.query["key"])
        else:
            return web.json_response({"error": "give key=... or msgId=..."}, status=400)
        reply = await self._handle(query)
        if reply.code != ResponseCode.SUCCESS:
            return http_reply(reply)
        out = []
        for row in QueryResponse.from_frame(reply).rows:
            m = decode_record(row.message)
            out.append({"position": row.position, "store_timestamp": row.store_ms, "msg_id": m.msg_id.hex(),
                        "topic": m.topic, "queue_id": m.queue_id, "tags": m.tags, "keys": list(m.keys),
                        "properties": m.properties, "body_base64": base64.b64encode(m.body).decode()})
        return web.json_response(out)
