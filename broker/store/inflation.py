"""Bounds on what compressed records make the broker inflate, and the threads they inflate on.

A record's header says how large its compressed message section becomes
(``RecordHeader.raw_length``), so the bounds are checked before anything is decompressed:

    MAX_INFLATED_PER_REQUEST   the raw bytes of all compressed records of one send request
                               (a frame of thousands of ~200-byte records each inflating to
                               max_message_bytes would otherwise cost seconds of CPU)
    MAX_INFLATED_PER_PULL      what one SQL92-filtered pull decompresses to read properties
                               before it answers with the rows it has (the client pulls on)

Decompression and the checks over it run on ``INFLATING`` (``inflate``): two worker
threads shared by the replica's requests, so the event loop keeps serving while they work
(zstd and lz4 release the GIL) and a flood of such requests waits for them instead of
taking every core.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

__all__ = ["INFLATING", "MAX_INFLATED_PER_PULL", "MAX_INFLATED_PER_REQUEST", "inflate"]

MAX_INFLATED_PER_REQUEST = 64 << 20
MAX_INFLATED_PER_PULL = 16 << 20

INFLATING = ThreadPoolExecutor(max_workers=2, thread_name_prefix="inflate")

P = ParamSpec("P")
T = TypeVar("T")


async def inflate(work: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``work(*args, **kwargs)`` on an ``INFLATING`` thread (event loop only)."""
    call = functools.partial(work, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(INFLATING, call)
