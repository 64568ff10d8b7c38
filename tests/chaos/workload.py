"""The chaos workload: ordered sends on shard keys, one orderly consumer, an offsets monitor.

Everything runs on one asyncio loop in a background thread, so the test's thread is
free to inject faults; the test talks to it through thread-safe methods only.

* **senders**: ``keys`` coroutines, each sending ``<key>:<n>`` with that key as shard key,
  single ``send_async`` calls with up to ``window`` of a key's messages in flight (the
  producer's accumulator gathers them into records, several requests per queue in
  flight), paced at ``rate`` messages/s per key, through an idempotent ``AsyncProducer``.
  Every attempt is recorded in the history, in send order: ``ok`` (SEND_OK, with its
  queue and offset), ``failed`` (SEQUENCE_GAP: refused, definitely not stored),
  ``unknown`` (any other error);
* **consumer**: an ``AsyncPushConsumer`` (orderly, from the first offset, reading from
  ``read_from``) recording every delivery with its queue, offset and CommitLog position;
* **monitor**: every 0.3 s, each node's committed offsets of the consumer group (tagged
  with the node's process incarnation) and its Raft term, read directly from the node.

All client traffic goes through the client proxies (``ChaosBrokers.servers`` and
``address_map``).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import aiohttp

from client.aio import AsyncAdmin, AsyncProducer, AsyncPushConsumer
from client.aio.auth import admin_token
from client.credentials import Credentials
from client.errors import AuthFailedError, ClientError, SequenceGapError
from client.message import ConsumeStatus, Message, ReceivedMessage, SendResult
from client.queues import MessageQueue
from tests.chaos.brokers import BROKER_GROUP, ChaosBrokers
from tests.support.broker_client import client_session
from tests.support.message_history import MessageHistory

__all__ = ["APP", "CONSUMER_GROUP", "TOPIC", "OrderedWorkload"]


TOPIC = "orders"
#: With '-' and a start that reads as a percent escape ("%ac"): the shape of issue 12's lost retries.
CONSUMER_GROUP = "acc-chaos-consumer"
T = TypeVar("T")
#: With ACLs on, the producer and the consumer are this plain user, with only these rights.
APP = Credentials("chaos-app", "chaos-app-password")
APP_GRANTS = (("topic:orders", ["pub", "sub", "get"]), (f"group:{CONSUMER_GROUP}", ["sub"]),
              ("group:chaos-producer", ["pub"]))


async def _until_authenticated(admin: AsyncAdmin, timeout: float = 20.0) -> None:
    """The leader adds the bootstrap super user within a second of its election."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            await admin.topics()
            return
        except AuthFailedError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


class OrderedWorkload:
    def __init__(self, brokers: ChaosBrokers, history: MessageHistory, work_dir: Path, *,
                 keys: int = 8, queues: int = 4, rate: float = 20.0, read_from: str = "follower",
                 send_timeout: float = 20.0, pad: int = 0, window: int = 4) -> None:
        """``pad``: bytes added to each payload (so that retention has segments to delete);
        ``window``: a key's sends in flight at most."""
        self.brokers = brokers
        self.history = history
        self.work_dir = work_dir
        self.keys = [f"k{i}" for i in range(keys)]
        self.queues = queues
        self.pause = 1.0 / rate
        self.pad = b"." * pad
        self.read_from = read_from
        self.send_timeout = send_timeout
        self.window = window
        self.send_started: dict[bytes, float] = {}  # payload -> monotonic start of its send
        self.unexpected: list[str] = []  # non-ClientError exceptions from the client
        self.terms: set[int] = set()
        self.consumers_started = 0
        #: the offsets monitor's readings per node, and each node's last error (none swallowed unseen)
        self.monitor_samples: collections.Counter[str] = collections.Counter()
        self.monitor_errors: dict[str, str] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="chaos-workload", daemon=True)
        self._sending = threading.Event()
        self._senders: list[asyncio.Task[None]] = []
        self._monitor: asyncio.Task[None] | None = None
        self._producer: AsyncProducer | None = None
        self._consumer: AsyncPushConsumer | None = None
        self._token: str | None = None  # the offsets monitor's admin token (ACLs on)

    # -- lifecycle (test thread) ------------------------------------------------------
    def start(self, timeout: float = 30.0) -> OrderedWorkload:
        self._thread.start()
        self._run(self._start(), timeout)
        return self

    def producer_counts(self) -> dict[str, int]:
        """The producer's requests so far, and how many were resent unchanged after a gap."""
        senders = list(self._producer._senders.values()) if self._producer is not None else []
        return {"requests": sum(s.requests_sent for s in senders),
                "gap_resends": sum(s.gap_resends for s in senders)}

    def stop_sending(self, timeout: float = 40.0) -> None:
        """Stop starting sends and wait for the ones under way to get their outcome."""
        self._sending.clear()
        self._run(self._join_senders(), timeout)

    def restart_consumer(self, timeout: float = 60.0, start_timeout: float = 30.0) -> None:
        """Shut the consumer down (it commits) and start a new member of the same group,
        which resumes from the committed offsets (redelivery is allowed, loss is not).
        Raises ClientError if no replica could be reached for ``start_timeout`` s (there is
        then no consumer until this is called again)."""
        self._run(self._stop_consumer(), timeout)
        self._run(self._start_consumer(start_timeout), timeout)

    def stop_consumer(self, timeout: float = 20.0) -> None:
        """Shut the consumer down (it commits its final offsets)."""
        self._run(self._stop_consumer(), timeout)

    def close(self) -> None:
        """Stop everything that still runs and the loop; safe to call more than once."""
        if not self._thread.is_alive():
            return
        self._sending.clear()
        with contextlib.suppress(Exception):
            self._run(self._close(), 30.0)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()

    # -- waiting (test thread) -------------------------------------------------------------
    def wait_acked(self, count: int, timeout: float, what: str = "") -> None:
        """Until ``count`` sends in total were acknowledged."""
        self._wait(lambda: self.history.acked_count >= count, timeout,
                   what or f"{count} acknowledged sends")

    def wait_more_acked(self, more: int, timeout: float, what: str = "") -> None:
        self.wait_acked(self.history.acked_count + more, timeout, what)

    def first_ack_of_send_started_after(self, t: float, timeout: float) -> float:
        """Seconds from ``t`` to the first acknowledgement of a send started after ``t``."""
        found: list[float] = []

        def acked() -> bool:
            times = [s.at for s in self.history.acked() if self.send_started.get(s.payload, 0) > t]
            if times:
                found.append(min(times))
            return bool(times)

        self._wait(acked, timeout, "a send started after the fault being acknowledged")
        return found[0] - t

    def delivery_gap_after(self, t: float, timeout: float, who: str | None = None) -> float:
        """Seconds from ``t`` until every queue delivered before ``t`` has delivered a message
        sent after ``t`` (to consumer ``who``, e.g. ``c2``, when given): how long the
        slowest queue's consumption stood still after a fault at ``t``."""
        queues = {d.queue for d in list(self.history.deliveries) if d.at <= t}  # a copy: appended meanwhile
        found: list[float] = []

        def every_queue_delivered() -> bool:
            first: dict[str, float] = {}
            for d in list(self.history.deliveries):
                if d.queue in queues and self.send_started.get(d.payload, 0.0) > t and who in (None, d.who):
                    first.setdefault(d.queue, d.at)
            if len(first) < len(queues):
                return False
            found.append(max(first.values()))
            return True

        self._wait(every_queue_delivered, timeout, f"every queue delivering again after the fault "
                   f"({len(queues)} queues{f', consumer {who}' if who else ''})")
        return found[0] - t

    @property
    def consumer_name(self) -> str:
        """The name deliveries of the running consumer are recorded under (``c<n>``)."""
        return f"c{self.consumers_started}"

    def drain(self, timeout: float = 30.0) -> None:
        """Until the consumer got every message the replicas store (history.replicas)."""
        self._wait(lambda: self.history.undelivered_stored() == 0, timeout,
                   "the consumer receiving every stored message",
                   detail=lambda: f"{self.history.undelivered_stored()} stored messages undelivered")

    def _wait(self, predicate: Any, timeout: float, what: str, detail: Any = None) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                more = f" ({detail()})" if detail else ""
                raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}{more}; "
                                   f"history {self.history.summary()}")
            if not self._thread.is_alive():
                raise RuntimeError("the workload thread died")
            time.sleep(0.05)

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"workload step did not finish within {timeout}s") from None

    # -- the loop's side -------------------------------------------------------------------
    async def _start(self) -> None:
        b = self.brokers
        async with AsyncAdmin(servers=b.servers, address_map=b.address_map, timeout=20.0,
                              tls=b.client_tls, credentials=b.credentials) as admin:
            if b.credentials is not None:
                await _until_authenticated(admin)
            await admin.create_topic(TOPIC, queues=self.queues)
            if b.credentials is not None:  # ACLs on: the producer and consumer are a plain user
                await admin.access.put_user(APP.user, APP.password)
                for resource, actions in APP_GRANTS:
                    await admin.access.grant(APP.user, resource, actions)
        self._monitor = asyncio.create_task(self._watch())
        await self._start_consumer()
        self._producer = AsyncProducer(servers=b.servers, address_map=b.address_map, tls=b.client_tls,
                                       group="chaos-producer", send_timeout=self.send_timeout,
                                       credentials=self._app)
        self._sending.set()
        self._senders = [asyncio.create_task(self._send_key(k)) for k in self.keys]

    async def _start_consumer(self, timeout: float = 30.0) -> None:
        """Start a new member of the consumer group; like an application would, retry a start
        that fails because no replica can be reached right now."""
        deadline = time.monotonic() + timeout
        while True:
            consumer = self._new_consumer()
            try:
                self._consumer = await consumer.start()
                return
            except ClientError:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(consumer.shutdown(), 10)
                with contextlib.suppress(Exception):
                    await consumer.core.close()
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)

    def _new_consumer(self) -> AsyncPushConsumer:
        b = self.brokers
        self.consumers_started += 1
        who = f"c{self.consumers_started}"
        consumer = AsyncPushConsumer(
            servers=b.servers, address_map=b.address_map, tls=b.client_tls, group=CONSUMER_GROUP, topic=TOPIC,
            credentials=self._app,
            orderly=True, from_where="first", read_from=self.read_from, commit_interval=0.5,
            heartbeat_interval=2.0, rebalance_interval=5.0, long_poll_s=1.0, suspend_s=0.2,
            consume_threads=4, offset_store_dir=self.work_dir / "offsets")

        def on_messages(messages: list[ReceivedMessage], _ctx: object) -> ConsumeStatus:
            for m in messages:
                self.history.delivered(m.body, str(m.queue), m.queue_offset, who, m.commit_log_offset)
            return ConsumeStatus.SUCCESS

        consumer.register(on_messages)
        return consumer

    async def _send_key(self, key: str) -> None:
        assert self._producer is not None
        n = 0
        in_flight: collections.deque[tuple[bytes, asyncio.Future[SendResult]]] = collections.deque()
        try:
            while self._sending.is_set():
                payload = f"{key}:{n:06d}".encode() + self.pad
                n += 1
                self.send_started[payload] = time.monotonic()
                future = self._producer.send_async(Message(TOPIC, payload), _ignore, shard_key=key)
                in_flight.append((payload, future))
                if len(in_flight) >= self.window:
                    await self._record(key, *in_flight.popleft())
                await asyncio.sleep(self.pause)
        finally:
            while in_flight:
                await self._record(key, *in_flight.popleft())

    async def _record(self, key: str, payload: bytes, future: asyncio.Future[SendResult]) -> None:
        """One send's outcome into the history (called in send order)."""
        try:
            r = await future
        except SequenceGapError:
            self.history.failed(payload, key)
        except ClientError:
            self.history.unknown(payload, key)
        except Exception as e:  # a client bug: recorded, the test reports it
            self.unexpected.append(f"{key}: {e!r}")
            self.history.unknown(payload, key)
        else:
            self.history.ok(payload, key, str(r.queue), r.queue_offset)

    async def _join_senders(self) -> None:
        await asyncio.gather(*self._senders, return_exceptions=True)
        self._senders = []

    async def _stop_consumer(self) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            await consumer.shutdown()

    async def _close(self) -> None:
        await self._join_senders()
        if self._producer is not None:
            with contextlib.suppress(Exception):
                await self._producer.shutdown(timeout=5)
            self._producer = None
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._stop_consumer(), 15)
        if self._monitor is not None:
            self._monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._monitor

    @property
    def _app(self) -> Credentials | None:
        """Who the producer and the consumer are (None: no ACLs)."""
        return None if self.brokers.credentials is None else APP

    async def _watch(self) -> None:
        timeout = aiohttp.ClientTimeout(total=1.0)
        async with client_session(self.brokers.client_tls or None, timeout=timeout) as session:
            while True:
                self.brokers.deaths.check()  # a node that died on its own, seen within 0.3 s
                for name in self.brokers.names:
                    try:
                        if await self._watch_node(session, name):
                            self.monitor_samples[name] += 1
                    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, ClientError) as e:
                        self.monitor_errors[name] = repr(e)[:200]  # counted: Scenario checks the samples
                await asyncio.sleep(0.3)

    async def _watch_node(self, session: aiohttp.ClientSession, name: str) -> bool:
        """One reading of ``name``'s committed offsets and term; False if none was taken."""
        b = self.brokers
        incarnation = b.incarnation[name]
        if not b.alive(name):
            return False
        offsets_url = b.group.url(name, f"/admin/groups/{quote(CONSUMER_GROUP, safe='')}/offsets")
        if b.credentials is not None and self._token is None:  # one token serves every replica
            self._token = await admin_token(session, b.group.url(name, ""), b.credentials)
        headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}
        async with session.get(offsets_url, headers=headers) as resp:
            doc = await resp.json()
        async with session.get(b.group.url(name, "/status")) as resp:
            status = await resp.json()
        if b.incarnation[name] != incarnation:
            return False  # restarted while we asked: the answer's incarnation is unknown
        self.terms.add(int(status["term"]))
        for row in doc["queues"]:
            queue = str(MessageQueue(row["topic"], BROKER_GROUP, int(row["queue"])))
            self.history.offset_seen(f"{name}#{incarnation}", queue, int(row["committed"]))
        return True


def _ignore(result: SendResult | None, error: BaseException | None) -> None:
    """The outcome is read from the send's future, in send order."""
