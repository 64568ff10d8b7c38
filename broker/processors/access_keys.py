"""RocketMQ access keys (the layouts: ``protocol.access_keys``):

    PUT_ACCESS_KEY       the secret key sealed with the cluster secret (``broker.security.
                         access_keys``), then through the log on the leader (``broker.store.
                         access_key_commands`` kind 144); audited once applied -- never the secret
    REVOKE_ACCESS_KEY    through the log (kind 145)
    LIST_ACCESS_KEYS     any replica's applied state: access keys, users, creation times

Only super users send them (``broker.security.access_map.SUPER_ONLY``).
"""

from __future__ import annotations

import time

from broker.processors.acl import validate_user
from broker.processors.base import Processor
from broker.processors.outcomes import answer
from broker.security.access_key_seal import SealError
from broker.state.outcome import Outcome
from broker.store.access_key_commands import AccessKeyRecord, RevokeAccessKey
from broker.store.commands import encode_admin
from protocol.access_keys import (
    AccessKeyRow,
    AccessKeysResponse,
    ListAccessKeysRequest,
    PutAccessKeyRequest,
    RevokeAccessKeyRequest,
    check_access_key,
)
from protocol.remoting import Frame, FrameError, ResponseCode

__all__ = ["AccessKeyProcessor"]


class AccessKeyProcessor(Processor):

    async def put_access_key(self, frame: Frame) -> Frame:
        req = PutAccessKeyRequest.from_frame(frame)
        user = validate_user(req.user)
        self._server.require_leader()
        try:
            record = self._server.access.access_keys.record(req.access_key, user, req.secret_key,
                                                            int(time.time() * 1000))
        except (ValueError, SealError) as e:  # SealError: a group without a cluster secret
            raise FrameError(ResponseCode.INVALID_ARGUMENT, str(e)) from None
        return await self._propose(frame, record, f"access key {req.access_key!r} added for {user!r}")

    async def revoke_access_key(self, frame: Frame) -> Frame:
        access_key = RevokeAccessKeyRequest.from_frame(frame).access_key
        try:
            check_access_key(access_key)
        except ValueError as e:
            raise FrameError(ResponseCode.INVALID_ARGUMENT, str(e)) from None
        self._server.require_leader()
        return await self._propose(frame, RevokeAccessKey(access_key), f"access key {access_key!r} revoked")

    async def list_access_keys(self, frame: Frame) -> Frame:
        user = ListAccessKeysRequest.from_frame(frame).user
        held = self._server.machine.access.access_keys.items()
        rows = tuple(AccessKeyRow(ak, k.user, k.created_ms) for ak, k in held if user in (None, k.user))
        return AccessKeysResponse(access_keys=rows).reply(frame)

    async def _propose(self, frame: Frame, record: AccessKeyRecord, what: str) -> Frame:
        (applied,) = await self._server.write.send([encode_admin(record)])
        if applied.outcome == Outcome.DONE:
            self._server.access.audit_change(what)
        return answer(frame, applied)
