"""A request task whose answer cannot be written (the client went away) ends quietly.

A reset storm on client links (tests/chaos, reset_peer_storms_on_client_links) left
``ERROR asyncio: Task exception was never retrieved ... ClientConnectionResetError: Cannot
write to closing transport`` in a broker's log: the task serving a request raised while
sending its answer to a connection being closed, and nobody looked at the task's outcome.
A lost connection is no error of the broker's; anything else a request task raises is
logged with its traceback, by the broker's logger.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from typing import Any

import aiohttp
import pytest

from broker.remoting.frame_reader import FrameReader


class _Limits:
    idle_timeout_s = 60.0
    max_inflight_bytes = 1 << 20


class _Guard:
    limits = _Limits()

    def hold(self, *_: Any) -> None:
        pass

    def watch(self, *_: Any) -> None:
        pass


async def _serve(error: BaseException) -> None:
    async def answer() -> None:
        raise error

    reader = FrameReader(None, None, _Guard())  # type: ignore[arg-type]
    reader.spawn(answer(), 100)
    for _ in range(5):
        await asyncio.sleep(0)
    del reader
    gc.collect()


def test_a_lost_connection_while_answering_is_not_an_error(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    asyncio.run(_serve(aiohttp.ClientConnectionResetError("Cannot write to closing transport")))
    gc.collect()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_another_failure_of_a_request_task_is_logged_with_its_traceback(
        caplog: pytest.LogCaptureFixture) -> None:
    asyncio.run(_serve(RuntimeError("a bug")))
    gc.collect()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.name for r in errors] == ["broker.server"], caplog.text
    assert errors[0].exc_info is not None and "a bug" in str(errors[0].exc_info[1])
