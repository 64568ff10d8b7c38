"""Records what a load generator was told and checks replicas against it.

One verifier for every fault test (in-process, multi-process, Toxiproxy): each
proposal has a unique id and one outcome -- ``ok`` (acknowledged at an index),
``failed`` (definitely not committed) or ``unknown`` (may have committed). The
checks:

* every acknowledged payload is in the log exactly once, at its acknowledged index;
* no payload appears twice; a ``failed`` one never appears;
* the logs of all replicas are identical (same entries, same positions, same terms);
* every replica applied every committed index exactly once, in order.
"""

from __future__ import annotations

import threading
import zlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from dledger.process.recording_machine import GAP_KIND

__all__ = ["History", "Violation", "check_applied", "check_history", "check_identical"]

DATA = 0


class Violation(AssertionError):
    """An invariant does not hold; the message lists the first offenders."""


@dataclass
class History:
    acked: dict[bytes, int] = field(default_factory=dict)
    failed: set[bytes] = field(default_factory=set)
    unknown: set[bytes] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def ok(self, payload: bytes, index: int) -> None:
        with self._lock:
            self.acked[payload] = index

    def fail(self, payload: bytes) -> None:
        with self._lock:
            self.failed.add(payload)

    def maybe(self, payload: bytes) -> None:
        with self._lock:
            self.unknown.add(payload)

    @property
    def acked_count(self) -> int:
        return len(self.acked)


def check_history(entries: list[list[Any]], history: History, who: str = "log") -> None:
    """``entries`` are ``[index, term, kind, position, body]`` rows of one replica."""
    bodies = [row[4] for row in entries if row[2] == DATA]
    counts = Counter(bodies)
    dupes = [b for b, n in counts.items() if n > 1]
    if dupes:
        raise Violation(f"{who}: {len(dupes)} payloads stored more than once, e.g. {dupes[:3]}")
    at = {row[4]: row[0] for row in entries if row[2] == DATA}
    missing = [p for p in history.acked if p not in at]
    if missing:
        raise Violation(f"{who}: {len(missing)} acknowledged payloads lost, e.g. {missing[:3]}")
    moved = [(p, i, at[p]) for p, i in history.acked.items() if at[p] != i]
    if moved:
        raise Violation(f"{who}: {len(moved)} payloads not at their acknowledged index: {moved[:3]}")
    resurrected = [p for p in history.failed if p in at]
    if resurrected:
        raise Violation(f"{who}: {len(resurrected)} definitely-failed payloads were stored")
    indexes = [row[0] for row in entries]
    if indexes and indexes != list(range(indexes[0], indexes[0] + len(indexes))):
        raise Violation(f"{who}: committed indexes are not contiguous")


def check_identical(logs: dict[str, list[list[Any]]]) -> None:
    """Every replica's committed log has the same rows (index, term, kind, position, body)."""
    names = list(logs)
    ref_name = names[0]
    ref = logs[ref_name]
    for name in names[1:]:
        other = logs[name]
        if len(other) != len(ref):
            raise Violation(f"{name} has {len(other)} committed entries, {ref_name} {len(ref)}")
        for a, b in zip(ref, other, strict=True):
            if a != b:
                raise Violation(f"{name} differs from {ref_name} at index {a[0]}: "
                                f"{a[:4]} vs {b[:4]}")


def check_applied(records: list[tuple[int, int, int, int]], entries: list[list[Any]],
                  who: str = "replica") -> None:
    """``records`` from a RecordingMachine: each committed index once, in order, same bytes,
    up to the last of ``entries`` (an applied log that stops short -- or is empty -- while
    entries are committed is a violation: nothing compared is not agreement)."""
    last_committed = max((row[0] for row in entries), default=0)
    last_applied = max((index for index, *_ in records), default=0)
    if last_applied < last_committed:
        raise Violation(f"{who}: applied up to index {last_applied} ({len(records)} records), "
                        f"committed up to {last_committed}")
    expected = 1
    for index, _, kind, _ in records:
        if kind == GAP_KIND and index >= expected - 1:
            expected = index + 1  # a reported retention gap
            continue
        if index != expected:
            raise Violation(f"{who}: applied index {index} where {expected} was due")
        expected += 1
    by_index = {row[0]: row for row in entries}
    for index, term, kind, crc in records:
        row = by_index.get(index)
        if row is None or kind == GAP_KIND:
            continue
        if (term, kind, crc) != (row[1], row[2], zlib.crc32(row[4])):
            raise Violation(f"{who}: applied entry {index} differs from the committed one")
