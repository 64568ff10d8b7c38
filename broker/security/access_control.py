"""Authentication and authorization of every request a broker serves, when ``[broker] acl``
is on (issue 15, build item 2; docs/SECURITY.md).

    WebSocket  a connection starts anonymous (``ConnectionAuth``); AUTH_START/AUTH_FINISH
               (SCRAM-SHA-256, ``broker.security.scram_auth``) bind it to a user. Every other request
               of an anonymous connection gets AUTH_FAILED; of a user, the needs of its row
               in ``broker.security.access_map`` are checked (``broker.security.authorizer``): NO_PERMISSION
               naming the user, the resource and the action when one is not met.
    HTTP       ``/admin/...`` needs ``Authorization: Bearer <token>``; a token comes from a
               SCRAM exchange over ``POST /auth/scram`` (two calls), valid ``acl_token_ttl_s`` on
               every replica of the group (600 s by default). 401 without a valid one, 403
               without the right.
               ``/healthz``, ``/status``, ``/metrics`` stay open (no message data).
    bootstrap  ``[broker] acl_bootstrap_file`` holds a super user's SCRAM record (``raftmq
               user hash``); a leader proposes it while the users table has no super user,
               so a group switched to ACLs always has a way in (``run_bootstrap``), and a
               bootstrap user deleted by another super user stays deleted.

Audit: logger ``raftmq.audit``, one line per refused request and per user or policy change
(on the replica that proposed it).

With ``acl`` off nothing is checked (the users and policies still replicate and can be set
up before it is switched on).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import msgspec
from aiohttp import web

from broker.security.access_keys import AccessKeys
from broker.security.access_map import HTTP_ACCESS, OPEN, SUPER_ONLY, needs
from broker.security.authorizer import Need, Principal
from broker.security.scram_auth import (
    TOKEN_TTL_S,
    AdminTokens,
    AuthFailed,
    AuthThrottled,
    PasswordRejected,
    ScramExchange,
    unknown_user_key,
)
from broker.store.commands import PutUser, encode_admin
from broker.store.fragments import MessageGone, read_message_at
from common.http_errors import require_json
from dledger.errors import ProposeError
from protocol.acl import PutUserRequest
from protocol.login_throttle import LoginThrottle
from protocol.message_format import peek_topic
from protocol.remoting import Frame, FrameError, RequestCode, ResponseCode

if TYPE_CHECKING:
    from prometheus_client import Counter

    from broker.replication.write_path import WritePath
    from broker.state.machine import BrokerStateMachine
    from dledger.log import Log

__all__ = ["AUDIT", "AccessControl", "ConnectionAuth", "SuperUserRecord", "current_user", "read_bootstrap"]

AUDIT = logging.getLogger("raftmq.audit")
log = logging.getLogger("broker.access")

BOOTSTRAP_CHECK_S = 1.0
#: HTTP SCRAM exchanges waiting for their second call: at most this many, this long.
MAX_HTTP_EXCHANGES = 1024
#: ... and at most this many from one source address (issue 25, row 9: one filled them all).
MAX_HTTP_EXCHANGES_PER_SOURCE = 8
#: END_TRANSACTION's refusal, the same whether a position holds another group's half or none
_END_REFUSED = ("user {!r} may not end this transaction: it needs pub on the pending half's producer "
                "group and topic")
HTTP_EXCHANGE_S = 10.0


class SuperUserRecord(msgspec.Struct, forbid_unknown_fields=True):
    """The bootstrap file (JSON, ``raftmq user hash``): a super user's SCRAM credentials,
    the keys in hex."""

    user: str
    salt: str
    iterations: int
    stored_key: str
    server_key: str

    def record(self) -> PutUser:
        checked = PutUserRequest(user=self.user, super=True, salt=bytes.fromhex(self.salt),
                                 iterations=self.iterations, stored_key=bytes.fromhex(self.stored_key),
                                 server_key=bytes.fromhex(self.server_key))
        return PutUser(checked.user, True, checked.salt, checked.iterations, checked.stored_key,
                       checked.server_key)


def read_bootstrap(path: Path) -> PutUser:
    """The super user record of a bootstrap file; ValueError saying what is wrong."""
    try:
        return msgspec.json.decode(path.read_bytes(), type=SuperUserRecord).record()
    except (OSError, msgspec.DecodeError, ValueError) as e:
        raise ValueError(f"{path}: not a super user record of `raftmq user hash`: {e}") from None


class ConnectionAuth:
    """One WebSocket's (or one admin HTTP request's) authentication state."""

    def __init__(self, remote: str | None, exchange: ScramExchange | None = None,
                 principal: Principal | None = None) -> None:
        self.remote = remote
        self.exchange = exchange
        self.principal = principal

    @property
    def user(self) -> str | None:
        return None if self.principal is None else self.principal.user


#: The connection of the frame being handled (set per WebSocket and per admin request).
CONNECTION_AUTH: contextvars.ContextVar[ConnectionAuth | None] = contextvars.ContextVar(
    "connection_auth", default=None)


def current_user() -> str | None:
    """The user the connection of the frame being handled authenticated as (None: none, or
    ACLs off)."""
    conn = CONNECTION_AUTH.get()
    return None if conn is None else conn.user


class AuthCounters(Protocol):
    """The series access control feeds (``broker.http_api.metrics.BrokerMetrics`` has them)."""

    @property
    def auth_throttled(self) -> Counter: ...
    @property
    def auth_failures(self) -> Counter: ...


class AccessServer(Protocol):
    """What access control reads of its broker (``BrokerServer`` satisfies it:
    tests/typing_conformance.py): the log, the state machine's access tables, the write path
    for the bootstrap user, the counters."""

    @property
    def rlog(self) -> Log: ...
    @property
    def machine(self) -> BrokerStateMachine: ...
    @property
    def write(self) -> WritePath: ...
    @property
    def metrics(self) -> AuthCounters: ...


class AccessControl:
    def __init__(self, server: AccessServer, *, enabled: bool, bootstrap: PutUser | None = None,
                 token_ttl_s: float = TOKEN_TTL_S) -> None:
        self.enabled = enabled
        self._server = server
        self._bootstrap = bootstrap
        config = server.rlog.config
        self.tokens = AdminTokens(config.secret, config.group, lambda: server.machine.access, token_ttl_s)
        #: RocketMQ's AK/SK signatures (the RocketMQ front end maps a key onto its user)
        self.access_keys = AccessKeys(config.secret, config.group, lambda: server.machine.access)
        self._unknown_key = unknown_user_key(config.secret, config.group)
        self.throttle = LoginThrottle()
        self._http_exchanges: dict[str, tuple[float, ScramExchange, str | None]] = {}

    # -- connections -------------------------------------------------------------------
    def open_connection(self, remote: str | None) -> ConnectionAuth:
        """A new WebSocket: anonymous until it authenticates (the handler's context)."""
        conn = ConnectionAuth(remote, self.exchange(remote))
        CONNECTION_AUTH.set(conn)
        return conn

    def exchange(self, remote: str | None) -> ScramExchange:
        """A SCRAM exchange for a client at ``remote``, its failures counted by the throttle."""
        return ScramExchange(lambda: self._server.machine.access, self._unknown_key,
                             throttle=self.throttle, source=remote)

    def auth_refused(self, remote: str | None, code: int, error: AuthFailed) -> None:
        """Audit a refused AUTH_START/AUTH_FINISH; count failed passwords and throttled tries."""
        if isinstance(error, AuthThrottled):
            self._server.metrics.auth_throttled.inc()
            AUDIT.warning("throttled user=%s from=%s request=%s: %s", error.user or "-", remote or "-",
                          _name(code), error)
            return
        if isinstance(error, PasswordRejected):
            self._server.metrics.auth_failures.inc()
        self.audit_denied(None, remote, code, f"authentication: {error}")

    def authenticated(self, conn: ConnectionAuth, user: str) -> None:
        conn.principal = Principal.of(user, conn.remote)
        log.debug("connection from %s authenticated as %r", conn.remote, user)

    # -- the check of every request ----------------------------------------------------
    def check(self, frame: Frame) -> Frame | None:
        """None if ``frame`` may be served; else its AUTH_FAILED or NO_PERMISSION answer."""
        if not self.enabled or frame.code in OPEN:
            return None
        conn = CONNECTION_AUTH.get()
        if conn is None or conn.principal is None:
            where = None if conn is None else conn.remote
            self.audit_denied(None, where, frame.code, "authentication")
            return self._refuse(frame, ResponseCode.AUTH_FAILED,
                                "authentication required: this broker has ACLs on; connect with "
                                "credentials (a user name and password)")
        principal = conn.principal
        tables = self._server.machine.access
        if principal.user not in tables.users:
            self.audit_denied(principal.user, conn.remote, frame.code, "a user that no longer exists")
            return self._refuse(frame, ResponseCode.AUTH_FAILED,
                                f"user {principal.user!r} no longer exists")
        if frame.code in SUPER_ONLY:
            if tables.users[principal.user].super or _own_password(frame, principal.user):
                return None
            self.audit_denied(principal.user, conn.remote, frame.code, "super user")
            return self._refuse(frame, ResponseCode.NO_PERMISSION,
                                f"user {principal.user!r} may not {_name(frame.code)}: only super users "
                                "manage users and policies")
        try:
            wanted = needs(frame, self)
        except FrameError:
            return None  # unreadable: its handler refuses it the same way
        for need in wanted:
            if not principal.may(tables, need):
                self.audit_denied(principal.user, conn.remote, frame.code, str(need))
                remark = (_END_REFUSED.format(principal.user) if frame.code == RequestCode.END_TRANSACTION
                          else _denied(principal.user, need))  # END_TRANSACTION: no probing for halves
                return self._refuse(frame, ResponseCode.NO_PERMISSION, remark)
        return None

    def require(self, need: Need, code: int | str) -> None:
        """Within a request: FrameError NO_PERMISSION (audited) unless its connection's user
        may ``need`` -- for what only the request's decoded messages say (a half's producer
        group). Nothing when ACLs are off."""
        conn = CONNECTION_AUTH.get()
        if not self.enabled or conn is None or conn.principal is None:
            return
        if not conn.principal.may(self._server.machine.access, need):
            self.audit_denied(conn.principal.user, conn.remote, code, str(need))
            raise FrameError(ResponseCode.NO_PERMISSION, _denied(conn.principal.user, need))

    # -- positions (broker.security.access_map.Positions) -----------------------------------------
    def topic_at(self, position: int) -> str | None:
        try:
            return peek_topic(read_message_at(self._server.rlog.reader, position)[0])
        except (MessageGone, ValueError, OSError):
            return None

    def half_at(self, position: int) -> tuple[str, str] | None:
        held = self._server.machine.halves.get(position)
        if held is None:
            return None
        return held.topic or (self.topic_at(position) or ""), held.group

    def _refuse(self, frame: Frame, code: ResponseCode, remark: str) -> Frame:
        return frame.response(code, remark=remark)

    # -- audit ---------------------------------------------------------------------------
    def audit_denied(self, user: str | None, remote: str | None, code: int | str, need: str) -> None:
        AUDIT.warning("denied user=%s from=%s request=%s needs=%r", user or "-", remote or "-",
                      _name(code), need)

    def audit_change(self, what: str) -> None:
        conn = CONNECTION_AUTH.get()
        AUDIT.warning("change by user=%s from=%s on %s: %s", (conn and conn.user) or "-",
                      (conn and conn.remote) or "-", self._server.rlog.config.node, what)

    # -- bootstrap -------------------------------------------------------------------------
    async def run_bootstrap(self) -> None:
        """On the leader: propose the bootstrap super user while the table has no super user
        (a deleted bootstrap user stays deleted while another super user exists)."""
        if self._bootstrap is None:
            return
        record = self._bootstrap
        while True:
            await asyncio.sleep(BOOTSTRAP_CHECK_S)
            users = self._server.machine.access.users
            if not self._server.rlog.is_leader or any(u.super for u in users.values()):
                continue
            try:
                (applied,) = await self._server.write.send([encode_admin(record)])
            except ProposeError as e:
                log.info("bootstrap super user %r not proposed yet: %s", record.user, e)
                continue
            AUDIT.warning("change by bootstrap on %s: super user %r added from the bootstrap file (%s)",
                          self._server.rlog.config.node, record.user, applied.outcome)

    # -- HTTP ------------------------------------------------------------------------------
    def routes(self) -> list[web.RouteDef]:
        return [web.post("/auth/scram", self._http_scram)]

    @web.middleware
    async def http_middleware(self, request: web.Request,
                              handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
                              ) -> web.StreamResponse:
        """Admin routes need a token and their row's rights; others pass (module docstring)."""
        if not self.enabled or not request.path.startswith("/admin"):
            return await handler(request)
        resource = request.match_info.route.resource
        method = "GET" if request.method == "HEAD" else request.method  # aiohttp adds HEAD to GETs
        rule = HTTP_ACCESS.get((method, resource.canonical if resource is not None else ""))
        if rule is None:
            return _json_error(403, ResponseCode.NO_PERMISSION, f"no access rule for {request.method} "
                                                                f"{request.path}")
        auth = request.headers.get("Authorization", "")
        if not auth.startswith("Bearer "):
            self.audit_denied(None, request.remote, 0, f"HTTP {request.method} {request.path}")
            return _json_error(401, ResponseCode.AUTH_FAILED, "authentication required: POST /auth/scram "
                                                             "for a token, then Authorization: Bearer")
        try:
            user = self.tokens.check(auth.removeprefix("Bearer ").strip())
        except AuthFailed as e:
            self.audit_denied(None, request.remote, 0, f"HTTP {request.method} {request.path}: {e}")
            return _json_error(401, ResponseCode.AUTH_FAILED, str(e))
        principal = Principal.of(user, request.remote)
        for need in rule(request.match_info):
            if not principal.may(self._server.machine.access, need):
                self.audit_denied(user, request.remote, 0, f"HTTP {request.method} {request.path}: {need}")
                return _json_error(403, ResponseCode.NO_PERMISSION, _denied(user, need))
        CONNECTION_AUTH.set(ConnectionAuth(request.remote, principal=principal))
        return await handler(request)

    async def _http_scram(self, request: web.Request) -> web.Response:
        """POST /auth/scram {"message": client-first} -> {"session", "message": server-first};
        then {"session", "message": client-final} -> {"message": server-final, "token",
        "expires_ms"}."""
        require_json(request)
        try:
            doc = await request.json()
            message, session = doc["message"], doc.get("session")
            if not isinstance(message, str) or not isinstance(session, str | None):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            return _json_error(400, ResponseCode.INVALID_ARGUMENT,
                               'body must be JSON {"message": str, "session": str (second call)}')
        now = time.monotonic()
        self._http_exchanges = {k: v for k, v in self._http_exchanges.items() if v[0] > now}
        try:
            if session is None:
                pending = sum(1 for _, _, source in self._http_exchanges.values() if source == request.remote)
                if pending >= MAX_HTTP_EXCHANGES_PER_SOURCE:
                    return _json_error(503, ResponseCode.SYSTEM_BUSY,
                                       f"too many authentications pending from {request.remote} "
                                       f"({pending}); finish them or wait {HTTP_EXCHANGE_S:.0f} s")
                if len(self._http_exchanges) >= MAX_HTTP_EXCHANGES:
                    return _json_error(503, ResponseCode.SYSTEM_BUSY, "too many authentications at once")
                exchange = self.exchange(request.remote)
                first = exchange.start(doc.get("mechanism", "SCRAM-SHA-256"), message)
                session = secrets.token_hex(16)
                self._http_exchanges[session] = (now + HTTP_EXCHANGE_S, exchange, request.remote)
                return web.json_response({"session": session, "message": first})
            _, exchange, _ = self._http_exchanges.pop(session, (0.0, None, None))
            if exchange is None:
                raise AuthFailed("unknown or expired authentication session; start again")
            final = exchange.finish(message)
        except AuthFailed as e:
            step = RequestCode.AUTH_FINISH if session else RequestCode.AUTH_START
            self.auth_refused(request.remote, step, e)
            if isinstance(e, AuthThrottled):
                response = _json_error(429, ResponseCode.AUTH_FAILED, str(e))
                response.headers["Retry-After"] = str(max(1, round(e.throttled.retry_after_s)))
                return response
            return _json_error(401, ResponseCode.AUTH_FAILED, str(e))
        token, expires = self.tokens.issue(exchange.user or "")
        return web.json_response({"message": final, "token": token, "expires_ms": expires,
                                  "user": exchange.user})


def _own_password(frame: Frame, user: str) -> bool:
    """A PUT_USER of the sender's own name that does not make it a super user."""
    if frame.code != RequestCode.PUT_USER:
        return False
    try:
        req = PutUserRequest.from_frame(frame)
    except FrameError:
        return False
    return req.user == user and not req.super


def _denied(user: str, need: Need) -> str:
    return f"user {user!r} may not {need}"


def _name(code: int | str) -> str:
    if isinstance(code, str):  # a request of another protocol, named by its front end
        return code
    try:
        return RequestCode(code).name
    except ValueError:
        return "HTTP" if code == 0 else str(code)


def _json_error(status: int, code: ResponseCode, message: str) -> web.Response:
    return web.json_response({"code": int(code), "error": message, "message": message}, status=status)
