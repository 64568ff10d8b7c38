"""``MemoryBroker``: a whole ``BrokerContext`` over the memory log, for processor tests with
no server and no socket (issue 26, pattern 19: RocketMQ's processors tested through
``processRequest`` on their store). The parts are the real ones -- the apply step, the write
path, the deferred service, the client registries, access control (off), the long-poll
signal -- wired as ``broker.remoting.server.BrokerServer`` wires them; the leader's clock is
a ``Clock`` the test moves, so store times are known and no test sleeps for a later one.

``memory_broker(one_node_broker)`` is an async context manager (inside the test's event
loop: the long-poll signal belongs to it); it yields the context and, on exit, takes the
signal off the state machine. The log, machine and applier are the ``one_node_broker``
fixture's (tests/unit/conftest.py), which closes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram

from broker.clients.registry import ConsumerRegistry
from broker.clients.retry_topics import RetryTopicQuota
from broker.deferred.service import DeferredService
from broker.processors.deferred import DeferredProcessor
from broker.processors.long_polls import AppliedSignal
from broker.processors.offset import OffsetProcessor
from broker.processors.pull import PullProcessor
from broker.processors.query import QueryProcessor
from broker.processors.send import SendProcessor
from broker.replication.write_path import WritePath
from broker.security.access_control import AccessControl
from broker.state.machine import BrokerStateMachine
from broker.store.commands import CreateTopic, encode_admin
from dledger.applier import Applier
from dledger.errors import NotLeader
from dledger.log import Log
from protocol.message_format import MAX_MESSAGE_BYTES
from protocol.remoting import Frame

__all__ = ["T0", "Clock", "MemoryBroker", "ProcessorCounters", "memory_broker", "run_on_topic"]

T0 = 1_900_000_000_000  # the leader's clock starts here (ahead of any real store time)


@dataclass
class Clock:
    """The leader's clock in ms (store times, delivery times); the test moves ``now_ms``."""

    now_ms: int = T0

    def __call__(self) -> int:
        return self.now_ms


@dataclass
class ProcessorCounters:
    """``ProcessorMetrics`` in a registry of their own (the test reads them back)."""

    registry: CollectorRegistry
    sent: Counter
    commit_latency: Histogram
    pulled: Counter
    pull_serve: Histogram

    @classmethod
    def fresh(cls) -> ProcessorCounters:
        registry = CollectorRegistry()
        return cls(registry, Counter("sent", "messages stored", registry=registry),
                   Histogram("commit_latency", "send to outcome", registry=registry),
                   Counter("pulled", "messages pulled", registry=registry),
                   Histogram("pull_serve", "pull served", registry=registry))

    def value(self, sample: str) -> float:
        """A sample's value now (``sent_total``, ``commit_latency_count``, ...; 0 if none)."""
        return self.registry.get_sample_value(sample) or 0.0


@dataclass
class MemoryBroker:
    """One replica as its processors see it (``broker.processors.context.BrokerContext``)."""

    rlog: Log
    machine: BrokerStateMachine
    write: WritePath
    deferred: DeferredService
    signal: AppliedSignal
    clock: Clock
    consumers: ConsumerRegistry = field(default_factory=ConsumerRegistry)
    producers: ConsumerRegistry = field(default_factory=ConsumerRegistry)
    metrics: ProcessorCounters = field(default_factory=ProcessorCounters.fresh)
    addresses: dict[str, str] = field(default_factory=lambda: {"n1": "127.0.0.1:9876"})
    max_message_bytes: int = MAX_MESSAGE_BYTES
    #: False: ``require_leader`` refuses, as on a follower
    leading: bool = True
    access: AccessControl = field(init=False)
    retry_quota: RetryTopicQuota = field(init=False)
    _opaque: int = 0

    def __post_init__(self) -> None:
        self.access = AccessControl(self, enabled=False)  # type: ignore[arg-type]  # no AuthCounters read
        self.retry_quota = RetryTopicQuota(lambda: self.machine.topics)

    # -- the processors under test, each on this context (as BrokerServer builds them)
    @functools.cached_property
    def sends(self) -> SendProcessor:
        return SendProcessor(self)

    @functools.cached_property
    def pulls(self) -> PullProcessor:
        return PullProcessor(self.machine, self.rlog, self.signal, self.metrics)

    @functools.cached_property
    def offsets(self) -> OffsetProcessor:
        return OffsetProcessor(self)

    @functools.cached_property
    def queries(self) -> QueryProcessor:
        return QueryProcessor(self)

    @functools.cached_property
    def deferred_requests(self) -> DeferredProcessor:
        return DeferredProcessor(self)

    def require_leader(self) -> None:
        if not self.leading:
            raise NotLeader("n2", "127.0.0.1:9877")

    async def call(self, handler: Callable[[Frame], Awaitable[Frame]], request: object) -> Frame:
        """``handler``'s answer to ``request`` (a typed request) sent as a frame, a new opaque each."""
        self._opaque += 1
        frame: Frame = request.to_frame(self._opaque)  # type: ignore[attr-defined]
        answer = await handler(frame)
        assert answer.opaque == frame.opaque
        return answer

    async def create_topic(self, topic: str, queues: int = 1) -> None:
        """``topic`` created through the log (as CREATE_TOPIC does)."""
        (applied,) = await self.write.send([encode_admin(CreateTopic(topic, queues))])
        assert applied.outcome == "done", applied.reason


@contextlib.asynccontextmanager
async def memory_broker(parts: tuple[Log, BrokerStateMachine, Applier], *,
                        max_message_bytes: int = MAX_MESSAGE_BYTES) -> AsyncIterator[MemoryBroker]:
    """``max_message_bytes``: the broker's ``[broker] max_message_bytes``."""
    rlog, machine, applier = parts
    clock = Clock()
    write = WritePath(rlog, machine, applier, clock_ms=clock, max_message_bytes=max_message_bytes)
    signal = AppliedSignal(asyncio.get_running_loop())
    machine.on_queues_grown.append(signal.notify)  # parked pulls wake by queue
    broker = MemoryBroker(rlog, machine, write, DeferredService(rlog, machine, write, ConsumerRegistry(),
                                                                clock_ms=clock), signal, clock,
                          max_message_bytes=max_message_bytes)
    broker.producers = broker.deferred.producers
    try:
        yield broker
    finally:
        machine.on_queues_grown.remove(signal.notify)


def run_on_topic(parts: tuple[Log, BrokerStateMachine, Applier], topic: str, queues: int,
                 scenario: Callable[[MemoryBroker], Awaitable[None]], timeout: float = 60) -> None:
    """Run ``scenario`` on a ``MemoryBroker`` over ``parts`` (the ``one_node_broker``
    fixture) once ``topic`` exists with ``queues`` queues, in an event loop of its own, within
    ``timeout`` seconds."""
    async def main() -> None:
        async with memory_broker(parts) as broker:
            await broker.create_topic(topic, queues)
            await scenario(broker)

    asyncio.run(asyncio.wait_for(main(), timeout))
