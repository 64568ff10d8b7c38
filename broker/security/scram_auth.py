"""SCRAM-SHA-256 on the broker's side (RFC 5802/7677, through ``scramp``), and the signed
tokens the admin HTTP API gives after one.

An exchange (``ScramExchange``) is two steps: client-first -> server-first (a fresh server
nonce, the user's salt and iteration count), client-final -> server-final (the client's
proof checked against the StoredKey; the server proves it holds the ServerKey). A captured
exchange replayed gets a new server nonce, so its proof no longer fits: refused. An
unknown user gets a salt derived from the user name under a key of the group secret (the
same on every replica) and the iteration count of new records, and fails at the proof, as a
wrong password does (the answer does not tell which).

An exchange whose proof failed ends its connection's attempts (AUTH_START again: refused).
With a ``LoginThrottle`` an exchange counts its failures by user and source and refuses an
attempt the throttle delays (``AuthThrottled``, before the proof is looked at): when it
starts, and again right before its proof is checked, so exchanges started together have
no more proofs checked than exchanges made one after another.

Admin token (``AdminTokens``), valid on every replica of the group for ``TOKEN_TTL_S``::

    token = base64url(msgpack [user, expires ms, key tag]) "." base64url(HMAC-SHA256)
    key   = HKDF-SHA256(group secret, info = "raftmq-admin-token-v1|" + group)
    key tag = the first 8 bytes of SHA-256(the user's StoredKey)

It is refused once expired, when the user is gone, or when the password changed (the tag
no longer matches).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import time
from collections.abc import Callable

import msgpack
import scramp
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from broker.state.access import AccessTables
from protocol.acl import DEFAULT_ITERATIONS, MECHANISM
from protocol.login_throttle import LoginThrottle, Throttled

__all__ = ["TOKEN_TTL_S", "AdminTokens", "AuthFailed", "AuthThrottled", "PasswordRejected",
           "ScramExchange", "unknown_user_key"]

TOKEN_TTL_S = 600.0
_MECH = scramp.ScramMechanism(MECHANISM)
_TOKEN_LABEL = b"raftmq-admin-token-v1|"
_UNKNOWN_LABEL = b"raftmq-unknown-user-salt-v1|"


class AuthFailed(Exception):
    """Authentication refused; the message is what the client is told."""


class PasswordRejected(AuthFailed):
    """The proof did not fit: a wrong user name or password (a counted failure)."""


class AuthThrottled(AuthFailed):
    """Refused unchecked: too many failures of this user or source (``LoginThrottle``)."""

    def __init__(self, throttled: Throttled, user: str) -> None:
        super().__init__(throttled.message())
        self.throttled = throttled
        self.user = user


def unknown_user_key(secret: str | bytes | None, group: str) -> bytes:
    """The key of unknown users' fake salts: the same on every replica of ``group``."""
    raw = (secret.encode() if isinstance(secret, str) else secret) or b""
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                info=_UNKNOWN_LABEL + group.encode()).derive(raw)


class ScramExchange:
    """One client's exchange; not thread-safe (one connection's frames, or one HTTP
    session). ``user`` is set once the proof checked."""

    def __init__(self, tables: Callable[[], AccessTables], unknown_key: bytes, *,
                 throttle: LoginThrottle | None = None, source: str | None = None) -> None:
        self._tables = tables
        self._unknown_key = unknown_key
        self._throttle = throttle
        self._source = source
        self._server: scramp.core.ScramServer | None = None
        self._name: str | None = None
        self._spent = False
        self.user: str | None = None

    def start(self, mechanism: str, client_first: str) -> str:
        """The server-first message; AuthFailed if the mechanism or the message is wrong or
        an exchange was already started."""
        if mechanism != MECHANISM:
            raise AuthFailed(f"mechanism {mechanism!r} is not supported; use {MECHANISM}")
        if self._server is not None or self.user is not None:
            raise AuthFailed("an authentication was already started on this connection")
        if self._spent:
            raise AuthFailed("an authentication failed on this connection: open a new connection "
                             "to try again")
        self._server = _MECH.make_server(self._auth_info)
        try:
            self._server.set_client_first(client_first)
        except scramp.ScramException as e:
            self._server = None
            raise AuthFailed(f"bad SCRAM client-first message: {e}") from None
        refused = self._throttle and self._throttle.check(self._name or "", self._source)
        if refused:
            self._server, self._spent = None, True
            raise AuthThrottled(refused, self._name or "")
        return self._server.get_server_first()

    def finish(self, client_final: str) -> str:
        """The server-final message; AuthFailed (wrong user or password) otherwise."""
        server, self._server = self._server, None
        if server is None:
            raise AuthFailed("no authentication was started: send AUTH_START first")
        name = self._name or ""
        refused = self._throttle and self._throttle.begin(name, self._source)
        if refused:  # exchanges started together: only as many proofs as checked one by one
            self._spent = True
            raise AuthThrottled(refused, name)
        ok = False
        try:
            server.set_client_final(client_final)
            if name not in self._tables().users:  # deleted meanwhile, or a fake salt's proof
                raise scramp.ScramException("no such user")
            ok = True
        except scramp.ScramException:
            self._spent = True
            raise PasswordRejected(f"wrong user name or password (user {name!r})") from None
        finally:
            if self._throttle is not None:
                self._throttle.end(name, self._source, ok=ok)
        self.user = name
        return server.get_server_final()

    def _auth_info(self, name: str) -> tuple[bytes, bytes, bytes, int]:
        self._name = name
        user = self._tables().users.get(name)
        if user is None:
            fake = hmac.new(self._unknown_key, name.encode(), hashlib.sha256).digest()
            return fake[:16], os.urandom(32), os.urandom(32), DEFAULT_ITERATIONS
        return user.salt, user.stored_key, user.server_key, user.iterations


class AdminTokens:
    """Signs and checks admin tokens for one group (module docstring)."""

    def __init__(self, secret: str | bytes | None, group: str, tables: Callable[[], AccessTables],
                 ttl_s: float = TOKEN_TTL_S, clock: Callable[[], float] = time.time) -> None:
        raw = (secret.encode() if isinstance(secret, str) else secret) or b""
        self._key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                         info=_TOKEN_LABEL + group.encode()).derive(raw)
        self._tables = tables
        self.ttl_s = ttl_s
        self._clock = clock

    def issue(self, user: str) -> tuple[str, int]:
        """(token, expiry in ms since the epoch) for ``user``, who just authenticated."""
        expires = int((self._clock() + self.ttl_s) * 1000)
        payload = msgpack.packb([user, expires, self._tag(user)], use_bin_type=True)
        return f"{_b64(payload)}.{_b64(self._sign(payload))}", expires

    def check(self, token: str) -> str:
        """The token's user; AuthFailed saying why it is refused."""
        try:
            head, _, sig = token.partition(".")
            payload, signature = _unb64(head), _unb64(sig)
        except ValueError:
            raise AuthFailed("malformed admin token") from None
        if not hmac.compare_digest(signature, self._sign(payload)):
            raise AuthFailed("admin token with a bad signature (another group's, or forged)")
        try:
            user, expires, tag = msgpack.unpackb(payload)
        except (ValueError, TypeError, msgpack.UnpackException):
            raise AuthFailed("malformed admin token") from None
        if expires <= self._clock() * 1000:
            raise AuthFailed(f"admin token of {user!r} expired; authenticate again")
        if self._tag(user) != tag:
            raise AuthFailed(f"admin token of {user!r} no longer valid (user deleted or password "
                             "changed)")
        return str(user)

    def _tag(self, user: str) -> bytes:
        credentials = self._tables().users.get(user)
        return b"" if credentials is None else hashlib.sha256(credentials.stored_key).digest()[:8]

    def _sign(self, payload: bytes) -> bytes:
        return hmac.new(self._key, payload, hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (ValueError, TypeError):
        raise ValueError("not base64") from None
