"""Idempotent producers: each one's last sequence on each queue (replicated state).

A record carrying (producer id, base sequence, count) is stored only if base == last + 1
for that producer and queue; it then takes sequences base .. base + count - 1. A resend
of a stored record (the same base and count, as first sent) is answered DUPLICATE with
its original base queue offset (for the last RECENT_RECORDS records); a record that
overlaps stored sequences any other way is refused (INVALID: a resend must be the whole
record as first sent); a gap (base > last + 1) is refused. A producer silent on a queue
for PRODUCER_EXPIRY_MS of store time is forgotten: its next sequence must be 0 again.

The table is bounded: a new window beyond MAX_PRODUCER_WINDOWS first drops the expired ones
(as of the entry's store time) and then, if still full, the tenth written longest ago
(oldest last store time, then key), which are forgotten as if expired. Both depend only on
the windows lookups see -- not on when a replica's checkpoint last pruned expired ones --
so every replica evicts alike. A producer silent while about MAX_PRODUCER_WINDOWS / 10
others start may thus lose its window early: its resend of an old record is then stored
again (a Spark sink's replay after a failure comes within minutes; see docs/SPARK.md).

Checkpoint form: ``{"producer\\0topic\\0queue id": [last sequence, [[base sequence, count,
base offset], ... oldest first], store ms of the last]}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from broker.state.keys import ProducerQueue, join_key, split_key
from broker.state.outcome import Kept, Outcome, kept

__all__ = ["MAX_PRODUCER_WINDOWS", "PRODUCER_EXPIRY_MS", "RECENT_RECORDS", "ProducerWindows"]

RECENT_RECORDS = 256  # per producer and queue: records answered on a retry (a batch of 256
#                     messages split into records of one, e.g. delayed ones, is answered whole)
#: An idempotent producer silent on a queue this long is forgotten (its next sequence must be 0).
PRODUCER_EXPIRY_MS = 24 * 3600 * 1000
#: At most this many windows (each at most 2 x RECENT_RECORDS records): a client inventing
#: producer ids, or a Spark sink's id per batch and partition, cannot grow the state unbounded.
MAX_PRODUCER_WINDOWS = 50_000


@dataclass(slots=True)
class _Window:
    last_sequence: int
    records: list[list[int]]  # [base sequence, count, base offset] of the last records, oldest first
    last_ms: int              # store time of the last


class ProducerWindows:
    """Apply thread only."""

    def __init__(self, state: Mapping[str, list[Any]] | None = None) -> None:
        self._windows: dict[ProducerQueue, _Window] = {}
        for text, (last, records, last_ms) in (state or {}).items():
            self._windows[split_key(text)] = _Window(last, [list(r) for r in records], last_ms)

    def admit(self, key: ProducerQueue, base: int, count: int, now_ms: int) -> Kept | None:
        """None if the record of sequences ``base`` .. ``base + count - 1`` is the next of
        ``key``'s; else the result that refuses it (DUPLICATE with its original base queue
        offset, or -1 if forgotten; INVALID for a partial overlap; SEQUENCE_GAP). ``now_ms``:
        the apply step's store time, which decides expiry alike on every replica."""
        window = self._windows.get(key)
        if window is None:
            last = -1
        elif window.last_ms < now_ms - PRODUCER_EXPIRY_MS:
            del self._windows[key]
            last = -1
        else:
            last = window.last_sequence
        if base == last + 1:
            return None
        if base > last + 1:
            return kept(Outcome.SEQUENCE_GAP, key[2], reason=f"sequence {base} after {last}: a gap")
        assert window is not None
        # Only the last RECENT_RECORDS: the list holds up to twice that between trims, and a
        # checkpoint trims it at a time of each replica's own -- the answer must not depend on it.
        recent = window.records[-RECENT_RECORDS:]
        for first, n, offset in reversed(recent):
            if first == base and n == count:
                return kept(Outcome.DUPLICATE, key[2], offset, reason=f"sequence {base} was already stored")
            if first <= base < first + n or base < first < base + count:
                break
        else:
            if base + count - 1 <= last and (not recent or base + count <= recent[0][0]):
                return kept(Outcome.DUPLICATE, key[2], -1, reason=f"sequence {base} was already stored")
        return kept(Outcome.INVALID, key[2], reason=(
            f"sequences {base}..{base + count - 1} overlap the stored ones (up to {last}) but are not a "
            "record as first sent: a resend must be the whole record, unchanged"))

    def record(self, key: ProducerQueue, base: int, count: int, queue_offset: int, stamp: int) -> None:
        """The record of sequences ``base`` .. (admitted) was stored at base ``queue_offset``
        (-1: held) at store time ``stamp``."""
        window = self._windows.get(key)
        if window is None:
            if len(self._windows) >= MAX_PRODUCER_WINDOWS:
                self._make_room(stamp)
            self._windows[key] = _Window(base + count - 1, [[base, count, queue_offset]], stamp)
            return
        window.last_sequence, window.last_ms = base + count - 1, stamp
        records = window.records
        records.append([base, count, queue_offset])
        if len(records) > 2 * RECENT_RECORDS:  # trimmed now and then: amortised O(1)
            del records[:-RECENT_RECORDS]

    def _make_room(self, now_ms: int) -> None:
        """The table is full: drop the expired windows, then (still full) the tenth written
        longest ago. Whether a replica gets here depends on when it last pruned, what stays
        does not: if the windows not expired at ``now_ms`` fill the table, every replica
        gets here and evicts the same ones; if not, none evicts any."""
        self.forget_expired(now_ms)
        excess = len(self._windows) - MAX_PRODUCER_WINDOWS + 1
        if excess <= 0:
            return
        drop = max(excess, MAX_PRODUCER_WINDOWS // 10)
        oldest = sorted(self._windows, key=lambda k: (self._windows[k].last_ms, join_key(k)))[:drop]
        for key in oldest:
            del self._windows[key]

    def forget_expired(self, now_ms: int) -> None:
        """Drop what lookups already treat as absent (producers silent for PRODUCER_EXPIRY_MS),
        and keep the last RECENT_RECORDS records only."""
        horizon = now_ms - PRODUCER_EXPIRY_MS
        for key in [k for k, w in self._windows.items() if w.last_ms < horizon]:
            del self._windows[key]
        for window in self._windows.values():
            del window.records[:-RECENT_RECORDS]

    def forget_topic(self, topic: str) -> None:
        """Deleted means deleted: a topic created again under the name takes sequence 0 as new."""
        for key in [k for k in self._windows if k[1] == topic]:
            del self._windows[key]

    def state(self) -> dict[str, list[Any]]:
        return {join_key(k): [w.last_sequence, w.records, w.last_ms] for k, w in self._windows.items()}
