"""The values the ``Log`` API hands to the layers above (``dledger.log``): where a proposal
landed (``Appended``), a change of role or leader (``LeaderChange``), and the state
machine's snapshots a log retains (``SnapshotSource``). No Raft engine is imported here, so
the in-memory log and the broker's tests load none."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

__all__ = ["Appended", "LeaderChange", "Role", "SnapshotSource"]


class Role(enum.StrEnum):
    FOLLOWER = "follower"
    CANDIDATE = "candidate"
    LEADER = "leader"


@dataclass(frozen=True, slots=True)
class LeaderChange:
    role: Role
    term: int
    leader: str | None


@dataclass(frozen=True, slots=True)
class Appended:
    """Where a committed proposal landed: the same on every replica."""

    index: int
    term: int
    position: int


class SnapshotSource(Protocol):
    """A state machine's snapshots: the state after an index, as bytes it can install."""

    def snapshot_indexes(self) -> list[int]: ...
    def snapshot_bytes(self, index: int) -> bytes | None: ...
    def prune_snapshots_below(self, index: int) -> None: ...
    def oldest_held_position(self) -> int | None:
        """The lowest CommitLog position the state still reads later (a held message)."""
