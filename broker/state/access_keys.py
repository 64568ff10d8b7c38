"""RocketMQ access keys (replicated state, issue 27): access key -> the user it acts as and
its secret key, sealed (``broker.security.access_key_seal``: only a holder of the group's
cluster secret unseals it). The same on every replica, in checkpoints, snapshots and
digests -- sealed, so none of them ever holds a secret key in clear.

Checkpoint form (only when not empty: a history without access keys keeps the state's
canonical form, and digest, it always had)::

    "access_keys": {access_key: [user, sealed, created_ms]}

Rules at apply: a key is created once (an access key already held is refused: a second
record cannot replace another's secret), for a user that exists; revoking an unknown key is
refused; deleting a user revokes its keys (``forget_user``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from broker.store.access_key_commands import AccessKeyRecord, PutAccessKey

__all__ = ["AccessKey", "AccessKeyTable"]


@dataclass(frozen=True, slots=True)
class AccessKey:
    user: str
    sealed: bytes
    created_ms: int


class AccessKeyTable:
    """The apply thread changes it; other threads read ``get`` and ``items`` (the table is
    replaced whole, never changed in place)."""

    def __init__(self, rows: Mapping[str, list[Any]] | None = None) -> None:
        self._keys: dict[str, AccessKey] = {
            ak: AccessKey(str(row[0]), bytes(row[1]), int(row[2])) for ak, row in (rows or {}).items()}

    def apply(self, cmd: AccessKeyRecord, users: Mapping[str, object]) -> str | None:
        """Apply one record; the reason it changed nothing, else None. ``users``: who exists."""
        if isinstance(cmd, PutAccessKey):
            if cmd.user not in users:
                return f"no user {cmd.user!r}: add it first"
            if cmd.access_key in self._keys:
                return f"access key {cmd.access_key!r} exists already"
            self._keys = {**self._keys, cmd.access_key: AccessKey(cmd.user, cmd.sealed, cmd.created_ms)}
            return None
        if cmd.access_key not in self._keys:
            return f"no access key {cmd.access_key!r}"
        self._keys = {k: v for k, v in self._keys.items() if k != cmd.access_key}
        return None

    def forget_user(self, user: str) -> None:
        """``user`` was deleted: its keys go with it (a user created again gets none back)."""
        if any(v.user == user for v in self._keys.values()):
            self._keys = {k: v for k, v in self._keys.items() if v.user != user}

    def get(self, access_key: str) -> AccessKey | None:
        return self._keys.get(access_key)

    def items(self) -> list[tuple[str, AccessKey]]:
        return sorted(self._keys.items())

    def __len__(self) -> int:
        return len(self._keys)

    def state(self) -> dict[str, Any]:
        if not self._keys:
            return {}
        return {"access_keys": {ak: [k.user, k.sealed, k.created_ms] for ak, k in sorted(self._keys.items())}}
