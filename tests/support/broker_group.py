"""A running 3-node broker group for tests, and the client's view of it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from raftmq.local_group import LocalGroup

__all__ = ["create_topic", "running_brokers", "servers"]


@contextlib.contextmanager
def running_brokers(base: Path, *, segment_bytes: int = 4 << 20, log_level: str = "INFO",
                    raft: dict[str, Any] | None = None, **broker: Any) -> Iterator[LocalGroup]:
    """Three broker processes under ``base`` with a leader; stopped by PID on exit.
    ``raft`` adds [raft] settings, ``broker`` [broker] settings (small IndexFiles by default)."""
    group = LocalGroup(base, 3, module="broker", raft={"segment_bytes": segment_bytes, **(raft or {})},
                       broker={"index_slots": 4096, "index_entries": 65536, **broker},
                       log_level=log_level)
    try:
        group.start()
        group.wait_leader(timeout=30)
        yield group
    finally:
        group.stop()


def servers(group: LocalGroup) -> list[str]:
    """The nodes' client addresses (``servers=`` of the client)."""
    return [p.http for p in group.nodes.values()]


def create_topic(group: LocalGroup, topic: str, queues: int) -> None:
    from client import Admin  # the client only where a test needs it

    admin = Admin(servers=servers(group))
    try:
        admin.create_topic(topic, queues=queues)
    finally:
        admin.close()
