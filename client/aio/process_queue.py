"""A push consumer's state per assigned queue (``ProcessQueue``: messages pulled and not
yet consumed, the offset to commit) and a broadcasting consumer's offsets, kept in a
local file per instance (``LocalOffsets``: JSON ``{"<queue>": offset}``, replaced whole).

Threads: the consumer's event loop only.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from client.message import ReceivedMessage
from client.queues import MessageQueue

__all__ = ["LocalOffsets", "ProcessQueue"]


@dataclass(slots=True)
class ProcessQueue:
    """One assigned queue: messages pulled and not yet consumed, in offset order."""

    queue: MessageQueue
    next_offset: int
    pending: dict[int, ReceivedMessage] = field(default_factory=dict)
    bytes: int = 0
    committed: int | None = None
    dropped: bool = False
    locked_until: float = 0.0  # orderly clustering: monotonic time the consume lock is trusted until
    lost: bool = False  # the lock lapsed: the queue is dropped and taken again by the next rebalance
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def commit_point(self) -> int:
        """Every offset below this one was consumed."""
        return next(iter(self.pending)) if self.pending else self.next_offset

    def done(self, offset: int) -> None:
        m = self.pending.pop(offset, None)
        if m is not None:
            self.bytes -= len(m.body)


class LocalOffsets:
    """A broadcasting consumer instance's committed offsets, in ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> dict[str, int]:
        """queue -> offset ({} before the first write)."""
        try:
            return dict(json.loads(self.path.read_text()))
        except FileNotFoundError:
            return {}

    def write(self, offsets: dict[str, int]) -> None:
        """Replace the file (a temporary file renamed over it)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(offsets, sort_keys=True))
        os.replace(tmp, self.path)
