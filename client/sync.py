"""The blocking facade: each object runs its asyncio twin on a private background loop.

Calls block the caller until the loop answers (bounded by the call's own timeouts);
listeners of a push consumer run on its consume thread pool, as in the async client.
"""

from __future__ import annotations

import _thread
import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from client.aio.admin import AsyncAdmin, QueueProgress
from client.aio.producer import AsyncProducer
from client.aio.pull_consumer import AsyncPullConsumer, PullResult
from client.aio.push_consumer import AsyncPushConsumer, Listener
from client.aio.send_sinks import SendCallback, log_failure
from client.aio.simple_consumer import AsyncSimpleConsumer, Receipt, SimpleMessage
from client.errors import BufferFullError, ClientClosedError, ClientError, RequestTimeoutError
from client.message import Message, ReceivedMessage, SendResult
from client.queues import MessageQueue

__all__ = ["Admin", "Producer", "PullConsumer", "PushConsumer", "SimpleConsumer", "TransactionProducer"]

T = TypeVar("T")

#: How long a blocking send waits for room in a full send buffer (``max_block_s``).
MAX_BLOCK_S = 60.0


class _Loop:
    """A private event loop on a daemon thread."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Awaitable[T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)  # type: ignore[arg-type]

    def make(self, factory: Callable[[], T]) -> T:
        async def build() -> T:
            return factory()
        return self.run(build())

    def on_loop_thread(self) -> bool:
        return threading.get_ident() == self._thread.ident

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self.loop.close()


class _Waiter:
    """One blocking ``send``'s outcome: a lock its thread waits on, released by the loop."""

    __slots__ = ("_lock", "error", "result")

    def __init__(self) -> None:
        self._lock = _thread.allocate_lock()
        self._lock.acquire()
        self.result: SendResult | None = None
        self.error: BaseException | None = None

    def __call__(self, result: SendResult | None, error: BaseException | None) -> None:
        self.result, self.error = result, error
        self._lock.release()

    def wait(self, timeout: float) -> SendResult:
        if not self._lock.acquire(timeout=timeout):
            raise RequestTimeoutError(f"no outcome of the send in {timeout:g} s")
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


class Producer:
    """``Producer(namesrv="127.0.0.1:9876", group="orders-producer").start()``; see AsyncProducer.

    Any thread may call it. Single messages (``send``, ``send_async``, ``send_oneway``) go
    through an inbox (a deque) that the producer's loop drains once per wake-up into its
    accumulator: no coroutine, task or cross-thread future per message, and the messages of
    many threads share records. A send waits for room while ``buffer_bytes`` of sends are
    not answered yet (what was posted since the loop's last turn is counted at its next:
    a thread posting in a tight loop may overshoot by one turn's worth).
    """

    def __init__(self, namesrv: str | Sequence[str] | None = None, group: str = "DEFAULT_PRODUCER",
                 **options: Any) -> None:
        """``options``: AsyncProducer's, and ``max_block_s`` (default 60): how long a send
        waits for room while ``buffer_bytes`` of sends are not answered yet, before it fails
        with BufferFullError (Kafka's max.block.ms)."""
        self._setup(f"producer-{group}", lambda: AsyncProducer(namesrv, group, **options), options)

    def _setup(self, name: str, factory: Callable[[], AsyncProducer], options: dict[str, Any]) -> None:
        """``options``: the factory's, less ``max_block_s`` (taken here, before it runs)."""
        self._max_block_s = float(options.pop("max_block_s", MAX_BLOCK_S))
        self._loop = _Loop(name)
        self._p = self._loop.make(factory)
        self._inbox: deque[tuple[Message, str | None, SendCallback]] = deque()
        self._drain_due = False
        self._shut = False
        # a blocking send waits at most this long (the producer's own deadlines end it first)
        self._wait_s = self._p.send_timeout * 2 + 5

    def start(self) -> Producer:
        self._loop.run(self._p.start())
        return self

    def send(self, message: Message, shard_key: str | None = None) -> SendResult:
        """Block until a majority stored it (SEND_OK), or raise its error. Not from a send
        callback (the producer's loop thread, which the answer needs): use ``send_async`` there."""
        if self._loop.on_loop_thread():
            raise ClientError("Producer.send from a send callback would wait for its own thread "
                              "(the producer's loop): use send_async or send_oneway there")
        waiter = _Waiter()
        self._post(message, shard_key, waiter)
        return waiter.wait(self._wait_s)

    def send_batch(self, messages: Sequence[Message], shard_key: str | None = None) -> list[SendResult]:
        return self._loop.run(self._p.send_batch(messages, shard_key))

    def send_async(self, message: Message, callback: SendCallback, shard_key: str | None = None) -> None:
        """Returns at once; ``callback`` runs on the producer's loop thread when the send ends
        (on the calling thread, with ClientClosedError, for a send racing ``shutdown``)."""
        self._post(message, shard_key, callback)

    def send_oneway(self, message: Message, shard_key: str | None = None) -> None:
        """Returns at once; a failure is only logged."""
        self._post(message, shard_key, log_failure)

    def _post(self, message: Message, shard_key: str | None, callback: SendCallback) -> None:
        if self._shut:
            raise ClientClosedError("the producer was shut down")
        buffer = self._p.buffer
        if buffer.full:
            if self._loop.on_loop_thread():  # a send callback: only this loop makes room
                raise BufferFullError(f"the producer's buffer is full ({buffer.held} bytes of sends not "
                                      "answered yet) and a send callback cannot wait for room: send "
                                      "from another thread, or fewer at once")
            if not buffer.wait_for_room(self._max_block_s):
                raise BufferFullError(f"no room in the producer's buffer for {self._max_block_s:g} s: "
                                      f"{buffer.held} bytes of sends not answered yet (buffer_bytes="
                                      f"{buffer.max_bytes}); the brokers take messages slower than they "
                                      "are sent")
            if self._shut:
                raise ClientClosedError("the producer was shut down")
        self._inbox.append((message, shard_key, callback))
        # The drain clears the flag before it empties the inbox, so a message appended
        # before a thread saw the flag set is always drained (CPython: each step is atomic).
        if not self._drain_due:
            self._drain_due = True
            with contextlib.suppress(RuntimeError):  # the loop closed: a shutdown raced this send
                self._loop.loop.call_soon_threadsafe(self._drain)
        if self._shut:  # shut down meanwhile: what the shutdown's last drain missed fails now
            self._fail_inbox()

    def _fail_inbox(self) -> None:
        """What no drain took fails as not sent (each message once: deque pops are atomic)."""
        error = ClientClosedError("the producer was shut down before sending")
        with contextlib.suppress(IndexError):
            while True:
                self._inbox.popleft()[2](None, error)

    def _drain(self) -> None:
        """Loop thread: everything in the inbox to the accumulator."""
        self._drain_due = False
        inbox, sends = self._inbox, []
        with contextlib.suppress(IndexError):
            while True:
                sends.append(inbox.popleft())
        if sends:
            self._p.enqueue_many(sends)

    def shutdown(self, timeout: float = 10.0) -> None:
        self._shut = True
        try:
            self._loop.run(self._shutdown(timeout), timeout + 5)
        finally:
            self._loop.stop()
            self._fail_inbox()

    async def _shutdown(self, timeout: float) -> None:
        self._drain()
        await self._p.shutdown(timeout)

    def __enter__(self) -> Producer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


class PushConsumer:
    """``PushConsumer(namesrv=..., group=..., topic=..., selector="a || b", orderly=True)``."""

    def __init__(self, namesrv: str | Sequence[str] | None = None, group: str = "DEFAULT_CONSUMER",
                 topic: str = "", selector: str | None = "*", **options: Any) -> None:
        self._loop = _Loop(f"consumer-{group}")
        self._c = self._loop.make(lambda: AsyncPushConsumer(namesrv, group, topic, selector, **options))

    def register(self, listener: Listener) -> None:
        self._c.register(listener)

    def start(self) -> PushConsumer:
        self._loop.run(self._c.start())
        return self

    @property
    def client_id(self) -> str:
        return self._c.client_id

    def assignment(self) -> list[MessageQueue]:
        return self._loop.run(_call(self._c.assignment))

    def shutdown(self) -> None:
        try:
            self._loop.run(self._c.shutdown(), 60)
        finally:
            self._loop.stop()


class PullConsumer:
    def __init__(self, namesrv: str | Sequence[str] | None = None, group: str = "DEFAULT_CONSUMER",
                 **options: Any) -> None:
        self._loop = _Loop(f"pull-{group}")
        self._c = self._loop.make(lambda: AsyncPullConsumer(namesrv, group, **options))

    def start(self) -> PullConsumer:
        return self

    def queues(self, topic: str) -> list[MessageQueue]:
        return self._loop.run(self._c.queues(topic))

    def assign(self, queues: Sequence[MessageQueue], from_where: str | int = "committed") -> None:
        self._loop.run(self._c.assign(queues, from_where))

    def assignment(self) -> dict[MessageQueue, int]:
        return self._c.assignment()

    def seek(self, queue: MessageQueue, offset: int) -> None:
        self._loop.run(_call(self._c.seek, queue, offset))

    def seek_to(self, queue: MessageQueue, where: str | int) -> None:
        self._loop.run(self._c.seek_to(queue, where))

    def pull(self, queue: MessageQueue, offset: int, max_msgs: int = 32, timeout: float = 0.0) -> PullResult:
        return self._loop.run(self._c.pull(queue, offset, max_msgs, timeout))

    def poll(self, max_msgs: int = 32, timeout: float = 1.0) -> list[ReceivedMessage]:
        return self._loop.run(self._c.poll(max_msgs, timeout))

    def commit(self, offsets: dict[MessageQueue, int] | None = None) -> None:
        self._loop.run(self._c.commit(offsets))

    def shutdown(self) -> None:
        try:
            self._loop.run(self._c.close(), 10)
        finally:
            self._loop.stop()

    close = shutdown


class SimpleConsumer:
    """The blocking ``client.aio.AsyncSimpleConsumer``: per-message acknowledgement; any
    number of consumers of one group share every queue of ``topic``."""

    def __init__(self, namesrv: str | Sequence[str] | None = None, group: str = "DEFAULT_CONSUMER",
                 topic: str = "", **options: Any) -> None:
        self._loop = _Loop(f"simple-{group}")
        try:
            self._c = self._loop.make(lambda: AsyncSimpleConsumer(namesrv, group, topic, **options))
        except BaseException:  # bad options: no loop thread left behind
            self._loop.stop()
            raise

    def start(self) -> SimpleConsumer:
        return self

    def __enter__(self) -> SimpleConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def receive(self, max_messages: int = 16, invisible_duration_s: float = 30.0,
                wait_s: float = 0.0) -> list[SimpleMessage]:
        return self._loop.run(self._c.receive(max_messages, invisible_duration_s, wait_s))

    def ack(self, message: SimpleMessage | Receipt) -> None:
        self._loop.run(self._c.ack(message))

    def change_invisible_duration(self, message: SimpleMessage | Receipt, seconds: float) -> None:
        self._loop.run(self._c.change_invisible_duration(message, seconds))

    def nack(self, message: SimpleMessage | Receipt) -> bool:
        return self._loop.run(self._c.nack(message))

    def shutdown(self) -> None:
        try:
            self._loop.run(self._c.close(), 10)
        finally:
            self._loop.stop()

    close = shutdown


class Admin:
    def __init__(self, namesrv: str | Sequence[str] | None = None, **options: Any) -> None:
        self._loop = _Loop("admin")
        self._a = self._loop.make(lambda: AsyncAdmin(namesrv, **options))

    def create_topic(self, topic: str, queues: int = 8, perm: int = 6,
                     groups: Sequence[str] | None = None) -> list[str]:
        return self._loop.run(self._a.create_topic(topic, queues, perm, groups))

    def delete_topic(self, topic: str, groups: Sequence[str] | None = None) -> list[str]:
        return self._loop.run(self._a.delete_topic(topic, groups))

    def group_config(self, group: str, retry_s: Sequence[float], max_deliveries: int,
                     groups: Sequence[str] | None = None, *, ordered: bool = False) -> list[str]:
        return self._loop.run(self._a.group_config(group, retry_s, max_deliveries, groups, ordered=ordered))

    def topics(self) -> dict[str, dict[str, list[int]]]:
        return self._loop.run(self._a.topics())

    def progress(self, group: str, topic: str) -> list[QueueProgress]:
        return self._loop.run(self._a.progress(group, topic))

    def reset_offsets(self, group: str, topic: str, timestamp_ms: int) -> dict[MessageQueue, int]:
        return self._loop.run(self._a.reset_offsets(group, topic, timestamp_ms))

    def message_by_id(self, topic: str, msg_id: str) -> ReceivedMessage | None:
        return self._loop.run(self._a.message_by_id(topic, msg_id))

    def messages_by_key(self, topic: str, key: str, begin_ms: int = 0, end_ms: int = 2**62,
                        max_results: int = 32) -> list[ReceivedMessage]:
        return self._loop.run(self._a.messages_by_key(topic, key, begin_ms, end_ms, max_results))

    def message_at(self, queue: MessageQueue, offset: int) -> ReceivedMessage | None:
        return self._loop.run(self._a.message_at(queue, offset))

    # users and policies (client.aio.access_admin): every group by default
    def put_user(self, user: str, password: str, *, super_user: bool = False) -> list[str]:
        return self._loop.run(self._a.access.put_user(user, password, super_user=super_user))

    def delete_user(self, user: str) -> list[str]:
        return self._loop.run(self._a.access.delete_user(user))

    def grant(self, user: str, resource: str, actions: Sequence[str], *, deny: bool = False,
              source: str = "") -> list[str]:
        return self._loop.run(self._a.access.grant(user, resource, actions, deny=deny, source=source))

    def revoke(self, user: str, resource: str, actions: Sequence[str] = (), *, deny: bool = False,
               source: str = "") -> list[str]:
        return self._loop.run(self._a.access.revoke(user, resource, actions, deny=deny, source=source))

    def close(self) -> None:
        try:
            self._loop.run(self._a.close(), 10)
        finally:
            self._loop.stop()


async def _call(fn: Callable[..., T], *args: Any) -> T:
    return fn(*args)


class TransactionProducer(Producer):
    """``TransactionProducer(namesrv=..., group=..., listener=obj)`` where ``obj`` has
    ``execute_local_transaction(message, arg)`` and ``check_local_transaction(message)``
    returning ``LocalTransactionState``; see ``client.aio.transaction``."""

    def __init__(self, namesrv: str | Sequence[str] | None = None, group: str = "DEFAULT_TX_PRODUCER",
                 **options: Any) -> None:
        from client.aio.transaction import AsyncTransactionProducer

        self._setup(f"tx-producer-{group}", lambda: AsyncTransactionProducer(namesrv, group, **options),
                    options)

    def send_in_transaction(self, message: Message, arg: Any = None,
                            shard_key: str | None = None) -> Any:
        return self._loop.run(self._p.send_in_transaction(message, arg, shard_key))  # type: ignore[attr-defined]
