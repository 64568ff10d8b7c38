"""Retention on one replica: deleting the log's old segments where ``dledger.storage.retention``'s plan
allows, and a leader's followers that fell behind the retained start.

    tick()                        the tick thread: ``enforce`` every ``retention_check_s``
    enforce(now)                  cut the log at a segment start, only after whose previous
                                  entry the state machine holds a snapshot (when it has any)
    followers_behind()            a leader's followers that need entries retention deleted

What is kept: every entry above the committed and the applied index, on a leader every
entry a follower still lacks, and every position a held message of the state machine
still reads (``SnapshotSource.oldest_held_position``; the broker's leader carries held
messages forward before this floor reaches the size cap or the age limit:
``broker.deferred.carry_forward``). After a cut the members before it are
forgotten, the retained start rewritten (``dledger.raft.retained_start``) and older snapshots
pruned.

Threads: ``tick``/``enforce`` on the tick thread only -- pysyncobj computes positions
relative to the first entry, which must not move between its own calls;
``followers_behind`` from any thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from dledger.config import GroupConfig
from dledger.membership import MemberHistory
from dledger.raft.node import RaftView
from dledger.raft.retained_start import RetainedStart
from dledger.storage.commitlog import CommitLog
from dledger.storage.retention import RetentionPlan, plan_retention

__all__ = ["LogRetention"]

log = logging.getLogger("dledger.replicated_log")


class LogRetention:
    """One replica's retention (module docstring)."""

    def __init__(self, config: GroupConfig, commitlog: CommitLog, view: RaftView, history: MemberHistory,
                 start: RetainedStart, committed_index: Callable[[], int]) -> None:
        self._config = config
        self._commitlog = commitlog
        self._view = view
        self._history = history
        self._start = start
        self._committed_index = committed_index
        self.applied_floor: Callable[[], int] = committed_index
        self._next = time.monotonic() + config.retention_check_s
        self._behind_reported: set[str] = set()

    def tick(self) -> None:
        if time.monotonic() < self._next:
            return
        self._next = time.monotonic() + self._config.retention_check_s
        try:
            self.enforce()
        except Exception:
            log.exception("retention failed; will retry")

    def enforce(self, now: float | None = None) -> RetentionPlan:
        """Delete expired segments (see dledger.storage.retention). Tick thread only."""
        c, cl, snapshots = self._config, self._commitlog, self._start.snapshots
        node_floor = min(self._committed_index(), self.applied_floor())
        floor = node_floor
        if self._view.is_leader:
            matches = self._view.follower_indexes("match_idx_server_")
            floor = min([floor, *matches.values()])
        held = snapshots.oldest_held_position() if snapshots is not None else None
        keep = cl.write_position if held is None else held  # messages the state still holds back
        plan = plan_retention(
            cl.segments(), c.segment_bytes, now=time.time() if now is None else now,
            max_age_s=c.retention_hours * 3600, max_bytes=c.retention_bytes,
            floor_position=min(self._position_at_or_after(floor), keep),
            node_floor_position=min(self._position_at_or_after(node_floor), keep))
        first = cl.index_at_position(plan.delete_below_position) if plan.segments else None
        if first is not None and snapshots is not None:
            first = self._cut_with_snapshot(first)
        if first is not None and first > cl.first_index:
            dropped = cl.delete_before(first)
            self._history.forget_below(first)
            self._start.write()
            if snapshots is not None:
                snapshots.prune_snapshots_below(first - 1)
            log.info("retention deleted %d entries; log now starts at %d (%d bytes kept)",
                     dropped, cl.first_index, cl.write_position - cl.start_position)
        if plan.blocked_by_floor:
            log.info("retention keeps %d expired segments for a lagging follower",
                     plan.blocked_by_floor)
        return plan

    def _cut_with_snapshot(self, first: int) -> int | None:
        """The highest segment start at or below ``first`` after whose previous entry the
        state machine holds a snapshot (None: nowhere, so nothing is deleted)."""
        cl, snapshots = self._commitlog, self._start.snapshots
        assert snapshots is not None
        for held in sorted(snapshots.snapshot_indexes(), reverse=True):
            start = held + 1
            if cl.first_index < start <= min(first, cl.last_index) and \
                    cl.position_of(start) % self._config.segment_bytes == 0:
                return start
        return None

    def _position_at_or_after(self, index: int) -> int:
        cl = self._commitlog
        if index < cl.first_index:
            return cl.start_position
        if index > cl.last_index:
            return cl.write_position
        return cl.position_of(index)

    def followers_behind(self) -> list[str]:
        """Followers the leader can no longer feed: they need entries retention deleted."""
        if not self._view.is_leader:
            return []
        first, snapshots = self._commitlog.first_index, self._start.snapshots
        behind = sorted(n for n, nxt in self._view.follower_indexes("next_node_idx_server_").items()
                        if nxt <= first)
        for name in set(behind) - self._behind_reported:
            if snapshots is not None and snapshots.snapshot_bytes(first - 1) is not None:
                log.warning("follower %s needs entries before %d, which retention deleted: it is "
                            "sent the snapshot at %d and the log from %d", name, first, first - 1, first)
            else:
                log.error("follower %s needs entries before %d, which retention deleted: it cannot "
                          "catch up from this leader (see docs/DURABILITY.md)", name, first)
        self._behind_reported = set(behind)
        return behind
