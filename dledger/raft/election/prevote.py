"""Pre-vote (Raft thesis §9.6): a replica asks before it stands for election.

pysyncobj starts an election -- raising its term -- as soon as its election deadline
passes while it is connected to any peer. A follower whose links drop messages while
the TCP connections stay up (a one-way fault, a switch that swallows frames) therefore
raises its term again and again, and when the link heals its higher term deposes a
healthy leader. With pre-vote it first asks every member::

    candidate                                        each other member
      deadline passed, not transferring  --pre_vote{round, term+1, last index/term}-->
                                         <--pre_vote_response{round, granted}--------
      granted by a majority (itself counted): let pysyncobj stand now

A member grants when it may vote (``dledger.raft.storage_rule``), is not the leader, has not
heard from a leader for the minimum election timeout, the proposed term is above its own,
and the candidate's log is at least as up to date as its own (the vote rule, §5.4.1). Nothing changes state on
either side: no term is raised and no vote is cast by a pre-vote.

How it is attached (pysyncobj 0.3.17, pinned; see docs/ARCHITECTURE.md): pysyncobj's
election deadline (the private ``__raftElectionDeadline``) is an ``ElectionDeadlineHold``
on ``RaftNode``: a deadline pysyncobj sets (heard a leader, voted, stood) goes to
``PreVote``, which remembers it as when it would stand, and pysyncobj reads one far in
the future -- from the moment it is set, so no pause between pysyncobj's message handling
and its next election check lets it stand unasked. ``PreVote.tick`` runs a round when
the remembered deadline passes; a won round releases the deadline (0) so pysyncobj's own
election starts on its next tick. A leadership transfer (TimeoutNow sets the deadline to 0
and pysyncobj's private ``__transferInProgress``) skips pre-vote, as in etcd; a transfer
overtaken by a vote (pysyncobj drew a new deadline, its flag still set) is dropped, or the
replica would never ask nor stand again. The messages
travel on pysyncobj's own connections: ``GroupTransport`` hands them here instead of to
pysyncobj.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any

from dledger.raft.election.candidacy import OUT_OF_REACH_S

__all__ = ["ElectionDeadlineHold", "PreVote"]

log = logging.getLogger(__name__)

_FAR = 1e18  # pysyncobj's election deadline while pre-vote holds it
_LEADER = 2  # pysyncobj's _RAFT_STATE.LEADER


class ElectionDeadlineHold:
    """pysyncobj's ``__raftElectionDeadline`` as a data descriptor on the SyncObj subclass:
    once ``attach``ed, what pysyncobj assigns goes to ``PreVote.deadline_set`` and what it
    reads is ``PreVote.visible_deadline()``; before, a plain value."""

    _RAW = "_election_deadline_raw"
    _KEEPER = "_election_deadline_keeper"

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        keeper = obj.__dict__.get(self._KEEPER)
        return keeper.visible_deadline() if keeper is not None else obj.__dict__.get(self._RAW, 0.0)

    def __set__(self, obj: Any, value: float) -> None:
        keeper = obj.__dict__.get(self._KEEPER)
        if keeper is not None:
            keeper.deadline_set(value)
        else:
            obj.__dict__[self._RAW] = value

    @classmethod
    def attach(cls, obj: Any, keeper: PreVote) -> None:
        """From now on ``keeper`` holds ``obj``'s election deadline (the current one first)."""
        current = obj.__dict__.get(cls._RAW, 0.0)
        obj.__dict__[cls._KEEPER] = keeper
        keeper.deadline_set(current)


class PreVote:
    """The pre-vote of one replica; every method runs on pysyncobj's tick thread."""

    def __init__(self, node: Any, min_timeout: Callable[[], float],
                 timeouts: Callable[[], tuple[float, float]], clock: Callable[[], float] = time.monotonic,
                 rng: random.Random | None = None, may_vote: Callable[[], bool] = lambda: True) -> None:
        """``node``: the SyncObj; ``min_timeout``: the configured minimum election timeout
        (s); ``timeouts``: the (min, max) election timeouts in force (1e9 while the replica
        does not stand)."""
        self._node = node
        self._min_timeout = min_timeout
        self._timeouts = timeouts
        self._clock = clock
        self._may_vote = may_vote
        self._rng = rng or random.Random()
        self._due: float | None = None  # when this replica would stand, had it not asked
        self._round = 0
        self._asking: set[Any] | None = None  # grants of the open round (None: none open)
        self._heard_at = -_FAR  # last append from a leader of the current term or newer
        self._released = False  # pysyncobj may stand on its next tick (a won round, TimeoutNow)
        self.rounds = 0
        self.won = 0
        self._failed_streak = 0
        if not isinstance(getattr(type(node), "_SyncObj__raftElectionDeadline", None), ElectionDeadlineHold):
            raise TypeError(f"{type(node).__name__}'s election deadline is not an ElectionDeadlineHold")
        ElectionDeadlineHold.attach(node, self)

    # -- the private pysyncobj state read and written here ---------------------------
    def _get(self, name: str) -> Any:
        return getattr(self._node, f"_SyncObj__{name}")

    def _set(self, name: str, value: Any) -> None:
        setattr(self._node, f"_SyncObj__{name}", value)

    def _last_log(self) -> tuple[int, int]:
        return self._get("getCurrentLogTerm")(), self._get("getCurrentLogIndex")()

    def _members(self) -> Any:
        return self._get("otherNodes")

    @property
    def heard_at(self) -> float:
        """When an append from a leader of the current term (or newer) last arrived."""
        return self._heard_at

    # -- pysyncobj's election deadline (ElectionDeadlineHold) ------------------------------
    def deadline_set(self, value: float) -> None:
        """pysyncobj assigned its election deadline: 0 (TimeoutNow) lets it stand at once;
        any other is remembered as when it would stand, and asked for first."""
        if value <= 0:
            self._released = True
            return
        self._released = False
        self._due = value if value < _FAR else None

    def visible_deadline(self) -> float:
        """The deadline pysyncobj's election check sees."""
        return 0.0 if self._released else _FAR

    # -- the candidate's side ------------------------------------------------------------
    def tick(self) -> None:
        if self._get("raftState") == _LEADER or self._get("selfNode") is None:
            self._due, self._asking = None, None
            return
        if self._get("transferInProgress"):
            if self._released:
                return  # TimeoutNow from the leader: pysyncobj stands on its next tick
            # pysyncobj drew a new deadline after the TimeoutNow (it voted for a candidate
            # of a higher term first) and keeps its transfer flag until it stands or hears a
            # higher term: a stale flag, which would skip every round here for good
            self._set("transferInProgress", False)
        lo, hi = self._timeouts()
        now = self._clock()
        if lo >= OUT_OF_REACH_S:  # not standing (a learner, a replica waiting for a snapshot)
            self._due, self._asking = None, None
            return
        if self._due is None:  # just stepped down, or stands again
            self._due = now + self._rng.uniform(lo, hi)
        if now >= self._due:
            self._due = now + self._rng.uniform(lo, hi)
            self._ask()

    def _ask(self) -> None:
        self._round += 1
        self.rounds += 1
        self._asking = set()
        term = self._get("raftCurrentTerm") + 1
        last_term, last_index = self._last_log()
        message = {"type": "pre_vote", "round": self._round, "term": term,
                   "last_log_term": last_term, "last_log_index": last_index}
        transport = self._get("transport")
        for node in list(self._members()):
            transport.send(node, message)
        self._count()

    def _count(self) -> None:
        if self._asking is None:
            return
        members = len(self._members()) + 1
        votes = len(self._asking) + 1
        if votes * 2 > members:
            self.won += 1
            self._asking = None
            self._failed_streak = 0
            log.info("pre-vote won (%d of %d members): standing for election in term %d",
                     votes, members, self._get("raftCurrentTerm") + 1)
            self._released = True  # pysyncobj stands on its next tick
            self._due = None

    # -- messages (GroupTransport hands them here) ---------------------------------------
    def on_message(self, node: Any, message: dict[str, Any]) -> bool:
        """True if ``message`` was a pre-vote message (consumed); notes leader contact."""
        kind = message.get("type")
        if kind == "append_entries":
            if message.get("term", -1) >= self._get("raftCurrentTerm"):
                self._heard_at = self._clock()
                if self._failed_streak:
                    self._failed_streak = 0
            return False
        if kind == "pre_vote":
            granted = self._grants(node, message)
            self._get("transport").send(node, {"type": "pre_vote_response", "round": message.get("round"),
                                               "granted": granted})
            return True
        if kind == "pre_vote_response":
            if message.get("round") == self._round and self._asking is not None:
                if message.get("granted") and node in self._members():
                    self._asking.add(node)
                    self._count()
                elif not message.get("granted"):
                    self._note_refusal()
            return True
        return False

    def _note_refusal(self) -> None:
        self._failed_streak += 1
        if self._failed_streak == 1:
            log.info("pre-vote refused: a member still hears a leader or holds a newer log; "
                     "not standing for election")

    def _grants(self, node: Any, message: dict[str, Any]) -> bool:
        if self._get("raftState") == _LEADER or node not in self._members() or not self._may_vote():
            return False  # a leader, a stranger asking, or a storage that may not vote
        if self._clock() - self._heard_at < self._min_timeout():
            return False  # a leader was heard from within the minimum election timeout
        try:
            term = int(message["term"])
            theirs = (int(message["last_log_term"]), int(message["last_log_index"]))
        except (KeyError, TypeError, ValueError):
            return False
        return term > self._get("raftCurrentTerm") and theirs >= self._last_log()
