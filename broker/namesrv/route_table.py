"""The name server's table: who serves which topic, and who leads each group.

Per group it holds the registrations of its replicas (identity: role, term, client
address, the members the replica's log names; renewed every 30 s, expired after 120 s)
and, per replica, its topic table, which arrives as versioned changes::

    group g1 ── term 7, leader n2, members (n1, n2, n3) from n2's registration at term 7
      ├─ n1: follower  10.0.0.11:10911  topics at version "a1b2:41"  {orders: (8, 6), ...}
      ├─ n2: leader    10.0.0.12:10911  topics at version "c3d4:17"
      └─ n3: follower  10.0.0.13:10911  building version "e5f6:2" (page 3 of 15 held)

Rules a registration must pass (else ``Refused``, HTTP 403):

* a leader claim with a term below the group's (the highest term a leader claimed) is
  refused, and so is a second leader at the same term while the first is registered;
  any registration with a term below the group's is refused too (that replica is cut off);
* a node outside the group's members, as named by its newest registrations (the leader
  of the highest term; before any leader, any replica), is refused -- unless it claims
  the leadership at a higher term naming itself a member (a new leader after a change).

Topics (``TopicDelta``, ``TopicPage``): a delta applies only to the version it was
computed from; a full table comes in pages that replace the held table when the last
arrives. A delta on another base, or a page out of order, raises ``Resync``: the broker
then sends its full table.

The route of a topic lists the groups whose registered members hold it, each with its
leader (the leader claim of the group's term, while registered) and members' addresses.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from protocol.topic import GroupRouteData, TopicRouteData

__all__ = ["EXPIRY_S", "Refused", "Registration", "Resync", "RouteTable", "TopicDelta", "TopicPage"]

log = logging.getLogger("broker.namesrv")

EXPIRY_S = 120.0

Topics = dict[str, tuple[int, int]]  # topic -> (queues, perm)


class Refused(Exception):
    """A registration the group's state contradicts (HTTP 403); ``reason`` a short tag."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class Resync(Exception):
    """The topic change does not apply to what is held: send the whole table (HTTP 409)."""


@dataclass(frozen=True, slots=True)
class Registration:
    """One replica's identity. ``topics``: a whole table replacing the held one (None:
    keep it; the protocol sends ``TopicDelta`` / ``TopicPage`` instead)."""

    group: str
    node: str
    role: str
    address: str
    topics: Topics | None = None
    term: int = 0
    members: tuple[str, ...] | None = None  # the group's member names, as this replica knows them


@dataclass(frozen=True, slots=True)
class TopicDelta:
    """Changes from version ``base`` ("" = the empty table) to ``version``."""

    base: str
    version: str
    set: Topics = field(default_factory=dict)
    removed: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TopicPage:
    """Page ``page`` (0-based) of ``pages`` of the whole table at ``version``."""

    version: str
    page: int
    pages: int
    set: Topics = field(default_factory=dict)


@dataclass(slots=True)
class _Node:
    reg: Registration
    renewed: float
    topics: Topics = field(default_factory=dict)
    version: str | None = None  # the complete version held (None: none yet)
    building: tuple[str, int, Topics] | None = None  # (version, next page, table so far)


@dataclass(slots=True)
class _Group:
    term: int = -1  # the highest term a leader claimed
    leader: str | None = None  # the node that claimed it
    members: tuple[str, ...] | None = None  # the newest view of the members
    view_from_leader: bool = False
    nodes: dict[str, _Node] = field(default_factory=dict)


class RouteTable:
    """Registrations by group and node. Not thread-safe: the name server's event loop owns it."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, expiry_s: float = EXPIRY_S) -> None:
        self._clock = clock
        self._expiry = expiry_s
        self._groups: dict[str, _Group] = {}
        self._pairs: dict[tuple[int, int], tuple[int, int]] = {}  # one tuple object per value

    # -- registrations ---------------------------------------------------------------
    def register(self, reg: Registration) -> None:
        """Record ``reg`` (renewing its node) or raise Refused (module docstring)."""
        self._expire()
        g = self._groups.setdefault(reg.group, _Group())
        self._check(g, reg)
        if reg.members is not None and (g.members is None or reg.role == "leader"
                                        or (not g.view_from_leader and reg.term >= g.term)):
            g.members, g.view_from_leader = reg.members, reg.role == "leader"
        if reg.role == "leader":
            g.term, g.leader = reg.term, reg.node
        node = g.nodes.get(reg.node)
        if node is None:
            node = g.nodes[reg.node] = _Node(reg, self._clock())
        node.reg, node.renewed = reg, self._clock()
        if reg.topics is not None:
            node.topics, node.version, node.building = self._shared(reg.topics), None, None
        if g.members is not None:  # a view without some node: it leaves the routes at once
            for gone in [n for n in g.nodes if n not in g.members]:
                del g.nodes[gone]

    def _check(self, g: _Group, reg: Registration) -> None:
        held = g.nodes.get(g.leader) if g.leader is not None else None
        if reg.term < g.term:
            kind = "leader claim" if reg.role == "leader" else "registration"
            raise Refused("stale term", f"{kind} of {reg.group}/{reg.node} at term {reg.term} is below the "
                          f"group's term {g.term} (led by {g.leader})")
        if (reg.role == "leader" and reg.term == g.term and held is not None and g.leader != reg.node
                and held.reg.role == "leader"):
            raise Refused("second leader", f"{reg.group}/{reg.node} claims term {reg.term}, which "
                          f"{g.leader} leads")
        if g.members is not None and reg.node not in g.members:
            newer_leader = reg.role == "leader" and reg.term > g.term and reg.node in (reg.members or ())
            if not newer_leader:
                raise Refused("not a member", f"{reg.node} is not a member of {reg.group} (members: "
                              f"{', '.join(g.members)})")

    def sync_topics(self, group: str, node: str, change: TopicDelta | TopicPage) -> str:
        """Apply a topic change for a registered node; the version now held. Raises
        Resync when it does not apply, KeyError when the node is not registered."""
        n = self._groups[group].nodes[node]
        if isinstance(change, TopicDelta):
            held = "" if n.version is None and not n.topics else n.version
            if change.base != held:
                raise Resync(f"topics at version {change.base!r} are not held here (held: {n.version!r})")
            for topic in change.removed:
                n.topics.pop(topic, None)
            n.topics.update(self._shared(change.set))
            n.version = change.version
            return n.version
        if change.page == 0:
            n.building = (change.version, 0, {})
        if n.building is None or n.building[:2] != (change.version, change.page):
            n.building = None
            raise Resync(f"page {change.page} of version {change.version!r} does not follow what is held")
        version, page, table = n.building
        table.update(self._shared(change.set))
        if page + 1 < change.pages:
            n.building = (version, page + 1, table)
            return n.version or ""
        n.topics, n.version, n.building = table, version, None
        return version

    def _shared(self, topics: Topics) -> Topics:
        """``topics`` with interned names and one tuple per (queues, perm): replicas hold
        the same names, and a large table is held once per node, not as fresh strings."""
        pairs, intern = self._pairs, sys.intern
        return {intern(t): pairs.setdefault(v, v) for t, v in topics.items()}

    def _expire(self) -> None:
        now = self._clock()
        for name, g in list(self._groups.items()):
            for node in [n for n, rec in g.nodes.items() if now - rec.renewed > self._expiry]:
                del g.nodes[node]
                log.info("registration of %s/%s expired", name, node)
            if not g.nodes:  # nobody left: the group starts afresh with its next registration
                del self._groups[name]

    # -- reads -----------------------------------------------------------------------
    def live(self) -> list[Registration]:
        self._expire()
        return [n.reg for _, g in sorted(self._groups.items()) for _, n in sorted(g.nodes.items())]

    def topics_of(self, group: str, node: str) -> Topics:
        """The topic table held for a node (a copy)."""
        return dict(self._groups[group].nodes[node].topics)

    def route(self, topic: str) -> TopicRouteData:
        """Groups holding ``topic`` (module docstring for the shape)."""
        self._expire()
        out: list[GroupRouteData] = []
        for name, g in sorted(self._groups.items()):
            holders = [n for n in g.nodes.values() if topic in n.topics]
            if not holders:
                continue
            leader = g.nodes.get(g.leader) if g.leader is not None else None
            pick = leader if leader is not None and topic in leader.topics else holders[-1]
            out.append(GroupRouteData(
                group=name, queues=max(n.topics[topic][0] for n in holders), perm=pick.topics[topic][1],
                leader=leader.reg.address if leader is not None and leader.reg.role == "leader" else None,
                replicas={n: rec.reg.address for n, rec in sorted(g.nodes.items())}))
        return TopicRouteData(topic, tuple(out))

    def cluster(self) -> dict[str, Any]:
        """group -> node -> role, term, address, how many topics and at which version."""
        self._expire()
        return {name: {node: {"role": rec.reg.role, "term": rec.reg.term, "address": rec.reg.address,
                              "topics": len(rec.topics), "topics_version": rec.version}
                       for node, rec in sorted(g.nodes.items())}
                for name, g in sorted(self._groups.items())}
