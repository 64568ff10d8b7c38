"""Users and access policies (replicated state): the same on every replica, so any replica
authenticates and authorizes, and a new leader enforces them at once.

A user holds SCRAM-SHA-256 credentials (``protocol.acl``), never a password. A policy
statement is (user, resource, decision, source) -> the actions it covers; granting adds
actions to a statement, revoking takes them away (the statement goes when none is left).
Deleting a user deletes its statements.

RocketMQ access keys (``broker.state.access_keys``) are held here too: a user's keys go
when the user does.

Checkpoint form (only when not empty: a history without users keeps the state's
canonical form, and digest, it always had)::

    "users":    {user: [super, salt, iterations, stored key, server key]}
    "policies": {"user\\0resource\\0decision\\0source": [actions, sorted]}
    "access_keys": see broker.state.access_keys

``version`` counts the changes this replica applied or loaded (not replicated): a
decision cached under one version is stale under another (``broker.security.authorizer``).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from broker.state.access_keys import AccessKeyTable
from broker.store.access_key_commands import ACCESS_KEY_TYPES, AccessKeyRecord
from broker.store.commands import DeleteUser, Grant, PutUser, Revoke

__all__ = ["AccessTables", "Statement", "UserCredentials"]

#: Versions are unique in the process: tables loaded anew (a snapshot installed) never
#: reuse an old table's version.
_VERSIONS = itertools.count(1)


@dataclass(frozen=True, slots=True)
class UserCredentials:
    super: bool
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


@dataclass(frozen=True, slots=True)
class Statement:
    user: str
    resource: str
    decision: str
    source: str
    actions: frozenset[str]


class AccessTables:
    """The apply thread changes them; other threads read ``users``, ``statements_of`` and
    ``version`` (a lookup is atomic; the tables are replaced whole, never changed in place)."""

    def __init__(self, users: Mapping[str, list[Any]] | None = None,
                 policies: Mapping[str, list[str]] | None = None,
                 access_keys: Mapping[str, list[Any]] | None = None) -> None:
        self.users: dict[str, UserCredentials] = {
            name: UserCredentials(bool(row[0]), bytes(row[1]), int(row[2]), bytes(row[3]), bytes(row[4]))
            for name, row in (users or {}).items()}
        self._policies: dict[tuple[str, str, str, str], frozenset[str]] = {
            _split(key): frozenset(actions) for key, actions in (policies or {}).items()}
        self._by_user: dict[str, tuple[Statement, ...]] = {}
        self.access_keys = AccessKeyTable(access_keys)
        self.version = 0
        self._changed()

    def apply(self, cmd: PutUser | DeleteUser | Grant | AccessKeyRecord) -> str | None:
        """Apply one user, policy or access-key record; the reason it changed nothing, else None."""
        if isinstance(cmd, ACCESS_KEY_TYPES):
            why = self.access_keys.apply(cmd, self.users)
            if why is None:
                self.version = next(_VERSIONS)
            return why
        if isinstance(cmd, PutUser):
            self.users = {**self.users, cmd.user: UserCredentials(
                cmd.super, cmd.salt, cmd.iterations, cmd.stored_key, cmd.server_key)}
        elif isinstance(cmd, DeleteUser):
            if cmd.user not in self.users:
                return f"no user {cmd.user!r}"
            self.users = {n: c for n, c in self.users.items() if n != cmd.user}
            self._policies = {k: a for k, a in self._policies.items() if k[0] != cmd.user}
            self.access_keys.forget_user(cmd.user)
        elif isinstance(cmd, Revoke):
            key = (cmd.user, cmd.resource, cmd.decision, cmd.source)
            held = self._policies.get(key)
            if held is None:
                return f"{cmd.user!r} has no {cmd.decision} statement on {cmd.resource}"
            left = held - set(cmd.actions) if cmd.actions else frozenset()
            self._policies = {k: a for k, a in self._policies.items() if k != key}
            if left:
                self._policies[key] = left
        else:
            if cmd.user not in self.users:
                return f"no user {cmd.user!r}: add it first"
            if not cmd.actions:  # a statement covers at least one action: none is never held
                return "a grant names at least one action"
            key = (cmd.user, cmd.resource, cmd.decision, cmd.source)
            self._policies = {**self._policies, key: self._policies.get(key, frozenset()) | set(cmd.actions)}
        self._changed()
        return None

    def statements_of(self, user: str) -> tuple[Statement, ...]:
        return self._by_user.get(user, ())

    def statements(self) -> list[Statement]:
        return [s for _, group in sorted(self._by_user.items()) for s in group]

    def _changed(self) -> None:
        by_user: dict[str, list[Statement]] = {}
        for (user, resource, decision, source), actions in sorted(self._policies.items()):
            by_user.setdefault(user, []).append(Statement(user, resource, decision, source, actions))
        self._by_user = {u: tuple(s) for u, s in by_user.items()}
        self.version = next(_VERSIONS)

    def state(self) -> dict[str, Any]:
        """The checkpoint form: empty when there are no users and no policies."""
        out: dict[str, Any] = {}
        if self.users:
            out["users"] = {n: [c.super, c.salt, c.iterations, c.stored_key, c.server_key]
                            for n, c in sorted(self.users.items())}
        if self._policies:
            out["policies"] = {"\x00".join(k): sorted(a) for k, a in sorted(self._policies.items())}
        return {**out, **self.access_keys.state()}


def _split(key: str) -> tuple[str, str, str, str]:
    user, resource, decision, source = key.split("\x00")
    return user, resource, decision, source
