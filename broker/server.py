"""The broker's aiohttp server: one WebSocket of remoting frames per client, plus HTTP.

    GET  /ws        binary WebSocket; every message is one ``protocol.remoting`` frame
    GET  /healthz   "ok" (the process serves)
    GET  /status    JSON: Raft status and applied index of this replica
    GET  /metrics, /admin/...               the admin API (``broker.admin_api``) and the
                                            members (``broker.membership_admin``)

Requests are dispatched by code (``_handlers``) to their processors -- sends
(``broker.send_processor``), pulls (``broker.pull_processor``), queries and resets by
time (``broker.query_processor``) -- or handled here: CREATE_TOPIC, DELETE_TOPIC,
GET_TOPICS, GET_ROUTE, COMMIT_OFFSET, QUERY_OFFSET, LOCK/UNLOCK_BATCH_MQ, HEARTBEAT
(consumer membership; the leader creates a subscribing group's %RETRY% topic),
UNREGISTER_CLIENT, GET_CONSUMER_LIST, CONSUMER_SEND_MSG_BACK, END_TRANSACTION; the
server sends NOTIFY_CONSUMER_IDS_CHANGED (oneway) to a group's members when it changes.
Writes go through the leader's ``WritePath``; a follower answers NOT_LEADER naming the
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
import contextlib
import contextvars
import itertools
import logging
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

import aiohttp
import msgpack
from aiohttp import WSMsgType, web

from broker.admin_api import admin_routes
from broker.commands import CommitOffset, CreateTopic, DeleteTopic, LockQueue, Perm, encode_admin
from broker.consumer_registry import ConsumerRegistry
from broker.deferred import DEFAULT_DELAY_LEVELS, RETRY_DELAYS
from broker.deferred_service import DEFAULT_MAX_RECONSUME, DeferredService
from broker.divergence import DivergenceCheck
from broker.entry_batch import MessageTooLarge
from broker.fragments import MessageGone, read_message_at
from broker.membership_admin import member_routes
from broker.metrics import BrokerMetrics
from broker.overdue import DEFAULT_THRESHOLD_S as DEFAULT_OVERDUE_S
from broker.overdue import OverdueWatch
from broker.pull_processor import PullProcessor
from broker.query_processor import QueryProcessor
from broker.send_processor import SendProcessor, answer
from broker.state_machine import BrokerStateMachine, Outcome
from broker.write_path import WritePath
from dledger.applier import Applier
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
    ext_str,
)

__all__ = ["AppliedSignal", "BrokerServer"]

log = logging.getLogger("broker.server")

OVERDUE_CHECK_S = 5.0
TRIM_CHECK_S = 5.0
#: A frame's bytes beyond its body (header fields, ext).
FRAME_SLACK = 64 * 1024

#: The WebSocket the frame being handled arrived on (consumer membership is per connection).
_connection: contextvars.ContextVar[web.WebSocketResponse | None] = contextvars.ContextVar(
    "connection", default=None)



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
        self.queries = QueryProcessor(self)
        self.sends = SendProcessor(self)
        self.overdue = OverdueWatch(machine, lambda: self.consumers.groups().keys(), self.queries.store_time,
                                    lambda: rlog.is_leader, threshold_s=retry_overdue_s)
        self._session: aiohttp.ClientSession | None = None  # to peers (divergence check)
        self._sockets: set[web.WebSocketResponse] = set()
        self.signal = signal
        self.leader_address = leader_address
        self.metrics = BrokerMetrics(self)
        self.pulls = PullProcessor(machine, rlog, signal, self.metrics, self.queries.store_time)
        self._handlers: dict[int, Callable[[Frame], Awaitable[Frame]]] = {
            RequestCode.SEND_MESSAGE: self.sends.send,
            RequestCode.SEND_BATCH: self.sends.send_batch,
            RequestCode.PULL_MESSAGE: self.pulls.pull,
            RequestCode.CREATE_TOPIC: self._create_topic,
            RequestCode.DELETE_TOPIC: self._delete_topic,
            RequestCode.GET_TOPICS: self._topics,
            RequestCode.COMMIT_OFFSET: self._commit_offset,
            RequestCode.LOCK_BATCH_MQ: self._lock_queues,
            RequestCode.UNLOCK_BATCH_MQ: self._lock_queues,
            RequestCode.QUERY_OFFSET: self._query_offset,
            RequestCode.HEARTBEAT: self._heartbeat,
            RequestCode.QUERY_MESSAGE: self.queries.query_by_key,
            RequestCode.VIEW_MESSAGE_BY_ID: self.queries.view_by_id,
            RequestCode.RESET_OFFSET: self.queries.reset_offset,
            RequestCode.GET_ROUTE: self._route,
            RequestCode.SEARCH_OFFSET: self.queries.search_offset,
            RequestCode.UNREGISTER_CLIENT: self._unregister,
            RequestCode.GET_CONSUMER_LIST: self._consumer_list,
            RequestCode.CONSUMER_SEND_MSG_BACK: self._send_back,
            RequestCode.END_TRANSACTION: self._end_transaction,
        }

    def app(self) -> web.Application:
        app = web.Application()
        app.add_routes([web.get("/ws", self._ws), web.get("/healthz", self._healthz),
                        web.get("/status", self._status), *admin_routes(self), *member_routes(self)])
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
    def require_leader(self) -> None:
        if not self.rlog.is_leader:
            leader = self.rlog.leader
            if leader is None:
                raise NoLeader("the group has no leader right now; retry shortly")
            raise NotLeader(leader, getattr(self.rlog.members().get(leader), "raft", ""))

    async def _create_topic(self, frame: Frame) -> Frame:
        self.require_leader()
        topic = validate_topic(ext_str(frame, "topic"))
        queues = ext_int(frame, "queues", 8, minimum=1, maximum=1024)
        perm = ext_int(frame, "perm", int(Perm.READ_WRITE))
        if perm not in (2, 4, 6):
            raise FrameError(ResponseCode.INVALID_ARGUMENT, "perm must be 2 (write), 4 (read) or 6")
        (applied,) = await self.write.send([encode_admin(CreateTopic(topic, queues, Perm(perm)))])
        return answer(frame, applied)

    async def _delete_topic(self, frame: Frame) -> Frame:
        """Delete a topic: its queues and consumer offsets go; its messages stay in the
        CommitLog until retention removes their segments."""
        self.require_leader()
        topic = validate_topic(ext_str(frame, "topic"))
        (applied,) = await self.write.send([encode_admin(DeleteTopic(topic))])
        return answer(frame, applied)

    async def _commit_offset(self, frame: Frame) -> Frame:
        self.require_leader()
        cmd = CommitOffset(validate_group(ext_str(frame, "group")),
                           validate_topic(ext_str(frame, "topic"), system=True),
                           ext_int(frame, "queueId", minimum=0), ext_int(frame, "offset", minimum=0))
        (applied,) = await self.write.send([encode_admin(cmd)])
        return answer(frame, applied)

    async def _lock_queues(self, frame: Frame) -> Frame:
        """LOCK_BATCH_MQ / UNLOCK_BATCH_MQ: ext group, clientId, topic, queues (ids); the body
        of the answer is the msgpack list of the queue ids this client now holds (lock) or
        gave back (unlock). Decided by the apply step, so a new leader knows every lock."""
        self.require_leader()
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
        self.require_leader()
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
        reply = answer(frame, applied)
        if reply.code != ResponseCode.SUCCESS:
            return reply
        return frame.response(ResponseCode.SUCCESS, ext={**reply.ext, "topic": copy.topic,
                                                         "reconsumeTimes": copy.reconsume})

    async def _end_transaction(self, frame: Frame) -> Frame:
        """Commit (make the half message visible in its topic) or roll back a transaction."""
        self.require_leader()
        position = ext_int(frame, "position", minimum=0)
        outcome = await self.deferred.end_transaction(position, ext_bool(frame, "commit"))
        return frame.response(ResponseCode.SUCCESS, ext={"outcome": outcome})

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
