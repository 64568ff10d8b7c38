"""Where a send's outcome goes (``QueueSender`` settles each message through one): a
whole ``send_batch`` call's future (``CallSink``), or a callback per message (``MessageSink``:
``send_async``, ``send_oneway``, the blocking client's sends -- no task, and a future only
when a caller awaits one). The bytes of the messages with a callback not yet settled are
held in a ``SendBuffer`` of bounded size (Kafka's ``buffer.memory``): those sends fail
(asyncio) or wait (blocking client) while it is full.

Event loop only, but for ``SendBuffer.full`` and ``wait_for_room`` (other threads).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from client.backoff import Deadline
from client.errors import ClientError
from client.message import Message, SendResult

if TYPE_CHECKING:
    from client.aio.producer import AsyncProducer

__all__ = ["CallSink", "MessageSink", "SendBuffer", "SendCallback", "call_back", "log_failure", "settler"]

log = logging.getLogger("client.producer")

_Outcome = SendResult | BaseException
#: ``callback(result, None)`` or ``callback(None, error)``, on the producer's event loop.
SendCallback = Callable[[SendResult | None, BaseException | None], None]


class CallSink:
    """One ``send_batch`` call: an outcome per message and the one future its caller awaits,
    done once every message has its outcome (a future per message costs more than the rest
    of its send). Cancelling the future abandons the messages not yet sent."""

    __slots__ = ("_left", "future", "outcomes")

    def __init__(self, future: asyncio.Future[None], count: int) -> None:
        self.future = future
        self.outcomes: list[_Outcome | None] = [None] * count
        self._left = count

    @property
    def abandoned(self) -> bool:
        return self.future.done()

    def settle(self, index: int, outcome: _Outcome) -> None:
        if self.outcomes[index] is None and not self.future.done():
            self.outcomes[index] = outcome
            self._left -= 1
            if not self._left:
                self.future.set_result(None)


class SendBuffer:
    """The bytes of sends not yet settled (``held``), against ``max_bytes``. ``held`` grows
    and ``give_back`` runs on the event loop; ``full`` is read and ``wait_for_room`` runs on
    other threads too (the blocking client)."""

    __slots__ = ("_room", "_waiters", "closed", "held", "max_bytes")

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 1:
            raise ValueError(f"buffer_bytes must be positive, not {max_bytes}")
        self.max_bytes, self.held = max_bytes, 0
        self._room = threading.Condition()
        self._waiters = 0
        self.closed = False

    @property
    def full(self) -> bool:
        return self.held >= self.max_bytes

    def give_back(self, size: int) -> None:
        was_full = self.held >= self.max_bytes
        self.held -= size
        if was_full and self._waiters and self.held < self.max_bytes:
            with self._room:
                self._room.notify_all()

    def close(self) -> None:
        """The producer shut down: waiters go on at once (their send then fails as closed)."""
        with self._room:
            self.closed = True
            self._room.notify_all()

    def wait_for_room(self, timeout: float) -> bool:
        """Another thread: wait until the buffer is not full or is closed; False after
        ``timeout`` s."""
        deadline = time.monotonic() + timeout
        with self._room:
            self._waiters += 1
            try:
                while self.held >= self.max_bytes and not self.closed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._room.wait(left)
                return True
            finally:
                self._waiters -= 1


class MessageSink:
    """One message sent with a callback (no task; a future only if its caller awaits one,
    and cancelling that future abandons the message if not yet sent). ``retry``: for an
    unordered send, what to do with a retriable failure instead of reporting it. Its ``size``
    (set by the producer once it has sized the message) is held in ``buffer`` until the send
    ends, retries on other groups included."""

    __slots__ = ("buffer", "callback", "done", "future", "retry", "size")

    def __init__(self, callback: SendCallback, future: asyncio.Future[SendResult] | None = None,
                 buffer: SendBuffer | None = None) -> None:
        self.callback, self.future, self.done = callback, future, False
        self.buffer, self.size = buffer, 0
        # an unordered send's retry: (producer, message, group tried, deadline of the whole send)
        self.retry: tuple[AsyncProducer, Message, str, Deadline] | None = None

    @property
    def abandoned(self) -> bool:
        return self.future is not None and self.future.done()

    def settle(self, index: int, outcome: _Outcome) -> None:
        if self.done:
            return
        self.done = True
        if isinstance(outcome, BaseException):
            if self.retry is not None and isinstance(outcome, ClientError) and outcome.retriable:
                producer, message, group, whole = self.retry
                producer.retry_elsewhere(message, group, whole, self.finish, outcome)  # still held
                return
            self.finish(None, outcome)
        else:
            self.finish(outcome, None)

    def finish(self, result: SendResult | None, error: BaseException | None) -> None:
        """The send's end: its bytes back to the buffer, its outcome to the callback."""
        if self.buffer is not None:
            self.buffer.give_back(self.size)
        call_back(self.callback, result, error)


def call_back(callback: SendCallback, result: SendResult | None, error: BaseException | None) -> None:
    try:
        callback(result, error)
    except Exception:
        log.exception("a send callback failed")


def settler(future: asyncio.Future[SendResult]) -> SendCallback:
    def settle(result: SendResult | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(cast(SendResult, result))
    return settle


def log_failure(result: SendResult | None, error: BaseException | None) -> None:
    if error is not None:
        log.warning("oneway send failed: %s", error)
