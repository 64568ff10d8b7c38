"""Candidacy: whether a replica may start an election, and the reasons it must not lead.

A replica always votes. It stands for election only while no reason holds it back:

    NOT_A_MEMBER   a learner, or a replica removed from the group (never stands)
    STORAGE_NOT_RECORDED  a member whose storage is new or replaced, until the leader has
                   recorded it (never stands; it does not vote either: dledger.raft.storage_rule)
    DISK_FULL      its disk cannot take an entry (``dledger.storage.disk_guard``)
    others         given by the broker: its state is known wrong, a snapshot is awaited

A member that must not lead still stands when no leader has been heard for
``HANDOVER_AFTER_TIMEOUTS`` maximum election timeouts: it still holds the log, which may
hold committed entries no other reachable member has, and then no other member can win
an election (their logs are older). It stands only to hand the leadership over at once
(``dledger.raft.election.leadership_transfer``).

How it acts on pysyncobj (0.3.17, pinned): the election timeouts of our conf object,
read at each use, are set out of reach (1e9 s) while the replica must not stand; and a
leader's TimeoutNow (Raft's leadership transfer) to it is dropped, so the leader's
transfer times out and it picks another member.

Threads: the reasons change from any thread (the broker's, the tick thread); the
timeouts are read on the tick thread. A set of strings swapped whole is safe to read.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from common.refusal_log import Throttle

__all__ = ["DISK_FULL", "HANDOVER_AFTER_TIMEOUTS", "NOT_A_MEMBER", "STORAGE_NOT_RECORDED", "Candidacy"]

log = logging.getLogger("dledger.replicated_log")

NOT_A_MEMBER = "this replica is not a voting member of the group"
#: A member whose storage is not the one the group recorded for it (``dledger.raft.storage_rule``):
#: it may have forgotten what it acknowledged, so it never stands, not even to hand over.
STORAGE_NOT_RECORDED = "its storage is not (yet) the one the group recorded for it"
#: Why a replica whose disk is full does not stand (``stand_for_election``'s reason).
DISK_FULL = "its disk is full"
#: A member that does not stand stands after this many maximum election timeouts
#: without a leader -- only to hand the leadership over (module docstring).
HANDOVER_AFTER_TIMEOUTS = 3
OUT_OF_REACH_S = 1e9  # the election timeouts of a replica that must not stand
_REFUSAL_LOG_S = 10.0  # a refused transfer is logged at most this often


class Candidacy:
    """The reasons this replica must not lead, and the election timeouts they leave."""

    def __init__(self, election_timeout_ms: tuple[int, int], reasons: set[str] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``election_timeout_ms``: the configured (min, max); ``reasons``: held from the
        start (before pysyncobj draws its first election deadline)."""
        self._timeouts = (election_timeout_ms[0] / 1000, election_timeout_ms[1] / 1000)
        self._reasons: frozenset[str] = frozenset(reasons or ())
        self._clock = clock
        self._started = clock()
        self._led_at = 0.0  # when this replica last led (for the hand-over rule)
        self._handing_over = False  # standing only to hand over
        self._refusals_logged = Throttle(_REFUSAL_LOG_S, clock)

    @property
    def reasons(self) -> frozenset[str]:
        """Why this replica must not lead now (empty: it may)."""
        return self._reasons

    def set(self, allowed: bool, reason: str) -> bool:
        """Lift or hold ``reason``; returns True when it is newly held."""
        if allowed:
            if reason in self._reasons:
                self._reasons = self._reasons - {reason}
                log.info("this node may stand for election again (%s is over)", reason)
            return False
        if reason in self._reasons:
            return False
        self._reasons = self._reasons | {reason}
        log.log(logging.INFO if reason in (NOT_A_MEMBER, STORAGE_NOT_RECORDED) else logging.ERROR,
                "this node no longer stands for election: %s", reason)
        return True

    def timeouts(self, is_leader: bool, leader_heard_at: float) -> tuple[float, float]:
        """The (min, max) election timeouts in force: the configured ones, or out of reach
        while a reason holds and no hand-over is due. pysyncobj never stands while it is
        connected to no peer; a node whose link drops messages while the connection stays
        up would, but ``dledger.raft.election.prevote`` makes it ask the members first."""
        lo, hi = self._timeouts
        if self._reasons and not self._may_stand_to_hand_over(is_leader, leader_heard_at):
            return OUT_OF_REACH_S, OUT_OF_REACH_S
        return lo, hi

    def _may_stand_to_hand_over(self, is_leader: bool, leader_heard_at: float) -> bool:
        if NOT_A_MEMBER in self._reasons or STORAGE_NOT_RECORDED in self._reasons:
            return False
        now = self._clock()
        if is_leader:
            self._led_at = now  # a leader hears no appends: it is the one heard
            return True  # the hand-over thread is at work; the timeouts do not matter now
        # pysyncobj's follower keeps naming a dead leader until a vote request arrives
        # (and none comes when this replica refuses the others' pre-votes): what counts is
        # when a leader's append was last heard.
        quiet = now - max(self._started, leader_heard_at, self._led_at)
        leaderless = quiet > HANDOVER_AFTER_TIMEOUTS * self._timeouts[1]
        if leaderless != self._handing_over:
            self._handing_over = leaderless
            if leaderless:
                log.warning("no leader heard for %.1f s and this replica's log may be the newest: "
                            "standing for election only to hand the leadership over (%s)",
                            quiet, "; ".join(sorted(self._reasons)))
        return leaderless

    def refuse_transfer(self, message: dict[str, Any]) -> bool:
        """Transport intercept (tick thread): a leader's TimeoutNow to a replica that must not
        lead (a full disk, a snapshot awaited, a state known wrong) is dropped -- standing now
        would only hand the leadership on again, an extra election. Returns whether it was."""
        if message.get("type") != "timeout_now" or not self._reasons:
            return False
        if self._refusals_logged.take("transfer") is not None:
            log.info("refused a leadership transfer: this replica must not lead (%s)",
                     "; ".join(sorted(self._reasons)))
        return True
