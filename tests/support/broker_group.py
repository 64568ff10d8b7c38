"""A running 3-node broker group for tests, and the client's view of it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dledger.config import MAX_ENTRY_BYTES
from raftmq.local_group import LocalGroup
from tests.support.procs import led

__all__ = ["SMALL_SEGMENT", "create_topic", "retaining_brokers", "running_brokers", "servers"]

SMALL_SEGMENT = 4 * MAX_ENTRY_BYTES
"""The smallest segment a group allows (~240 KiB): retention has segments to delete soon."""


@contextlib.contextmanager
def running_brokers(base: Path, *, segment_bytes: int = 4 << 20, log_level: str = "INFO",
                    raft: dict[str, Any] | None = None, tls: bool = False, mutual_tls: bool = False,
                    **broker: Any) -> Iterator[LocalGroup]:
    """Three broker processes under ``base`` with a leader; stopped by PID on exit.
    ``raft`` adds [raft] settings, ``broker`` [broker] settings (small IndexFiles by default);
    ``tls``/``mutual_tls``: the client ports serve TLS (clients: ``group.client_tls``)."""
    group = LocalGroup(base, 3, module="broker", raft={"segment_bytes": segment_bytes, **(raft or {})},
                       broker={"index_slots": 4096, "index_entries": 65536, **broker},
                       log_level=log_level, tls=tls, mutual_tls=mutual_tls)
    with led(group, LocalGroup.wait_leader):
        yield group


@contextlib.contextmanager
def retaining_brokers(base: Path, *, segments_kept: int, **broker: Any) -> Iterator[LocalGroup]:
    """``running_brokers`` with SMALL_SEGMENT segments and retention keeping about
    ``segments_kept`` of them (checked every 0.2 s); ``broker`` as there."""
    raft = {"retention_bytes": segments_kept * SMALL_SEGMENT, "retention_check_s": 0.2}
    with running_brokers(base, segment_bytes=SMALL_SEGMENT, raft=raft, **broker) as group:
        yield group


def servers(group: LocalGroup) -> list[str]:
    """The nodes' client addresses (``servers=`` of the client)."""
    return [p.http for p in group.nodes.values()]


def create_topic(group: LocalGroup, topic: str, queues: int) -> None:
    """``topic`` created on ``group`` with ``queues`` queues (over TLS when it serves TLS)."""
    from tests.support.client_calls import create_topic_at  # the client only where a test needs it

    create_topic_at(servers(group), topic, queues, tls=group.client_tls or False)
