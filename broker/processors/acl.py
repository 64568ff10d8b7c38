"""Authentication and user/policy requests (the layouts: ``protocol.acl``):

    AUTH_START, AUTH_FINISH      a SCRAM-SHA-256 exchange binding this connection to a user
                                 (any replica: the users table is replicated)
    PUT_USER, DELETE_USER,       through the log on the leader (``broker.store.commands`` kinds
    GRANT, REVOKE                140..143); audited on this replica once applied
    LIST_USERS, LIST_POLICIES    any replica's applied state (never the credentials)

Who may send the management requests is ``broker.security.access_control``'s check (super users;
a user may change their own password).
"""

from __future__ import annotations

import string

from broker.processors.base import Processor
from broker.processors.outcomes import answer
from broker.security.access_control import CONNECTION_AUTH
from broker.security.scram_auth import AuthFailed
from broker.state.outcome import Outcome
from broker.store.commands import DeleteUser, Grant, PutUser, Revoke, encode_admin
from protocol.acl import (
    AuthFinishRequest,
    AuthResponse,
    AuthStartRequest,
    DeleteUserRequest,
    GrantRequest,
    ListPoliciesRequest,
    PoliciesResponse,
    PolicyRow,
    PutUserRequest,
    RevokeRequest,
    UserRow,
    UsersResponse,
    parse_resource,
    parse_source,
)
from protocol.remoting import Frame, FrameError, ResponseCode

__all__ = ["AclProcessor", "validate_user"]

_USER_CHARS = frozenset(string.ascii_letters + string.digits + "_-.@")


def validate_user(name: str) -> str:
    """``name`` if it is a valid user name (1..64 of letters, digits, ``_-.@``)."""
    if not 1 <= len(name) <= 64 or not set(name) <= _USER_CHARS:
        raise FrameError(ResponseCode.INVALID_ARGUMENT,
                         f"user name {name[:70]!r} must be 1 to 64 of: letters, digits, '_', '-', '.', '@'")
    return name


#: the answer to AUTH_START/AUTH_FINISH over plain HTTP (a SCRAM exchange binds a connection)
NOT_ON_A_WEBSOCKET = "authenticate on a WebSocket"


class AclProcessor(Processor):

    async def auth_start(self, frame: Frame) -> Frame:
        req = AuthStartRequest.from_frame(frame)
        if (conn := CONNECTION_AUTH.get()) is None or conn.exchange is None:
            return frame.response(ResponseCode.AUTH_FAILED, remark=NOT_ON_A_WEBSOCKET)
        try:
            return AuthResponse(message=conn.exchange.start(req.mechanism, req.message)).reply(frame)
        except AuthFailed as e:
            return self._failed(frame, e)

    async def auth_finish(self, frame: Frame) -> Frame:
        req = AuthFinishRequest.from_frame(frame)
        if (conn := CONNECTION_AUTH.get()) is None or conn.exchange is None:
            return frame.response(ResponseCode.AUTH_FAILED, remark=NOT_ON_A_WEBSOCKET)
        try:
            final = conn.exchange.finish(req.message)
        except AuthFailed as e:
            return self._failed(frame, e)
        user = conn.exchange.user or ""
        self._server.access.authenticated(conn, user)
        return AuthResponse(message=final, user=user).reply(frame)

    def _failed(self, frame: Frame, error: AuthFailed) -> Frame:
        conn = CONNECTION_AUTH.get()
        self._server.access.auth_refused(conn.remote if conn else None, frame.code, error)
        return frame.response(ResponseCode.AUTH_FAILED, remark=str(error))

    # -- through the log --------------------------------------------------------------------
    async def put_user(self, frame: Frame) -> Frame:
        req = PutUserRequest.from_frame(frame)
        record = PutUser(validate_user(req.user), req.super, req.salt, req.iterations, req.stored_key,
                         req.server_key)
        existed = req.user in self._server.machine.access.users
        what = (f"password of {req.user!r} changed" if existed else f"user {req.user!r} added") + \
            f" (super: {req.super})"
        return await self._propose(frame, record, what)

    async def delete_user(self, frame: Frame) -> Frame:
        user = validate_user(DeleteUserRequest.from_frame(frame).user)
        return await self._propose(frame, DeleteUser(user), f"user {user!r} deleted with its policies")

    async def grant(self, frame: Frame) -> Frame:
        revoke = frame.code == RevokeRequest.CODE
        req = (RevokeRequest if revoke else GrantRequest).from_frame(frame)
        try:
            resource, source = str(parse_resource(req.resource)), parse_source(req.source)
        except ValueError as e:
            raise FrameError(ResponseCode.INVALID_ARGUMENT, str(e)) from None
        actions = tuple(sorted({str(a) for a in req.actions}))
        if not actions and not revoke:
            raise FrameError(ResponseCode.INVALID_ARGUMENT, "grant at least one action")
        kind = Revoke if revoke else Grant
        record = kind(validate_user(req.user), resource, str(req.decision), source, actions)
        what = (f"{'revoked' if revoke else 'granted'} {req.decision} "
                f"{'|'.join(actions) or 'every action'} on {resource} "
                f"{'from ' + source + ' ' if source else ''}{'from' if revoke else 'to'} {req.user!r}")
        return await self._propose(frame, record, what)

    async def _propose(self, frame: Frame, record: PutUser | DeleteUser | Grant, what: str) -> Frame:
        self._server.require_leader()
        (applied,) = await self._server.write.send([encode_admin(record)])
        if applied.outcome == Outcome.DONE:
            self._server.access.audit_change(what)
        return answer(frame, applied)

    # -- reads -------------------------------------------------------------------------------
    async def list_users(self, frame: Frame) -> Frame:
        users = self._server.machine.access.users
        return UsersResponse(users=tuple(UserRow(n, c.super) for n, c in sorted(users.items()))).reply(frame)

    async def list_policies(self, frame: Frame) -> Frame:
        user = ListPoliciesRequest.from_frame(frame).user
        rows = tuple(PolicyRow(s.user, s.resource, s.decision, s.source, tuple(sorted(s.actions)))
                     for s in self._server.machine.access.statements() if user is None or s.user == user)
        return PoliciesResponse(policies=rows).reply(frame)
