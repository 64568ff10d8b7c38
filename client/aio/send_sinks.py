"""Where a send's outcome goes (``QueueSender`` settles each message through one): a
whole ``send_batch`` call's future (``CallSink``), or a callback per message (``MessageSink``:
``send_async``, ``send_oneway``, the blocking client's sends -- no task, and a future only
when a caller awaits one).

Event loop only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from client.backoff import Deadline
from client.errors import ClientError
from client.message import Message, SendResult

if TYPE_CHECKING:
    from client.aio.producer import AsyncProducer

__all__ = ["CallSink", "MessageSink", "SendCallback", "call_back", "log_failure", "settler"]

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


class MessageSink:
    """One message sent with a callback (no task; a future only if its caller awaits one,
    and cancelling that future abandons the message if not yet sent). ``retry``: for an
    unordered send, what to do with a retriable failure instead of reporting it."""

    __slots__ = ("callback", "done", "future", "retry")

    def __init__(self, callback: SendCallback, future: asyncio.Future[SendResult] | None = None) -> None:
        self.callback, self.future, self.done = callback, future, False
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
                producer.retry_elsewhere(message, group, whole, self.callback, outcome)
                return
            call_back(self.callback, None, outcome)
        else:
            call_back(self.callback, outcome, None)


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
