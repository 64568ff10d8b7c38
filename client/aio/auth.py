"""Authenticating to a broker with SCRAM-SHA-256 (``protocol.acl``): on a new WebSocket,
before any other request (``login``), and over HTTP for an admin token (``admin_token``).

The client checks the broker's final signature too: a process that does not hold the
user's ServerKey (a fake broker) cannot complete the exchange.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import aiohttp
import scramp

from client.credentials import Credentials
from client.errors import AuthFailedError, ConnectionLostError, broker_error
from protocol.acl import MECHANISM, AuthFinishRequest, AuthResponse, AuthStartRequest
from protocol.remoting import ResponseCode

if TYPE_CHECKING:
    from client.aio.connection import Connection

__all__ = ["admin_token", "login"]


async def login(conn: Connection, credentials: Credentials, timeout: float = 10.0) -> str:
    """Authenticate ``conn`` as ``credentials.user``; returns the user name. Raises
    AuthFailedError (wrong user or password; not retriable) or the connection's errors."""
    client = scramp.ScramClient([MECHANISM], credentials.user, credentials.password)
    first = await conn.call(AuthStartRequest(mechanism=MECHANISM, message=client.get_client_first()), timeout)
    if first.code != ResponseCode.SUCCESS:
        raise broker_error(first.code, first.remark, conn.address)
    try:
        client.set_server_first(AuthResponse.from_frame(first).message)
        final_message = client.get_client_final()
    except scramp.ScramException as e:
        raise AuthFailedError(ResponseCode.AUTH_FAILED, f"bad SCRAM answer: {e}", conn.address) from None
    final = await conn.call(AuthFinishRequest(message=final_message), timeout)
    if final.code != ResponseCode.SUCCESS:
        raise broker_error(final.code, final.remark, conn.address)
    _check_server(client, AuthResponse.from_frame(final).message, conn.address)
    return credentials.user


async def admin_token(session: aiohttp.ClientSession, base_url: str, credentials: Credentials,
                      timeout: float = 10.0) -> str:
    """A token for the broker's admin HTTP API at ``base_url`` (``http://host:port``), valid
    on every replica of its group for a few minutes. Raises AuthFailedError or
    ConnectionLostError."""
    client = scramp.ScramClient([MECHANISM], credentials.user, credentials.password)
    url = f"{base_url}/auth/scram"
    first = await _post(session, url, {"message": client.get_client_first()}, timeout)
    try:
        client.set_server_first(first["message"])
        final_message = client.get_client_final()
    except scramp.ScramException as e:
        raise AuthFailedError(ResponseCode.AUTH_FAILED, f"bad SCRAM answer: {e}", base_url) from None
    final = await _post(session, url, {"session": first["session"], "message": final_message}, timeout)
    _check_server(client, final["message"], base_url)
    return str(final["token"])


async def _post(session: aiohttp.ClientSession, url: str, doc: dict[str, str],
                timeout: float) -> dict[str, str]:
    try:
        async with session.post(url, json=doc, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            body = await resp.json(content_type=None)
            if resp.status != 200:
                raise broker_error(int(body.get("code", ResponseCode.AUTH_FAILED)),
                                   str(body.get("error", resp.reason)), url)
            return dict(body)
    except (aiohttp.ClientError, TimeoutError, ValueError) as e:
        raise ConnectionLostError(f"cannot authenticate at {url}: {e}") from None


def _check_server(client: scramp.ScramClient, server_final: str, where: str) -> None:
    try:
        client.set_server_final(server_final)
    except scramp.ScramException as e:
        raise AuthFailedError(ResponseCode.AUTH_FAILED, f"the broker could not prove it knows this "
                                                        f"user's key: {e}", where) from None
