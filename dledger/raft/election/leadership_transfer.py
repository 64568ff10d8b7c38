"""Leadership transfer (Raft thesis §3.10) and the hand-over of a leader that must not lead.

    transfer(target, timeout) -> new leader | None      any thread but the tick thread
    tick()                                               the tick thread: offer TimeoutNow
    start_hand_over()                                    a leader that must not lead

A transfer pauses new proposals (``paused``: the caller answers NoLeader, retriable), then
on every tick offers pysyncobj's ``transferLeadership`` (TimeoutNow) until it accepts: it
refuses while the target lacks an entry, and proposals made before the pause may still be
appended, so the check must be the tick thread's own. The default target is the connected
member with the highest match index, passing over members whose disks are full (they would
hand it on again) and members that did not take a transfer in the last
``TRANSFER_NOT_TAKEN_S`` (they must not lead: ``dledger.raft.election.candidacy`` drops TimeoutNow).

A replica that must not lead and leads anyway (it won an election, or was found wrong
while leading) hands over from a thread of its own, as soon as a member has every entry.

A leader whose lease lapsed (no majority answered within ``leader_lease_ms``; pysyncobj
made it a follower in the same term) sends TimeoutNow to the member it last knew furthest
ahead (``after_lease_lapsed``). When only its inbound side failed -- a *deaf* leader, whose
peers still hear it -- that member stands at once instead of waiting out an election
timeout after the last heartbeat (issue 35: 1.0 s -> about the lease). When its messages
are lost too, nothing changes. Either way an election decides, with every vote's checks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from pysyncobj.config import FAIL_REASON
from pysyncobj.pipe_notifier import PipeNotifier

from dledger.errors import NoLeader, NotLeader, ProposeError
from dledger.membership import Member
from dledger.raft.election.candidacy import DISK_FULL
from dledger.raft.full_disks import FollowerDisks
from dledger.raft.node import RaftNode, RaftView
from dledger.raft.proposals import wake
from dledger.raft.transport import PeerNode

__all__ = ["TRANSFER_NOT_TAKEN_S", "LeadershipTransfer"]

log = logging.getLogger("dledger.replicated_log")

TRANSFER_NOT_TAKEN_S = 30.0  # a member that did not take a transfer is passed over this long
_POLL_S = 0.001  # how often a transfer looks at the outcome
_HAND_OVER_RETRY_S = 0.2
_HAND_OVER_TIMEOUT_S = 5.0


class LeadershipTransfer:
    """One replica's leadership transfers (module docstring)."""

    def __init__(self, node: RaftNode, view: RaftView, wakeup: PipeNotifier, own_address: str, *,
                 members: Callable[[], dict[str, Member]], peer_node: Callable[[Member], PeerNode],
                 follower_disks: FollowerDisks, must_not_lead: Callable[[], frozenset[str]],
                 not_leader: Callable[[], NotLeader | NoLeader]) -> None:
        self._node = node
        self._view = view
        self._wakeup = wakeup
        self._own_address = own_address
        self._members = members
        self._peer_node = peer_node
        self._follower_disks = follower_disks
        self._must_not_lead = must_not_lead
        self._not_leader = not_leader
        self._transferring = threading.Lock()  # one transfer at a time; proposals refused meanwhile
        self._target: PeerNode | None = None  # handed to pysyncobj on the tick thread
        self._not_taken: dict[str, float] = {}  # member -> when a transfer to it timed out
        self._hand_over_thread: threading.Thread | None = None
        self._hand_over_lock = threading.Lock()
        self.lease_hand_offs = 0  # TimeoutNow sent after a lapsed lease (status)

    @property
    def paused(self) -> bool:
        """Whether proposals are refused now: the leadership is moving."""
        return self._transferring.locked()

    def transfer(self, target: str | None = None, timeout: float = 3.0) -> str | None:
        """Leader: hand the leadership to ``target`` (default: module docstring). Returns the
        new leader, or None if it did not move within ``timeout`` (or another transfer is under
        way: one at a time, so neither reopens proposals while the other runs). Raises
        NotLeader/NoLeader on a replica that does not lead, ValueError when ``target`` is no
        other member."""
        if not self._view.is_leader:
            raise self._not_leader()
        if target is None:
            target = self._default_target()
            if target is None:
                return None
        others = {n: m for n, m in self._members().items() if m.raft != self._own_address}
        if target not in others:
            raise ValueError(f"{target!r} is not another member of this group ({sorted(others)})")
        if not self._transferring.acquire(blocking=False):
            return None
        deadline = time.monotonic() + timeout
        try:
            self._target = self._peer_node(others[target])
            wake(self._wakeup)
            while self._view.is_leader and time.monotonic() < deadline:
                time.sleep(_POLL_S)
            if self._view.is_leader:
                self._not_taken[target] = time.monotonic()
                return None
            log.info("leadership handed to %s", target)
            while self._view.leader is None and time.monotonic() < deadline:
                time.sleep(_POLL_S)
            return self._view.leader
        finally:
            self._target = None
            self._transferring.release()

    def _default_target(self) -> str | None:
        matches = self._view.connected_matches()
        roomy = {n: i for n, i in matches.items() if not self._follower_disks.is_full(n)}
        matches = roomy or matches  # a member whose disk is full would hand it on again
        recent = time.monotonic() - TRANSFER_NOT_TAKEN_S
        willing = {n: i for n, i in matches.items() if self._not_taken.get(n, -1e18) < recent}
        matches = willing or matches  # one that did not take it lately (it must not lead)
        if not matches:
            return None
        return max(matches, key=lambda n: (matches[n], n))

    def tick(self) -> None:
        """Tick thread: offer the target TimeoutNow until pysyncobj sends it."""
        target = self._target
        if target is None or not self._view.is_leader:
            return
        answers: list[int] = []
        self._node.transferLeadership(target, lambda _res, err: answers.append(err))
        if answers and answers[0] == FAIL_REASON.SUCCESS:
            self._target = None  # TimeoutNow sent; the caller waits for the election
            log.info("leadership transfer: TimeoutNow sent to %s", target.address)
        # REQUEST_DENIED: the target lacks an entry yet -- offered again next tick

    def after_lease_lapsed(self) -> None:
        """Tick thread, just after this replica stopped leading because its lease lapsed:
        TimeoutNow, at the term it led in, to the member with the highest match index it
        knew, passing over full disks and members that did not take a transfer lately."""
        node = self._node
        names = self._view.address_names()
        by_name = {names[n.address]: n for n in node._SyncObj__otherNodes if n.address in names}
        matches = {name: node._SyncObj__raftMatchIndex.get(n, 0) for name, n in by_name.items()}
        recent = time.monotonic() - TRANSFER_NOT_TAKEN_S
        fit = {n: i for n, i in matches.items()
               if not self._follower_disks.is_full(n) and self._not_taken.get(n, -1e18) < recent}
        if not fit:
            return
        target = max(fit, key=lambda n: (fit[n], n))
        node._SyncObj__transport.send(by_name[target], {"type": "timeout_now",
                                                        "term": node._SyncObj__raftCurrentTerm})
        self.lease_hand_offs += 1
        log.info("no majority answered within the leader lease: stepped down; TimeoutNow sent to %s "
                 "(it stands at once if it still hears this replica)", target)

    def start_hand_over(self) -> None:
        """A leader that must not lead: hand over from a thread (one at a time)."""
        with self._hand_over_lock:
            if self._hand_over_thread is not None and self._hand_over_thread.is_alive():
                return
            self._hand_over_thread = threading.Thread(target=self._hand_over, name="dledger-hand-over",
                                                      daemon=True)
            self._hand_over_thread.start()

    def _hand_over(self) -> None:
        """Pass the leadership on as soon as a member has every entry (``transfer`` waits for
        that), while this replica leads and must not."""
        try:
            while self._view.is_leader and self._must_not_lead():
                roomy = [n for n, up in self._view.connected().items()
                         if up and not self._follower_disks.is_full(n)]
                if self._must_not_lead() == {DISK_FULL} and not roomy:
                    time.sleep(_HAND_OVER_RETRY_S)  # every other member's disk is full too
                    continue
                if self.transfer(timeout=_HAND_OVER_TIMEOUT_S) is not None:
                    return
                time.sleep(_HAND_OVER_RETRY_S)  # no member connected, or none caught up in time
        except ProposeError:
            pass  # deposed meanwhile
