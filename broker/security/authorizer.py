"""Whether an authenticated user may do something: the policies of ``broker.state.access``
evaluated for a ``Need`` (a resource and the actions any one of which suffices).

Rules, as RocketMQ ACL 2.0's and stricter:

* a user that no longer exists may do nothing (a connection authenticated before the
  delete loses its rights at the next request);
* a super user may do everything;
* otherwise some action of the need must be allowed by a statement of the user whose
  resource matches and whose source network holds the request's address, and no such
  statement may deny it (deny wins); nothing allowed is denied (default deny).

``Principal`` is one authenticated connection (or admin token): its user, its address, and
its decisions cached by need, valid while the tables' ``version`` is the one they were
taken under -- a send or pull costs a dict lookup once its topic was decided.
"""

from __future__ import annotations

import functools
import ipaddress
from dataclasses import dataclass, field

from broker.state.access import AccessTables, Statement
from protocol.acl import Action, Decision, Resource, ResourceType, parse_resource

__all__ = ["Need", "Principal", "allowed"]

_Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True, slots=True)
class Need:
    """``kind``:``name`` (name "" for the cluster) with any one of ``actions``."""

    kind: ResourceType
    name: str
    actions: tuple[Action, ...]

    def __str__(self) -> str:
        where = "cluster" if self.kind == ResourceType.CLUSTER else f"{self.kind}:{self.name}"
        return f"{'|'.join(self.actions)} on {where}"


@dataclass(slots=True)
class Principal:
    """Who a connection or a token is, and from where (None: the address is unknown)."""

    user: str
    address: _Address | None
    _version: int = -1
    _cache: dict[Need, bool] = field(default_factory=dict)

    @classmethod
    def of(cls, user: str, remote: str | None) -> Principal:
        try:
            address: _Address | None = ipaddress.ip_address(remote) if remote else None
        except ValueError:
            address = None
        return cls(user, address)

    def may(self, tables: AccessTables, need: Need) -> bool:
        """Whether this user may meet ``need`` under ``tables`` (cached per table version)."""
        if tables.version != self._version:
            self._cache.clear()
            self._version = tables.version
        verdict = self._cache.get(need)
        if verdict is None:
            verdict = self._cache[need] = allowed(tables, self.user, self.address, need)
        return verdict


def allowed(tables: AccessTables, user: str, address: _Address | None, need: Need) -> bool:
    """The rules of the module docstring, uncached."""
    credentials = tables.users.get(user)
    if credentials is None:
        return False
    if credentials.super:
        return True
    statements = [s for s in tables.statements_of(user) if _applies(s, need, address)]
    for action in need.actions:
        decisions = {s.decision for s in statements if action in s.actions}
        if Decision.ALLOW in decisions and Decision.DENY not in decisions:
            return True
    return False


def _applies(statement: Statement, need: Need, address: _Address | None) -> bool:
    if not _resource(statement.resource).matches(need.kind, need.name):
        return False
    if not statement.source:
        return True
    return address is not None and address in _network(statement.source)


@functools.lru_cache(maxsize=4096)
def _resource(text: str) -> Resource:
    try:
        return parse_resource(text)
    except ValueError:  # the leader checked it; a bad one matches nothing
        return Resource(ResourceType.TOPIC, "\x00")


@functools.lru_cache(maxsize=1024)
def _network(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    return ipaddress.ip_network(text, strict=False)
