"""The push consumer: queues assigned by rebalancing, a pull loop per queue, a listener.

    rebalance (every 20 s, at start, on a membership notice)
        members = GET_CONSUMER_LIST(group); queues = route(topic)
        mine = allocate(me, members, queues)      (clustering; broadcasting takes all)
    per assigned queue:
        pull loop ──fetch (long poll, follower by default)──▶ ProcessQueue ──▶ listener
                       flow control: ≤ 1,000 messages / 100 MiB cached per queue
        concurrent: messages go to a thread pool (consume_threads) as they arrive
        orderly:    one message at a time per queue, in queue order; SUSPEND or a failure
                    retries the same message after ``suspend_s`` (1 s). Clustering: a queue
                    is consumed only while this client holds its consume lock on the broker
                    (LOCK_BATCH_MQ, decided through the log, renewed every 20 s, valid here
                    for 30 s, expiring on the broker after 60 s): a queue that moves to
                    another member is unlocked only after the message in hand is done and
                    its offset committed, and the new owner starts once it has the lock, so
                    two members never consume one queue at the same time. While a broker
                    group has no leader no lock can be decided (nor granted to anyone): its
                    queues are then consumed from followers without one, and locked again
                    when a leader is back
    offsets: the lowest offset not yet consumed per queue is committed every 5 s, when a
    queue is taken away, and at shutdown (clustering: through the log, so every replica
    and every member agrees; broadcasting: a local file per instance).

Delivery is at-least-once: a message consumed but not yet committed when a member
dies or a queue moves is delivered again to the next owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from client.aio.core import READ_FROM, READ_GRACE_S, ClientCore
from client.aio.process_queue import LocalOffsets, ProcessQueue
from client.aio.pull_consumer import commit_offset, committed_offset, fetch, queue_offsets
from client.aio.queue_locks import LOCK_RENEW_S, LOCK_VALID_S, lock_queues
from client.aio.routes import PERM_READ, TopicRoute
from client.backoff import Deadline
from client.credentials import Credentials
from client.errors import ClientError, RouteNotFoundError, TopicNotExistError
from client.message import ConsumeStatus, ReceivedMessage
from client.queues import MessageQueue
from client.rebalance import STRATEGIES
from client.tag_filter import SubscriptionError, parse_tags
from protocol.consumer import ConsumerListRequest, ConsumerListResponse, HeartbeatRequest, UnregisterRequest
from protocol.deferred import SendBackRequest
from protocol.names import retry_topic
from protocol.sql_filter import FilterSyntaxError, compile_filter
from protocol.tls import ClientTls
from protocol.wire import Request

__all__ = ["AsyncPushConsumer", "ConsumeContext", "Listener"]

log = logging.getLogger("client.consumer")



@dataclass(slots=True)
class ConsumeContext:
    queue: MessageQueue
    attempt: int = 0  # orderly: how many times this message was tried before


Listener = Callable[[list[ReceivedMessage], ConsumeContext], ConsumeStatus]


class AsyncPushConsumer:
    def __init__(self, namesrv: str | Sequence[str] | None = None, group: str = "DEFAULT_CONSUMER",
                 topic: str = "", selector: str | None = "*", *, servers: Sequence[str] | None = None,
                 orderly: bool = False, from_where: str | int = "last", model: str = "clustering",
                 read_from: str = "follower", allocate: str = "averagely",
                 rebalance_interval: float = 20.0, commit_interval: float = 5.0,
                 heartbeat_interval: float = 10.0, pull_batch: int = 32, consume_threads: int = 20,
                 max_cached_messages: int = 1000, max_cached_bytes: int = 100 << 20,
                 suspend_s: float = 1.0, long_poll_s: float = 15.0, instance_name: str = "DEFAULT",
                 sql: str | None = None, max_reconsume_times: int = 16,
                 offset_store_dir: str | os.PathLike[str] | None = None,
                 address_map: Mapping[str, str] | None = None,
                 core: ClientCore | None = None, tls: ClientTls | bool | None = None,
                 credentials: Credentials | None = None) -> None:
        if not topic:
            raise ValueError("give the topic to consume: topic='orders'")
        if model not in ("clustering", "broadcasting"):
            raise ValueError(f"model must be 'clustering' or 'broadcasting', got {model!r}")
        if read_from not in READ_FROM:
            raise ValueError(f"read_from must be one of {READ_FROM}, got {read_from!r}")
        if allocate not in STRATEGIES:
            raise ValueError(f"allocate must be one of {sorted(STRATEGIES)}, got {allocate!r}")
        if not (from_where in ("first", "last") or isinstance(from_where, int)):
            raise ValueError(f"from_where must be 'first', 'last' or a timestamp in ms, got {from_where!r}")
        self.group, self.topic = group, topic
        self.selector = parse_tags(selector)
        self.sql = sql
        if sql is not None:
            try:
                compile_filter(sql)
            except FilterSyntaxError as e:
                raise SubscriptionError(str(e)) from None
        self.max_reconsume_times = max_reconsume_times
        # clustering consumers also consume their group's retry topic (failed messages come back)
        self.topics = [topic] + ([retry_topic(group)] if model == "clustering" else [])
        self.orderly, self.from_where, self.model = orderly, from_where, model
        self.read_from, self.allocate = read_from, STRATEGIES[allocate]
        self.rebalance_interval, self.commit_interval = rebalance_interval, commit_interval
        self.heartbeat_interval, self.pull_batch = heartbeat_interval, pull_batch
        self.max_cached_messages, self.max_cached_bytes = max_cached_messages, max_cached_bytes
        self.suspend_s, self.long_poll_s = suspend_s, long_poll_s
        self.core = core or ClientCore(namesrv, servers, address_map=address_map, tls=tls,
                                       credentials=credentials)
        self._own_core = core is None
        self._listener: Listener | None = None
        self._pool = ThreadPoolExecutor(consume_threads, thread_name_prefix=f"consume-{group}")
        self._slots = asyncio.Semaphore(consume_threads)
        self._queues: dict[MessageQueue, ProcessQueue] = {}
        self._background: list[asyncio.Task[None]] = []
        self._rebalance_now = asyncio.Event()
        self._route_retry_s = 0.0  # the retry topic is not routed yet: rebalance again this soon
        self._stopping = False
        self._locking = orderly and model == "clustering"  # queue consume locks on the broker
        self._stragglers: set[asyncio.Future[None]] = set()  # calls left on a hung replica
        store = Path(offset_store_dir or Path.home() / ".raftmq" / "offsets")
        self._local_offsets = LocalOffsets(store / group / f"{instance_name}.json")
        self.core.on_notify.append(self._on_notify)

    def register(self, listener: Listener) -> None:
        """``listener(messages, context) -> ConsumeStatus``; runs on the consume thread pool."""
        self._listener = listener

    @property
    def client_id(self) -> str:
        return self.core.client_id

    def assignment(self) -> list[MessageQueue]:
        return sorted(q for q, pq in self._queues.items() if not pq.dropped)

    async def start(self) -> AsyncPushConsumer:
        if self._listener is None:
            raise ClientError("register a listener before start()")
        await self.core.routes.route(self.topic)
        if self.model == "clustering":
            await self._heartbeat_once()
        await self._rebalance()
        self._background = [asyncio.create_task(self._every(self.rebalance_interval, self._rebalance,
                                                            self._rebalance_now)),
                            asyncio.create_task(self._every(self.commit_interval, self._commit_all))]
        if self.model == "clustering":
            self._background.append(asyncio.create_task(self._every(self.heartbeat_interval,
                                                                    self._heartbeat_once)))
        if self._locking:
            self._background.append(asyncio.create_task(self._every(LOCK_RENEW_S, self._renew_locks)))
        return self

    async def shutdown(self) -> None:
        """Stop pulling, let running listeners finish, commit offsets, unregister."""
        self._stopping = True
        for t in self._background:
            t.cancel()
        for t in self._background:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        pqs = list(self._queues.values())
        finished = await asyncio.gather(*(self._drop(pq, give_back=False) for pq in pqs))
        if self._locking:  # one request per broker group, after every commit
            await self._lock([pq.queue for pq, done in zip(pqs, finished, strict=True) if done],
                             take=False)
        await self._commit_all()
        if self.model == "clustering":
            await self._unregister()
        self._pool.shutdown(wait=True)
        if self._own_core:
            await self.core.close()

    # -- periodic work ---------------------------------------------------------------
    async def _every(self, seconds: float, work: Callable[[], Any],
                     wake: asyncio.Event | None = None) -> None:
        while not self._stopping:
            if wake is None:
                await asyncio.sleep(seconds)
            else:
                # asyncio.timeout, not wait_for: 3.11's wait_for can swallow the cancellation
                # that shutdown() sends when the event fires at the same moment
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(seconds):
                        await wake.wait()
                wake.clear()
            if self._stopping:
                return
            try:
                await work()
            except ClientError as e:
                log.warning("%s: %s", getattr(work, "__name__", "periodic work"), e)
            except Exception:
                log.exception("periodic work failed")

    def _on_notify(self, group: str) -> None:
        if group == self.group:
            self._rebalance_now.set()

    async def _routes(self) -> list[TopicRoute]:
        """Routes of the topic and of the retry topic. The broker creates the retry topic when
        the group's first heartbeat reaches its leader; until the name server lists it, the
        next rebalance comes soon (0.5 s, doubling up to the rebalance interval), so the
        first redelivery is not held back until a periodic rebalance finds the queue."""
        routes = [await self.core.routes.route(self.topic, refresh=True)]
        missing = False
        for extra in self.topics[1:]:
            try:
                routes.append(await self.core.routes.route(extra, refresh=True))
            except (TopicNotExistError, RouteNotFoundError):
                missing = True
        if missing and not self._stopping:
            self._route_retry_s = min(self.rebalance_interval, self._route_retry_s * 2 or 0.5)
            log.debug("%s: %s not routed yet; rebalancing again in %.1f s", self.client_id,
                      self.topics[1:], self._route_retry_s)
            asyncio.get_running_loop().call_later(self._route_retry_s, self._rebalance_now.set)
        else:
            self._route_retry_s = 0.0
        return routes

    async def _heartbeat_once(self) -> None:
        """Every replica at once (a hung replica's heartbeat goes on in the background until
        its own timeout)."""
        beat = HeartbeatRequest(client_id=self.client_id, subscriptions={self.group: tuple(self.topics)})
        await self._to_every_replica(beat, cancel_late=False)

    async def _call_quietly(self, address: str, request: Request) -> None:
        with contextlib.suppress(ClientError):
            await self.core.pool.call(address, request, timeout=3)

    async def _unregister(self) -> None:
        """Every replica at once (a request already sent still reaches a replica that is
        only slow); a replica that does not hear it drops this client when its heartbeats
        stop."""
        await self._to_every_replica(UnregisterRequest(client_id=self.client_id, group=self.group),
                                     cancel_late=True)

    async def _to_every_replica(self, request: Request, *, cancel_late: bool) -> None:
        """``request`` to every replica of the topic's groups at once; returns when a
        majority of each group's replicas answered (or failed), waiting READ_GRACE_S at most
        (a stalled replica is not waited for: issue 35). The calls still running go on in
        the background, or are cancelled (``cancel_late``), and are collected once they end."""
        route = await self.core.routes.route(self.topic)
        calls = [{asyncio.ensure_future(self._call_quietly(address, request)) for address in g.addresses}
                 for g in route.groups]
        deadline = asyncio.get_running_loop().time() + READ_GRACE_S

        async def majority_of(group_calls: set[asyncio.Future[None]]) -> None:
            need = len(group_calls) // 2 + 1
            pending = set(group_calls)
            while pending and len(group_calls) - len(pending) < need:
                _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)

        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(deadline):
                await asyncio.gather(*(majority_of(c) for c in calls))
        late = {c for group_calls in calls for c in group_calls if not c.done()}
        for call in late:
            if cancel_late:
                call.cancel()
            self._stragglers.add(call)
            call.add_done_callback(self._stragglers.discard)

    async def _members(self, groups: Sequence[str]) -> list[str]:
        members: set[str] = {self.client_id}
        for g in groups:
            with contextlib.suppress(ClientError):
                reply = await self.core.read_request(g, ConsumerListRequest(group=self.group),
                                                     read_from="leader", timeout=3, hold_s=0.0)
                members.update(ConsumerListResponse.from_frame(reply).client_ids)
                break
        return sorted(members)

    async def _rebalance(self) -> None:
        if self._stopping:
            return
        routes = await self._routes()
        queues = [q for r in routes for q in r.queues(PERM_READ)]
        if self.model == "broadcasting":
            mine = set(queues)
        else:
            members = await self._members([g.group for g in routes[0].groups])
            mine = set(self.allocate(self.client_id, members, queues))
        leaving = [pq for q, pq in self._queues.items() if q not in mine or pq.lost]
        for pq in leaving:
            log.info("%s: %s is no longer ours", self.client_id, pq.queue)
        await asyncio.gather(*(self._drop(pq) for pq in leaving))
        new = sorted(mine - set(self._queues))
        locked_at = time.monotonic()
        if self._locking and new:
            held, undecided = await self._lock(new)
            if undecided:
                log.warning("%s: consuming %s without their locks: their group has no leader",
                            self.client_id, sorted(undecided))
            if len(held) + len(undecided) < len(new):  # held by their previous owner: ask again soon
                log.info("%s: waiting for the locks of %s", self.client_id,
                         sorted(set(new) - held - undecided))
                asyncio.get_running_loop().call_later(self.suspend_s, self._rebalance_now.set)
            new = [q for q in new if q in held or q in undecided]
        # every queue's start offset at once: one hung replica costs one timeout, not one per queue
        starts = await asyncio.gather(*(self._start_offset(q) for q in new), return_exceptions=True)
        for q, offset in zip(new, starts, strict=True):
            if isinstance(offset, BaseException):
                if not isinstance(offset, ClientError):
                    raise offset
                log.warning("cannot start %s yet: %s", q, offset)
                if self._locking:
                    await self._lock([q], take=False)  # (undecided: it expires on the broker)
                continue
            pq = self._queues[q] = ProcessQueue(q, offset, committed=None,
                                                 locked_until=locked_at + LOCK_VALID_S)
            pq.tasks.append(asyncio.create_task(self._pull_loop(pq)))
            if self.orderly:
                pq.tasks.append(asyncio.create_task(self._orderly_loop(pq)))
            log.info("%s: consuming %s from offset %d", self.client_id, q, offset)

    async def _start_offset(self, q: MessageQueue) -> int:
        if self.model == "broadcasting":
            stored = self._local_offsets.read().get(str(q))
            if stored is not None:
                return int(stored)
        else:
            committed = await committed_offset(self.core, self.group, q)
            if committed is not None:
                return committed
        ts = self.from_where if isinstance(self.from_where, int) else None
        low, high, at = await queue_offsets(self.core, q, ts)
        if self.from_where == "first" or q.topic != self.topic:
            return low  # the retry topic holds only this group's failures: all of them (as RocketMQ)
        if ts is not None and at is not None:
            return at
        return high

    async def _drop(self, pq: ProcessQueue, give_back: bool = True) -> bool:
        """Stop consuming ``pq`` and commit its offset; give its lock back (``give_back``)
        if the message in hand finished. Returns whether it did finish."""
        pq.dropped = True
        pq.ready.set()
        finished = True
        if self._locking and len(pq.tasks) > 1:
            # the message in hand is finished first: the next owner waits for the lock,
            # which is given back only after that and the commit below
            done, _ = await asyncio.wait([pq.tasks[1]], timeout=LOCK_VALID_S)
            finished = bool(done)
        for t in pq.tasks:
            t.cancel()
        for t in pq.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        await self._commit(pq)
        self._queues.pop(pq.queue, None)
        finished = finished and not pq.lost  # a lapsed lock is not ours to give back
        if self._locking and finished and give_back:
            await self._lock([pq.queue], take=False)
        return finished

    async def _lock(self, queues: Sequence[MessageQueue],
                    take: bool = True) -> tuple[set[MessageQueue], set[MessageQueue]]:
        """``client.aio.queue_locks.lock_queues`` for this consumer's group and client id."""
        return await lock_queues(self.core, self.group, self.client_id, queues, take)

    async def _renew_locks(self) -> None:
        pqs = [pq for pq in self._queues.values() if not pq.dropped]
        asked_at = time.monotonic()
        if not pqs:
            return
        held, undecided = await self._lock([pq.queue for pq in pqs])
        for pq in pqs:
            if pq.queue in held or pq.queue in undecided:  # refused: it lapses, is dropped, asked again
                pq.locked_until = asked_at + LOCK_VALID_S

    # -- pulling and consuming ---------------------------------------------------------
    async def _pull_loop(self, pq: ProcessQueue) -> None:
        failures = 0
        while not pq.dropped:
            if len(pq.pending) >= self.max_cached_messages or pq.bytes >= self.max_cached_bytes:
                await asyncio.sleep(0.05)  # flow control: the listener is behind
                continue
            try:
                main = pq.queue.topic == self.topic  # the retry topic takes everything
                result = await fetch(self.core, pq.queue, pq.next_offset, max_msgs=self.pull_batch,
                                     suspend_s=self.long_poll_s, selector=self.selector if main else None,
                                     read_from=self.read_from, sql=self.sql if main else None,
                                     whole_records=True)  # no record is pulled twice
                failures = 0
            except ClientError as e:
                failures += 1
                log.debug("pull %s failed: %s", pq.queue, e)
                await asyncio.sleep(min(0.1 * failures, 1.0))
                continue
            if pq.dropped:
                return
            for m in result.messages:
                pq.pending[m.queue_offset] = m
                pq.bytes += len(m.body)
                if not self.orderly:
                    pq.tasks.append(asyncio.create_task(self._consume_one(pq, m)))
            pq.next_offset = max(pq.next_offset, result.next_offset)
            pq.ready.set()
            if len(pq.tasks) > 64:
                pq.tasks = [t for t in pq.tasks if not t.done()]

    async def _call_listener(self, pq: ProcessQueue, m: ReceivedMessage, attempt: int) -> ConsumeStatus:
        assert self._listener is not None
        loop = asyncio.get_running_loop()
        try:
            status = await loop.run_in_executor(self._pool, self._listener, [m],
                                                ConsumeContext(pq.queue, attempt))
        except Exception:
            log.exception("listener failed on %s offset %d", pq.queue, m.queue_offset)
            return ConsumeStatus.RECONSUME_LATER
        if not isinstance(status, ConsumeStatus):
            log.error("listener returned %r, not a ConsumeStatus; treating it as RECONSUME_LATER", status)
            return ConsumeStatus.RECONSUME_LATER
        return status

    async def _consume_one(self, pq: ProcessQueue, m: ReceivedMessage) -> None:
        """Concurrent mode: a failed message goes back to the broker, which redelivers it
        through the group's retry topic on the retry schedule (dead-letters it after
        ``max_reconsume_times``); if that fails, it is retried here after ``suspend_s``."""
        async with self._slots:
            attempt = 0
            while not pq.dropped:
                if await self._call_listener(pq, m, attempt) == ConsumeStatus.SUCCESS:
                    pq.done(m.queue_offset)
                    return
                if self.model == "clustering" and await self._send_back(m):
                    pq.done(m.queue_offset)
                    return
                attempt += 1
                await asyncio.sleep(self.suspend_s)

    async def _send_back(self, m: ReceivedMessage) -> bool:
        try:
            await self.core.leader_request(
                m.queue.group, SendBackRequest(group=self.group, position=m.commit_log_offset,
                                               max_reconsume_times=self.max_reconsume_times),
                deadline=Deadline(5.0), topic=m.queue.topic)
            return True
        except ClientError as e:
            log.warning("could not send %s back for a retry (retrying here): %s", m.msg_id, e)
            return False

    async def _orderly_loop(self, pq: ProcessQueue) -> None:
        """Orderly mode: one message at a time, in queue order; a failure blocks the queue."""
        while not pq.dropped:
            if not pq.pending:
                pq.ready.clear()
                await pq.ready.wait()
                continue
            if self._locking and time.monotonic() >= pq.locked_until:
                log.warning("%s: the lock of %s lapsed; consuming it stops until it is taken again",
                            self.client_id, pq.queue)
                pq.lost = True
                self._rebalance_now.set()
                return
            offset = next(iter(pq.pending))
            m = pq.pending[offset]
            attempt = 0
            while not pq.dropped:
                status = await self._call_listener(pq, m, attempt)
                if status == ConsumeStatus.SUCCESS:
                    pq.done(offset)
                    break
                attempt += 1
                await asyncio.sleep(self.suspend_s)

    # -- offsets ---------------------------------------------------------------------
    async def _commit(self, pq: ProcessQueue) -> None:
        point = pq.commit_point()
        if point == pq.committed:
            return
        if self.model == "broadcasting":
            offsets = self._local_offsets.read()
            offsets[str(pq.queue)] = point
            self._local_offsets.write(offsets)
        else:
            try:
                await commit_offset(self.core, self.group, pq.queue, point)
            except ClientError as e:
                log.warning("commit of %s at %d failed (kept for the next round): %s", pq.queue, point, e)
                return
        pq.committed = point

    async def _commit_all(self) -> None:
        for pq in list(self._queues.values()):
            await self._commit(pq)
