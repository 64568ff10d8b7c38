"""``ServerView``: what the HTTP endpoints (admin API, ``/metrics``, members, verify) read of
their broker -- a protocol ``broker.remoting.server.BrokerServer`` satisfies
(tests/typing_conformance.py), so this folder types against no module of ``remoting/`` and
the server, which builds the routes, is the only side that imports the other."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import aiohttp

    from broker.clients.registry import ConsumerRegistry
    from broker.deferred.overdue import OverdueWatch
    from broker.http_api.metrics import BrokerMetrics
    from broker.replication.divergence import DivergenceCheck
    from broker.replication.write_path import WritePath
    from broker.state.machine import BrokerStateMachine
    from dledger.applier import Applier
    from dledger.log import Log
    from protocol.remoting import Frame

__all__ = ["ServerView"]


class ServerView(Protocol):
    """One broker replica as its HTTP endpoints see it."""

    @property
    def rlog(self) -> Log: ...
    @property
    def applier(self) -> Applier: ...
    @property
    def machine(self) -> BrokerStateMachine: ...
    @property
    def write(self) -> WritePath: ...
    @property
    def consumers(self) -> ConsumerRegistry: ...
    @property
    def metrics(self) -> BrokerMetrics: ...
    @property
    def divergence(self) -> DivergenceCheck: ...
    @property
    def overdue(self) -> OverdueWatch: ...
    @property
    def addresses(self) -> dict[str, str]: ...

    def http_session(self) -> aiohttp.ClientSession:
        """The session for calls to peers (their ``peer_url``s)."""
    def peer_url(self, address: str, path: str) -> str: ...
    async def handle(self, frame: Frame) -> Frame: ...
    def require_leader(self) -> None: ...
    def lag_rows(self, group: str) -> list[dict[str, object]]: ...
    async def transfer_leadership(self, to: str | None = None, timeout: float = 3.0) -> str | None: ...
