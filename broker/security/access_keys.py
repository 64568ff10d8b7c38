"""Who signed a RocketMQ request: its access key looked up in the replicated table
(``broker.state.access_keys``), the secret key unsealed with the group's cluster secret
(``broker.security.access_key_seal``), the request's ``Signature`` checked with it
(``protocol.rocketmq.signature``, as RocketMQ's ``PlainAccessValidator`` does). The answer is
the RaftMQ user the key maps to; the RocketMQ front end then serves the request as that
user, through the same ``AccessControl`` checks as a native request.

Refusals (``AccessKeyRefused``, its text the remark a client reads) say what is wrong
without helping a guesser: an unsigned request, an unknown or revoked key and a wrong
signature are told apart (RocketMQ's broker does the same); the secret never appears.

Unsealed secrets are cached per access key while the record's sealed bytes are the same
(a revoked key is refused before the cache is looked at). Threads: the server's event loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from broker.security.access_key_seal import AccessKeySeal, SealError
from broker.store.access_key_commands import PutAccessKey
from protocol.access_keys import check_access_key, check_secret_key
from protocol.rocketmq.signature import SignedRequest

if TYPE_CHECKING:
    from broker.state.access import AccessTables

__all__ = ["AccessKeyRefused", "AccessKeys"]

log = logging.getLogger("broker.access")

#: unsealed secrets kept (the cache is emptied past it)
MAX_CACHED = 4096
#: a record that does not unseal is logged at most this often per access key
LOG_EVERY_S = 60.0


class AccessKeyRefused(Exception):
    """A RocketMQ request whose signature does not prove an access key's secret."""


class AccessKeys:
    def __init__(self, secret: str | bytes | None, group: str, tables: Callable[[], AccessTables]) -> None:
        self.seal = AccessKeySeal(secret, group)
        self._tables = tables
        self._unsealed: dict[str, tuple[bytes, str]] = {}  # access key -> (sealed, secret key)
        self._logged: dict[str, float] = {}

    def record(self, access_key: str, user: str, secret_key: str, created_ms: int) -> PutAccessKey:
        """The log record of a new key, its secret sealed; ValueError for a malformed key or
        secret, SealError when the group has no cluster secret."""
        check_access_key(access_key)
        check_secret_key(secret_key)
        return PutAccessKey(access_key, user, self.seal.seal(access_key, user, secret_key), created_ms)

    def user_of(self, request: SignedRequest) -> str:
        """The user whose access key signed ``request``; AccessKeyRefused saying why not."""
        access_key = request.access_key
        if not access_key:
            raise AccessKeyRefused("this broker has ACLs on: sign requests with an access key "
                                   "(AclClientRPCHook; `raftmq user access-key create USER`)")
        row = self._tables().access_keys.get(access_key)
        if row is None:
            raise AccessKeyRefused(f"access key {access_key[:64]!r} is unknown or revoked")
        secret_key = self._secret(access_key, row.user, row.sealed)
        if not request.signed_with(secret_key):
            raise AccessKeyRefused(f"the signature of access key {access_key!r} does not match the "
                                   "request: a wrong secret key, or the request changed")
        return row.user

    def holds(self, access_key: str, user: str) -> bool:
        """Whether ``access_key`` is still held for ``user`` (not revoked, the user not deleted)."""
        row = self._tables().access_keys.get(access_key)
        return row is not None and row.user == user

    def _secret(self, access_key: str, user: str, sealed: bytes) -> str:
        cached = self._unsealed.get(access_key)
        if cached is not None and cached[0] == sealed:
            return cached[1]
        try:
            secret_key = self.seal.unseal(access_key, user, sealed)
        except SealError as e:
            now = time.monotonic()
            if now - self._logged.get(access_key, -LOG_EVERY_S) >= LOG_EVERY_S:
                self._logged[access_key] = now
                log.error("%s (logged at most once a minute per key)", e)
            raise AccessKeyRefused(f"access key {access_key!r} cannot be used on this broker: its "
                                   "record does not unseal (see the broker log)") from None
        if len(self._unsealed) >= MAX_CACHED:
            self._unsealed.clear()
        self._unsealed[access_key] = (sealed, secret_key)
        return secret_key
