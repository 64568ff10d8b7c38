"""Test groups formed as operators form them: each initial replica's empty data directory
formatted as a founding storage first (``raftmq replica init``; dledger.raft.storage_identity)."""

from __future__ import annotations

from dledger.config import GroupConfig
from dledger.raft.storage_identity import format_founder, read_identity

__all__ = ["founding"]


def founding(config: GroupConfig) -> GroupConfig:
    """``config``, its data directory formatted as a founder's unless it already has an
    identity (a replica reopened by the test). Never for a replica the test wiped: that one
    must start as a new storage."""
    if not config.join and read_identity(config.data_dir) is None:
        format_founder(config.data_dir)
    return config
