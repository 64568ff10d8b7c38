"""Client calls that broker tests make again and again, against any broker addresses
(``servers=``): a topic created, a push consumer keeping what it receives, and the dead
letters of a consumer group once there are some. Each closes the clients it opens, except
the consumer it returns (the caller shuts it down)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from client import Admin, ClientTls, ConsumeStatus, PullConsumer, PushConsumer, ReceivedMessage
from tests.support.procs import wait_until

__all__ = ["Listener", "collecting_consumer", "create_topic_at", "dead_letters"]

Listener = Callable[[list[ReceivedMessage], Any], ConsumeStatus]


def create_topic_at(servers: list[str], topic: str, queues: int, tls: ClientTls | bool = False) -> None:
    """``topic`` created with ``queues`` queues through an Admin on ``servers``."""
    admin = Admin(servers=servers, tls=tls)
    try:
        admin.create_topic(topic, queues=queues)
    finally:
        admin.close()


def collecting_consumer(servers: list[str], topic: str, group: str, listener: Listener | None = None,
                        **options: Any) -> tuple[PushConsumer, list[ReceivedMessage]]:
    """A started PushConsumer of ``group`` on ``topic`` from its first message (``options``:
    more PushConsumer arguments) and the list its default listener appends each message it
    receives to (under a lock), then consumes it; ``listener`` replaces that listener (the
    list stays empty)."""
    got: list[ReceivedMessage] = []
    lock = threading.Lock()

    def keep(msgs: list[ReceivedMessage], ctx: Any) -> ConsumeStatus:
        with lock:
            got.extend(msgs)
        return ConsumeStatus.SUCCESS

    consumer = PushConsumer(servers=servers, group=group, topic=topic, from_where="first", **options)
    consumer.register(listener or keep)
    consumer.start()
    return consumer, got


def dead_letters(servers: list[str], group: str, timeout: float) -> list[ReceivedMessage]:
    """The messages in ``%DLQ%group`` (its first queue, from offset 0) as soon as there are
    any; TimeoutError after ``timeout`` s (a pull that fails meanwhile counts as none yet)."""
    pc = PullConsumer(servers=servers, group="inspect", read_from="any")
    try:
        return wait_until(lambda: pc.pull(pc.queues(f"%DLQ%{group}")[0], 0).messages, timeout,
                          what=f"a message in %DLQ%{group}")
    finally:
        pc.shutdown()
