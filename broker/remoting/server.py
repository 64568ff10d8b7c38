"""The broker's aiohttp server: one WebSocket of remoting frames per client, plus HTTP.

    GET  /ws        binary WebSocket; every message is one ``protocol.remoting`` frame
    GET  /healthz   "ok" (the process serves)
    GET  /status    JSON: Raft status, applied index, disk, version and start time of this replica
    GET  /metrics, /admin/...               the admin API (``broker.http_api.admin``), the
                                            members (``broker.http_api.membership``) and
                                            ``raftmq cluster verify``'s (``broker.http_api.verify``)

Requests are dispatched by code (``_handlers``: ``broker.remoting.dispatch``, which also
answers a handler's errors) to one processor per family, as RocketMQ's remoting server
does: sends (``broker.processors.send``), pulls (``broker.processors.pull``), queries and
resets by time (``broker.processors.query``), topics (``broker.processors.topic``), offsets
and locks (``broker.processors.offset``), consumer membership (``broker.processors.consumer``),
send-backs and transactions (``broker.processors.deferred``). This module builds the parts
and owns the health gate and HTTP; ``broker.remoting.client_sockets`` the WebSockets,
``broker.remoting.replica_tasks`` the background tasks.

Writes go through the leader's ``WritePath``; a follower answers NOT_LEADER naming the
leader. A message may be up to ``max_message_bytes`` encoded (4 MiB by default; larger
ones get MESSAGE_TOO_LARGE and nothing is stored); one that does not fit in a Raft entry
is stored as a chain of fragments (``broker.store.fragments``) and read back whole. Reads
(pull, offsets, topics) are served by any replica from applied -- hence committed --
state only. A malformed frame gets MALFORMED_FRAME and the connection stays open; one
that cannot be answered (its opaque unreadable, or a malformed oneway or response) closes
the connection with 1007 and the reason; an unknown code gets REQUEST_CODE_NOT_SUPPORTED.
What a client may hold of the port (connections, descriptors, frames still arriving,
requests in flight, parked pulls, idle time) is bounded by ``ClientLimits``: see
``broker.remoting.connection_guard``, ``broker.remoting.frame_reader`` and ``broker.processors.long_polls``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
from aiohttp import web

from broker.clients.registry import ConsumerRegistry
from broker.clients.retry_topics import RetryTopicQuota
from broker.deferred.overdue import DEFAULT_THRESHOLD_S as DEFAULT_OVERDUE_S
from broker.deferred.overdue import OverdueWatch
from broker.deferred.service import DeferredService
from broker.http_api.admin import admin_routes
from broker.http_api.membership import member_routes
from broker.http_api.metrics import VERSION, BrokerMetrics
from broker.http_api.verify import Verifier
from broker.processors.access_keys import AccessKeyProcessor
from broker.processors.acl import AclProcessor
from broker.processors.consumer import ConsumerProcessor
from broker.processors.deferred import DeferredProcessor
from broker.processors.long_polls import AppliedSignal, ParkedPulls
from broker.processors.offset import OffsetProcessor
from broker.processors.pop import PopProcessor
from broker.processors.pull import PullProcessor
from broker.processors.query import QueryProcessor
from broker.processors.send import SendProcessor
from broker.processors.topic import TopicProcessor
from broker.remoting.client_limits import ClientLimits
from broker.remoting.client_sockets import ClientSockets
from broker.remoting.connection_guard import ConnectionGuard
from broker.remoting.dispatch import SERVED_WHEN_UNHEALTHY, answer, dispatch_table
from broker.remoting.guarded_site import GuardedRunner
from broker.remoting.replica_tasks import run_background
from broker.replication.divergence import MARKER as DIVERGENT_MARKER
from broker.replication.divergence import DivergenceCheck
from broker.replication.write_path import WritePath
from broker.security.access_control import AccessControl
from broker.state.held import DEFAULT_DELAY_LEVELS, RETRY_DELAYS
from broker.state.machine import BrokerStateMachine
from broker.store.commands import PutUser
from common.http_errors import browser_guard, json_errors
from dledger.applier import Applier
from dledger.errors import NoLeader, NotLeader
from dledger.log import Log
from protocol.message_format import MAX_MESSAGE_BYTES
from protocol.remoting import DEFAULT_MAX_FRAME, Frame, ResponseCode
from protocol.tls import ClientTls, http_url

__all__ = ["AppliedSignal", "BrokerServer"]

log = logging.getLogger("broker.server")

#: A frame's bytes beyond its body (header fields, ext).
FRAME_SLACK = 64 * 1024


class BrokerServer:
    def __init__(self, rlog: Log, machine: BrokerStateMachine, applier: Applier,
                 signal: AppliedSignal, leader_address: Callable[[str], str | None], *,
                 addresses: Mapping[str, str] | None = None,
                 max_message_bytes: int = MAX_MESSAGE_BYTES, delay_levels: str = DEFAULT_DELAY_LEVELS,
                 retry_delays: str = RETRY_DELAYS,
                 retry_overdue_s: float = DEFAULT_OVERDUE_S, acl: bool = False,
                 acl_bootstrap: PutUser | None = None, acl_token_ttl_s: float = 600.0,
                 limits: ClientLimits | None = None, peer_tls: ClientTls | None = None,
                 allowed_origins: tuple[str, ...] = ()) -> None:
        """``peer_tls``: how to dial the peers' client ports (None: plain HTTP);
        ``allowed_origins``: web pages that may open ``/ws`` and change state over HTTP
        besides the port's own origin (``common.http_errors.browser_guard``)."""
        self.allowed_origins = allowed_origins
        if max_message_bytes < 1:
            raise ValueError("max_message_bytes must be positive")
        self.max_message_bytes = max_message_bytes
        #: Largest request frame accepted: one message of the limit and the frame around it.
        self.max_frame_bytes = max(DEFAULT_MAX_FRAME, max_message_bytes + FRAME_SLACK)
        self.rlog = rlog
        self.applier = applier
        rlog.set_client_addresses(dict(addresses or {}))
        self.consumers = ConsumerRegistry()
        self.machine = machine
        self.write = WritePath(rlog, machine, applier, max_message_bytes=max_message_bytes)
        self.producers = ConsumerRegistry()  # producer groups' connections (transaction checks)
        self.deferred = DeferredService(rlog, machine, self.write, self.producers,
                                        delay_levels=delay_levels, retry_delays=retry_delays)
        self.divergence = DivergenceCheck(rlog.config.node, rlog.client_addresses,
                                          lambda: len(rlog.members()),
                                          machine.recent_digests, self._peer_digests,
                                          lambda: rlog.is_leader,
                                          lambda _why: rlog.stand_for_election(False),
                                          marker=rlog.config.data_dir / DIVERGENT_MARKER)
        self.queries = QueryProcessor(self)
        self.sends = SendProcessor(self)
        self.topic_requests = TopicProcessor(self)
        self.offset_requests = OffsetProcessor(self)
        self.client_requests = ConsumerProcessor(self)
        self.deferred_requests = DeferredProcessor(self)
        self.overdue = OverdueWatch(machine, lambda: self.consumers.groups().keys(), lambda: rlog.is_leader,
                                    threshold_s=retry_overdue_s)
        self._session: aiohttp.ClientSession | None = None  # to peers (divergence check)
        self._peer_tls = peer_tls
        self.sockets = ClientSockets(self)  # /ws
        self.signal = signal
        machine.on_queues_grown.append(signal.notify)  # parked pulls wake by queue
        self.connections = ConnectionGuard(limits)
        self.leader_address = leader_address
        self.metrics = BrokerMetrics(self)
        self.started_at = time.time()  # /status: uptime
        parked = ParkedPulls(self.connections.limits.max_parked_pulls_per_connection,
                             self.connections.limits.max_parked_pulls)  # long pulls and POPs alike
        self.pulls = PullProcessor(machine, rlog, signal, self.metrics, parked)
        self.pop_requests = PopProcessor(self, signal, parked)
        self.access = AccessControl(self, enabled=acl, bootstrap=acl_bootstrap,  # every request checked
                                    token_ttl_s=acl_token_ttl_s)
        self.acl_requests = AclProcessor(self)
        self.access_key_requests = AccessKeyProcessor(self)
        self.retry_quota = RetryTopicQuota(lambda: machine.topics)  # heartbeats' and send-backs'
        self.verifier = Verifier(self)  # raftmq cluster verify's routes, the last comparison
        self._handlers = dispatch_table(self)  # every request code served -> its handler

    def app(self) -> web.Application:
        app = web.Application(middlewares=[json_errors, browser_guard(self.allowed_origins),
                                           self.connections.middleware,
                                           self.access.http_middleware],
                              handler_args={"keepalive_timeout": self.connections.limits.idle_timeout_s})
        app.add_routes([web.get("/ws", self.sockets.serve), web.get("/healthz", self._healthz),
                        web.get("/status", self._status), *admin_routes(self), *member_routes(self),
                        *self.verifier.routes(), *self.access.routes()])
        app.cleanup_ctx.append(functools.partial(run_background, self))
        app.cleanup_ctx.append(self.connections.background)
        return app

    def runner(self, **kwargs: Any) -> GuardedRunner:
        """An ``AppRunner`` of ``app()`` whose connections pass the connection guard; serve it
        with ``broker.remoting.guarded_site.GuardedSite``. ``kwargs`` as AppRunner's."""
        return GuardedRunner(self.app(), self.connections, **kwargs)

    async def close_connections(self) -> None:
        """Close every client WebSocket (going away): clients reconnect elsewhere."""
        await self.sockets.close_all()

    async def close_http_session(self) -> None:
        if self._session is not None:
            await self._session.close()

    # -- HTTP ----------------------------------------------------------------------
    def unhealthy(self) -> str | None:
        """Why this replica must not be trusted to serve (None: it may)."""
        return self.divergence.divergent or self.applier.stalled or self._log_behind_state()

    def _log_behind_state(self) -> str | None:
        """A CommitLog cut (--repair-log, a torn tail below the commit index) ends before the
        state applied from it: ConsumeQueue units name positions the log does not hold until
        the leader sends those entries again, and a read there would call them deleted."""
        log = self.rlog.reader
        held = log.last_index or max(log.awaiting_start - 1, 0)  # an empty reset log: its start
        applied = self.machine.applied_index()
        if applied <= held:
            return None
        return (f"its CommitLog ends at index {held}, before the state it applied (index {applied}); "
                "it serves again once the leader sent it the missing entries")

    async def _peer_digests(self, address: str) -> dict[int, str] | None:
        """A peer's recent state digests (its ``/status``); None if it does not answer."""
        try:
            async with self.http_session().get(self.peer_url(address, "/status"),
                                        timeout=aiohttp.ClientTimeout(total=3)) as resp:
                doc = await resp.json()
            return {int(i): str(d) for i, d in doc.get("state_digests", {}).items()}
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None

    def http_session(self) -> aiohttp.ClientSession:
        """The session for calls to peers (their ``peer_url``s)."""
        if self._session is None or self._session.closed:
            ssl = self._peer_tls.context() if self._peer_tls is not None else True
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ssl))
        return self._session

    def peer_url(self, address: str, path: str) -> str:
        """``path`` on a peer's client port, https when this replica serves TLS."""
        return http_url(address, path, self._peer_tls is not None)

    async def _healthz(self, request: web.Request) -> web.Response:
        why = self.unhealthy()
        if why is not None:
            return web.Response(status=503, text=f"unhealthy: {why}\n")
        return web.Response(text="ok")

    async def _status(self, request: web.Request) -> web.Response:
        status = self.rlog.status().to_json()
        status["applied_index"] = self.machine.applied_index()
        status["healthy"] = self.unhealthy() is None
        status["apply_stalled"] = self.applier.stalled
        snapshots = self.machine.snapshot_indexes()
        status["snapshot_index"] = snapshots[-1] if snapshots else None
        status["snapshot_indexes"] = snapshots[-8:]
        status["state_digests"] = {str(i): d for i, d in sorted(self.machine.recent_digests().items())}
        status["snapshot_installs"] = self.machine.installs
        cl = self.rlog.reader
        status["disk"] = {"commitlog_bytes": cl.write_position - cl.start_position,
                          **self.rlog.disk.status()}
        status["log_start_position"] = cl.start_position
        status.update(self.verifier.status())  # last_verify, last_marker
        status["version"] = VERSION
        status["started_at"] = self.started_at
        return web.json_response(status)

    async def handle(self, frame: Frame) -> Frame:
        handler = self._handlers.get(frame.code)
        self.metrics.request(frame.code if handler is not None else None)  # bounded labels
        if handler is None:
            return frame.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                  remark=f"request code {frame.code} is not supported")
        refused = self.access.check(frame)
        if refused is not None:
            return refused
        why = self.unhealthy()
        if why is not None and frame.code not in SERVED_WHEN_UNHEALTHY:
            return frame.response(ResponseCode.SYSTEM_BUSY,
                                  remark=f"replica {self.rlog.config.node} does not serve: {why}")
        return await answer(frame, handler, self.leader_address)

    # -- writes ----------------------------------------------------------------------
    def require_leader(self) -> None:
        if not self.rlog.is_leader:
            leader = self.rlog.leader
            if leader is None:
                raise NoLeader("the group has no leader right now; retry shortly")
            raise NotLeader(leader, getattr(self.rlog.members().get(leader), "raft", ""))

    # -- HTTP: metrics and admin ----------------------------------------------------------
    def lag_rows(self, group: str) -> list[dict[str, object]]:
        rows = []
        for topic, by_queue in sorted(self.machine.offsets.of_group(group).items()):
            for qid, committed in sorted(by_queue.items()):
                cq = self.machine.queue(topic, qid)
                top = cq.max_offset if cq is not None else 0
                low = 0 if cq is None else self.machine.retained_min_offset(
                    cq, self.rlog.reader.start_position)
                rows.append({"topic": topic, "queue": qid, "committed": committed, "min_offset": low,
                             "max_offset": top, "lag": max(0, top - max(committed, low))})
        return rows

    @property
    def addresses(self) -> dict[str, str]:
        """name -> broker address of every member of the group (the log says who)."""
        return self.rlog.client_addresses()

    async def transfer_leadership(self, to: str | None = None, timeout: float = 3.0) -> str | None:
        """Hand this leader's role to ``to`` (default: the most up-to-date follower); the new
        leader's name, or None if it did not move in time. Raises NotLeader/NoLeader."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        new = await loop.run_in_executor(None, self.rlog.transfer_leadership, to, timeout)
        log.info("leadership transfer to %s: %s after %.0f ms", to or "the most up-to-date follower",
                 new or "did not complete", (loop.time() - started) * 1000)
        return new
