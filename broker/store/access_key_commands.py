"""The records of RocketMQ access keys (AK/SK, issue 27): each a msgpack array whose first
element is its kind (``broker.store.commands`` routes kinds 144..145 here). A super user's
request makes the leader propose them; the apply step (``broker.state.access_keys``) keeps
them beside the users::

    kind  record                                                   effect at apply
    ----  -------------------------------------------------------  ------------------------------
     144  [144, access_key, user, sealed, created_ms]              a new access key of ``user``:
                                                                   its secret key sealed with the
                                                                   cluster secret (broker.security.
                                                                   access_key_seal), never in clear
     145  [145, access_key]                                        revoke it

``created_ms`` is the leader's clock when it proposed the key (shown by ``list``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["ACCESS_KEY_KINDS", "ACCESS_KEY_TYPES", "AccessKeyKind", "AccessKeyRecord", "PutAccessKey",
           "RevokeAccessKey", "access_key_row", "decode_access_key"]


class AccessKeyKind(enum.IntEnum):
    PUT_ACCESS_KEY = 144
    REVOKE_ACCESS_KEY = 145


ACCESS_KEY_KINDS = frozenset(int(k) for k in AccessKeyKind)


@dataclass(frozen=True, slots=True)
class PutAccessKey:
    """``access_key`` of ``user``; ``sealed``: its secret key, sealed (never the secret key)."""

    access_key: str
    user: str
    sealed: bytes
    created_ms: int


@dataclass(frozen=True, slots=True)
class RevokeAccessKey:
    access_key: str


AccessKeyRecord = PutAccessKey | RevokeAccessKey
ACCESS_KEY_TYPES = (PutAccessKey, RevokeAccessKey)


def access_key_row(record: AccessKeyRecord) -> list[object]:
    """The msgpack array of ``record``."""
    if isinstance(record, PutAccessKey):
        return [AccessKeyKind.PUT_ACCESS_KEY, record.access_key, record.user, record.sealed,
                record.created_ms]
    return [AccessKeyKind.REVOKE_ACCESS_KEY, record.access_key]


def decode_access_key(kind: int, args: list[object]) -> AccessKeyRecord:
    """The record of ``kind`` from its array's other elements; ValueError if malformed."""
    if kind == AccessKeyKind.PUT_ACCESS_KEY:
        access_key, user, sealed, created_ms = args
        if not (isinstance(access_key, str) and access_key and isinstance(user, str) and user
                and isinstance(sealed, bytes) and sealed and type(created_ms) is int):
            raise ValueError("bad put-access-key record")
        return PutAccessKey(access_key, user, sealed, created_ms)
    (access_key,) = args
    if not (isinstance(access_key, str) and access_key):
        raise ValueError("bad revoke-access-key record")
    return RevokeAccessKey(access_key)
