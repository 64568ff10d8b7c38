"""Plumbing every RaftMQ process shares (replicas, brokers, the name server): a subcommand run
alone, one log format, and the HTTP control API's application."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable

from aiohttp import web

from common.http_errors import browser_guard, json_errors

__all__ = ["configure_logging", "control_app", "run_alone"]


def run_alone(argv: list[str] | None, prog: str, description: str,
              configure: Callable[[argparse.ArgumentParser], None],
              run: Callable[[argparse.Namespace], int]) -> int:
    """A subcommand's ``main`` when it runs alone (``python -m ...``): its own parser
    named ``prog``, ``configure``d, then ``run`` with the parsed ``argv``."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    configure(parser)
    return run(parser.parse_args(argv))


def control_app(routes: list[web.RouteDef], max_body: int = 1 << 20) -> web.Application:
    """An HTTP control API: ``routes`` plus ``GET /healthz`` ("ok" while the process
    serves); request bodies up to ``max_body`` bytes; web pages of other origins refused
    (``common.http_errors.browser_guard``)."""
    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application(client_max_size=max_body, middlewares=[json_errors, browser_guard()])
    app.add_routes([*routes, web.get("/healthz", healthz)])
    return app


def configure_logging(level: str) -> None:
    """One format for every process's log lines."""
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
