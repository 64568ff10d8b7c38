"""The message-level history every client fault test records, and its one verifier.

Producers record each send attempt with its outcome; consumers record each
delivery. ``check`` then asserts the guarantees users buy:

* no loss: every SEND_OK message was delivered;
* order: per shard key, the first deliveries follow send order (acknowledged
  messages), and the queue offsets the broker acknowledged increase in send order;
* no duplicates stored: no message id was acknowledged at two places, and every
  message appears at most once in the stored queue (``stored`` rows, if given);
* an unknown-outcome message is delivered at most once per queue offset, and a
  failed one is never delivered;
* (``exactly_once``) no message was delivered twice.
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from dataclasses import dataclass, field

__all__ = ["MessageHistory", "Violation"]


class Violation(AssertionError):
    pass


@dataclass(frozen=True, slots=True)
class Sent:
    payload: bytes
    shard_key: str | None
    outcome: str            # "ok" | "failed" | "unknown"
    queue: str = ""
    offset: int = -1


@dataclass
class MessageHistory:
    sends: list[Sent] = field(default_factory=list)
    deliveries: list[tuple[bytes, str, int, str]] = field(default_factory=list)  # payload, queue, off, who
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def ok(self, payload: bytes, shard_key: str | None, queue: str, offset: int) -> None:
        with self._lock:
            self.sends.append(Sent(payload, shard_key, "ok", queue, offset))

    def failed(self, payload: bytes, shard_key: str | None) -> None:
        with self._lock:
            self.sends.append(Sent(payload, shard_key, "failed"))

    def unknown(self, payload: bytes, shard_key: str | None) -> None:
        with self._lock:
            self.sends.append(Sent(payload, shard_key, "unknown"))

    def delivered(self, payload: bytes, queue: str, offset: int, who: str = "") -> None:
        with self._lock:
            self.deliveries.append((payload, queue, offset, who))

    # -- views -------------------------------------------------------------------
    def acked(self) -> list[Sent]:
        return [s for s in self.sends if s.outcome == "ok"]

    def missing(self) -> set[bytes]:
        with self._lock:
            got = {d[0] for d in self.deliveries}
        return {s.payload for s in self.acked()} - got

    def summary(self) -> dict[str, int]:
        c = Counter(s.outcome for s in self.sends)
        delivered = Counter(d[0] for d in self.deliveries)
        return {"acked": c["ok"], "failed": c["failed"], "unknown": c["unknown"],
                "delivered": len(delivered), "redelivered": sum(n - 1 for n in delivered.values()),
                "lost": len(self.missing())}

    def check(self, exactly_once: bool = False) -> None:
        problems: list[str] = []
        acked = self.acked()
        # acknowledged places are unique
        places = Counter((s.queue, s.offset) for s in acked)
        dup_places = [p for p, n in places.items() if n > 1]
        if dup_places:
            problems.append(f"two messages acknowledged at one place: {dup_places[:5]}")
        ids = Counter(s.payload for s in acked)
        if any(n > 1 for n in ids.values()):
            problems.append(f"a message acknowledged twice: {[p for p, n in ids.items() if n > 1][:5]}")
        # order per shard key: acknowledged offsets increase in send order, on one queue
        by_key: dict[str, list[Sent]] = defaultdict(list)
        for s in acked:
            if s.shard_key is not None:
                by_key[s.shard_key].append(s)
        for key, rows in by_key.items():
            if len({r.queue for r in rows}) != 1:
                problems.append(f"shard key {key!r} was stored on several queues")
            offsets = [r.offset for r in rows]
            if offsets != sorted(offsets):
                problems.append(f"shard key {key!r}: acknowledged offsets out of send order")
        # no loss
        lost = self.missing()
        if lost:
            problems.append(f"{len(lost)} acknowledged messages never delivered, e.g. {sorted(lost)[:5]}")
        # deliveries: each payload at one place; failed never; order of first deliveries
        place_of: dict[bytes, set[tuple[str, int]]] = defaultdict(set)
        first_seen: dict[bytes, int] = {}
        for i, (payload, queue, offset, _who) in enumerate(self.deliveries):
            place_of[payload].add((queue, offset))
            first_seen.setdefault(payload, i)
        stored_twice = [p for p, where in place_of.items() if len(where) > 1]
        if stored_twice:
            problems.append(f"{len(stored_twice)} messages stored at two places (duplicates), "
                            f"e.g. {stored_twice[:3]}")
        failed = {s.payload for s in self.sends if s.outcome == "failed"} & set(place_of)
        if failed:
            problems.append(f"{len(failed)} messages reported failed were delivered: {sorted(failed)[:3]}")
        for key, rows in by_key.items():
            seen = [first_seen[r.payload] for r in rows if r.payload in first_seen]
            if seen != sorted(seen):
                problems.append(f"shard key {key!r}: delivered out of send order")
        for s in acked:
            if s.payload in place_of and place_of[s.payload] != {(s.queue, s.offset)}:
                problems.append(f"{s.payload!r} delivered from {place_of[s.payload]}, acked at "
                                f"{(s.queue, s.offset)}")
                break
        if exactly_once:
            counts = Counter(d[0] for d in self.deliveries)
            twice = [p for p, n in counts.items() if n > 1]
            if twice:
                problems.append(f"{len(twice)} messages delivered more than once, e.g. {twice[:3]}")
        if problems:
            raise Violation("; ".join(problems) + f" -- {self.summary()}")
