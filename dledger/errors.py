"""Errors of the replicated log, each saying whether the entry may have been committed.

``definitely_not_committed`` is what makes blind retries safe or not: only when
it is True can a caller resend without risking a duplicate; otherwise the
broker's idempotent-producer check has to decide.
"""

from __future__ import annotations

__all__ = [
    "DiskFull",
    "EntryTooLarge",
    "NoLeader",
    "NotLeader",
    "OutcomeUnknown",
    "ProposalRejected",
    "ProposeError",
]


class ProposeError(Exception):
    """A proposal that did not complete with a known committed index."""

    retriable: bool = True
    definitely_not_committed: bool = True


class NotLeader(ProposeError):
    """This replica is not the leader; ``leader`` names the one it knows, if any."""

    def __init__(self, leader: str | None, leader_address: str | None) -> None:
        self.leader = leader
        self.leader_address = leader_address
        where = f"{leader} at {leader_address}" if leader else "unknown (election in progress)"
        super().__init__(f"not the leader; the leader is {where}")


class NoLeader(ProposeError):
    """The group has no leader right now (election, or no quorum)."""


class ProposalRejected(ProposeError):
    """The leader dropped the proposal before appending it (queue full, denied)."""


class OutcomeUnknown(ProposeError):
    """Leadership changed or the wait timed out after the entry may have been appended.

    The entry may still commit: retry only with an idempotency key.
    """

    definitely_not_committed = False


class DiskFull(ProposeError):
    """A replica's disk cannot take the entry; ``nodes`` names the replicas whose disks are
    full. Retriable: writes resume by themselves once space is freed. Definitely not
    committed unless ``may_have_committed`` (the entry was appended and waits for a majority
    that has room: it may still commit then)."""

    def __init__(self, nodes: list[str], detail: str, *, may_have_committed: bool = False) -> None:
        self.nodes = list(nodes)
        self.definitely_not_committed = not may_have_committed
        super().__init__(detail)


class EntryTooLarge(ValueError):
    """The payload does not fit in one Raft entry (see ``MAX_ENTRY_BYTES``)."""

    retriable = False
