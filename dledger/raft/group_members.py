"""A replica's group members: the log's (``dledger.membership``), pysyncobj's made equal to
them, a learner becoming a member, and a leader's single-server changes.

    members() / is_member / learner      the set the log says now; whether this replica votes
    on_raft_entry / on_truncate          journal hooks: a change entry appended or cut
    restart_at(index, members)           the log restarted after ``index`` (a snapshot)
    tick()                               the tick thread: reintroduce, reconcile (about 1/s
                                         and after any change)
    change(change, timeout)              leader: add or remove one replica, committed

pysyncobj undoes the membership changes after a stale ``prevLogIdx`` although our journal
keeps those entries, and has no public call to set its member set, so ``reconcile`` calls
its private change routine (``_SyncObj__doChangeCluster``, 0.3.17 pinned) to make its set
the log's again.

Threads: the hooks and ``tick`` on the tick thread; ``members``/``change`` from any thread
(``change`` not from the tick thread: it waits for the commit).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from pysyncobj.config import FAIL_REASON
from pysyncobj.pipe_notifier import PipeNotifier

from dledger.config import GroupConfig
from dledger.errors import NoLeader, NotLeader, OutcomeUnknown, ProposalRejected
from dledger.membership import MEMBERSHIP_PREFIX, Change, Member, MemberHistory, decode_changes, encode_change
from dledger.raft.election.candidacy import NOT_A_MEMBER
from dledger.raft.node import RaftNode, RaftView
from dledger.raft.proposals import propose_error, wake
from dledger.raft.transport import PeerNode

__all__ = ["MEMBER_VIEW_CHECK_S", "GroupMembers"]

log = logging.getLogger("dledger.replicated_log")

MEMBER_VIEW_CHECK_S = 1.0


class GroupMembers:
    """One replica's members (module docstring). ``stand(allowed, reason)`` is the replica's
    ``stand_for_election``; ``attach`` gives it the pysyncobj node once that exists."""

    def __init__(self, config: GroupConfig, history: MemberHistory,
                 stand: Callable[[bool, str], None]) -> None:
        self._config = config
        self.history = history
        self._stand = stand
        self.learner = not self.is_member
        self.initial_clients: dict[str, str] = {}
        self._reintroduce = False
        self._dirty = False
        self._next_view_check = 0.0
        self._change_lock = threading.Lock()
        self._node: RaftNode | None = None
        self._view: RaftView | None = None
        self._wakeup: PipeNotifier | None = None
        self._transport: Callable[[], Any] = lambda: None
        self._committed_index: Callable[[], int] = lambda: 0
        self._not_leader: Callable[[], NotLeader | NoLeader] = lambda: NoLeader("not started")

    def attach(self, node: RaftNode, view: RaftView, wakeup: PipeNotifier, *, transport: Callable[[], Any],
               committed_index: Callable[[], int], not_leader: Callable[[], NotLeader | NoLeader]) -> None:
        self._node, self._view, self._wakeup = node, view, wakeup
        self._transport, self._committed_index, self._not_leader = transport, committed_index, not_leader

    def members(self) -> dict[str, Member]:
        """The group's voting members, by name, as this replica's log says."""
        return self.history.current()

    @property
    def is_member(self) -> bool:
        return any(m.raft == self._config.address for m in self.members().values())

    def client_addresses(self) -> dict[str, str]:
        """name -> broker address of every member (``initial_clients``: those of the initial
        members, whose change entries carry none)."""
        out = {n: m.client or self.initial_clients.get(n, "") for n, m in self.members().items()}
        return {n: a for n, a in out.items() if a}

    def peer_node(self, member: Member) -> PeerNode:
        return PeerNode(member.raft, self._config.dial.get(member.name), name=member.name)

    def node_of_member_id(self, member_id: Any) -> PeerNode:
        """pysyncobj's ``nodeClass``: the node of a member id from a change entry."""
        try:
            return self.peer_node(Member.parse(str(member_id)))
        except ValueError:
            return PeerNode(str(member_id))

    def mark_dirty(self) -> None:
        """Reconcile on the next tick (pysyncobj may have changed its set)."""
        self._dirty = True

    # -- the log's changes ---------------------------------------------------------------
    def on_raft_entry(self, index: int, command: bytes) -> None:
        """Journal hook (tick thread): a change entry was appended -- it applies now."""
        changes = decode_changes(command)
        if not changes:
            return
        self.history.record(index, changes)
        self._dirty = True
        for change in changes:
            if change.op == "bind":
                log.info("membership: storage %s recorded for %s at index %d", change.member.storage,
                         change.member.name, index)
            else:
                log.info("membership: %s %s (raft %s) at index %d; members now %s",
                         "added" if change.op == "add" else "removed", change.member.name,
                         change.member.raft, index, ", ".join(sorted(self.members())))
        self._changed()

    def on_truncate(self, index: int) -> None:
        if self.history.changed_at() >= index:
            self.history.truncate_from(index)
            self._dirty = True
            log.warning("membership change at or after %d truncated; members now %s",
                        index, ", ".join(sorted(self.members())))
            self._changed()

    def restart_at(self, index: int, members: dict[str, Member] | None) -> None:
        """The log restarts after ``index`` (the leader's retained start), ``members`` then."""
        self.history.restart_at(index, members)
        self._dirty = True
        self._changed()

    def _changed(self) -> None:
        if self.is_member:
            if self.learner:
                self.learner = False
                self._reintroduce = True  # on the next tick, outside pysyncobj's handler
                log.info("%s is now a voting member of group %s", self._config.node, self._config.group)
            self._stand(True, NOT_A_MEMBER)
        else:
            if not self.learner:
                log.warning("%s was removed from group %s: it no longer votes or stands for "
                            "election; stop it", self._config.node, self._config.group)
            self._stand(False, NOT_A_MEMBER)

    # -- pysyncobj's set -------------------------------------------------------------------
    def tick(self) -> None:
        transport = self._transport()
        if self._reintroduce and transport is not None:
            self._reintroduce = False
            transport.reintroduce()
        now = time.monotonic()
        if self._dirty or now >= self._next_view_check:
            self._dirty = False
            self._next_view_check = now + MEMBER_VIEW_CHECK_S
            self.reconcile()

    def reconcile(self) -> None:
        """Make pysyncobj's member set the log's again. pysyncobj undoes the changes after a
        stale ``prevLogIdx`` before it asks the journal to delete those entries -- which
        this journal keeps when they match (dledger.raft.journal) -- and re-applies only the
        changes the leader sends again; a real truncation and a log restart change the set
        too. The node this replica receives entries from is kept as well: a member added
        after a snapshot is still to be learned from it. Tick thread only."""
        assert self._node is not None and self._view is not None
        s = self._view.raw()
        prefix = "partner_node_status_server_"
        theirs = {k[len(prefix):] for k in s if k.startswith(prefix)}
        want = {m.raft: m for m in self.members().values() if m.raft != self._config.address}
        leader = self._node._getLeader()
        keep = {leader.address} if leader is not None else set()
        change = self._node._SyncObj__doChangeCluster
        for address in sorted(theirs - set(want) - keep):
            change(["rem", address])
            log.info("pysyncobj's member set: removed %s again, as the log says", address)
        for address in sorted(set(want) - theirs):
            change(["add", want[address].member_id])
            log.info("pysyncobj's member set: added %s (%s) again, as the log says",
                     want[address].name, address)

    # -- a leader's change -----------------------------------------------------------------
    def change(self, change: Change, timeout: float = 10.0) -> dict[str, Member]:
        """Leader: add or remove one replica (Raft's single-server change) and wait until the
        change is committed; returns the new member set. Raises ValueError for a change that
        makes no sense, ``ProposeError`` when it could not be made (retry: another change is
        still uncommitted, or this leader has not committed an entry of its term yet)."""
        assert self._node is not None and self._view is not None and self._wakeup is not None
        change.member.check()
        with self._change_lock:
            if not self._view.is_leader:
                raise self._not_leader()
            change = self._checked(change)
            if self.history.changed_at() > self._committed_index():
                raise ProposalRejected("the previous membership change is not committed yet; retry")
            future: concurrent.futures.Future[None] = concurrent.futures.Future()

            def done(_res: Any, err: int) -> None:
                if err == FAIL_REASON.SUCCESS:
                    future.set_result(None)
                elif err == FAIL_REASON.REQUEST_DENIED:
                    future.set_exception(ProposalRejected(
                        "the leader refused the change: it has not committed an entry of its term "
                        "yet, or the change is a no-op; retry"))
                else:
                    future.set_exception(propose_error(err, self._not_leader))

            self._node._applyCommand(encode_change(change), done, MEMBERSHIP_PREFIX[0])
            wake(self._wakeup)
            try:
                future.result(timeout)
            except concurrent.futures.TimeoutError:
                raise OutcomeUnknown(f"the membership change did not commit within {timeout}s; "
                                     "it may still commit: check the members") from None
            return self.members()

    def _checked(self, change: Change) -> Change:
        """``change`` as it will be proposed (a removal names the member as the log has it);
        ValueError when it makes no sense."""
        members = self.members()
        if change.op == "add":
            clash = [n for n, m in members.items()
                     if n == change.member.name or m.raft == change.member.raft]
            if clash:
                raise ValueError(f"{change.member.name} ({change.member.raft}) clashes with member "
                                 f"{clash[0]} ({members[clash[0]].raft}): names and Raft addresses "
                                 "must be new")
            return change
        current = members.get(change.member.name)
        if current is None:
            raise ValueError(f"{change.member.name!r} is not a member ({sorted(members)})")
        if current.raft == self._config.address:
            raise ValueError(f"{change.member.name} is the leader: transfer the leadership "
                             "first (raftmq leader transfer)")
        if len(members) == 1:
            raise ValueError("a group keeps at least one member")
        return Change("rem", current)
