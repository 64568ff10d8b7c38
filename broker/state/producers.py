"""Idempotent producers: each one's last sequence on each queue (replicated state).

A message carrying (producer id, sequence) is stored only if sequence == last + 1 for that
producer and queue; a resend of a stored one (sequence <= last) is answered DUPLICATE with
its original queue offset (for the last RECENT_SEQUENCES) and not stored again; a gap
(sequence > last + 1) is refused. A producer silent on a queue for PRODUCER_EXPIRY_MS of
store time is forgotten: its next sequence must be 0 again.

Checkpoint form: ``{"producer\\0topic\\0queue id": [last sequence, [queue offsets of the
last sequences, oldest first], store ms of the last]}``; older checkpoints held
``[sequence, offset]`` pairs, and no store time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from broker.state.keys import ProducerQueue, join_key, split_key
from broker.state.outcome import Kept, Outcome, kept

__all__ = ["PRODUCER_EXPIRY_MS", "RECENT_SEQUENCES", "ProducerWindows"]

RECENT_SEQUENCES = 256   # per producer and queue: sequences answered on a retry
#: An idempotent producer silent on a queue this long is forgotten (its next sequence must be 0).
PRODUCER_EXPIRY_MS = 24 * 3600 * 1000


@dataclass(slots=True)
class _Window:
    last_sequence: int
    offsets: list[int]  # queue offsets of the sequences up to the last; offsets[-1] is the last's
    last_ms: int        # store time of the last


class ProducerWindows:
    """Apply thread only."""

    def __init__(self, state: Mapping[str, list[Any]] | None = None) -> None:
        self._windows: dict[ProducerQueue, _Window] = {}
        for text, (last, offsets, *rest) in (state or {}).items():
            if offsets and isinstance(offsets[0], list):  # written as [sequence, offset] pairs
                offsets = [offset for _, offset in offsets]
            self._windows[split_key(text)] = _Window(last, list(offsets), rest[0] if rest else 0)

    def admit(self, key: ProducerQueue, sequence: int, now_ms: int) -> Kept | None:
        """None if ``sequence`` is the next of ``key``'s; else the result that refuses it
        (DUPLICATE with its original queue offset, or -1 if forgotten; SEQUENCE_GAP). ``now_ms``:
        the apply step's store time, which decides expiry alike on every replica."""
        window = self._windows.get(key)
        if window is None:
            last = -1
        elif window.last_ms < now_ms - PRODUCER_EXPIRY_MS:
            del self._windows[key]
            last = -1
        else:
            last = window.last_sequence
        if sequence == last + 1:
            return None
        if sequence <= last:
            assert window is not None
            recent, back = window.offsets, last - sequence  # recent[-1] is last's offset
            original = recent[-1 - back] if back < min(len(recent), RECENT_SEQUENCES) else -1
            return kept(Outcome.DUPLICATE, key[2], original, reason=f"sequence {sequence} was already stored")
        return kept(Outcome.SEQUENCE_GAP, key[2], reason=f"sequence {sequence} after {last}: a gap")

    def record(self, key: ProducerQueue, sequence: int, queue_offset: int, stamp: int) -> None:
        """``sequence`` (admitted) was stored at ``queue_offset`` (-1: held) at store time ``stamp``."""
        window = self._windows.get(key)
        if window is None:
            self._windows[key] = _Window(sequence, [queue_offset], stamp)
            return
        window.last_sequence, window.last_ms = sequence, stamp
        offsets = window.offsets
        offsets.append(queue_offset)
        if len(offsets) > 2 * RECENT_SEQUENCES:  # trimmed now and then: amortised O(1)
            del offsets[:-RECENT_SEQUENCES]

    def forget_expired(self, now_ms: int) -> None:
        """Drop what lookups already treat as absent (producers silent for PRODUCER_EXPIRY_MS),
        and keep the offsets of the last RECENT_SEQUENCES sequences only."""
        horizon = now_ms - PRODUCER_EXPIRY_MS
        for key in [k for k, w in self._windows.items() if w.last_ms < horizon]:
            del self._windows[key]
        for window in self._windows.values():
            del window.offsets[:-RECENT_SEQUENCES]

    def forget_topic(self, topic: str) -> None:
        """Deleted means deleted: a topic created again under the name takes sequence 0 as new."""
        for key in [k for k in self._windows if k[1] == topic]:
            del self._windows[key]

    def state(self) -> dict[str, list[Any]]:
        return {join_key(k): [w.last_sequence, w.offsets, w.last_ms] for k, w in self._windows.items()}
