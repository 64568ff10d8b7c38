"""Errors of the HTTP APIs (a replica's control API, the broker's admin API, the name server)
as JSON: a bad request gets a 4xx saying what is wrong, never a 500 page or a traceback.

``read_json(request, Shape)`` decodes a body into a msgspec ``Struct`` (numbers are
coerced from strings; unknown fields ignored) or raises ``HTTPBadRequest`` with
``{"error": ...}`` naming the problem: not JSON, nested too deep, a missing field, a wrong
type, a number out of range (``1e400``). ``json_errors`` (a middleware) turns aiohttp's own
errors (404, 405, 413, ...) into ``{"error": reason}`` with their status, and any other
exception into 500 ``{"error": "internal error; see the log"}``, logging its traceback at
most once a minute per route with a count of the others.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import msgspec
from aiohttp import web

from dledger.refusal_log import Throttle

__all__ = ["json_error", "json_errors", "read_json"]

log = logging.getLogger("dledger.http")

S = TypeVar("S", bound=msgspec.Struct)

LOG_EVERY_S = 60.0


def json_error(status: int, message: str, **fields: object) -> web.Response:
    return web.json_response({"error": message, **fields}, status=status)


async def read_json(request: web.Request, shape: type[S]) -> S:
    """The request's JSON body as ``shape``; HTTPBadRequest (a JSON body) if it is not one."""
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
