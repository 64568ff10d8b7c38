"""ReplicatedLog: the one interface the broker uses to reach the Raft CommitLog.

    propose(payload) -> Future[Appended]   leader only; resolves once committed
    read(from_index, max_bytes)            committed entries only, any replica
    committed_index / wait_committed()     what may be served or applied
    status()                               role, term, leader, indexes, fsync time
    add_leader_listener(fn)                leadership changes
    change_membership(change)              add or remove one replica (leader only)
    transfer_leadership(target)            hand the leadership over (leader only)
    stand_for_election(allowed, reason)    whether this replica may lead

Behind it: a pysyncobj ``SyncObj`` (``dledger.raft.node``: its configuration closes the
remaining defects) whose journal is ``RaftJournal`` over the segmented ``CommitLog``,
whose transport is ``GroupTransport`` (flush before send, conflict hints) and whose peers
are ``PeerNode`` (dialable through a proxy). ``dledger.raft.replica_wiring`` (the base
class) builds and wires those parts, each of which is one concern; this module is the
interface over them and the ticks that watch the disk, leadership and membership.

A full disk (``dledger.storage.disk_guard``): a replica whose disk cannot take an entry does not
stand for election until ``disk_resume_free_bytes`` are free again; a leader hands the
leadership to a member with room and refuses proposals with ``DiskFull`` naming itself;
a follower refuses the entries it cannot store and says so in every answer, so the
leader keeps its lease (no elections) and refuses proposals with ``DiskFull`` naming
the full members while a majority cannot store. Entries resume by themselves.

Threads: pysyncobj's tick thread runs Raft, appends, commit callbacks and every
``_watch_*`` tick; ``propose``/``read``/``status`` may be called from any thread.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable

from dledger.config import MAX_ENTRY_BYTES, FlushPolicy, GroupConfig
from dledger.errors import EntryTooLarge, NoLeader, NotLeader
from dledger.latency import LatencyHistogram
from dledger.log_events import Appended, LeaderChange, Role, SnapshotSource
from dledger.log_reader import LogReader
from dledger.log_status import MemberStatus, Status
from dledger.membership import Change, Member
from dledger.raft.election.candidacy import DISK_FULL, NOT_A_MEMBER
from dledger.raft.full_disks import own_disk_full, refusal
from dledger.raft.node import ROLE_OF_STATE, check_bindable
from dledger.raft.patches import install_patches
from dledger.raft.replica_wiring import ReplicaWiring
from dledger.stage_clock import StageClock
from dledger.storage.entry_format import Entry
from dledger.storage.retention import RetentionPlan

__all__ = ["NOT_A_MEMBER", "Appended", "LeaderChange", "ReplicatedLog", "Role", "SnapshotSource"]

log = logging.getLogger("dledger.replicated_log")

DISK_CHECK_S = 1.0  # how often the disk's free space is looked at


class ReplicatedLog(ReplicaWiring):
    """One replica of a group's CommitLog (see module docstring)."""

    def __init__(self, config: GroupConfig) -> None:
        install_patches()
        self.config = config
        check_bindable(config.address)
        config.data_dir.mkdir(parents=True, exist_ok=True)
        self._listeners: list[Callable[[LeaderChange], None]] = []
        self._last_change: LeaderChange | None = None
        self._closed = threading.Event()
        self._open_storage()
        sync = config.flush == FlushPolicy.SYNC
        self._start_raft(sync)
        self._attach_to_ticks()
        if self._members.learner:
            log.warning("%s is not a member of group %s yet: it catches up as a learner (no vote, "
                        "no candidacy) until a member adds it (raftmq replica add)",
                        config.node, config.group)
            self.stand_for_election(False, NOT_A_MEMBER)
        self._flusher: threading.Thread | None = None
        if not sync:
            self._flusher = threading.Thread(target=self._flush_loop, name="dledger-flush",
                                             daemon=True)
            self._flusher.start()

    # -- writing ---------------------------------------------------------------
    def propose(self, payload: bytes) -> concurrent.futures.Future[Appended]:
        """Append ``payload`` as one DATA entry; the future resolves once committed.

        Raises ``EntryTooLarge`` at once; the future fails with ``NotLeader``,
        ``NoLeader``, ``ProposalRejected``, ``DiskFull`` (definitely not committed) or
        ``OutcomeUnknown`` (may have committed).
        """
        if len(payload) > MAX_ENTRY_BYTES:
            raise EntryTooLarge(
                f"entry payload is {len(payload)} bytes; the limit is {MAX_ENTRY_BYTES}")
        future: concurrent.futures.Future[Appended] = concurrent.futures.Future()
        if not self.is_leader:
            future.set_exception(self._not_leader())
            return future
        refused = refusal(self.config.node, self.config.group, self.disk, self.disk_full_nodes(),
                          len(self.members()))
        if refused is not None:
            future.set_exception(refused)
            return future
        if self._transfer.paused or self.candidacy.reasons:
            future.set_exception(NoLeader("leadership is being transferred; retry shortly"))
            return future
        return self._proposals.submit(payload)

    def _not_leader(self) -> NotLeader | NoLeader:
        leader = self.leader
        if leader is None:
            return NoLeader("the group has no leader right now; retry shortly")
        member = self.members().get(leader)
        return NotLeader(leader, member.raft if member else "")

    # -- a full disk (dledger.storage.disk_guard, dledger.raft.full_disks) -------------------------------
    def disk_full_nodes(self) -> list[str]:
        """Members whose disks are full: this replica, and on a leader the followers whose
        last answer said so. Any thread."""
        full = {self.config.node} if self.disk.full else set()
        if self.is_leader:
            full |= self._follower_disks.full_among(self.members())
        return sorted(full)

    def _on_not_stored(self, command: bytes) -> None:
        """Journal hook (tick thread): the disk could not take ``command``. If it is this
        leader's own proposal, it was never appended: answered DiskFull (not committed)."""
        self._members.mark_dirty()  # pysyncobj stopped in the middle of its handler
        self._proposals.not_stored(command, lambda: own_disk_full(self.config.node, self.config.group,
                                                                  self.disk))

    def _watch_disk(self) -> None:
        """Tick: no candidacy while the disk is full; look for free space about once a second."""
        now = time.monotonic()
        if now >= self._next_disk_check:  # lowers the flag when there is room, raises it when
            self._next_disk_check = now + DISK_CHECK_S  # not even one entry fits
            self.disk.check()
        full = self.disk.full
        if full != (DISK_FULL in self.candidacy.reasons):
            self.stand_for_election(not full, DISK_FULL)

    # -- reading ---------------------------------------------------------------
    @property
    def committed_index(self) -> int:
        return self.journal.committed_index

    @property
    def reader(self) -> LogReader:
        return self.commitlog  # the storage itself stays ``commitlog`` (this package's)

    def read(self, from_index: int, max_bytes: int = 1 << 20) -> list[Entry]:
        """Committed entries from ``from_index`` (never beyond ``committed_index``).

        Raises ``LogGap`` if retention already deleted ``from_index``.
        """
        return self.journal.read_committed(from_index, max_bytes)

    def wait_committed(self, index: int, timeout: float) -> bool:
        """Block until ``committed_index >= index`` or the timeout; returns whether it is."""
        with self._commit_cond:
            return self._commit_cond.wait_for(lambda: self.committed_index >= index, timeout)

    def _on_commit(self, _committed: int) -> None:
        with self._commit_cond:
            self._commit_cond.notify_all()

    # -- leadership ------------------------------------------------------------------------
    @property
    def is_leader(self) -> bool:
        return self._view.is_leader

    @property
    def leader(self) -> str | None:
        return self._view.leader

    def stand_for_election(self, allowed: bool, reason: str = "its state is known to be wrong") -> None:
        """Whether this node may become a candidate for ``reason`` (it always votes): a replica
        whose state is wrong or behind what it can apply must not lead. It stands again once
        no reason is left; a leader that must not lead hands over (``dledger.raft.election.candidacy``)."""
        if self.candidacy.set(allowed, reason) and self.is_leader:
            self._transfer.start_hand_over()
        self._apply_candidacy()

    def _apply_candidacy(self) -> None:
        """Set the election timeouts on our conf object; pysyncobj reads them at each use
        (0.3.17, pinned)."""
        lo, hi = self.candidacy.timeouts(self.is_leader, self._prevote.heard_at)
        if (self._conf.raftMinTimeout, self._conf.raftMaxTimeout) != (lo, hi):
            self._conf.raftMinTimeout, self._conf.raftMaxTimeout = lo, hi

    def transfer_leadership(self, target: str | None = None, timeout: float = 3.0) -> str | None:
        """Leader: hand the leadership to ``target`` (default: the connected member with the
        highest match index, passing over members known full or that did not take a transfer
        lately; ``dledger.raft.election.leadership_transfer``). Returns the new leader, or None if it did
        not move within ``timeout``. Any thread but the tick thread."""
        return self._transfer.transfer(target, timeout)

    def add_leader_listener(self, listener: Callable[[LeaderChange], None]) -> None:
        """``listener(LeaderChange)`` runs on the tick thread; it must not block."""
        self._listeners.append(listener)

    def _watch_leadership(self) -> None:
        self._apply_candidacy()
        self._transfer.tick()
        status = self._view.raw()
        change = LeaderChange(ROLE_OF_STATE[status["state"]], status["raft_term"], self.leader)
        if change == self._last_change:
            return
        log.info("%s is now %s in term %d (leader: %s)", self.config.node, change.role.value,
                 change.term, change.leader or "none known")
        if change.role == Role.LEADER and self.candidacy.reasons:
            log.warning("leading only to hand over: this replica must not lead (%s)",
                        "; ".join(sorted(self.candidacy.reasons)))
            self._transfer.start_hand_over()
        was_leader = self._last_change is not None and self._last_change.role == Role.LEADER
        if was_leader and change.role != Role.LEADER:
            self._proposals.fail_in_flight()
            if self._last_change is not None and change.term == self._last_change.term:
                self._transfer.after_lease_lapsed()  # no newer term deposed it: its lease lapsed
        self._last_change = change
        for listener in self._listeners:
            listener(change)

    # -- status ----------------------------------------------------------------------------
    def status(self) -> Status:
        s = self._view.raw()
        followers = self._view.follower_indexes("match_idx_server_")
        return Status(
            group=self.config.group,
            node=self.config.node,
            role=ROLE_OF_STATE[s["state"]].value,
            term=s["raft_term"],
            leader=self.leader,
            commit_index=self.committed_index,
            raft_commit_index=s["commit_idx"],
            first_index=self.commitlog.first_index,
            last_index=self.commitlog.last_index,
            write_position=self.commitlog.write_position,
            follower_match_index=followers if s["state"] == 2 else {},
            peers_connected=self._view.connected(s),
            last_fsync_time=self.journal.last_fsync_time,
            flush=self.config.flush.value,
            conflict_truncations=self.journal.conflict_truncations,
            lease_hand_offs=self._transfer.lease_hand_offs,
            followers_behind_retained_start=self.followers_behind_retained_start(),
            log_resets=list(self.journal.log_resets),
            members={n: MemberStatus(m.raft, m.client, m.storage) for n, m in sorted(self.members().items())},
            **self._binding.status(),
            forgot=self.forgot,
            member=self.is_member,
            members_changed_at=self._history.changed_at(),
            pre_vote_rounds=self._prevote.rounds, pre_vote_won=self._prevote.won,
            snapshot_fetch=self._fetch.progress(),
            disk=self.disk.status(),
            disk_full_members=self.disk_full_nodes(),
        )

    @property
    def fsync_seconds(self) -> LatencyHistogram:
        """How long each fsync of this replica's log took (the journal's flushes)."""
        return self.journal.fsync_seconds

    @property
    def stages(self) -> StageClock:
        """Where entries' commit time goes, per stage (``dledger.stage_clock``)."""
        return self.journal.stages

    @property
    def stage_seconds(self) -> dict[str, LatencyHistogram]:
        return self.journal.stages.histograms

    # -- membership (dledger.raft.group_members) --------------------------------------------------
    def members(self) -> dict[str, Member]:
        """The group's voting members, by name, as this replica's log says."""
        return self._members.members()

    @property
    def is_member(self) -> bool:
        return self._members.is_member

    @property
    def is_learner(self) -> bool:
        return self._members.learner

    def change_membership(self, change: Change, timeout: float = 10.0) -> dict[str, Member]:
        """Leader: add or remove one replica, committed (``GroupMembers.change``)."""
        return self._members.change(change, timeout)

    def set_client_addresses(self, clients: dict[str, str]) -> None:
        """Broker addresses of the initial members (their change entries carry the others')."""
        self._members.initial_clients = dict(clients)

    def client_addresses(self) -> dict[str, str]:
        """name -> broker address of every member."""
        return self._members.client_addresses()

    def _watch_membership(self) -> None:
        self._start.at_startup = False
        self._members.tick()

    # -- the retained start and retention (dledger.raft.retained_start, dledger.raft.log_retention) ---
    def set_snapshot_source(self, source: SnapshotSource) -> None:
        """The state machine whose snapshots go with the retained start: retention then
        cuts the log only where a snapshot of the state before the cut is held."""
        self._start.snapshots = source
        self._start.write()

    def received_snapshot(self) -> tuple[int, bytes] | None:
        """(index, snapshot) the leader last sent with its retained start, if any."""
        return self._start.received()

    def forget_received_snapshot(self) -> None:
        """The state machine installed it (and keeps its own copy)."""
        self._start.forget_received()

    def set_applied_floor(self, applied_index: Callable[[], int]) -> None:
        """Retention keeps every entry above ``applied_index()`` (the state machine's)."""
        self._retention.applied_floor = applied_index

    def enforce_retention(self, now: float | None = None) -> RetentionPlan:
        """Delete expired segments (see dledger.storage.retention). Tick thread only."""
        return self._retention.enforce(now)

    def followers_behind_retained_start(self) -> list[str]:
        """Followers the leader can no longer feed: they need entries retention deleted."""
        return self._retention.followers_behind()

    # -- lifecycle ---------------------------------------------------------------
    def _flush_loop(self) -> None:
        interval = self.config.flush_interval_ms / 1000
        while not self._closed.wait(interval):
            try:
                self.journal.flush()
            except Exception:  # keep flushing; the error is logged each time
                log.exception("async flush failed")

    def close(self) -> None:
        """Stop Raft, flush and close the files. Idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        self.disk.close()
        self._node.destroy_synchronous()  # also closes the journal
        if self._flusher is not None:
            self._flusher.join(timeout=5)
        self.journal._destroy()
