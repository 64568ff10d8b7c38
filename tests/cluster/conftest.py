"""Fixtures for the multi-process tests: local groups stopped by PID whatever happens."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from raftmq.local_group import LocalGroup


@pytest.fixture
def make_group(tmp_path: Path) -> Iterator[Callable[..., LocalGroup]]:
    """``make_group(n=3, **raft_options)``: a LocalGroup under tmp_path (not started)."""
    groups: list[LocalGroup] = []

    def make(n: int = 3, **raft: object) -> LocalGroup:
        group = LocalGroup(tmp_path / f"group{len(groups)}", n, raft=dict(raft))
        groups.append(group)
        return group

    yield make
    for group in groups:
        group.stop()
