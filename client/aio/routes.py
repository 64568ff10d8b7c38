"""Where a topic's queues live and who leads each group.

Routes come from the name servers (``GET /route/{topic}``) or, for a single group
without a name server, from the nodes themselves (``GET_ROUTE``; every node answers
with its group's replicas and the leader it knows). Both have one shape,
``protocol.topic.TopicRouteData``::

    {"topic": T, "groups": [{"group", "queues", "perm", "leader", "replicas": {node: address}}]}

Without a name server the group's replicas are asked, and also the members the last
answer named (members change). Routes are refreshed every ``refresh_s`` (30 s) and at
once when a request fails;
a NOT_LEADER answer moves the group's leader at once (``set_leader``).

A client given neither name servers nor servers uses ``default_namesrv()``:
``$RAFTMQ_NAMESRV`` (comma-separated), else RocketMQ's ``127.0.0.1:9876``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import aiohttp
import msgspec
import yarl

from client.aio.connection import ConnectionPool, certificate_refused, tls_hint
from client.errors import (
    AuthFailedError,
    BrokerError,
    ClientError,
    RouteNotFoundError,
    TlsError,
    TopicNotExistError,
    broker_error,
)
from client.queues import MessageQueue
from protocol.remoting import FrameError, ResponseCode
from protocol.tls import http_url
from protocol.topic import GetRouteRequest, Perm, RouteResponse, TopicRouteData

__all__ = ["DEFAULT_NAMESRV", "GroupRoute", "RouteBook", "TopicRoute", "default_namesrv", "route_url"]

PERM_WRITE = int(Perm.WRITE)
PERM_READ = int(Perm.READ)
DEFAULT_NAMESRV = "127.0.0.1:9876"  # RocketMQ's
#: A stale route kept because no name server answered is used as fresh for this long, then
#: asked for again (sends go on meanwhile instead of waiting for a route that will not come).
STALE_RETRY_S = 1.0


def default_namesrv() -> list[str]:
    """The name servers of a client given none: ``$RAFTMQ_NAMESRV`` (comma-separated),
    else ``DEFAULT_NAMESRV``."""
    listed = [a.strip() for a in os.environ.get("RAFTMQ_NAMESRV", "").split(",") if a.strip()]
    return listed or [DEFAULT_NAMESRV]


@dataclass(slots=True)
class GroupRoute:
    group: str
    queues: int
    perm: int
    leader: str | None
    replicas: dict[str, str] = field(default_factory=dict)

    @property
    def addresses(self) -> list[str]:
        return sorted(self.replicas.values())

    def followers(self) -> list[str]:
        return [a for a in self.addresses if a != self.leader]


@dataclass(slots=True)
class TopicRoute:
    topic: str
    groups: list[GroupRoute]
    fetched_at: float = field(default_factory=time.monotonic)
    # perm -> its queues, sorted: every send asks (a group's perm and queue count never
    # change within a route; a refresh makes a new one)
    _by_perm: dict[int, list[MessageQueue]] = field(default_factory=dict, repr=False, compare=False)

    def queues(self, perm: int = 0) -> list[MessageQueue]:
        queues = self._by_perm.get(perm)
        if queues is None:
            queues = self._by_perm[perm] = sorted(MessageQueue(self.topic, g.group, q) for g in self.groups
                                                  if g.perm & perm == perm for q in range(g.queues))
        return list(queues)

    def group(self, name: str) -> GroupRoute:
        for g in self.groups:
            if g.group == name:
                return g
        raise RouteNotFoundError(f"topic {self.topic!r} has no group {name!r} in its route")


def route_url(namesrv: str, topic: str, tls: bool = False) -> yarl.URL:
    """``GET /route/{topic}`` on ``namesrv`` (https with ``tls``) with the topic percent-encoded
    whole: names may hold '%' and '|', and text like "%ac" in ``%RETRY%acc-g`` must not be
    read as an escape."""
    return yarl.URL(http_url(namesrv, f"/route/{urllib.parse.quote(topic, safe='')}", tls), encoded=True)


def _route(data: TopicRouteData) -> TopicRoute:
    """A route as this client keeps it (leaders and addresses change in place)."""
    groups = [GroupRoute(g.group, g.queues, g.perm, g.leader, dict(g.replicas)) for g in data.groups]
    return TopicRoute(data.topic, groups)


class RouteBook:
    def __init__(self, pool: ConnectionPool, namesrv: Sequence[str] = (), servers: Sequence[str] = (),
                 refresh_s: float = 30.0, address_map: Mapping[str, str] | None = None) -> None:
        if not namesrv and not servers:
            raise ValueError("give namesrv=['host:port'] or servers=['host:port', ...] (one group's nodes)")
        self._pool = pool
        self._namesrv = list(namesrv)
        self._servers = list(servers)
        self._refresh_s = refresh_s
        self._routes: dict[str, TopicRoute] = {}
        self._leaders: dict[str, str | None] = {}  # group -> leader address (newest knowledge)
        self._replicas: dict[str, list[str]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        # broker address as registered -> address to dial (a proxy, a NAT); tests route
        # every client link through Toxiproxy with it
        self._map = dict(address_map or {})

    def fresh(self, topic: str) -> TopicRoute | None:
        """The topic's route if known and fresh (what ``route`` would return without a fetch)."""
        cached = self._routes.get(topic)
        if cached is not None and time.monotonic() - cached.fetched_at < self._refresh_s:
            return cached
        return None

    async def route(self, topic: str, refresh: bool = False) -> TopicRoute:
        cached = self._routes.get(topic)
        if cached is not None and not refresh and time.monotonic() - cached.fetched_at < self._refresh_s:
            return cached
        lock = self._locks.setdefault(topic, asyncio.Lock())
        async with lock:
            cached = self._routes.get(topic)
            if cached is not None and time.monotonic() - cached.fetched_at < 0.2:
                return cached  # refreshed by a concurrent caller just now
            try:
                fresh = await (self._from_namesrv(topic) if self._namesrv else self._from_servers(topic))
            except RouteNotFoundError:
                if cached is not None and not refresh:  # the last one known, used until a retry
                    cached.fetched_at = time.monotonic() - self._refresh_s + STALE_RETRY_S
                    return cached
                raise
            for g in fresh.groups:
                g.replicas = {n: self._map.get(a, a) for n, a in g.replicas.items()}
                g.leader = self._map.get(g.leader, g.leader) if g.leader else None
                self._replicas[g.group] = g.addresses
                if g.leader:
                    self._leaders[g.group] = g.leader
                else:
                    g.leader = self._leaders.get(g.group)
            self._routes[topic] = fresh
            return fresh

    async def _from_namesrv(self, topic: str) -> TopicRoute:
        errors, missing = [], 0
        for ns in self._namesrv:
            try:
                async with self._pool.session.get(route_url(ns, topic, self._pool.tls is not None),
                                                  timeout=aiohttp.ClientTimeout(total=3)) as resp:
                    if resp.status == 404:
                        errors.append(f"{ns}: no group serves topic {topic!r}")
                        missing += 1
                        continue
                    resp.raise_for_status()
                    return _route(msgspec.json.decode(await resp.read(), type=TopicRouteData))
            except aiohttp.ClientConnectorCertificateError as e:
                raise certificate_refused(f"name server {ns}", e) from None
            except (aiohttp.ClientError, TimeoutError, ValueError) as e:  # msgspec's errors are ValueErrors
                errors.append(f"{ns}: {e}{tls_hint(e, self._pool.tls)}")
        if missing == len(self._namesrv):
            raise TopicNotExistError(ResponseCode.TOPIC_NOT_EXIST,
                                     f"no group serves topic {topic!r}; create it with `raftmq topic "
                                     "create` (auto-create is off)")
        raise RouteNotFoundError(f"no route for topic {topic!r} ({'; '.join(errors)}); create the topic "
                                 "with `raftmq topic create` and check the name servers are up")

    async def _from_servers(self, topic: str) -> TopicRoute:
        """Ask every server at once; the answer of the highest term wins. A majority of
        answers is enough (the leader's term is on a majority), so one hung server does not
        make every route lookup wait for its timeout."""
        errors: list[str] = []
        answers: list[TopicRouteData] = []
        missing = 0
        refused: BrokerError | None = None  # a user without the right: not worth retrying
        need = len(self._servers) // 2 + 1
        # the group's members as last answered too: members added since the client started
        # (raftmq replica add) keep it routed after the ones it was given are removed
        asked = list(dict.fromkeys([*self._servers, *(a for g in self._replicas.values() for a in g)]))
        calls = [asyncio.ensure_future(self._pool.call(address, GetRouteRequest(topic=topic), timeout=3))
                 for address in asked]
        try:
            for done in asyncio.as_completed(calls):
                try:
                    reply = await done
                except TlsError:
                    raise  # a refused certificate: the same on every replica and every retry
                except ClientError as e:
                    errors.append(str(e))
                    if isinstance(e, AuthFailedError):
                        refused = e
                    continue
                if reply.code != ResponseCode.SUCCESS:
                    errors.append(f"{reply.remark}")
                    missing += reply.code == ResponseCode.TOPIC_NOT_EXIST
                    if reply.code in (ResponseCode.AUTH_FAILED, ResponseCode.NO_PERMISSION):
                        refused = broker_error(reply.code, reply.remark)
                    continue
                try:
                    answers.append(RouteResponse.from_frame(reply).route)
                except FrameError as e:
                    errors.append(f"{e}")
                    continue
                if len(answers) >= need:
                    break
        finally:
            for call in calls:
                call.cancel()
        best, best_term = None, -1
        for doc in answers:
            term = doc.groups[0].term or 0
            if term > best_term or (term == best_term and best is not None and doc.groups[0].leader):
                best, best_term = doc, term
        if best is None and missing:
            raise TopicNotExistError(ResponseCode.TOPIC_NOT_EXIST,
                                     f"topic {topic!r} does not exist; create it with "
                                     "`raftmq topic create` (auto-create is off)")
        if best is None and refused is not None:
            raise refused
        if best is None:
            raise RouteNotFoundError(f"no route for topic {topic!r}: {'; '.join(errors)}")
        return _route(best)

    @property
    def uses_namesrv(self) -> bool:
        return bool(self._namesrv)

    def leader(self, group: str) -> str | None:
        return self._leaders.get(group)

    def set_leader(self, group: str, address: str | None) -> None:
        address = self._map.get(address, address) if address else None
        self._leaders[group] = address
        for r in self._routes.values():
            for g in r.groups:
                if g.group == group:
                    g.leader = address

    def replicas(self, group: str) -> list[str]:
        return list(self._replicas.get(group, self._servers))

    def leader_candidates(self, group: str) -> list[str]:
        """The known leader first, then the other replicas (a follower names the leader)."""
        leader = self._leaders.get(group)
        rest = [a for a in self.replicas(group) if a != leader]
        return ([leader] if leader else []) + rest

    def dial(self, address: str) -> str:
        """The address to connect to for ``address`` as a broker gives it (``address_map``)."""
        return self._map.get(address, address)

    def topic_of(self, group: str) -> str | None:
        """A topic with queues in ``group`` whose route this book holds (to ask the group's
        replicas for its route), or None."""
        for topic, route in self._routes.items():
            if any(g.group == group for g in route.groups):
                return topic
        return None

    def static_servers(self) -> list[str]:
        """The nodes given as ``servers`` (mapped), when there is no name server."""
        return [self._map.get(a, a) for a in self._servers]

    def known_groups(self) -> list[str]:
        return sorted(self._replicas)

    def register_group(self, group: str, addresses: Sequence[str]) -> None:
        self._replicas[group] = sorted(self._map.get(a, a) for a in addresses)

    def forget(self, topic: str) -> None:
        with contextlib.suppress(KeyError):
            del self._routes[topic]

    async def groups(self) -> dict[str, list[str]]:
        """Every group known to the name servers (or the static servers' group): name -> addresses."""
        if not self._namesrv:  # one group: its name once a route named it
            named = {g: list(a) for g, a in self._replicas.items() if g}
            return named or {"": self.static_servers()}
        for ns in self._namesrv:
            try:
                async with self._pool.session.get(self._pool.url(ns, "/cluster"),
                                                  timeout=aiohttp.ClientTimeout(total=3)) as resp:
                    doc = await resp.json()
                    return {g: sorted(n["address"] for n in nodes.values()) for g, nodes in doc.items()}
            except aiohttp.ClientConnectorCertificateError as e:
                raise certificate_refused(f"name server {ns}", e) from None
            except (aiohttp.ClientError, TimeoutError, ValueError) as e:
                last = e
        raise RouteNotFoundError(f"no name server answered: {last}{tls_hint(last, self._pool.tls)}")
