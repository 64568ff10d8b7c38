"""Which old CommitLog segments may be deleted (a pure decision, no I/O).

A segment may go when it is not the active (last) one, every entry in it is
below the *floor* -- the lowest index still needed by this node (its committed
and applied index) or, on a leader, by a follower (its match index) -- and it is
either older than the age limit or the log is over its size cap.

The size cap is a hard limit: when a follower that is down or lagging holds the
floor back, segments beyond the age limit wait for it, but the size cap still
deletes them. That follower then sits behind the retained start; the leader
reports it in ``status().followers_behind_retained_start`` and logs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dledger.storage.segments import SegmentInfo

__all__ = ["RetentionPlan", "plan_retention"]


@dataclass(frozen=True, slots=True)
class RetentionPlan:
    delete_below_position: int  # delete whole segments ending at or before this position
    segments: int               # how many segments that removes
    blocked_by_floor: int       # expired segments kept because the floor holds them


def plan_retention(segments: Sequence[SegmentInfo], segment_size: int, *, now: float,
                   max_age_s: float, max_bytes: int | None, floor_position: int,
                   node_floor_position: int) -> RetentionPlan:
    """Decide how far to delete.

    ``floor_position``: position of the lowest entry anybody still needs (this node
    and, on a leader, every follower). ``node_floor_position``: the same for this
    node alone; the size cap may delete up to it even past ``floor_position``.
    """
    closed = list(segments[:-1])  # never the active segment
    total = sum(s.size_on_disk for s in segments)
    bound = segments[0].start if segments else 0
    count = blocked = 0
    for seg in closed:
        end = seg.start + segment_size
        expired = now - seg.mtime > max_age_s
        over_cap = max_bytes is not None and total > max_bytes
        if not (expired or over_cap):
            break
        limit = node_floor_position if over_cap else floor_position
        if end > limit:
            blocked += 1 if expired else 0
            break
        bound = end
        count += 1
        total -= seg.size_on_disk
    return RetentionPlan(bound, count, blocked)
