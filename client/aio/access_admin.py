"""Users and access policies of the broker groups (``raftmq user`` and ``raftmq acl``).

Users and policies are entries in each group's log: a change goes to every group's leader
(default: every group the client knows), a listing is read from any replica. The password
is turned into a SCRAM record here (``client.credentials.scram_record``): brokers never see it.
Only super users may manage users and policies; a user may change their own password.
RocketMQ access keys (AK/SK, for RocketMQ clients signing with ``AclClientRPCHook``) are
made here, one pair for every group; each group's leader seals the secret key before it
enters its log.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from client.backoff import Deadline
from client.credentials import scram_record
from protocol import access_keys, acl
from protocol.wire import Request

if TYPE_CHECKING:
    from client.aio.admin import AsyncAdmin

__all__ = ["AccessAdmin"]


class AccessAdmin:
    """Over one ``AsyncAdmin`` (its connections and credentials)."""

    def __init__(self, admin: AsyncAdmin) -> None:
        self._admin = admin

    async def _write(self, request: Request, groups: Sequence[str] | None) -> list[str]:
        chosen = await self._admin._groups(groups)
        for g in chosen:
            await self._admin.core.leader_request(g, request, deadline=Deadline(self._admin.timeout))
        return chosen

    async def put_user(self, user: str, password: str, *, super_user: bool = False,
                       groups: Sequence[str] | None = None) -> list[str]:
        """Create ``user`` or set its password (and super flag) on each group."""
        record = scram_record(password)
        request = acl.PutUserRequest(user=user, super=super_user, salt=record.salt,
                                     iterations=record.iterations, stored_key=record.stored_key,
                                     server_key=record.server_key)
        return await self._write(request, groups)

    async def delete_user(self, user: str, groups: Sequence[str] | None = None) -> list[str]:
        """Delete ``user`` and its policies on each group."""
        return await self._write(acl.DeleteUserRequest(user=user), groups)

    async def users(self, group: str | None = None) -> list[acl.UserRow]:
        chosen = await self._admin._groups([group] if group else None)
        reply = await self._admin.core.read_request(chosen[0], acl.ListUsersRequest(), read_from="any")
        return list(acl.UsersResponse.from_frame(reply).users)

    async def grant(self, user: str, resource: str, actions: Sequence[str], *, deny: bool = False,
                    source: str = "", groups: Sequence[str] | None = None) -> list[str]:
        """Allow (or deny) ``user`` the ``actions`` on ``resource`` (from ``source``)."""
        return await self._write(acl.GrantRequest(user=user, resource=resource,
                                                  actions=tuple(acl.Action(a) for a in actions),
                                                  decision=acl.Decision.DENY if deny else acl.Decision.ALLOW,
                                                  source=source), groups)

    async def revoke(self, user: str, resource: str, actions: Sequence[str] = (), *, deny: bool = False,
                     source: str = "", groups: Sequence[str] | None = None) -> list[str]:
        """Take ``actions`` (none: all) from the statement of ``user`` on ``resource``."""
        return await self._write(acl.RevokeRequest(user=user, resource=resource,
                                                   actions=tuple(acl.Action(a) for a in actions),
                                                   decision=acl.Decision.DENY if deny else acl.Decision.ALLOW,
                                                   source=source), groups)

    async def policies(self, user: str | None = None, group: str | None = None) -> list[acl.PolicyRow]:
        chosen = await self._admin._groups([group] if group else None)
        reply = await self._admin.core.read_request(chosen[0], acl.ListPoliciesRequest(user=user),
                                                    read_from="any")
        return list(acl.PoliciesResponse.from_frame(reply).policies)

    async def create_access_key(self, user: str, groups: Sequence[str] | None = None,
                                ) -> tuple[str, str, list[str]]:
        """A new access key of ``user`` on each group: (access key, secret key, groups). The
        secret key is not kept anywhere readable: show it to the operator once."""
        access_key, secret_key = access_keys.new_access_key(), access_keys.new_secret_key()
        request = access_keys.PutAccessKeyRequest(access_key=access_key, user=user, secret_key=secret_key)
        return access_key, secret_key, await self._write(request, groups)

    async def revoke_access_key(self, access_key: str, groups: Sequence[str] | None = None) -> list[str]:
        """Revoke ``access_key`` on each group."""
        return await self._write(access_keys.RevokeAccessKeyRequest(access_key=access_key), groups)

    async def list_access_keys(self, user: str | None = None,
                               group: str | None = None) -> list[access_keys.AccessKeyRow]:
        """The access keys (of ``user``), never their secrets."""
        chosen = await self._admin._groups([group] if group else None)
        reply = await self._admin.core.read_request(chosen[0], access_keys.ListAccessKeysRequest(user=user),
                                                    read_from="any")
        return list(access_keys.AccessKeysResponse.from_frame(reply).access_keys)
