"""The admin HTTP API's token for the operator tools (``raftmq replica``, ``raftmq leader
transfer``, the local clusters' helpers) on a group with ACLs on: a SCRAM exchange with
the replica over ``POST /auth/scram`` (https when the cluster serves TLS), from a blocking
caller. ``raftmq.cluster_http.ClusterHttp`` keeps the tokens and sends them."""

from __future__ import annotations

import asyncio

import aiohttp

from client.aio.auth import admin_token
from client.credentials import Credentials
from protocol.tls import ClientTls, http_url

__all__ = ["fetch_admin_token"]


def fetch_admin_token(address: str, credentials: Credentials, tls: ClientTls | None = None,
                      timeout: float = 10.0) -> str:
    """A token for ``/admin/...`` of the replica at ``address`` (valid on every replica of
    its group for ``[broker] acl_token_ttl_s``). Must not be called from a running event
    loop. Raises the client's AuthFailedError (wrong user or password) or ConnectionLostError."""
    async def fetch() -> str:
        connector = aiohttp.TCPConnector(ssl=tls.context() if tls is not None else True)
        async with aiohttp.ClientSession(connector=connector) as session:
            return await admin_token(session, http_url(address, "", tls is not None), credentials, timeout)

    return asyncio.run(fetch())
