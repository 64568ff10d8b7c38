"""Plumbing shared by every replica process (log node, broker) and the name server: the
command line, logging, and the HTTP control API's application."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

from aiohttp import web

from dledger.config import ConfigError, load_group_config
from dledger.http_errors import browser_guard, json_errors
from dledger.replicated_log import ReplicatedLog

__all__ = ["add_replica_arguments", "configure_logging", "control_app", "open_replica", "run_alone"]

T = TypeVar("T")


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
    (``dledger.http_errors.browser_guard``)."""
    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application(client_max_size=max_body, middlewares=[json_errors, browser_guard()])
    app.add_routes([*routes, web.get("/healthz", healthz)])
    return app


def configure_logging(level: str) -> None:
    """One format for every process's log lines."""
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def add_replica_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, required=True, help="node TOML file")
    parser.add_argument("--insecure", action="store_true",
                        help="allow a group without a cluster secret (its Raft port then runs what it "
                             "is sent), and a broker listening where other hosts reach it without TLS "
                             "and ACLs (a WARNING at every start; tests only)")
    parser.add_argument("--repair-log", action="store_true",
                        help="cut the CommitLog at a corrupt record and re-fetch the rest")
    parser.add_argument("--log-level", default="INFO")


def open_replica(args: argparse.Namespace,
                 read_extra: Callable[[Path], T] = lambda _path: None,
                 sections: Iterable[str] = ("node", "group", "raft")) -> tuple[ReplicatedLog, T]:
    """Configure logging, load and check the config (and ``read_extra`` of the same file,
    whose top-level tables are ``sections``), open the replica. Any problem is printed as
    one ``error:`` line and exits with 2."""
    configure_logging(args.log_level)
    try:
        config = load_group_config(args.config, insecure=args.insecure, repair_log=args.repair_log,
                                   other_sections=[s for s in sections if s not in ("node", "group", "raft")])
        extra = read_extra(args.config)
        return ReplicatedLog(config), extra
    except (ConfigError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
    except Exception as e:  # CorruptLogError and friends: say it plainly
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
    raise SystemExit(2)
