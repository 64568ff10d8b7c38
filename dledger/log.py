"""``Log``: what the layers above ask of a replicated CommitLog -- propose, read committed
entries, read records by position (``reader``: a ``dledger.log_reader.LogReader``), status
(a typed ``dledger.log_status.Status``), leadership events, members, and the
snapshot/retention hooks. The broker is written against it, never the concrete CommitLog;
``ReplicatedLog`` (Raft on pysyncobj) and ``LocalLog`` (one replica, no Raft: the unit tests)
implement it (``tests/unit/test_local_log.py`` and ``tests/typing_conformance.py`` check both).
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from dledger.config import GroupConfig
    from dledger.latency import LatencyHistogram
    from dledger.log_events import Appended, LeaderChange, SnapshotSource
    from dledger.log_reader import LogReader
    from dledger.log_status import Status
    from dledger.membership import Change, Member
    from dledger.storage.disk_guard import DiskGuard
    from dledger.storage.entry_format import Entry

__all__ = ["Log"]


class Log(Protocol):
    config: GroupConfig
    #: the disk-full flag of this replica's data directory (the broker's files report to it)
    disk: DiskGuard

    # -- writing and reading
    def propose(self, payload: bytes) -> concurrent.futures.Future[Appended]: ...
    @property
    def committed_index(self) -> int: ...
    def read(self, from_index: int, max_bytes: int = ...) -> list[Entry]: ...
    def wait_committed(self, index: int, timeout: float) -> bool: ...
    @property
    def reader(self) -> LogReader:
        """Records by CommitLog position (the broker reads messages where its ConsumeQueue
        and IndexFile point) and the retained range; only committed entries are read."""
        ...
    @property
    def commitlog(self) -> LogReader:
        """The same reader under its old name, for ``broker/rocketmq`` alone (offsets.py,
        admin.py read the CommitLog's bounds through it): that folder was outside the change
        that moved the broker to ``reader`` (issue 26); this goes once those reads move."""
        ...

    # -- leadership
    @property
    def is_leader(self) -> bool: ...
    @property
    def leader(self) -> str | None: ...
    def add_leader_listener(self, listener: Callable[[LeaderChange], None]) -> None: ...
    def stand_for_election(self, allowed: bool, reason: str = ...) -> None: ...
    def transfer_leadership(self, target: str | None = None, timeout: float = ...) -> str | None: ...

    # -- members and status
    def members(self) -> dict[str, Member]: ...
    def change_membership(self, change: Change, timeout: float = ...) -> dict[str, Member]: ...
    def set_client_addresses(self, clients: dict[str, str]) -> None: ...
    def client_addresses(self) -> dict[str, str]: ...
    def status(self) -> Status: ...
    def disk_full_nodes(self) -> list[str]: ...
    @property
    def fsync_seconds(self) -> LatencyHistogram: ...
    @property
    def stage_seconds(self) -> dict[str, LatencyHistogram]:
        """Stage name -> durations of that stage of entries' commits (issue 30); a fixed
        set of names (a log without replication: only the server's ``receive`` and ``answer``).
        The serving process observes ``receive`` and ``answer`` from one thread each."""
        ...

    # -- snapshots and retention
    def set_snapshot_source(self, source: SnapshotSource) -> None: ...
    def set_applied_floor(self, applied_index: Callable[[], int]) -> None: ...
    def received_snapshot(self) -> tuple[int, bytes] | None: ...
    def forget_received_snapshot(self) -> None: ...

    def close(self) -> None: ...
