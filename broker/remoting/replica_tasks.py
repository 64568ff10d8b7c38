"""The broker server's background tasks, run while its app serves (``BrokerServer.app``'s
cleanup context): the leader's deferred-message loop (``broker.deferred.service``), the
overdue watch (``broker.deferred.overdue``), the divergence check (``broker.replication.divergence``), the ACL
bootstrap (``broker.security.access_control``), and the trimming of derived files.

    derived files   ConsumeQueue and IndexFile files that point only at deleted CommitLog
                    segments go with them: checked every ``TRIM_CHECK_S``, off the loop
    overdue         checked every ``OVERDUE_CHECK_S``; a failure is logged, the next is fresh

Every task is cancelled and awaited when the app stops; the peers' HTTP session closes last.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from broker.remoting.server import BrokerServer

__all__ = ["OVERDUE_CHECK_S", "TRIM_CHECK_S", "run_background"]

log = logging.getLogger("broker.server")

OVERDUE_CHECK_S = 5.0
TRIM_CHECK_S = 5.0


async def run_background(server: BrokerServer, app: web.Application) -> AsyncIterator[None]:
    """aiohttp cleanup context: the tasks start with the app and stop with it."""
    tasks = [asyncio.create_task(server.deferred.run()), asyncio.create_task(_watch_overdue(server)),
             asyncio.create_task(server.divergence.run()), asyncio.create_task(_trim_derived(server)),
             asyncio.create_task(server.access.run_bootstrap())]
    yield
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await server.close_http_session()


async def _trim_derived(server: BrokerServer) -> None:
    trimmed_at = -1
    while True:
        await asyncio.sleep(TRIM_CHECK_S)
        start = server.rlog.reader.start_position
        if start == trimmed_at:
            continue
        try:
            removed = await asyncio.get_running_loop().run_in_executor(None, server.machine.trim, start)
        except Exception:
            log.exception("trimming the derived files failed")
            continue
        trimmed_at = start
        if removed:
            log.info("deleted %d ConsumeQueue/IndexFile files below CommitLog position %d",
                     removed, start)


async def _watch_overdue(server: BrokerServer) -> None:
    while True:
        await asyncio.sleep(OVERDUE_CHECK_S)
        try:
            server.overdue.check()
        except Exception:  # e.g. a queue deleted under the check: the next one is fresh
            log.exception("overdue check failed")
