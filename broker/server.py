"""The broker's aiohttp server: one WebSocket of remoting frames per client, plus HTTP.

    GET  /ws        binary WebSocket; every message is one ``protocol.remoting`` frame
    GET  /healthz   "ok" (the process serves)
    GET  /status    JSON: Raft status and applied index of this replica
    GET  /metrics   Prometheus text: role, term, indexes, send/pull counters, commit
                    latency, consumer lag per group and queue, overdue redeliveries
                    (``broker.overdue``)
    GET  /admin/cluster                     this group: replicas, leader, Raft status, consumers
    GET  /admin/topics                      topics with queues, permissions, max offsets
    POST /admin/topics   {"topic","queues","perm"}   create or update (leader; 421 names it)
    GET  /admin/groups/{group}/offsets      committed offset, max offset and lag per queue
    GET  /admin/messages?key=K | ?msgId=ID  query stored messages (JSON, body in base64)

Requests handled (``RequestCode``): SEND_MESSAGE (body: one encoded message),
SEND_BATCH (body: msgpack list of encoded messages), PULL_MESSAGE (long poll,
optional tag-hash filter), CREATE_TOPIC, GET_TOPICS, GET_ROUTE, COMMIT_OFFSET,
QUERY_OFFSET, RESET_OFFSET, QUERY_MESSAGE, VIEW_MESSAGE_BY_ID, HEARTBEAT (consumer
membership; the leader creates a subscribing group's %RETRY% topic), UNREGISTER_CLIENT,
GET_CONSUMER_LIST; the server sends
NOTIFY_CONSUMER_IDS_CHANGED (oneway) to a group's members when it changes. Writes go
through the leader's ``WritePath``; a follower answers NOT_LEADER naming the
leader. A message may be up to ``max_message_bytes`` encoded (4 MiB by default;
larger ones get MESSAGE_TOO_LARGE and nothing is stored); one that does not fit in
a Raft entry is stored as a chain of fragments (``broker.fragments``) and read
back whole. A pull answers at most ``PULL_BODY_BYTES`` of rows, but always at
least one message. Reads (pull, offsets, topics) are served by any replica from applied --
hence committed -- state only. A malformed frame gets MALFORMED_FRAME and the
connection stays open; an unknown code gets REQUEST_CODE_NOT_SUPPORTED.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import contextvars
import itertools
import logging
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

import aiohttp
import msgpack
from aiohttp import WSMsgType, web

from broker.commands import CommitOffset, CreateTopic, DeleteTopic, LockQueue, Perm, encode_admin
from broker.consumer_registry import ConsumerRegistry
from broker.deferred import DEFAULT_DELAY_LEVELS, RETRY_DELAYS
from broker.deferred_service import DEFAULT_MAX_RECONSUME, DeferredService
from broker.divergence import DivergenceCheck
from broker.entry_batch import MessageTooLarge, read_stamp
from broker.fragments import MessageGone, read_message, read_message_at
from broker.membership_admin import member_routes
from broker.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from broker.metrics import BrokerMetrics
from broker.overdue import DEFAULT_THRESHOLD_S as DEFAULT_OVERDUE_S
from broker.overdue import OverdueWatch
from broker.state_machine import Applied, BrokerStateMachine, Outcome
from broker.write_path import WritePath
from dledger.applier import Applier
from dledger.commitlog import CommitLog
from dledger.entry_format import HEADER_SIZE
from dledger.errors import NoLeader, NotLeader, OutcomeUnknown, ProposeError
from dledger.replicated_log import ReplicatedLog
from protocol.message_format import MAX_MESSAGE_BYTES, MessageFormatError, decode_message, encode_message
from protocol.names import InvalidName, retry_topic, validate_group, validate_topic
from protocol.remoting import (
    DEFAULT_MAX_FRAME,
    Frame,
    FrameError,
    RequestCode,
    ResponseCode,
    decode_frame,
    ext_bool,
    ext_int,
    ext_ints,
    ext_str,
)
from protocol.sql_filter import FilterSyntaxError, SqlFilter, compile_filter

__all__ = ["AppliedSignal", "BrokerServer"]

log = logging.getLogger("broker.server")

MAX_PULL = 256
OVERDUE_CHECK_S = 5.0
TRIM_CHECK_S = 5.0
MAX_SUSPEND_MS = 30_000
#: Longest long poll a replica that knows no leader holds (see _pull).
LEADERLESS_SUSPEND_S = 0.5
#: Most ConsumeQueue units one filtered pull looks at before answering (an empty page).
MAX_FILTER_SCAN = 4096
#: A pull stops adding rows past this many body bytes (it always returns one message):
#: with the largest default message, the response frame stays within DEFAULT_MAX_FRAME,
#: which is what clients accept by default.
PULL_BODY_BYTES = 4 * 1024 * 1024
_ROW_OVERHEAD = 40  # msgpack of [offset, position, stamp, bin header]
#: A frame's bytes beyond its body (header fields, ext).
FRAME_SLACK = 64 * 1024

#: The WebSocket the frame being handled arrived on (consumer membership is per connection).
_connection: contextvars.ContextVar[web.WebSocketResponse | None] = contextvars.ContextVar(
    "connection", default=None)

_OUTCOME_CODE = {
    Outcome.STORED: ResponseCode.SUCCESS,
    Outcome.DUPLICATE: ResponseCode.SUCCESS,
    Outcome.DONE: ResponseCode.SUCCESS,
    Outcome.TOPIC_NOT_EXIST: ResponseCode.TOPIC_NOT_EXIST,
    Outcome.NO_PERMISSION: ResponseCode.NO_PERMISSION,
    Outcome.INVALID: ResponseCode.INVALID_ARGUMENT,
    Outcome.SEQUENCE_GAP: ResponseCode.SEQUENCE_GAP,
    Outcome.LOCKED: ResponseCode.NO_PERMISSION,
    Outcome.ABANDONED: ResponseCode.SYSTEM_BUSY,  # not stored; a retry may succeed
    Outcome.FRAGMENT: ResponseCode.SYSTEM_ERROR,  # never a caller's outcome
}


#: Requests an unhealthy replica still answers: none of them reads or changes state.
_SERVED_WHEN_UNHEALTHY = frozenset({RequestCode.HEARTBEAT, RequestCode.UNREGISTER_CLIENT})


class AppliedSignal:
    """Wakes long-polling pulls when the applier applied something (thread-safe notify)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._event = asyncio.Event()

    def notify(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting
            self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout)


class BrokerServer:
    def __init__(self, rlog: ReplicatedLog, machine: BrokerStateMachine, applier: Applier,
                 signal: AppliedSignal, leader_address: Callable[[str], str | None], *,
                 addresses: Mapping[str, str] | None = None,
                 max_message_bytes: int = MAX_MESSAGE_BYTES, delay_levels: str = DEFAULT_DELAY_LEVELS,
                 retry_delays: str = RETRY_DELAYS,
                 retry_overdue_s: float = DEFAULT_OVERDUE_S) -> None:
        if max_message_bytes < 1:
            raise ValueError("max_message_bytes must be positive")
        self.max_message_bytes = max_message_bytes
        #: Largest request frame accepted: one message of the limit and the frame around it.
        self.max_frame_bytes = max(DEFAULT_MAX_FRAME, max_message_bytes + FRAME_SLACK)
        self.rlog = rlog
        self.applier = applier
        rlog.set_client_addresses(dict(addresses or {}))
        self.consumers = ConsumerRegistry()
        self._server_opaques = itertools.count(1)
        self.machine = machine
        self.write = WritePath(rlog, machine, applier, max_message_bytes=max_message_bytes)
        self.producers = ConsumerRegistry()  # producer groups' connections (transaction checks)
        self.deferred = DeferredService(rlog, machine, self.write, self.producers,
                                        delay_levels=delay_levels, retry_delays=retry_delays)
        self.divergence = DivergenceCheck(rlog.config.node, rlog.client_addresses,
                                          lambda: len(rlog.members()),
                                          machine.recent_digests, self._peer_digests,
                                          lambda: rlog.is_leader,
                                          lambda _why: rlog.stand_for_election(False))
        self.overdue = OverdueWatch(machine, lambda: self.consumers.groups().keys(), self._store_time,
                                    lambda: rlog.is_leader, threshold_s=retry_overdue_s)
        self._session: aiohttp.ClientSession | None = None  # to peers (divergence check)
        self._filters: dict[str, SqlFilter] = {}
        self._sockets: set[web.WebSocketResponse] = set()
        self.signal = signal
        self.leader_address = leader_address
        self._stamps: dict[int, int] = {}  # entry record position -> store time (committed: immutable)
        self.metrics = BrokerMetrics(self)
        self._handlers: dict[int, Callable[[Frame], Awaitable[Frame]]] = {
            RequestCode.SEND_MESSAGE: self._send,
            RequestCode.SEND_BATCH: self._send_batch,
            RequestCode.PULL_MESSAGE: self._pull,
            RequestCode.CREATE_TOPIC: self._create_topic,
            RequestCode.DELETE_TOPIC: self._delete_topic,
            RequestCode.GET_TOPICS: self._topics,
            RequestCode.COMMIT_OFFSET: self._commit_offset,
            RequestCode.LOCK_BATCH_MQ: self._lock_queues,
            RequestCode.UNLOCK_BATCH_MQ: self._lock_queues,
            RequestCode.QUERY_OFFSET: self._query_offset,
            RequestCode.HEARTBEAT: self._heartbeat,
            RequestCode.QUERY_MESSAGE: self._query_by_key,
            RequestCode.VIEW_MESSAGE_BY_ID: self._view_by_id,
            RequestCode.RESET_OFFSET: self._reset_offset,
            RequestCode.GET_ROUTE: self._route,
            RequestCode.SEARCH_OFFSET: self._search_offset,
            RequestCode.UNREGISTER_CLIENT: self._unregister,
            RequestCode.GET_CONSUMER_LIST: self._consumer_list,
            RequestCode.CONSUMER_SEND_MSG_BACK: self._send_back,
            RequestCode.END_TRANSACTION: self._end_transaction,
        }

    def app(self) -> web.Application:
        app = web.Application()
        app.add_routes([web.get("/ws", self._ws), web.get("/healthz", self._healthz),
                        web.get("/status", self._status), web.get("/metrics", self._metrics),
                        web.get("/admin/topics", self._admin_topics),
                        web.post("/admin/topics", self._admin_create_topic),
                        web.get("/admin/cluster", self._admin_cluster),
                        web.get("/admin/groups/{group}/offsets", self._admin_group),
                        web.get("/admin/messages", self._admin_messages),
                        web.post("/admin/leader/transfer", self._admin_transfer),
                        *member_routes(self)])
        app.cleanup_ctx.append(self._background)
        return app

    async def close_connections(self) -> None:
        """Close every client WebSocket (going away): clients reconnect elsewhere."""
        for ws in list(self._sockets):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ws.close(code=1001, message=b"broker stopping"), 1.0)

    async def _background(self, app: web.Application) -> AsyncIterator[None]:
        """The leader's deferred-message loop and the overdue watch run while the server does."""
        tasks = [asyncio.create_task(self.deferred.run()), asyncio.create_task(self._watch_overdue()),
                 asyncio.create_task(self.divergence.run()), asyncio.create_task(self._trim_derived())]
        yield
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._session is not None:
            await self._session.close()

    async def _trim_derived(self) -> None:
        """ConsumeQueue and IndexFile files that point only at deleted CommitLog segments go
        with them (checked every TRIM_CHECK_S, off the event loop)."""
        trimmed_at = -1
        while True:
            await asyncio.sleep(TRIM_CHECK_S)
            start = self.rlog.commitlog.start_position
            if start == trimmed_at:
                continue
            try:
                removed = await asyncio.get_running_loop().run_in_executor(None, self.machine.trim, start)
            except Exception:
                log.exception("trimming the derived files failed")
                continue
            trimmed_at = start
            if removed:
                log.info("deleted %d ConsumeQueue/IndexFile files below CommitLog position %d",
                         removed, start)

    async def _watch_overdue(self) -> None:
        while True:
            await asyncio.sleep(OVERDUE_CHECK_S)
            try:
                self.overdue.check()
            except Exception:  # e.g. a queue deleted under the check: the next one is fresh
                log.exception("overdue check failed")

    # -- HTTP ----------------------------------------------------------------------
    def unhealthy(self) -> str | None:
        """Why this replica must not be trusted to serve (None: it may)."""
        return self.divergence.divergent or self.applier.stalled

    async def _peer_digests(self, address: str) -> dict[int, str] | None:
        """A peer's recent state digests (its ``/status``); None if it does not answer."""
        try:
            async with self.http_session().get(f"http://{address}/status",
                                        timeout=aiohttp.ClientTimeout(total=3)) as resp:
                doc = await resp.json()
            return {int(i): str(d) for i, d in doc.get("state_digests", {}).items()}
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None

    def http_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    async def _healthz(self, request: web.Request) -> web.Response:
        why = self.unhealthy()
        if why is not None:
            return web.Response(status=503, text=f"unhealthy: {why}\n")
        return web.Response(text="ok")

    async def _status(self, request: web.Request) -> web.Response:
        status = self.rlog.status()
        status["applied_index"] = self.machine.applied_index()
        status["healthy"] = self.unhealthy() is None
        status["apply_stalled"] = self.applier.stalled
        snapshots = self.machine.snapshot_indexes()
        status["snapshot_index"] = snapshots[-1] if snapshots else None
        status["snapshot_indexes"] = snapshots[-8:]
        status["state_digests"] = {str(i): d for i, d in sorted(self.machine.recent_digests().items())}
        status["snapshot_installs"] = self.machine.installs
        cl = self.rlog.commitlog
        status["disk"] = {"commitlog_bytes": cl.write_position - cl.start_position,
                          "free_bytes": shutil.disk_usage(self.rlog.config.data_dir).free}
        return web.json_response(status)

    async def _ws(self, request: web.Request) -> web.WebSocketResponse:
        # twice the frame limit: a somewhat larger frame still gets a MESSAGE_TOO_LARGE answer
        ws = web.WebSocketResponse(max_msg_size=2 * self.max_frame_bytes)
        await ws.prepare(request)
        tasks: set[asyncio.Task[None]] = set()
        _connection.set(ws)
        self._sockets.add(ws)
        try:
            await self._read_frames(ws, tasks)
        finally:
            for task in tasks:
                task.cancel()
            self._sockets.discard(ws)
            await self._members_changed(self.consumers.drop_connection(ws))
            self.producers.drop_connection(ws)
        return ws

    async def _read_frames(self, ws: web.WebSocketResponse, tasks: set[asyncio.Task[None]]) -> None:
        async for msg in ws:
            if msg.type != WSMsgType.BINARY:
                if msg.type == WSMsgType.TEXT:
                    await ws.send_bytes(Frame(ResponseCode.MALFORMED_FRAME, 0, 1,
                                              "frames are binary WebSocket messages").encode())
                continue
            task = asyncio.create_task(self._serve_frame(ws, msg.data))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    async def _serve_frame(self, ws: web.WebSocketResponse, data: bytes) -> None:
        try:
            frame = decode_frame(data, self.max_frame_bytes)
        except FrameError as e:
            reply = e.response()
            if reply is not None and not ws.closed:
                await ws.send_bytes(reply.encode())
            return
        if frame.is_response:
            return  # no server-to-client requests are outstanding yet
        reply = await self.handle(frame)
        if not frame.is_oneway and not ws.closed:
            await ws.send_bytes(reply.encode())

    async def handle(self, frame: Frame) -> Frame:
        self.metrics.request(frame.code)
        handler = self._handlers.get(frame.code)
        if handler is None:
            return frame.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                  remark=f"request code {frame.code} is not supported")
        why = self.unhealthy()
        if why is not None and frame.code not in _SERVED_WHEN_UNHEALTHY:
            return frame.response(ResponseCode.SYSTEM_BUSY,
                                  remark=f"replica {self.rlog.config.node} does not serve: {why}")
        try:
            return await handler(frame)
        except FrameError as e:
            return frame.response(e.code, remark=e.message)
        except InvalidName as e:
            return frame.response(ResponseCode.INVALID_NAME, remark=str(e))
        except MessageTooLarge as e:
            return frame.response(ResponseCode.MESSAGE_TOO_LARGE, remark=str(e))
        except NotLeader as e:
            address = self.leader_address(e.leader or "")
            return frame.response(ResponseCode.NOT_LEADER, remark=str(e),
                                  ext={"leader": e.leader, "leaderAddress": address})
        except NoLeader as e:
            return frame.response(ResponseCode.NO_LEADER, remark=str(e))
        except OutcomeUnknown as e:
            return frame.response(ResponseCode.OUTCOME_UNKNOWN, remark=str(e))
        except ProposeError as e:
            return frame.response(ResponseCode.SYSTEM_BUSY, remark=str(e))
        except Exception:
            log.exception("request %s failed", frame.code)
            return frame.response(ResponseCode.SYSTEM_ERROR, remark="internal error; see the broker log")

    # -- writes ----------------------------------------------------------------------
    def _require_leader(self) -> None:
        if not self.rlog.is_leader:
            leader = self.rlog.leader
            if leader is None:
                raise NoLeader("the group has no leader right now; retry shortly")
            raise NotLeader(leader, getattr(self.rlog.members().get(leader), "raft", ""))

    def _check_message(self, record: bytes, checked_topics: set[str] | None = None) -> bytes:
        """The record as it will be stored (delays become a delivery time); raises for bad ones.
        Topics in ``checked_topics`` (a batch's, checked once) are not checked again."""
        if len(record) > self.max_message_bytes:
            raise MessageTooLarge(f"message of {len(record)} bytes exceeds this broker's "
                                  f"{self.max_message_bytes}-byte limit (max_message_bytes)")
        try:
            m = decode_message(record)
        except MessageFormatError as e:
            raise FrameError(ResponseCode.INVALID_ARGUMENT, str(e)) from None
        if checked_topics is None or m.topic not in checked_topics:
            validate_topic(m.topic, system=False)
            if m.topic not in self.machine.topics:
                raise FrameError(ResponseCode.TOPIC_NOT_EXIST,
                                 f"topic {m.topic!r} does not exist; create it first (auto-create is off)")
            if checked_topics is not None:
                checked_topics.add(m.topic)
        if not m.properties:
            return record
        prepared = self.deferred.prepare(m)
        return record if prepared is m else encode_message(prepared)

    async def _send(self, frame: Frame) -> Frame:
        self._require_leader()
        record = self._check_message(frame.body)
        (applied,) = await self._timed_send([record])
        return self._answer(frame, applied)

    async def _timed_send(self, records: list[bytes]) -> list[Applied]:
        started = asyncio.get_running_loop().time()
        outcomes = await self.write.send(records)
        self.metrics.commit_latency.observe(asyncio.get_running_loop().time() - started)
        self.metrics.sent.inc(sum(a.outcome == Outcome.STORED for a in outcomes))
        return outcomes

    async def _send_batch(self, frame: Frame) -> Frame:
        self._require_leader()
        try:
            records = msgpack.unpackb(frame.body, use_list=True)
            if not isinstance(records, list) or not all(isinstance(r, bytes) for r in records):
                raise ValueError("a list of encoded messages")
        except Exception as e:
            raise FrameError(ResponseCode.INVALID_ARGUMENT, f"batch body must be {e}") from None
        checked: set[str] = set()
        records = [self._check_message(r, checked) for r in records]  # all before anything is proposed
        outcomes = await self._timed_send(records)
        rows = [[_OUTCOME_CODE[a.outcome], a.queue_id, a.queue_offset, a.reason, a.position]
                for a in outcomes]
        return frame.response(ResponseCode.SUCCESS, body=msgpack.packb(rows))

    def _answer(self, frame: Frame, applied: Applied) -> Frame:
        code = _OUTCOME_CODE[applied.outcome]
        if code != ResponseCode.SUCCESS:
            return frame.response(code, remark=applied.reason)
        return frame.response(code, ext={
            "queueId": applied.queue_id, "queueOffset": applied.queue_offset, "position": applied.position,
            "duplicate": applied.outcome == Outcome.DUPLICATE})

    async def _create_topic(self, frame: Frame) -> Frame:
        self._require_leader()
        topic = validate_topic(ext_str(frame, "topic"))
        queues = ext_int(frame, "queues", 8, minimum=1, maximum=1024)
        perm = ext_int(frame, "perm", int(Perm.READ_WRITE))
        if perm not in (2, 4, 6):
            raise FrameError(ResponseCode.INVALID_ARGUMENT, "perm must be 2 (write), 4 (read) or 6")
        (applied,) = await self.write.send([encode_admin(CreateTopic(topic, queues, Perm(perm)))])
        return self._answer(frame, applied)

    async def _delete_topic(self, frame: Frame) -> Frame:
        """Delete a topic: its queues and consumer offsets go; its messages stay in the
        CommitLog until retention removes their segments."""
        self._require_leader()
        topic = validate_topic(ext_str(frame, "topic"))
        (applied,) = await self.write.send([encode_admin(DeleteTopic(topic))])
        return self._answer(frame, applied)

    async def _commit_offset(self, frame: Frame) -> Frame:
        self._require_leader()
        cmd = CommitOffset(validate_group(ext_str(frame, "group")),
                           validate_topic(ext_str(frame, "topic"), system=True),
                           ext_int(frame, "queueId", minimum=0), ext_int(frame, "offset", minimum=0))
        (applied,) = await self.write.send([encode_admin(cmd)])
        return self._answer(frame, applied)

    async def _lock_queues(self, frame: Frame) -> Frame:
        """LOCK_BATCH_MQ / UNLOCK_BATCH_MQ: ext group, clientId, topic, queues (ids); the body
        of the answer is the msgpack list of the queue ids this client now holds (lock) or
        gave back (unlock). Decided by the apply step, so a new leader knows every lock."""
        self._require_leader()
        group = validate_group(ext_str(frame, "group"))
        topic = validate_topic(ext_str(frame, "topic"), system=True)
        client_id = ext_str(frame, "clientId")
        queues = frame.ext.get("queues")
        if not client_id or not isinstance(queues, list | tuple) or not queues or not all(
                type(q) is int and 0 <= q < 1024 for q in queues):
            raise FrameError(ResponseCode.INVALID_ARGUMENT,
                             "clientId and queues (a non-empty list of queue ids) are required")
        lock = frame.code == RequestCode.LOCK_BATCH_MQ
        outcomes = await self.write.send([encode_admin(LockQueue(group, client_id, topic, q, lock))
                                          for q in dict.fromkeys(queues)])
        held = [a.queue_id for a in outcomes if a.outcome == Outcome.DONE]
        return frame.response(ResponseCode.SUCCESS, body=msgpack.packb(held))

    # -- reads -----------------------------------------------------------------------
    async def _topics(self, frame: Frame) -> Frame:
        topics = {t: [c.queues, c.perm] for t, c in sorted(self.machine.topics.items())}
        return frame.response(ResponseCode.SUCCESS, body=msgpack.packb(topics))

    async def _query_offset(self, frame: Frame) -> Frame:
        offset = self.machine.committed_offset(ext_str(frame, "group"), ext_str(frame, "topic"),
                                               ext_int(frame, "queueId", minimum=0))
        return frame.response(ResponseCode.SUCCESS, ext={"offset": -1 if offset is None else offset})

    async def _heartbeat(self, frame: Frame) -> Frame:
        """ext clientId; body (optional): msgpack {consumer group: [topics]}."""
        client_id = ext_str(frame, "clientId", "")
        subscriptions: dict[str, list[str]] = {}
        if frame.body:
            try:
                doc = msgpack.unpackb(frame.body)
                if not (isinstance(doc, dict) and all(
                        isinstance(g, str) and isinstance(t, list) and all(isinstance(x, str) for x in t)
                        for g, t in doc.items())):
                    raise ValueError
            except Exception:
                raise FrameError(ResponseCode.INVALID_ARGUMENT,
                                 "heartbeat body must be a msgpack map {group: [topics]}") from None
            if not client_id:
                raise FrameError(ResponseCode.INVALID_ARGUMENT, "a consumer heartbeat needs clientId")
            subscriptions = {validate_group(g): t for g, t in doc.items()}
        ws = _connection.get()
        producer_group = ext_str(frame, "producerGroup", None)
        if producer_group and ws is not None:
            self.producers.heartbeat(ws, client_id or str(id(ws)), {validate_group(producer_group): []})
        if subscriptions and ws is not None:
            await self._members_changed(self.consumers.heartbeat(ws, client_id, subscriptions))
        await self._create_retry_topics(subscriptions)
        return frame.response(ResponseCode.SUCCESS)

    async def _create_retry_topics(self, subscriptions: Mapping[str, list[str]]) -> None:
        """The leader creates ``%RETRY%group`` (one queue) for a group that subscribes to it
        (clustering consumers do), as RocketMQ does at the heartbeat: the consumer routes and
        pulls its retry queue from the start, so the first redelivery is on time."""
        missing = [retry_topic(g) for g, topics in sorted(subscriptions.items())
                   if retry_topic(g) in topics and retry_topic(g) not in self.machine.topics]
        if not missing or not self.rlog.is_leader:
            return
        try:
            outcomes = await self.write.send([encode_admin(CreateTopic(t, 1, Perm.READ_WRITE))
                                              for t in missing])
        except ProposeError as e:  # the next heartbeat (or the first send-back) creates it
            log.info("could not create %s yet: %s", missing, e)
            return
        for topic, applied in zip(missing, outcomes, strict=True):
            log.info("created retry topic %s: %s", topic, applied.outcome)

    async def _unregister(self, frame: Frame) -> Frame:
        changed = self.consumers.unregister(ext_str(frame, "clientId"), ext_str(frame, "group", None))
        await self._members_changed(changed)
        return frame.response(ResponseCode.SUCCESS)

    async def _consumer_list(self, frame: Frame) -> Frame:
        clients = self.consumers.clients(validate_group(ext_str(frame, "group")))
        return frame.response(ResponseCode.SUCCESS, body=msgpack.packb(clients))

    async def _members_changed(self, groups: set[str]) -> None:
        """Tell the members of each group that its membership changed (oneway, best effort)."""
        for group in sorted(groups):
            for conn in self.consumers.connections(group):
                if isinstance(conn, web.WebSocketResponse) and not conn.closed:
                    note = Frame.request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
                                         next(self._server_opaques) % (2**32), {"group": group},
                                         oneway=True)
                    with contextlib.suppress(ConnectionError, RuntimeError):
                        await conn.send_bytes(note.encode())

    async def _send_back(self, frame: Frame) -> Frame:
        """A consumer could not consume the message at ``position``: store a retry copy in
        %RETRY%group (delayed by the retry schedule) or, past ``maxReconsumeTimes``, in
        %DLQ%group."""
        self._require_leader()
        group = validate_group(ext_str(frame, "group"))
        position = ext_int(frame, "position", minimum=0)
        max_times = ext_int(frame, "maxReconsumeTimes", DEFAULT_MAX_RECONSUME, minimum=0, maximum=10_000)
        try:
            stored = decode_message(read_message_at(self.rlog.commitlog, position))
        except (MessageGone, MessageFormatError, ValueError) as e:
            raise FrameError(ResponseCode.INVALID_ARGUMENT,
                             f"no message at position {position}: {e}") from None
        copy = self.deferred.retry_copy(stored, group, max_times, position)
        (applied,) = await self.write.send([encode_message(copy)])
        reply = self._answer(frame, applied)
        if reply.code != ResponseCode.SUCCESS:
            return reply
        return frame.response(ResponseCode.SUCCESS, ext={**reply.ext, "topic": copy.topic,
                                                         "reconsumeTimes": copy.reconsume})

    async def _end_transaction(self, frame: Frame) -> Frame:
        """Commit (make the half message visible in its topic) or roll back a transaction."""
        self._require_leader()
        position = ext_int(frame, "position", minimum=0)
        outcome = await self.deferred.end_transaction(position, ext_bool(frame, "commit"))
        return frame.response(ResponseCode.SUCCESS, ext={"outcome": outcome})

    def _sql_filter(self, expression: str | None) -> SqlFilter | None:
        if expression is None:
            return None
        found = self._filters.get(expression)
        if found is None:
            try:
                found = compile_filter(expression)
            except FilterSyntaxError as e:
                raise FrameError(ResponseCode.SUBSCRIPTION_INVALID, str(e)) from None
            if len(self._filters) > 1024:
                self._filters.clear()
            self._filters[expression] = found
        return found

    async def _route(self, frame: Frame) -> Frame:
        """This group's part of a topic's route, in the name server's shape."""
        topic = ext_str(frame, "topic")
        config = self.machine.topics.get(topic)
        if config is None:
            raise FrameError(ResponseCode.TOPIC_NOT_EXIST, f"topic {topic!r} does not exist")
        status = self.rlog.status()
        leader = self.rlog.leader
        doc = {"topic": topic, "groups": [{
            "group": self.rlog.config.group, "queues": config.queues, "perm": int(config.perm),
            "term": status["term"], "leader": self.addresses.get(leader) if leader else None,
            "replicas": dict(sorted(self.addresses.items()))}]}
        return frame.response(ResponseCode.SUCCESS, body=msgpack.packb(doc))

    async def _pull(self, frame: Frame) -> Frame:
        topic = ext_str(frame, "topic")
        queue_id = ext_int(frame, "queueId", minimum=0)
        offset = ext_int(frame, "offset", minimum=0)
        max_msgs = ext_int(frame, "maxMsgs", 32, minimum=1, maximum=MAX_PULL)
        suspend_s = ext_int(frame, "suspendMs", 0, minimum=0, maximum=MAX_SUSPEND_MS) / 1000
        wanted = ext_ints(frame, "tagHashes", None)
        wanted_set = None if wanted is None else frozenset(wanted)
        sql = self._sql_filter(ext_str(frame, "sql", None))
        if topic not in self.machine.topics:
            raise FrameError(ResponseCode.TOPIC_NOT_EXIST, f"topic {topic!r} does not exist")
        loop = asyncio.get_running_loop()
        # A replica that knows no leader may be cut off and fall behind: it says so
        # ("leaderless") and holds a long poll briefly, so clients try another replica
        # first -- and still read here when it is the only one left (no leader anywhere).
        leaderless = self.rlog.leader is None
        if leaderless:
            suspend_s = min(suspend_s, LEADERLESS_SUSPEND_S)
        deadline = loop.time() + suspend_s
        while True:
            cq = self.machine.queue(topic, queue_id)
            max_offset = cq.max_offset if cq is not None else 0
            if offset < max_offset or loop.time() >= deadline:
                break
            await self.signal.wait(deadline - loop.time())
        if cq is None or offset >= max_offset:
            if offset > max_offset:
                return frame.response(ResponseCode.PULL_OFFSET_MOVED,
                                      ext={"nextOffset": max_offset, "leaderless": leaderless})
            return frame.response(ResponseCode.PULL_NOT_FOUND,
                                  ext={"nextOffset": offset, "leaderless": leaderless})
        served_from = loop.time()
        low = self.machine.retained_min_offset(cq, self.rlog.commitlog.start_position)
        if offset < low:  # retention deleted those messages: the first one kept
            return frame.response(ResponseCode.PULL_OFFSET_MOVED, ext={"nextOffset": low, "minOffset": low})
        filtered = wanted_set is not None or sql is not None
        read = cq.read(offset, MAX_FILTER_SCAN if filtered else max_msgs)
        units = read.units
        next_offset = read.next_offset
        if wanted_set is not None:
            units = [(off, u) for off, u in units if u.tag_hash in wanted_set]
        rows: list[list[object]] = []
        size = 0
        entry = _EntryWindow(self.rlog.commitlog)  # consecutive messages share an entry: one read
        for off, unit in units:
            if rows and size + unit.size + _ROW_OVERHEAD > PULL_BODY_BYTES:
                next_offset = off  # the rest on the next pull
                break
            try:
                data = entry.slice(unit.position, unit.size)
                stamp = entry.stamp
                if data is None:  # a message chained over several entries
                    data = read_message(self.rlog.commitlog, unit.position, unit.size)
                    stamp = self._store_time(unit.position)
            except MessageGone:  # retention deleted it while this pull read the queue
                if rows:
                    next_offset = off
                    break
                low = self.machine.retained_min_offset(cq, self.rlog.commitlog.start_position)
                return frame.response(ResponseCode.PULL_OFFSET_MOVED,
                                      ext={"nextOffset": max(low, off + 1), "minOffset": low})
            if sql is not None and not sql.matches(_properties(data)):
                continue
            rows.append([off, unit.position, stamp, data])
            size += unit.size + _ROW_OVERHEAD
            if len(rows) == max_msgs and filtered:
                next_offset = off + 1
                break
        self.metrics.pulled.inc(len(rows))
        self.metrics.pull_serve.observe(loop.time() - served_from)
        return frame.response(ResponseCode.SUCCESS, body=msgpack.packb(rows),
                              ext={"nextOffset": next_offset, "maxOffset": max_offset,
                                   "leaderless": leaderless})

    # -- store time, queries ------------------------------------------------------------
    def _store_time(self, position: int) -> int:
        """The store time of the entry holding ``position`` (messages of one entry share it;
        a chained message's position is in its first fragment's entry, whose stamp it has)."""
        found = self.rlog.commitlog.entry_containing(position)
        if found is None:
            return -1
        index, start = found
        stamp = self._stamps.get(start)
        if stamp is None:
            size = self.rlog.commitlog.record_size_of(index) - HEADER_SIZE
            stamp = read_stamp(self.rlog.commitlog.read_at(start + HEADER_SIZE, min(16, size)))
            if len(self._stamps) >= 4096:
                self._stamps.clear()
            self._stamps[start] = stamp
        return stamp

    def _message_at(self, position: int) -> tuple[bytes, int]:
        """The message bytes starting at ``position`` (whole, if chained) and their store time."""
        try:
            data = read_message_at(self.rlog.commitlog, position)
        except MessageGone:
            raise FrameError(ResponseCode.QUERY_NOT_FOUND, f"position {position} is not retained") from None
        return data, self._store_time(position)

    async def _query_by_key(self, frame: Frame) -> Frame:
        key = ext_str(frame, "key")
        begin = ext_int(frame, "beginMs", 0)
        end = ext_int(frame, "endMs", 2**62)
        limit = ext_int(frame, "maxResults", 32, minimum=1, maximum=256)
        return self._query_rows(frame, key, begin, end, limit, by_id=False)

    async def _view_by_id(self, frame: Frame) -> Frame:
        return self._query_rows(frame, ext_str(frame, "msgId"), 0, 2**62, 1, by_id=True)

    def _query_rows(self, frame: Frame, key: str, begin: int, end: int, limit: int,
                    by_id: bool) -> Frame:
        rows = []
        for position in self.machine.query_key(key, begin, end, limit * 4):
            data, stamp = self._message_at(position)
            m = decode_message(data)
            real = m.msg_id.hex() == key if by_id else key in m.keys
            if real and begin <= stamp <= end:  # hash collisions and second-granular times
                rows.append([position, stamp, data])
            if len(rows) >= limit:
                break
        if not rows:
            return frame.response(ResponseCode.QUERY_NOT_FOUND, remark=f"no message for {key!r}")
        return frame.response(ResponseCode.SUCCESS, body=msgpack.packb(rows))

    async def _search_offset(self, frame: Frame) -> Frame:
        """ext topic, queueId, timestamp (ms, optional) -> minOffset, maxOffset and, with a
        timestamp, ``offset``: the first message stored at or after it (maxOffset if none)."""
        topic = ext_str(frame, "topic")
        queue_id = ext_int(frame, "queueId", minimum=0)
        ts = ext_int(frame, "timestamp", None, minimum=0)
        if topic not in self.machine.topics:
            raise FrameError(ResponseCode.TOPIC_NOT_EXIST, f"topic {topic!r} does not exist")
        cq = self.machine.queue(topic, queue_id)
        low, high = (0, 0) if cq is None else (
            self.machine.retained_min_offset(cq, self.rlog.commitlog.start_position), cq.max_offset)
        ext = {"minOffset": low, "maxOffset": high}
        if ts is not None:
            ext["offset"] = 0 if cq is None else cq.bisect(lambda u: self._store_time(u.position), ts)
        return frame.response(ResponseCode.SUCCESS, ext=ext)

    async def _reset_offset(self, frame: Frame) -> Frame:
        """Set a group's offsets on every queue of a topic to the first message stored at
        or after ``timestamp`` (ms); binary search on store time per queue."""
        self._require_leader()
        group = validate_group(ext_str(frame, "group"))
        topic = ext_str(frame, "topic")
        ts = ext_int(frame, "timestamp", minimum=0)
        config = self.machine.topics.get(topic)
        if config is None:
            raise FrameError(ResponseCode.TOPIC_NOT_EXIST, f"topic {topic!r} does not exist")
        offsets = {}
        for qid in range(config.queues):
            cq = self.machine.queue(topic, qid)
            offsets[qid] = 0 if cq is None else cq.bisect(lambda u: self._store_time(u.position), ts)
        records = [encode_admin(CommitOffset(group, topic, q, o)) for q, o in offsets.items()]
        outcomes = await self.write.send(records)
        bad = [a for a in outcomes if a.outcome != Outcome.DONE]
        if bad:
            return frame.response(_OUTCOME_CODE[bad[0].outcome], remark=bad[0].reason)
        return frame.response(ResponseCode.SUCCESS, body=msgpack.packb(offsets))

    # -- HTTP: metrics and admin ----------------------------------------------------------
    def lag_rows(self, group: str) -> list[dict[str, object]]:
        rows = []
        for topic, by_queue in sorted(self.machine.offsets.get(group, {}).items()):
            for qid, committed in sorted(by_queue.items()):
                cq = self.machine.queue(topic, qid)
                top = cq.max_offset if cq is not None else 0
                low = 0 if cq is None else self.machine.retained_min_offset(
                    cq, self.rlog.commitlog.start_position)
                rows.append({"topic": topic, "queue": qid, "committed": committed, "min_offset": low,
                             "max_offset": top, "lag": max(0, top - max(committed, low))})
        return rows

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.exposition(), content_type=METRICS_CONTENT_TYPE,
                            charset="utf-8")

    @property
    def addresses(self) -> dict[str, str]:
        """name -> broker address of every member of the group (the log says who)."""
        return self.rlog.client_addresses()

    async def _admin_topics(self, request: web.Request) -> web.Response:
        out = {}
        for topic, cfg in sorted(self.machine.topics.items()):
            queues = [self.machine.queue(topic, q) for q in range(cfg.queues)]
            out[topic] = {"queues": cfg.queues, "perm": cfg.perm,
                          "max_offsets": [q.max_offset if q else 0 for q in queues]}
        return web.json_response(out)

    async def _admin_cluster(self, request: web.Request) -> web.Response:
        """This group as this replica sees it: replicas, leader, Raft status, consumers."""
        status = self.rlog.status()
        leader = self.rlog.leader
        return web.json_response({
            "group": self.rlog.config.group, "node": self.rlog.config.node,
            "leader": leader, "leader_address": self.addresses.get(leader) if leader else None,
            "replicas": self.addresses, "status": {**status, "applied_index": self.machine.applied_index()},
            "consumers": {g: [m.client_id for m in members]
                          for g, members in self.consumers.groups().items()},
            "held": {"delayed": len(self.machine.timers), "transaction_halves": len(self.machine.halves)}})

    async def _admin_create_topic(self, request: web.Request) -> web.Response:
        try:
            doc = await request.json()
            ext = {"topic": doc["topic"], "queues": int(doc.get("queues", 8)),
                   "perm": int(doc.get("perm", int(Perm.READ_WRITE)))}
        except (ValueError, KeyError, TypeError):
            return web.json_response({"error": "body must be JSON with topic, queues, perm"}, status=400)
        reply = await self.handle(Frame.request(RequestCode.CREATE_TOPIC, 0, ext))
        return self._http_reply(reply)

    async def transfer_leadership(self, to: str | None = None, timeout: float = 3.0) -> str | None:
        """Hand this leader's role to ``to`` (default: the most up-to-date follower); the new
        leader's name, or None if it did not move in time. Raises NotLeader/NoLeader."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        new = await loop.run_in_executor(None, self.rlog.transfer_leadership, to, timeout)
        log.info("leadership transfer to %s: %s after %.0f ms", to or "the most up-to-date follower",
                 new or "did not complete", (loop.time() - started) * 1000)
        return new

    async def _admin_transfer(self, request: web.Request) -> web.Response:
        """POST /admin/leader/transfer {"to": node (optional)} on the leader."""
        try:
            doc = await request.json() if request.can_read_body else {}
            to = doc.get("to") if isinstance(doc, dict) else None
            if to is not None and not isinstance(to, str):
                raise ValueError
        except ValueError:
            return web.json_response({"error": 'body must be JSON {"to": "n2"} or empty'}, status=400)
        try:
            new = await self.transfer_leadership(to)
        except ValueError as e:
            return web.json_response({"error": str(e)}, status=400)
        except (NotLeader, NoLeader) as e:
            leader = self.rlog.leader
            return web.json_response({"error": str(e), "leader": leader,
                                      "leader_address": self.addresses.get(leader or "")}, status=421)
        if new is None:
            return web.json_response({"error": "the leadership did not move within 3 s (is the target "
                                               "up and caught up?); this node still leads"}, status=503)
        return web.json_response({"leader": new, "leader_address": self.addresses.get(new)})

    async def _admin_group(self, request: web.Request) -> web.Response:
        return web.json_response({"group": request.match_info["group"],
                                  "queues": self.lag_rows(request.match_info["group"])})

    async def _admin_messages(self, request: web.Request) -> web.Response:
        if "msgId" in request.query:
            frame = Frame.request(RequestCode.VIEW_MESSAGE_BY_ID, 0, {"msgId": request.query["msgId"]})
        elif "key" in request.query:
            frame = Frame.request(RequestCode.QUERY_MESSAGE, 0, {"key": request.query["key"]})
        else:
            return web.json_response({"error": "give key=... or msgId=..."}, status=400)
        reply = await self.handle(frame)
        if reply.code != ResponseCode.SUCCESS:
            return self._http_reply(reply)
        out = []
        for position, stamp, data in msgpack.unpackb(reply.body):
            m = decode_message(data)
            out.append({"position": position, "store_timestamp": stamp, "msg_id": m.msg_id.hex(),
                        "topic": m.topic, "queue_id": m.queue_id, "tags": m.tags, "keys": list(m.keys),
                        "properties": m.properties, "body_base64": base64.b64encode(m.body).decode()})
        return web.json_response(out)

    def _http_reply(self, reply: Frame) -> web.Response:
        status = {ResponseCode.SUCCESS: 200, ResponseCode.NOT_LEADER: 421, ResponseCode.NO_LEADER: 503,
                  ResponseCode.QUERY_NOT_FOUND: 404, ResponseCode.TOPIC_NOT_EXIST: 404,
                  ResponseCode.OUTCOME_UNKNOWN: 409}.get(reply.code, 400)
        body: dict[str, object] = {"code": reply.code, "message": reply.remark, **reply.ext}
        return web.json_response(body, status=status)


def _properties(data: bytes) -> dict[str, str]:
    try:
        return decode_message(data).properties
    except MessageFormatError:
        return {}


class _EntryWindow:
    """The last entry record a pull read: the messages a ConsumeQueue lists one after the
    other mostly sit in the same entry, so each entry is read (and its store time parsed)
    once, not once per message."""

    __slots__ = ("_commitlog", "_data", "_end", "_start", "stamp")

    def __init__(self, commitlog: CommitLog) -> None:
        self._commitlog = commitlog
        self._start, self._end, self._data = -1, -1, b""
        self.stamp = -1  # the store time of the entry last sliced

    def slice(self, position: int, size: int) -> bytes | None:
        """The ``size`` bytes at ``position`` if they lie inside one entry record, else None."""
        if not (self._start <= position and position + size <= self._end):
            found = self._commitlog.entry_containing(position)
            if found is None:
                return None
            index, start = found
            self._data = self._commitlog.read_at(start, self._commitlog.record_size_of(index))
            self._start, self._end = start, start + len(self._data)
            self.stamp = read_stamp(self._data[HEADER_SIZE:HEADER_SIZE + 16])
            if position + size > self._end:
                return None
        offset = position - self._start
        return self._data[offset:offset + size]
