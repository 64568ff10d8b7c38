"""``StageClock``: where one entry's commit time goes, stage by stage (issue 30).

An entry's life on the leader and on a follower is a fixed sequence of points; the time
between two consecutive points is a *stage*, observed into one ``LatencyHistogram`` per
stage (``/metrics``: ``raftmq_commit_stage_seconds{stage}``; the log node's ``/stages``;
``scripts/bench-log --breakdown``). Every stage is timed inside one process
(``time.perf_counter``); a follower times its own stages by the entry's index.

    the server's own (the process answering the client; ``observe``):
      receive          request read -> proposal submitted
      answer           commit answer ready -> response handed to the connection
    the leader's (``proposed`` .. ``applied``):
      queue            submitted -> pysyncobj's tick thread takes it (thread hand-off, tick)
      append           the journal's append of the entry (no fsync)
      leader_fsync     appended -> the fsync covering it ends (flush before send)
      send             fsynced -> the first append_entries carrying it is written to a peer
      replicate        sent -> the first follower ack covering it is read (wire, follower, wire)
      commit           acked -> pysyncobj advances the commit index over it
      apply            committed -> pysyncobj applies it and the proposal is answered
    a follower's (``received`` .. ``ack_sent``):
      follower_append  append_entries read -> the entry appended to its journal
      follower_fsync   appended -> the fsync covering it ends
      follower_ack     fsynced -> its next_node_idx ack written to the leader

Points are reached in index order, so each point keeps a queue of (index, time) waiting
for the next one, and ``reach(upto)`` moves every waiting index <= ``upto`` on. Queues are
bounded (entries nobody will ever carry on -- a leader's own no-op -- fall off the front).

It knows no pysyncobj (it sits in the Log API beside ``dledger.latency``): the Raft adapter
calls the hooks (``dledger.raft.proposals``, ``.journal``, ``.transport``).

Threads: ``proposed`` and ``observe`` from any thread; everything else on pysyncobj's tick
thread. A histogram has one writer thread each (the tick thread, or the server's loop).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from dledger.latency import LatencyHistogram

__all__ = ["FOLLOWER_STAGES", "LEADER_STAGES", "SERVER_STAGES", "STAGES", "STAGE_BUCKETS", "StageClock"]

SERVER_STAGES = ("receive", "answer")
LEADER_STAGES = ("queue", "append", "leader_fsync", "send", "replicate", "commit", "apply")
FOLLOWER_STAGES = ("follower_append", "follower_fsync", "follower_ack")
STAGES = SERVER_STAGES + LEADER_STAGES + FOLLOWER_STAGES

#: Seconds: stages of a few microseconds up to a busy box's tens of milliseconds.
STAGE_BUCKETS = (0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025,
                 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
WAITING_PER_POINT = 8192
_PROPOSED_HELD = 65536


class _Pipeline:
    """Points 0..n of one role; stage i lies between point i and point i + 1."""

    def __init__(self, stages: tuple[str, ...], histograms: dict[str, LatencyHistogram]) -> None:
        self._stages = [histograms[s] for s in stages]
        self._waiting: list[deque[tuple[int, float]]] = [
            deque(maxlen=WAITING_PER_POINT) for _ in stages]

    def enter(self, index: int, at: float) -> None:
        """``index`` reached point 0 at ``at``."""
        self._waiting[0].append((index, at))

    def step(self, point: int, index: int, began: float, at: float) -> None:
        """``index`` reached ``point`` (>= 1) at ``at``, the previous point at ``began``."""
        self._stages[point - 1].observe(at - began)
        if point < len(self._stages):
            self._waiting[point].append((index, at))

    def reach(self, point: int, upto: int, at: float) -> None:
        """Every index <= ``upto`` waiting at ``point - 1`` reached ``point`` at ``at``."""
        waiting = self._waiting[point - 1]
        while waiting and waiting[0][0] <= upto:
            index, began = waiting.popleft()
            self.step(point, index, began, at)


class StageClock:
    """The stage histograms of one replica and the hooks that feed them (module docstring)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.histograms = {s: LatencyHistogram(STAGE_BUCKETS) for s in STAGES}
        self._leader = _Pipeline(LEADER_STAGES, self.histograms)
        self._follower = _Pipeline(FOLLOWER_STAGES, self.histograms)
        self._proposed: dict[int, float] = {}  # id(command bytes) -> when submitted
        self._lock = threading.Lock()
        self._receiving: float | None = None

    # -- the server's stages ----------------------------------------------------------
    def observe(self, stage: str, seconds: float) -> None:
        """A server stage (``SERVER_STAGES``) took ``seconds``; one writer thread per stage."""
        self.histograms[stage].observe(seconds)

    # -- the leader's points ----------------------------------------------------------------
    def proposed(self, command: bytes) -> None:
        """Any thread: ``command`` (the very bytes object given to pysyncobj) was submitted."""
        with self._lock:
            if len(self._proposed) >= _PROPOSED_HELD:
                self._proposed.clear()
            self._proposed[id(command)] = self.clock()

    def appended(self, index: int, command: bytes, began: float) -> None:
        """The journal appended ``index`` (``command``), starting at ``began``: a proposal of
        this node enters the leader's points, an entry read from a leader the follower's."""
        now = self.clock()
        with self._lock:
            submitted = self._proposed.pop(id(command), None)
        if submitted is not None:
            self._leader.enter(index, submitted)
            self._leader.reach(1, index, began)
            self._leader.reach(2, index, now)
        elif self._receiving is not None:
            self._follower.enter(index, self._receiving)
            self._follower.reach(1, index, now)

    def synced(self, upto: int) -> None:
        """An fsync covering every entry <= ``upto`` ended."""
        now = self.clock()
        self._leader.reach(3, upto, now)
        self._follower.reach(2, upto, now)

    def sent(self, upto: int) -> None:
        """An append_entries carrying entries up to ``upto`` was written to a peer."""
        self._leader.reach(4, upto, self.clock())

    def acked(self, upto: int) -> None:
        """A follower's ack that it holds every entry <= ``upto`` was read."""
        self._leader.reach(5, upto, self.clock())

    def committed(self, upto: int) -> None:
        self._leader.reach(6, upto, self.clock())

    def applied(self, index: int) -> None:
        """The proposal of ``index`` was answered with its commit."""
        self._leader.reach(7, index, self.clock())

    # -- a follower's points ----------------------------------------------------------------
    def receiving(self, started: bool) -> None:
        """An append_entries from the leader is being handled (True) or was (False)."""
        self._receiving = self.clock() if started else None

    def ack_sent(self, upto: int) -> None:
        """This follower's ack of every entry <= ``upto`` was written to the leader."""
        self._follower.reach(3, upto, self.clock())
