"""``BrokerContext``: what a processor may reach of its broker -- the narrow view the
composition root (``broker.remoting.server.BrokerServer``) satisfies, so processors import
neither the server nor the HTTP layer (tests/unit/test_layering.py) and a test can hand them
any object with these attributes (the memory log, a state machine, a write path).

Threads: the server's event loop only.
"""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING, Protocol

from aiohttp import web
from prometheus_client import Counter, Histogram

if TYPE_CHECKING:
    from broker.clients.registry import ConsumerRegistry
    from broker.clients.retry_topics import RetryTopicQuota
    from broker.deferred.service import DeferredService
    from broker.replication.write_path import WritePath
    from broker.security.access_control import AccessControl
    from broker.state.machine import BrokerStateMachine
    from dledger.log import Log

__all__ = ["CONNECTION", "BrokerContext", "ProcessorMetrics"]

#: the client WebSocket whose request is being served (set by the server per request)
CONNECTION: contextvars.ContextVar[web.WebSocketResponse | None] = contextvars.ContextVar(
    "connection", default=None)


class ProcessorMetrics(Protocol):
    """The series processors feed (``broker.http_api.metrics.BrokerMetrics`` has them)."""

    @property
    def sent(self) -> Counter: ...
    @property
    def commit_latency(self) -> Histogram: ...
    @property
    def pulled(self) -> Counter: ...
    @property
    def pull_serve(self) -> Histogram: ...


class BrokerContext(Protocol):
    """One broker replica as its processors see it."""

    @property
    def rlog(self) -> Log: ...
    @property
    def machine(self) -> BrokerStateMachine: ...
    @property
    def write(self) -> WritePath: ...
    @property
    def deferred(self) -> DeferredService: ...
    @property
    def consumers(self) -> ConsumerRegistry: ...
    @property
    def producers(self) -> ConsumerRegistry: ...
    @property
    def access(self) -> AccessControl: ...
    @property
    def retry_quota(self) -> RetryTopicQuota: ...
    @property
    def metrics(self) -> ProcessorMetrics: ...
    @property
    def addresses(self) -> dict[str, str]: ...
    @property
    def max_message_bytes(self) -> int: ...

    def require_leader(self) -> None:
        """Raise ``NotLeader``/``NoLeader`` unless this replica leads (the server answers them)."""
