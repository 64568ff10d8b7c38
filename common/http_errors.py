"""Errors of the HTTP APIs (a replica's control API, the broker's admin API, the name server)
as JSON: a bad request gets a 4xx saying what is wrong, never a 500 page or a traceback.

``read_json(request, Shape)`` decodes a body into a msgspec ``Struct`` (numbers are
coerced from strings; unknown fields ignored) or raises ``HTTPBadRequest`` with
``{"error": ...}`` naming the problem: not JSON, nested too deep, a missing field, a wrong
type, a number out of range (``1e400``). ``json_errors`` (a middleware) turns aiohttp's own
errors (404, 405, 413, ...) into ``{"error": reason}`` with their status, and any other
exception into 500 ``{"error": "internal error; see the log"}``, logging its traceback at
most once a minute per route with a count of the others.

``browser_guard(allowed_origins)`` (a middleware) keeps web pages from driving the API: a
browser names the page that made a request in ``Origin``; a WebSocket upgrade or a request
that may change state (not GET, HEAD, OPTIONS) is refused (403) when it carries an Origin
that is neither allowed nor the API's own (scheme and ``Host``, the host an IP address or
``localhost``: a name could be rebound to 127.0.0.1 by an attacker's DNS). Tools send no
Origin. ``read_json`` refuses a body not sent as ``application/json`` (415): a page cannot
send that type across origins without a CORS preflight, which these APIs never grant.
On plain http every request, a read too, must name the API by an IP address or
``localhost`` in ``Host``: a page on a name rebound to 127.0.0.1 is same-origin to its
browser and could otherwise read the API's answers (with TLS the certificate check stops it).
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

import msgspec
from aiohttp import web

from common.refusal_log import Throttle

__all__ = [
    "browser_guard",
    "foreign_origin",
    "json_error",
    "json_errors",
    "literal_host",
    "read_json",
    "require_json",
]

log = logging.getLogger("dledger.http")

S = TypeVar("S", bound=msgspec.Struct)

LOG_EVERY_S = 60.0

Middleware = Callable[[web.Request, Callable[[web.Request], Awaitable[web.StreamResponse]]],
                      Awaitable[web.StreamResponse]]
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def json_error(status: int, message: str, **fields: object) -> web.Response:
    return web.json_response({"error": message, **fields}, status=status)


def require_json(request: web.Request) -> None:
    """HTTPUnsupportedMediaType (a JSON body) unless the request's body is ``application/json``."""
    if request.content_type != "application/json":
        raise web.HTTPUnsupportedMediaType(
            text=msgspec.json.encode({"error": f"send the body as Content-Type: application/json, not "
                                               f"{request.content_type!r}"}).decode(),
            content_type="application/json")


async def read_json(request: web.Request, shape: type[S]) -> S:
    """The request's JSON body as ``shape``; HTTPBadRequest (a JSON body) if it is not one,
    HTTPUnsupportedMediaType if it was not sent as ``application/json``."""
    require_json(request)
    body = await request.read()
    try:
        return msgspec.json.decode(body, type=shape, strict=False)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise _bad_request(f"bad request body: {e}") from None
    except RecursionError:
        raise _bad_request("bad request body: JSON nested too deeply") from None


def _bad_request(message: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(text=msgspec.json.encode({"error": message}).decode(),
                              content_type="application/json")


_failures = Throttle(LOG_EVERY_S)  # one traceback a minute per route


@web.middleware
async def json_errors(request: web.Request,
                      handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400 or e.content_type == "application/json":
            raise
        headers = {k: v for k, v in e.headers.items() if k.lower() in ("allow", "retry-after")}
        return web.json_response({"error": e.reason}, status=e.status, headers=headers)
    except Exception:
        route = request.match_info.route.resource.canonical if request.match_info.route.resource else "?"
        skipped = _failures.take(f"{request.method} {route}")
        if skipped is not None:
            more = f" ({skipped} more failures of it in the last minute)" if skipped else ""
            log.exception("%s %s failed%s", request.method, route, more)
        return json_error(500, "internal error; see the log")


def foreign_origin(method: str, headers: dict[str, str] | object, scheme: str, host: str,
                   allowed: frozenset[str]) -> str | None:
    """The Origin of a browser request that must be refused (module docstring), else None.
    ``headers``: the request's (a mapping with ``get``)."""
    get = headers.get  # type: ignore[attr-defined]
    upgrade = str(get("Upgrade", "")).lower() == "websocket"
    if method in _SAFE_METHODS and not upgrade:
        return None
    origin = get("Origin")
    if origin is None:
        return None
    origin = str(origin).rstrip("/").lower()
    if origin in allowed:
        return None
    if origin == f"{scheme}://{host}".lower() and literal_host(host):
        return None
    return origin


def literal_host(host: str) -> bool:
    """Whether ``host`` (a Host header) names an IP address or localhost, not a DNS name."""
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    name = name.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def browser_guard(allowed_origins: Iterable[str] = ()) -> Middleware:
    """A middleware refusing (403) WebSocket upgrades and state-changing requests from web
    pages of origins other than the API's own and ``allowed_origins`` (``foreign_origin``)."""
    allowed = frozenset(o.rstrip("/").lower() for o in allowed_origins)

    @web.middleware
    async def guard(request: web.Request,
                    handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        if not request.secure and not literal_host(request.host):
            return json_error(403, f"this API on plain http answers only at an IP address or "
                                   f"localhost, not {request.host!r}: a web page could rebind that "
                                   "name to this host and read it (use TLS for a DNS name)")
        origin = foreign_origin(request.method, request.headers, request.scheme, request.host, allowed)
        if origin is not None:
            return json_error(403, f"requests from the web page of {origin} are refused: a browser "
                                   "may not drive this API (list its origin in allowed_origins "
                                   "if it should)")
        return await handler(request)

    return guard
