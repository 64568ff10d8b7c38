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
are ``PeerNode`` (dialable through a proxy). This module wires the parts, each of which is
one concern:

    dledger/raft/proposals.py           a leader's proposals in flight, batching by bytes
    dledger/raft/candidacy.py           the reasons a replica must not lead; hand-over rule
    dledger/raft/leadership_transfer.py  TimeoutNow transfers and a leader's hand-over
    dledger/raft/group_members.py       members from the log, pysyncobj's set reconciled
    dledger/raft/retained_start.py      the log-start dump and the snapshot a follower receives
    dledger/raft/log_retention.py       old segments deleted, followers behind the start
    dledger/raft/prevote.py, snapshot_fetch.py   on pysyncobj's peer connections

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
from typing import Any

from pysyncobj.pipe_notifier import PipeNotifier

from dledger.config import MAX_ENTRY_BYTES, FlushPolicy, GroupConfig
from dledger.errors import EntryTooLarge, NoLeader, NotLeader
from dledger.latency import LatencyHistogram
from dledger.log_events import Appended, LeaderChange, Role, SnapshotSource
from dledger.membership import BIND_FUNC_ID, Change, Member, MemberHistory
from dledger.raft.candidacy import DISK_FULL, NOT_A_MEMBER, STORAGE_NOT_RECORDED, Candidacy
from dledger.raft.codec import APPEND_FUNC_ID
from dledger.raft.full_disks import FollowerDisks, own_disk_full, refusal
from dledger.raft.group_members import GroupMembers
from dledger.raft.journal import RaftJournal
from dledger.raft.leadership_transfer import LeadershipTransfer
from dledger.raft.log_retention import LogRetention
from dledger.raft.node import (
    ROLE_OF_STATE,
    RaftNode,
    RaftView,
    check_bindable,
    group_conf,
    hand_journal,
)
from dledger.raft.patches import install_patches
from dledger.raft.prevote import PreVote
from dledger.raft.proposals import Proposals
from dledger.raft.retained_start import RetainedStart, finish_interrupted_reset
from dledger.raft.snapshot_fetch import SnapshotFetch
from dledger.raft.storage_binding import StorageBinding
from dledger.raft.storage_identity import StorageIdentity, open_identity
from dledger.raft.transport import PeerNode, make_transport_class
from dledger.stage_clock import StageClock
from dledger.storage.commitlog import CommitLog
from dledger.storage.disk_guard import DiskGuard
from dledger.storage.entry_format import Entry
from dledger.storage.hard_state import probe as probe_hard_state
from dledger.storage.retention import RetentionPlan

__all__ = ["NOT_A_MEMBER", "Appended", "LeaderChange", "ReplicatedLog", "Role", "SnapshotSource"]

log = logging.getLogger("dledger.replicated_log")

DISK_CHECK_S = 1.0  # how often the disk's free space is looked at

def held_through(commitlog: CommitLog) -> int:
    """The highest index a reopened CommitLog accounts for: its last entry; for a log
    restarted empty at a leader's retained start (a snapshot install), that start, which
    the journal counts as committed before it arrives; 0 for an empty log."""
    return commitlog.last_index or commitlog.awaiting_start

class ReplicatedLog:
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

    def _open_storage(self) -> None:
        """The CommitLog (an interrupted log restart finished), the members it says, the
        candidacy they leave, the disk guard and the journal with its hooks."""
        config = self.config
        self.commitlog_dir = config.data_dir / "commitlog"
        self.commitlog = CommitLog(self.commitlog_dir, config.segment_bytes, repair=config.repair_log)
        finish_interrupted_reset(self.commitlog, config.data_dir)
        self.identity, self.forgot = self._open_identity()
        initial = {name: Member(name, addr) for name, addr in config.peers.items()
                   if not (config.join and name == config.node)}
        self._history = MemberHistory(config.data_dir / "members", initial, self.commitlog.last_index)
        self._members = GroupMembers(config, self._history, self.stand_for_election)
        self.disk = DiskGuard(config.data_dir, config.disk_resume_free_bytes)
        self._follower_disks = FollowerDisks()  # on a leader: what each follower last said
        self._next_disk_check = 0.0
        self.journal = RaftJournal(self.commitlog, config.data_dir / "raft-state", self.disk)
        self._binding = StorageBinding(
            config.node, self.identity, self._history, committed_index=lambda: self.journal.committed_index,
            is_leader=lambda: self._view.is_leader, names=lambda: self._view.address_names(),
            propose=self._propose_bindings,
            stand=lambda allowed: self.stand_for_election(allowed, STORAGE_NOT_RECORDED))
        # held before pysyncobj draws its first election deadline
        held = {NOT_A_MEMBER} if self._members.learner else set()
        if self._binding.refusal() is not None:
            held.add(STORAGE_NOT_RECORDED)
            log.warning("%s neither votes nor stands: %s", config.node, self._binding.refusal())
        self.candidacy = Candidacy(config.election_timeout_ms, held)
        self.journal.on_raft_entry = self._members.on_raft_entry
        self.journal.on_truncate = self._members.on_truncate
        self.journal.on_kept_tail = self._members.mark_dirty
        self.journal.on_not_stored = self._on_not_stored
        self.journal.on_forgetting = self._forgetting
        self._commit_cond = threading.Condition()
        self.journal.add_commit_listener(self._on_commit)

    def _open_identity(self) -> tuple[StorageIdentity, str | None]:
        """This replica's storage identity (``dledger.raft.storage_identity``): a new one when it may
        have forgotten what it acknowledged -- a lost or unreadable hard state (moved aside
        as ``raft-state.corrupt``), or a CommitLog cut by repair or below the commit index
        it had stored, with or without a cut."""
        state_path = self.config.data_dir / "raft-state"
        hard, state = probe_hard_state(state_path)
        if hard == "corrupt":
            state_path.rename(state_path.with_name("raft-state.corrupt"))
        recovery = self.commitlog.recovery
        forgot = None
        if recovery.cut_at is not None and recovery.repaired:
            forgot = (f"--repair-log cut its CommitLog ({recovery.cut_bytes} bytes from position "
                      f"{recovery.cut_at}): entries it had stored and acknowledged are gone")
        elif state is not None and held_through(self.commitlog) < state.commit:
            # The hint is stored only once the log under it is on disk (RaftJournal), so a log
            # that ends below it lost entries this replica had acknowledged: a tail cut at
            # recovery, or segments (or the whole folder) gone without a cut.
            how = ("its CommitLog's tail failed its checks and was cut" if recovery.cut_at is not None
                   else "its CommitLog lost entries (files missing)")
            forgot = (f"{how}: it ends at index {held_through(self.commitlog)}, below the commit "
                      f"index {state.commit} it had stored")
        return open_identity(self.config.data_dir, hard_state=hard,
                             log_holds_entries=self.commitlog.last_index > 0, forgot=forgot)

    def _forgetting(self, why: str) -> None:
        """The journal is about to drop entries this replica may have acknowledged: a new storage."""
        self.identity, self.forgot = self._binding.forget(self.config.data_dir, why), why

    def _propose_bindings(self, payload: bytes, callback: Any) -> None:
        """Append a bind entry (``dledger.raft.storage_binding``); tick thread."""
        self._node._bind_storage(payload, callback=callback)

    def _start_raft(self, sync: bool) -> None:
        """The retained start's dump rewritten, pysyncobj's node over our journal and
        transport, and the parts that act through it."""
        config = self.config
        transport = make_transport_class(self.journal.flush if sync else None,
                                         lambda: self.journal.resume_hint, lambda: self._members.learner,
                                         self._set_transport, disk_full=lambda: self.disk.full,
                                         follower_full=self._follower_disks.node_is_full,
                                         stages=self.journal.stages)
        self._transport: Any = None
        self._start = RetainedStart(
            config.data_dir, self.commitlog, self.journal, self._history,
            want_snapshot=lambda ref: self._fetch.want(ref), restarted=self._members.restart_at,
            nodes=lambda: [self._members.peer_node(m) for m in self.members().values()],
            sender=lambda: self._node._getLeader())
        self._start.dump_path.unlink(missing_ok=True)  # rewritten from the log as it is now
        self._start.write()
        journal_key = str(self.commitlog_dir)
        hand_journal(journal_key, self.journal)
        others = [self._members.peer_node(m) for m in self.members().values() if m.raft != config.address]
        self._conf = group_conf(config, journal_key, str(self._start.dump_path), self._start.read,
                                standing=not self.candidacy.reasons)
        self._node = RaftNode(PeerNode(config.address, name=config.node), others, self._conf,
                              nodeClass=self._members.node_of_member_id, transportClass=transport)
        if (self._node._methodToID.get("_append_v0", APPEND_FUNC_ID) != APPEND_FUNC_ID
                or self._node._methodToID.get("_bind_storage_v0", BIND_FUNC_ID) != BIND_FUNC_ID):
            raise RuntimeError("pysyncobj numbered the replicated methods unexpectedly")
        self._wakeup = PipeNotifier(self._node._poller)
        self._view = RaftView(self._node, config.address, config.node, self.members)
        self._proposals = Proposals(self._node, self._conf, self._wakeup, self.journal, self.commitlog,
                                    self._not_leader)
        self._transfer = LeadershipTransfer(
            self._node, self._view, self._wakeup, config.address, members=self.members,
            peer_node=self._members.peer_node, follower_disks=self._follower_disks,
            must_not_lead=lambda: self.candidacy.reasons, not_leader=self._not_leader)
        self._members.attach(self._node, self._view, self._wakeup, transport=lambda: self._transport,
                             committed_index=lambda: self.committed_index, not_leader=self._not_leader)
        self._retention = LogRetention(config, self.commitlog, self._view, self._history, self._start,
                                       lambda: self.committed_index)

    def _attach_to_ticks(self) -> None:
        """What runs on pysyncobj's tick thread besides Raft: leadership events, pre-vote,
        snapshot transfers (both on pysyncobj's peer connections), membership, retention."""
        self._prevote = PreVote(self._node, lambda: self.config.election_timeout_ms[0] / 1000,
                                lambda: (self._conf.raftMinTimeout, self._conf.raftMaxTimeout),
                                may_vote=lambda: self._binding.refusal() is None)
        snapshots = self._start
        self._fetch = SnapshotFetch(
            self.config.data_dir, members=lambda: list(self._node._SyncObj__otherNodes),
            leader=self._node._getLeader, send=lambda node, m: self._transport.send(node, m),
            snapshot_bytes=lambda i: snapshots.snapshots.snapshot_bytes(i) if snapshots.snapshots else None,
            done=snapshots.keep_received)
        self._transport.intercept = (
            lambda node, m: self._binding.on_message(node, m)
            or self._follower_disks.note_answer(node, m, self._view.address_names)
            or self.candidacy.refuse_transfer(m)
            or self._prevote.on_message(node, m) or self._fetch.on_message(node, m))
        for tick in (self._binding.tick, self._watch_disk, self._watch_leadership, self._prevote.tick,
                     self._fetch.tick, self._watch_membership, self._retention.tick):
            self._node.addOnTickCallback(tick)

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
        no reason is left; a leader that must not lead hands over (``dledger.raft.candidacy``)."""
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
        lately; ``dledger.raft.leadership_transfer``). Returns the new leader, or None if it did
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
    def status(self) -> dict[str, Any]:
        s = self._view.raw()
        followers = self._view.follower_indexes("match_idx_server_")
        return {
            "group": self.config.group,
            "node": self.config.node,
            "role": ROLE_OF_STATE[s["state"]].value,
            "term": s["raft_term"],
            "leader": self.leader,
            "commit_index": self.committed_index,
            "raft_commit_index": s["commit_idx"],
            "first_index": self.commitlog.first_index,
            "last_index": self.commitlog.last_index,
            "write_position": self.commitlog.write_position,
            "follower_match_index": followers if s["state"] == 2 else {},
            "peers_connected": self._view.connected(s),
            "last_fsync_time": self.journal.last_fsync_time,
            "flush": self.config.flush.value,
            "conflict_truncations": self.journal.conflict_truncations,
            "lease_hand_offs": self._transfer.lease_hand_offs,
            "followers_behind_retained_start": self.followers_behind_retained_start(),
            "log_resets": [list(r) for r in self.journal.log_resets],
            "members": {n: {"raft": m.raft, "client": m.client, "storage": m.storage}
                        for n, m in sorted(self.members().items())},
            **self._binding.status(),
            "forgot": self.forgot,
            "member": self.is_member,
            "members_changed_at": self._history.changed_at(),
            "pre_vote_rounds": self._prevote.rounds, "pre_vote_won": self._prevote.won,
            "snapshot_fetch": self._fetch.progress(),
            "disk": self.disk.status(),
            "disk_full_members": self.disk_full_nodes(),
        }

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

    def _set_transport(self, transport: Any) -> None:
        """pysyncobj made its transport: the storage rule holds from its first message on."""
        self._transport = transport
        transport.stamp = self._binding.stamp
        transport.intercept = self._binding.on_message  # until _attach_to_ticks chains the rest

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
