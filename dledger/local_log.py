"""``LocalLog``: a group of one replica without Raft -- a proposal is appended to the
CommitLog, fsynced, and committed at once. The same surface the broker uses of
``ReplicatedLog`` (propose, read committed entries, status, leadership events, the
snapshot and retention hooks), so broker and client tests run in one process with no
pysyncobj node, no election and no Raft socket (as hashicorp raft's ``InmemStore`` or
etcd's ``MemoryStorage`` stand in for a real log). The CommitLog is the real one, in a
directory: the broker reads messages by CommitLog position, so the bytes must be the
ones a replica would hold.

It always leads (term 1); membership changes and leadership transfers are refused.
``commitlog`` is the storage itself (the tests that damage or inspect files use it); the
layers above read through ``reader``.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable

from dledger.config import MAX_ENTRY_BYTES, FlushPolicy, GroupConfig
from dledger.errors import DiskFull, EntryTooLarge, ProposalRejected
from dledger.latency import LatencyHistogram
from dledger.log_events import Appended, LeaderChange, Role, SnapshotSource
from dledger.log_reader import LogReader
from dledger.log_status import MemberStatus, Status
from dledger.membership import Change, Member
from dledger.stage_clock import SERVER_STAGES, STAGE_BUCKETS
from dledger.storage.commitlog import CommitLog
from dledger.storage.disk_guard import DiskGuard
from dledger.storage.entry_format import Entry, EntryKind

__all__ = ["LocalLog"]

TERM = 1


class LocalLog:
    def __init__(self, config: GroupConfig) -> None:
        self.config = config
        self.commitlog = CommitLog(config.data_dir / "commitlog", config.segment_bytes)
        self._cond = threading.Condition()
        self._committed = self.commitlog.last_index
        self._clients: dict[str, str] = {}
        self._standing = True
        self._closed = False
        self.fsync_seconds = LatencyHistogram()
        # no replication: only the serving process's own stages (dledger.stage_clock)
        self.stage_seconds = {s: LatencyHistogram(STAGE_BUCKETS) for s in SERVER_STAGES}
        self.disk = DiskGuard(config.data_dir, config.disk_resume_free_bytes)

    # -- writing and reading -----------------------------------------------------------
    def propose(self, payload: bytes) -> concurrent.futures.Future[Appended]:
        """Append ``payload`` as one DATA entry, fsync it (flush ``sync``) and commit it; a
        failed future with DiskFull if the disk cannot take it (or has not had room again
        since it could not)."""
        if len(payload) > MAX_ENTRY_BYTES:
            raise EntryTooLarge(f"entry payload is {len(payload)} bytes; the limit is {MAX_ENTRY_BYTES}")
        future: concurrent.futures.Future[Appended] = concurrent.futures.Future()
        with self._cond:
            if self._closed:
                future.set_exception(ProposalRejected("the log is closed"))
                return future
            index = self.commitlog.last_index + 1
            try:
                if self.disk.check():
                    raise OSError(28, "the disk has not had room again yet")
                position = self.commitlog.append(index, TERM, EntryKind.DATA, payload)
            except OSError as e:
                if not self.disk.note(f"appending entry {index} to the CommitLog", e):
                    raise
                future.set_exception(DiskFull([self.config.node], f"replica {self.config.node} "
                                              f"cannot store entries: its disk is full ({self.disk.reason})"))
                return future
            if self.config.flush == FlushPolicy.SYNC:
                began = time.monotonic()
                self.commitlog.flush()
                self.fsync_seconds.observe(time.monotonic() - began)
            self._committed = index
            self._cond.notify_all()
        future.set_result(Appended(index, TERM, position))
        return future

    @property
    def committed_index(self) -> int:
        return self._committed

    @property
    def reader(self) -> LogReader:
        return self.commitlog

    def read(self, from_index: int, max_bytes: int = 1 << 20) -> list[Entry]:
        """Committed entries from ``from_index``; ``LogGap`` below the first held one."""
        return self.commitlog.committed_entries(from_index, max_bytes, self._committed)

    def wait_committed(self, index: int, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._committed >= index, timeout)

    # -- leadership and members: one replica, always leading -----------------------------
    @property
    def is_leader(self) -> bool:
        return self._standing

    @property
    def leader(self) -> str | None:
        return self.config.node if self._standing else None

    def stand_for_election(self, allowed: bool, reason: str = "its state is known to be wrong") -> None:
        self._standing = allowed

    def add_leader_listener(self, listener: Callable[[LeaderChange], None]) -> None:
        listener(LeaderChange(Role.LEADER, TERM, self.config.node))

    def transfer_leadership(self, target: str | None = None, timeout: float = 3.0) -> str | None:
        raise ValueError("a local log has no other member to lead")

    def disk_full_nodes(self) -> list[str]:
        return [self.config.node] if self.disk.full else []

    def members(self) -> dict[str, Member]:
        return {self.config.node: Member(self.config.node, self.config.address,
                                         self._clients.get(self.config.node, ""))}

    @property
    def is_member(self) -> bool:
        return True

    def change_membership(self, change: Change, timeout: float = 10.0) -> dict[str, Member]:
        raise ProposalRejected("a local log has exactly one member")

    def set_client_addresses(self, clients: dict[str, str]) -> None:
        self._clients = dict(clients)

    def client_addresses(self) -> dict[str, str]:
        return {n: a for n, a in self._clients.items() if n == self.config.node and a}

    def status(self) -> Status:
        me = self.members()[self.config.node]
        cl = self.commitlog
        return Status(
            group=self.config.group, node=self.config.node,
            role=(Role.LEADER if self._standing else Role.FOLLOWER).value, term=TERM,
            leader=self.leader, commit_index=self._committed, raft_commit_index=self._committed,
            first_index=cl.first_index, last_index=cl.last_index, write_position=cl.write_position,
            follower_match_index={}, peers_connected={}, last_fsync_time=None, flush=self.config.flush.value,
            conflict_truncations=0, lease_hand_offs=0, followers_behind_retained_start=[], log_resets=[],
            members={me.name: MemberStatus(me.raft, me.client, "")},
            # one replica, no Raft: nothing to forget or record (dledger.raft.storage_rule)
            storage="", voter=True, vote_refusal=None, storages_catching_up={}, forgot=None,
            member=True, members_changed_at=0, pre_vote_rounds=0, pre_vote_won=0, snapshot_fetch=None,
            disk=self.disk.status(), disk_full_members=self.disk_full_nodes())

    # -- hooks the broker sets (snapshots, retention): nothing is ever cut here -----------
    def set_snapshot_source(self, source: SnapshotSource) -> None:
        self._snapshots = source

    def set_applied_floor(self, applied_index: Callable[[], int]) -> None:
        self._applied_floor = applied_index

    def received_snapshot(self) -> tuple[int, bytes] | None:
        return None

    def forget_received_snapshot(self) -> None:
        pass

    def close(self) -> None:
        with self._cond:
            if not self._closed:
                self._closed = True
                self.disk.close()
                self.commitlog.close()
