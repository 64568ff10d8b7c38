"""How a ``ReplicatedLog`` (``dledger.raft.replicated_log``) is put together: its storage,
identity, pysyncobj node and the parts that act through it, and what runs on the ticks.

``ReplicaWiring`` is ``ReplicatedLog``'s base class and holds only its construction, in the
order ``ReplicatedLog.__init__`` calls it:

    _open_storage      the CommitLog (an interrupted reset finished), the storage identity,
                       members, disk guard, the journal and its hooks, the candidacy
    _start_raft        the retained start's dump, pysyncobj's node over our journal and
                       transport, proposals, leadership transfer, membership, retention
    _attach_to_ticks   pre-vote, snapshot fetches, the receive-path intercepts and the
                       tick callbacks

The parts it wires, each one concern:

    dledger/raft/proposals.py                    a leader's proposals in flight, batching by bytes
    dledger/raft/election/candidacy.py           the reasons a replica must not lead; hand-over rule
    dledger/raft/election/leadership_transfer.py TimeoutNow transfers and a leader's hand-over
    dledger/raft/group_members.py                members from the log, pysyncobj's set reconciled
    dledger/raft/retained_start.py               the log-start dump and the snapshot a follower receives
    dledger/raft/log_retention.py                old segments deleted, followers behind the start
    dledger/raft/election/prevote.py, snapshot_fetch.py   on pysyncobj's peer connections

The callbacks it hands the parts (``stand_for_election``, ``members``, ``_not_leader``,
``committed_index``, ``_on_not_stored``, ``_on_commit``, the ``_watch_*`` ticks) are
``ReplicatedLog``'s (abstract here). Runs on the constructing thread, before pysyncobj's
tick thread starts -- except ``_set_transport``, which pysyncobj calls when it makes its
transport.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from typing import Any

from pysyncobj.pipe_notifier import PipeNotifier

from dledger.config import GroupConfig
from dledger.errors import NoLeader, NotLeader
from dledger.membership import BIND_FUNC_ID, Member, MemberHistory
from dledger.raft.codec import APPEND_FUNC_ID
from dledger.raft.election.candidacy import NOT_A_MEMBER, STORAGE_NOT_RECORDED, Candidacy
from dledger.raft.election.leadership_transfer import LeadershipTransfer
from dledger.raft.election.prevote import PreVote
from dledger.raft.full_disks import FollowerDisks
from dledger.raft.group_members import GroupMembers
from dledger.raft.journal import RaftJournal
from dledger.raft.log_retention import LogRetention
from dledger.raft.node import RaftNode, RaftView, group_conf, hand_journal
from dledger.raft.proposals import Proposals
from dledger.raft.retained_start import RetainedStart, finish_interrupted_reset
from dledger.raft.snapshot_fetch import SnapshotFetch
from dledger.raft.storage_binding import StorageBinding
from dledger.raft.storage_identity import StorageIdentity, open_identity
from dledger.raft.transport import PeerNode, make_transport_class
from dledger.storage.commitlog import CommitLog
from dledger.storage.disk_guard import DiskGuard
from dledger.storage.hard_state import probe as probe_hard_state

__all__ = ["ReplicaWiring"]

log = logging.getLogger("dledger.replicated_log")


def held_through(commitlog: CommitLog) -> int:
    """The highest index a reopened CommitLog accounts for: its last entry; for a log
    restarted empty at a leader's retained start (a snapshot install), that start, which
    the journal counts as committed before it arrives; 0 for an empty log."""
    return commitlog.last_index or commitlog.awaiting_start


class ReplicaWiring(ABC):
    """The construction of a ``ReplicatedLog`` (see the module docstring)."""

    config: GroupConfig

    # -- ReplicatedLog's, handed to the parts ------------------------------------------
    @abstractmethod
    def stand_for_election(self, allowed: bool, reason: str = "its state is known to be wrong") -> None: ...

    @abstractmethod
    def members(self) -> dict[str, Member]: ...

    @property
    @abstractmethod
    def committed_index(self) -> int: ...

    @abstractmethod
    def _not_leader(self) -> NotLeader | NoLeader: ...

    @abstractmethod
    def _on_not_stored(self, command: bytes) -> None: ...

    @abstractmethod
    def _on_commit(self, _committed: int) -> None: ...

    @abstractmethod
    def _watch_disk(self) -> None: ...

    @abstractmethod
    def _watch_leadership(self) -> None: ...

    @abstractmethod
    def _watch_membership(self) -> None: ...

    # -- the construction ----------------------------------------------------------------

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
            done=snapshots.keep_received,
            held_indexes=lambda: snapshots.snapshots.snapshot_indexes() if snapshots.snapshots else [],
            reachable=lambda: min(self.journal.committed_index, held_through(self.commitlog)))
        self._transport.intercept = (
            lambda node, m: self._binding.on_message(node, m)
            or self._follower_disks.note_answer(node, m, self._view.address_names)
            or self.candidacy.refuse_transfer(m)
            or self._prevote.on_message(node, m) or self._fetch.on_message(node, m))
        for tick in (self._binding.tick, self._watch_disk, self._watch_leadership, self._prevote.tick,
                     self._fetch.tick, self._watch_membership, self._retention.tick):
            self._node.addOnTickCallback(tick)

    def _set_transport(self, transport: Any) -> None:
        """pysyncobj made its transport: the storage rule holds from its first message on."""
        self._transport = transport
        transport.stamp = self._binding.stamp
        transport.intercept = self._binding.on_message  # until _attach_to_ticks chains the rest
