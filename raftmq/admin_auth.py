"""The admin HTTP API's token for the operator commands (``raftmq replica``, ``raftmq leader
transfer``) on a group with ACLs on: the user from the environment or a credentials file
(``client.credentials``), a SCRAM exchange with the replica, one token per process (it is
valid on every replica of the group)."""

from __future__ import annotations

import asyncio

import aiohttp

from client.aio.auth import admin_token
from client.credentials import Credentials

__all__ = ["admin_headers"]

_tokens: dict[str, str] = {}  # credentials file or user -> token


def admin_headers(address: str) -> dict[str, str]:
    """``Authorization`` for ``/admin/...`` of the replica at ``address`` (empty when no
    credentials are given: a group with ACLs off). Raises the client's AuthFailedError."""
    credentials = Credentials.from_env()
    if credentials is None:
        return {}
    token = _tokens.get(credentials.user)
    if token is None:
        async def fetch() -> str:
            async with aiohttp.ClientSession() as session:
                return await admin_token(session, f"http://{address}", credentials)

        token = _tokens[credentials.user] = asyncio.run(fetch())
    return {"Authorization": f"Bearer {token}"}
