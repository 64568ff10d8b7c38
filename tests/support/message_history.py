"""The message-level history every client fault test records, and its one verifier.

Shared by the in-process/multi-process client tests (``tests/cluster``) and the
Toxiproxy chaos suite (``tests/chaos``). What is recorded:

* ``ok`` / ``failed`` / ``unknown``: every send attempt's outcome, in send order per
  shard key (``failed`` only for a definite refusal, e.g. SEQUENCE_GAP; a timeout or
  a lost connection is ``unknown``: the message may or may not be stored);
* ``delivered``: every message a consumer was handed (queue, offset, CommitLog
  position when known);
* ``stored``: the final contents of every replica's queues, read after healing;
* ``offset_seen`` / ``offset_logged``: consumer-group offsets as replicas reported
  them over time (per process incarnation), and in the order the log committed them.

``analyze`` computes the figures and lists every broken invariant; ``check`` raises
:class:`Violation` naming them. The invariants:

* no loss: every SEND_OK message was delivered (and is stored, when ``stored`` rows
  were given);
* order: per shard key the acknowledged messages are stored on one queue at
  increasing offsets, and the first deliveries of that key, restricted to the
  acknowledged ones, are exactly the acknowledged sequence (same order, no gaps);
  no delivered message of a key (unknown outcomes included) overtakes an earlier-sent one;
* no duplicates: no message is acknowledged or stored twice (idempotent producer), two
  messages are never acknowledged at one place, and an acknowledged message is stored
  and delivered at exactly its acknowledged place;
* an unknown-outcome message appears at most once; a failed one never;
* replicas agree: every replica stores the same rows, and every delivery is one of
  them (queue, offset, bytes, position) -- a replica that served an entry which was
  not committed would show up as a delivered-but-not-stored message; with retention
  active (``retained``), rows below the first offset every replica holds are gone and
  those checks cover what is retained, while no-loss and order still cover everything
  through the deliveries;
* committed consumer offsets never go backwards (per replica incarnation, and in log
  order);
* (``exactly_once``) no message was delivered twice; (``complete``) every stored
  message was delivered.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import NamedTuple

__all__ = ["PROBLEM_KINDS", "Delivery", "MessageHistory", "Sent", "Stored", "Violation", "kinds_of"]

#: Every kind of problem ``analyze`` reports -> the words its line always holds. Each has a
#: negative test in tests/chaos/test_verifier_selftest.py (a history with that defect),
#: which also keeps this list in step with the checks.
PROBLEM_KINDS: dict[str, str] = {
    "payload_sent_twice": "the workload sent one payload twice",
    "two_acks_at_one_place": "two messages acknowledged at one place",
    "key_on_several_queues": "was stored on several queues",
    "acked_offsets_not_increasing": "acknowledged offsets do not increase in send order",
    "delivered_never_sent": "delivered messages were never sent",
    "lost": "acknowledged messages never delivered (lost)",
    "delivered_from_two_places": "messages delivered from two places",
    "failed_delivered": "messages reported failed were delivered",
    "delivered_elsewhere_than_acked": "messages delivered elsewhere than acknowledged",
    "consumed_out_of_order": "messages consumed before an earlier-sent one",
    "gap_in_consumed_sequence": "consumed acknowledged sequence differs from the acknowledged one",
    "replicas_differ": "store different rows",
    "stored_twice": "messages stored more than once",
    "acked_not_stored": "acknowledged messages are not stored",
    "stored_elsewhere_than_acked": "acknowledged messages stored elsewhere than acknowledged",
    "failed_stored": "messages reported failed are stored",
    "delivery_not_in_final_log": "deliveries are not in the final log",
    "stored_never_delivered": "stored messages were never delivered",
    "offset_back_reported": "reported the committed offset of",
    "offset_back_in_log": "the log commits the offset of",
    "delivered_twice": "messages delivered more than once",
}


def kinds_of(problems: Iterable[str]) -> set[str]:
    """The kinds (``PROBLEM_KINDS``) the problem lines name."""
    return {kind for kind, words in PROBLEM_KINDS.items() for line in problems if words in line}


class Violation(AssertionError):
    pass


@dataclass(frozen=True, slots=True)
class Sent:
    payload: bytes
    shard_key: str | None
    outcome: str            # "ok" | "failed" | "unknown"
    queue: str = ""
    offset: int = -1
    at: float = 0.0         # time.monotonic() when the outcome was known


class Delivery(NamedTuple):
    payload: bytes
    queue: str
    offset: int
    who: str = ""
    position: int = -1      # CommitLog position, -1 if unknown
    at: float = 0.0


class Stored(NamedTuple):
    """One message as a replica stores it at the end."""

    queue: str
    offset: int
    payload: bytes
    position: int = -1


def _first(items: Iterable[object], n: int = 3) -> list[object]:
    return sorted(items, key=repr)[:n]  # type: ignore[arg-type]


@dataclass
class MessageHistory:
    sends: list[Sent] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)
    replicas: dict[str, list[Stored]] = field(default_factory=dict)
    offsets_seen: dict[tuple[str, str], list[int]] = field(default_factory=dict)  # (source, queue)
    offsets_logged: dict[str, list[int]] = field(default_factory=dict)  # queue -> log order
    #: queue -> the first offset every replica still holds (retention deleted what is below):
    #: what is below is checked through the deliveries only
    retained_from: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # -- recording (thread-safe) ------------------------------------------------
    def ok(self, payload: bytes, shard_key: str | None, queue: str, offset: int) -> None:
        with self._lock:
            self.sends.append(Sent(payload, shard_key, "ok", queue, offset, time.monotonic()))

    def failed(self, payload: bytes, shard_key: str | None) -> None:
        with self._lock:
            self.sends.append(Sent(payload, shard_key, "failed", at=time.monotonic()))

    def unknown(self, payload: bytes, shard_key: str | None) -> None:
        with self._lock:
            self.sends.append(Sent(payload, shard_key, "unknown", at=time.monotonic()))

    def delivered(self, payload: bytes, queue: str, offset: int, who: str = "",
                  position: int = -1) -> None:
        with self._lock:
            self.deliveries.append(Delivery(payload, queue, offset, who, position, time.monotonic()))

    def stored(self, replica: str, rows: Iterable[Stored]) -> None:
        """The final rows of one replica (every queue, from its first retained offset)."""
        with self._lock:
            self.replicas[replica] = sorted(rows)

    def retained(self) -> None:
        """Retention was active: note, per queue, the first offset every replica holds."""
        with self._lock:
            firsts: dict[str, list[int]] = defaultdict(list)
            for rows in self.replicas.values():
                seen: dict[str, int] = {}
                for row in rows:
                    seen[row.queue] = min(seen.get(row.queue, row.offset), row.offset)
                for queue, first in seen.items():
                    firsts[queue].append(first)
            self.retained_from = {q: max(v) for q, v in firsts.items()}

    def offset_seen(self, source: str, queue: str, offset: int) -> None:
        """A committed offset as ``source`` (one process incarnation of a replica) reported it."""
        with self._lock:
            seen = self.offsets_seen.setdefault((source, queue), [])
            if not seen or seen[-1] != offset:
                seen.append(offset)

    def offset_logged(self, queue: str, offsets: list[int]) -> None:
        """The offsets committed for ``queue``, in log order (from a final CommitLog)."""
        with self._lock:
            self.offsets_logged[queue] = list(offsets)

    # -- views -------------------------------------------------------------------
    def acked(self) -> list[Sent]:
        with self._lock:
            return [s for s in self.sends if s.outcome == "ok"]

    @property
    def acked_count(self) -> int:
        with self._lock:
            return sum(s.outcome == "ok" for s in self.sends)

    def missing(self) -> set[bytes]:
        with self._lock:
            got = {d.payload for d in self.deliveries}
        return {s.payload for s in self.acked()} - got

    def undelivered_stored(self) -> int:
        """How many messages some replica stores and no consumer got yet."""
        with self._lock:
            got = {d.payload for d in self.deliveries}
            rows = next(iter(self.replicas.values()), [])
            return sum(r.payload not in got for r in rows)

    def summary(self) -> dict[str, int]:
        with self._lock:
            c = Counter(s.outcome for s in self.sends)
            delivered = Counter(d.payload for d in self.deliveries)
        return {"acked": c["ok"], "failed": c["failed"], "unknown": c["unknown"],
                "delivered": len(delivered), "redelivered": sum(n - 1 for n in delivered.values()),
                "lost": len(self.missing())}

    # -- the verifier --------------------------------------------------------------
    def analyze(self, exactly_once: bool = False, complete: bool = False) -> tuple[dict[str, int], list[str]]:
        """(figures, problems). Figures: acked, failed, unknown, delivered, redelivered,
        lost, duplicated, out_of_order, unknown_stored; problems: one line per broken invariant."""
        with self._lock:
            sends = list(self.sends)
            deliveries = list(self.deliveries)
            kept = dict(self.retained_from)
            replicas = {k: [r for r in v if r.offset >= kept.get(r.queue, 0)]
                        for k, v in self.replicas.items()}
            seen = {k: list(v) for k, v in self.offsets_seen.items()}
            logged = {k: list(v) for k, v in self.offsets_logged.items()}
        problems: list[str] = []
        acked = [s for s in sends if s.outcome == "ok"]
        by_payload = {s.payload: s for s in sends}
        key_of = {s.payload: s.shard_key for s in sends}
        send_rank = {s.payload: i for i, s in enumerate(sends)}
        if len(by_payload) != len(sends):
            problems.append("the workload sent one payload twice (test bug: payloads must be unique)")

        # acknowledged places are unique; a message is acknowledged once
        places = Counter((s.queue, s.offset) for s in acked)
        dup_places = [p for p, n in places.items() if n > 1]
        if dup_places:
            problems.append(f"two messages acknowledged at one place: {_first(dup_places, 5)}")

        # order of acknowledgements per shard key: one queue, offsets increasing
        acked_by_key: dict[str, list[Sent]] = defaultdict(list)
        for s in acked:
            if s.shard_key is not None:
                acked_by_key[s.shard_key].append(s)
        for key, rows in acked_by_key.items():
            if len({r.queue for r in rows}) != 1:
                problems.append(f"shard key {key!r} was stored on several queues")
            offsets = [r.offset for r in rows]
            if any(b <= a for a, b in pairwise(offsets)):
                problems.append(f"shard key {key!r}: acknowledged offsets do not increase in send order")

        # deliveries: where each payload was delivered, first-delivery order
        place_of: dict[bytes, set[tuple[str, int]]] = defaultdict(set)
        first_seen: dict[bytes, int] = {}
        delivered_count: Counter[bytes] = Counter()
        for i, d in enumerate(deliveries):
            place_of[d.payload].add((d.queue, d.offset))
            first_seen.setdefault(d.payload, i)
            delivered_count[d.payload] += 1
        strangers = [p for p in place_of if p not in by_payload]
        if strangers:
            problems.append(f"{len(strangers)} delivered messages were never sent: {_first(strangers)}")

        lost = {s.payload for s in acked} - set(place_of)
        if lost:
            problems.append(f"{len(lost)} acknowledged messages never delivered (lost), e.g. "
                            f"{_first(lost, 5)}")
        stored_twice = [p for p, where in place_of.items() if len(where) > 1]
        if stored_twice:
            problems.append(f"{len(stored_twice)} messages delivered from two places (duplicates), "
                            f"e.g. {_first(stored_twice)}")
        failed = {s.payload for s in sends if s.outcome == "failed"} & set(place_of)
        if failed:
            problems.append(f"{len(failed)} messages reported failed were delivered: {_first(failed)}")
        moved = [s.payload for s in acked
                 if s.payload in place_of and place_of[s.payload] != {(s.queue, s.offset)}]
        if moved:
            s = by_payload[moved[0]]
            problems.append(f"{len(moved)} messages delivered elsewhere than acknowledged, e.g. "
                            f"{s.payload!r} from {sorted(place_of[s.payload])}, acked at "
                            f"{(s.queue, s.offset)}")

        # per shard key: consumed order == acknowledged order, no gaps; nothing overtakes
        out_of_order = 0
        keys = {s.shard_key for s in sends if s.shard_key is not None}
        consumed_by_key: dict[str, list[bytes]] = defaultdict(list)
        for p in sorted(first_seen, key=first_seen.__getitem__):
            k = key_of.get(p)
            if k is not None:
                consumed_by_key[k].append(p)
        for key in sorted(keys):
            consumed = consumed_by_key.get(key, [])
            ranks = [send_rank[p] for p in consumed]
            inversions = sum(b < a for a, b in pairwise(ranks))
            out_of_order += inversions
            if inversions:
                problems.append(f"shard key {key!r}: {inversions} messages consumed before an "
                                "earlier-sent one")
            acked_seq = [s.payload for s in acked_by_key.get(key, [])]
            acked_set = set(acked_seq)
            consumed_acked = [p for p in consumed if p in acked_set]
            if consumed_acked != acked_seq and not inversions:
                gap = next((i for i, (a, b) in enumerate(zip(acked_seq, consumed_acked, strict=False))
                            if a != b), min(len(acked_seq), len(consumed_acked)))
                problems.append(f"shard key {key!r}: consumed acknowledged sequence differs from the "
                                f"acknowledged one at position {gap} (gap or reorder)")

        # what the replicas store at the end
        duplicated = len(stored_twice) + sum(n > 1 for n in Counter(s.payload for s in acked).values())
        unknown_stored = 0
        if replicas:
            names = sorted(replicas)
            ref = replicas[names[0]]
            for name in names[1:]:
                if replicas[name] != ref:
                    diff = set(replicas[name]) ^ set(ref)
                    problems.append(f"replicas {names[0]} and {name} store different rows "
                                    f"({len(ref)} vs {len(replicas[name])}; e.g. {_first(diff, 2)})")
            stored_at: dict[bytes, list[Stored]] = defaultdict(list)
            for row in ref:
                stored_at[row.payload].append(row)
            twice = [p for p, rows in stored_at.items() if len(rows) > 1]
            duplicated += len(twice)
            if twice:
                problems.append(f"{len(twice)} messages stored more than once (idempotence broken), "
                                f"e.g. {_first(twice)}")
            unknown = {s.payload for s in sends if s.outcome == "unknown"}
            unknown_stored = sum(p in stored_at for p in unknown)
            checkable = [s for s in acked if s.offset >= kept.get(s.queue, 0)]  # not retention's
            not_stored = [s.payload for s in checkable if s.payload not in stored_at]
            if not_stored:
                problems.append(f"{len(not_stored)} acknowledged messages are not stored, e.g. "
                                f"{_first(not_stored)}")
            wrong_place = [s.payload for s in checkable if s.payload in stored_at
                           and [(r.queue, r.offset) for r in stored_at[s.payload]] != [(s.queue, s.offset)]]
            if wrong_place:
                problems.append(f"{len(wrong_place)} acknowledged messages stored elsewhere than "
                                f"acknowledged, e.g. {_first(wrong_place)}")
            failed_stored = [s.payload for s in sends if s.outcome == "failed" and s.payload in stored_at]
            if failed_stored:
                problems.append(f"{len(failed_stored)} messages reported failed are stored: "
                                f"{_first(failed_stored)}")
            rows_by_place = {(r.queue, r.offset): r for r in ref}
            phantom = [d for d in deliveries if d.offset >= kept.get(d.queue, 0)
                       and not _matches(rows_by_place.get((d.queue, d.offset)), d)]
            if phantom:
                d = phantom[0]
                problems.append(f"{len(phantom)} deliveries are not in the final log (served an entry "
                                f"that was not committed?), e.g. {d.payload!r} at {(d.queue, d.offset)} "
                                f"(stored there: {rows_by_place.get((d.queue, d.offset))})")
            if complete:
                undelivered = [r for r in ref if r.payload not in place_of]
                if undelivered:
                    problems.append(f"{len(undelivered)} stored messages were never delivered, e.g. "
                                    f"{_first(undelivered, 2)}")

        # committed consumer offsets never go backwards
        for (source, queue), offsets in sorted(seen.items()):
            back = [(a, b) for a, b in pairwise(offsets) if b < a]
            if back:
                problems.append(f"{source} reported the committed offset of {queue} going back "
                                f"{back[0][0]} -> {back[0][1]}")
        for queue, offsets in sorted(logged.items()):
            back = [(a, b) for a, b in pairwise(offsets) if b < a]
            if back:
                problems.append(f"the log commits the offset of {queue} backwards "
                                f"{back[0][0]} -> {back[0][1]}")

        if exactly_once:
            twice = [p for p, n in delivered_count.items() if n > 1]
            if twice:
                problems.append(f"{len(twice)} messages delivered more than once, e.g. {_first(twice)}")

        c = Counter(s.outcome for s in sends)
        figures = {"acked": c["ok"], "failed": c["failed"], "unknown": c["unknown"],
                   "unknown_stored": unknown_stored, "delivered": len(delivered_count),
                   "redelivered": sum(n - 1 for n in delivered_count.values()), "lost": len(lost),
                   "duplicated": duplicated, "out_of_order": out_of_order}
        return figures, problems

    def check(self, exactly_once: bool = False, complete: bool = False) -> dict[str, int]:
        """Raise :class:`Violation` listing every broken invariant; return the figures."""
        figures, problems = self.analyze(exactly_once=exactly_once, complete=complete)
        if problems:
            raise Violation("; ".join(problems) + f" -- {figures}")
        return figures


def _matches(row: Stored | None, d: Delivery) -> bool:
    return row is not None and row.payload == d.payload and (d.position < 0 or row.position == d.position)
