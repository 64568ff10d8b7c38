"""Which consumers of which groups are alive, as this replica hears their heartbeats.

A consumer heartbeats every replica of every group it consumes from, so all
replicas hold the same membership and a consumer may ask any of them for its
group's members (``GET_CONSUMER_LIST``) when it rebalances. Membership is soft
state, not in the log: a member leaves when its connection closes, when it
unregisters, or when it missed heartbeats for ``expiry_s``.

Each registration remembers its connection, so the server can tell the other
members of a group at once when the membership changes
(``NOTIFY_CONSUMER_IDS_CHANGED``) instead of leaving them to find out at their
next periodic rebalance, and the user that connection authenticated as (ACLs on): a
client id registered in a group is that user's while it lives -- another user can
neither register it nor take its orderly locks (``require_owner``: ``ClientIdTaken``).

Bounded (issue 25, row 6): a heartbeat names at most ``MAX_GROUPS`` groups of at most
``MAX_TOPICS`` topics each (``check_subscriptions``), a connection holds at most
``MAX_MEMBERS_PER_CONNECTION`` memberships (``TooManyMembers``), and expiry looks only at
members that expired (they are kept in last-heard order), not at every member per heartbeat.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from protocol.remoting import Frame

__all__ = ["EXPIRY_S", "MAX_GROUPS", "MAX_MEMBERS_PER_CONNECTION", "MAX_TOPICS", "ClientIdTaken",
           "ConsumerRegistry", "ForeignClient", "Member", "TooManyMembers", "check_subscriptions"]

#: A member that sent no heartbeat for this long is dropped (clients beat every 10 s).
EXPIRY_S = 30.0
#: Bounds of what heartbeats may make a replica hold (issue 25, row 6).
MAX_GROUPS = 64
MAX_TOPICS = 256
MAX_MEMBERS_PER_CONNECTION = 256


@runtime_checkable
class ForeignClient(Protocol):
    """A connection in another protocol than RaftMQ's WebSocket (a RocketMQ client,
    ``broker.rocketmq``): the broker's requests to it (membership notices, transaction
    checks) are RaftMQ frames it translates."""

    @property
    def closed(self) -> bool: ...

    async def deliver(self, frame: Frame) -> None:
        """Send a oneway request of the broker's (best effort)."""


class TooManyMembers(Exception):
    """A connection would hold more than MAX_MEMBERS_PER_CONNECTION memberships."""


def check_subscriptions(subscriptions: Mapping[str, Sequence[str]]) -> None:
    """ValueError if a heartbeat names more groups or topics than the bounds allow."""
    if len(subscriptions) > MAX_GROUPS:
        raise ValueError(f"a heartbeat names at most {MAX_GROUPS} groups, not {len(subscriptions)}")
    for group, topics in subscriptions.items():
        if len(topics) > MAX_TOPICS:
            raise ValueError(f"a heartbeat names at most {MAX_TOPICS} topics per group, not "
                             f"{len(topics)} for {group[:80]!r}")


class ClientIdTaken(Exception):
    """A live member of ``group`` has this client id and registered as another user."""

    def __init__(self, group: str, client_id: str) -> None:
        super().__init__(f"client id {client_id!r} of group {group!r} is registered by another user")
        self.group, self.client_id = group, client_id


@dataclass(slots=True)
class Member:
    client_id: str
    topics: tuple[str, ...]
    connection: Hashable
    last_seen: float
    user: str | None = None  # the user its connection authenticated as (ACLs on)


class ConsumerRegistry:
    def __init__(self, clock: Callable[[], float] = time.monotonic, expiry_s: float = EXPIRY_S) -> None:
        self._clock = clock
        self._expiry = expiry_s
        self._groups: dict[str, dict[str, Member]] = {}
        self._heard: OrderedDict[tuple[str, str], None] = OrderedDict()  # oldest heartbeat first
        self._by_connection: dict[Hashable, set[tuple[str, str]]] = {}

    def heartbeat(self, connection: Hashable, client_id: str,
                  subscriptions: Mapping[str, Sequence[str]], user: str | None = None) -> set[str]:
        """Record ``client_id`` as a member of each group in ``subscriptions`` (group ->
        topics), registered by ``user``. Returns the groups whose member set changed.
        ClientIdTaken, before anything changes, if a live member of one of them has that
        client id and another user."""
        for group in subscriptions:
            self.require_owner(group, client_id, user)
        now = self._clock()
        changed = self.expire()
        held = self._by_connection.get(connection, set())
        new = {(g, client_id) for g in subscriptions} - held
        if len(held) + len(new) > MAX_MEMBERS_PER_CONNECTION:
            raise TooManyMembers(f"a connection holds at most {MAX_MEMBERS_PER_CONNECTION} memberships "
                                 f"(client id x group); this one has {len(held)}")
        for group, topics in subscriptions.items():
            members = self._groups.setdefault(group, {})
            old = members.get(client_id)
            if old is None:
                changed.add(group)
            elif old.connection is not connection:
                self._forget_connection(old.connection, (group, client_id))
            members[client_id] = Member(client_id, tuple(sorted(topics)), connection, now, user)
            self._heard[(group, client_id)] = None
            self._heard.move_to_end((group, client_id))
            self._by_connection.setdefault(connection, set()).add((group, client_id))
        return changed

    def require_owner(self, group: str, client_id: str, user: str | None) -> None:
        """ClientIdTaken if a live member of ``group`` has ``client_id`` and a user other than
        ``user`` (without ACLs every user is None: never)."""
        member = self._groups.get(group, {}).get(client_id)
        if member is not None and member.user != user and member.last_seen >= self._clock() - self._expiry:
            raise ClientIdTaken(group, client_id)

    def unregister(self, client_id: str, group: str | None = None, connection: Hashable | None = None,
                   ) -> set[str]:
        """Drop ``client_id`` from ``group`` (every group if None) -- only where it registered
        over ``connection`` when one is given: a client cannot unregister another's."""
        changed = set()
        for name in [group] if group is not None else list(self._groups):
            member = self._groups.get(name, {}).get(client_id)
            if member is not None and (connection is None or member.connection is connection):
                self._remove(name, client_id)
                changed.add(name)
        return changed

    def drop_connection(self, connection: Hashable) -> set[str]:
        """Drop every member registered over ``connection`` (it closed)."""
        changed = set()
        for name, cid in sorted(self._by_connection.get(connection, ())):
            self._remove(name, cid)
            changed.add(name)
        return changed

    def expire(self) -> set[str]:
        """Drop members silent for longer than the expiry; returns the groups changed. Looks
        at the expired members only (and the first live one)."""
        horizon = self._clock() - self._expiry
        changed = set()
        while self._heard:
            name, cid = next(iter(self._heard))
            if self._groups[name][cid].last_seen >= horizon:
                break
            self._remove(name, cid)
            changed.add(name)
        return changed

    def clients(self, group: str) -> list[str]:
        """The live members' client ids, sorted (every member computes the same allocation)."""
        self.expire()
        return sorted(self._groups.get(group, {}))

    def connections(self, group: str) -> list[Hashable]:
        return [m.connection for m in self._groups.get(group, {}).values()]

    def groups(self) -> dict[str, list[Member]]:
        self.expire()
        return {g: sorted(m.values(), key=lambda x: x.client_id) for g, m in sorted(self._groups.items())}

    def _remove(self, group: str, client_id: str) -> None:
        members = self._groups[group]
        member = members.pop(client_id)
        if not members:
            del self._groups[group]
        del self._heard[(group, client_id)]
        self._forget_connection(member.connection, (group, client_id))

    def _forget_connection(self, connection: Hashable, key: tuple[str, str]) -> None:
        held = self._by_connection.get(connection)
        if held is not None:
            held.discard(key)
            if not held:
                del self._by_connection[connection]
