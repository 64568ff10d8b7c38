"""The end-of-scenario comparisons between replicas, each with the minimum it must reach.

A comparison that compared nothing proves nothing, so each one counts what it compared
and names a shortfall as a problem:

* ``compare_digests``: the state digests of every index two replicas or more recorded
  (``/status`` ``state_digests``) are equal, at ``MIN_DIGEST_INDEXES`` indexes at least
  (``Scenario.finish`` has the leader propose a verify marker first, at which every
  replica records one);
* ``compare_consume_queues``: the ConsumeQueues are equal unit by unit over the offsets
  every replica holds, ``MIN_CQ_UNITS`` units at least; a replica without the folder of a
  queue that others hold units of differs;
* ``monitor_shortfall``: the offsets monitor read every member ``MIN_MONITOR_SAMPLES``
  times at least, and saw committed offsets.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from broker.store.consume_queue_layout import UNIT, UNIT_SIZE

__all__ = ["MIN_CQ_UNITS", "MIN_DIGEST_INDEXES", "MIN_MONITOR_SAMPLES", "compare_consume_queues",
           "compare_digests", "consume_queue_units", "monitor_shortfall"]

MIN_DIGEST_INDEXES = 1
MIN_CQ_UNITS = 1
MIN_MONITOR_SAMPLES = 1

Units = dict[int, bytes]


def consume_queue_units(directory: Path) -> Units | None:
    """Base queue offset -> its 40-byte unit (one per record), from one ConsumeQueue's files
    (read as bytes, nothing is opened for writing); None without the folder."""
    if not directory.is_dir():
        return None
    units: Units = {}
    for path in sorted(p for p in directory.iterdir() if p.name.isdigit()):
        data = path.read_bytes()
        for i in range(len(data) // UNIT_SIZE):
            unit = data[i * UNIT_SIZE:(i + 1) * UNIT_SIZE]
            if unit != bytes(UNIT_SIZE):
                units[UNIT.unpack(unit)[5]] = unit
    return units


def compare_digests(digests: Mapping[str, Mapping[str, str]]) -> tuple[int, list[str]]:
    """(indexes compared, problems) for replica -> {index: digest}."""
    compared, problems = 0, []
    for index in sorted({i for d in digests.values() for i in d}, key=int):
        held = {n: d[index] for n, d in digests.items() if index in d}
        if len(held) > 1:
            compared += 1
            if len(set(held.values())) > 1:
                problems.append(f"state digests differ at index {index}: "
                                f"{ {n: v[:12] for n, v in held.items()} }")
    if compared < MIN_DIGEST_INDEXES:
        problems.append(f"state digests compared at {compared} indexes (at least {MIN_DIGEST_INDEXES} "
                        f"required): {dict((n, len(d)) for n, d in digests.items())} digests held")
    return compared, problems


def compare_consume_queues(queues: Mapping[int, Mapping[str, Units | None]]) -> tuple[int, list[str]]:
    """(units compared, problems) for queue id -> replica -> its units (None: no folder)."""
    problems, total = [], 0
    for qid, held in sorted(queues.items()):
        names = list(held)
        if any(held.values()):
            missing = [n for n in names if held[n] is None]
            if missing:
                problems.append(f"queue {qid}: {missing} hold no ConsumeQueue folder; the others hold units")
                continue
        units = {n: u or {} for n, u in held.items()}
        low = max((min(u) for u in units.values() if u), default=0)
        high = min((max(u) + 1 for u in units.values() if u), default=0)
        ref = names[0]
        for name in names[1:]:
            bad = [o for o in range(low, high) if units[name].get(o) != units[ref].get(o)]
            if bad:
                problems.append(f"queue {qid}: {name}'s ConsumeQueue differs from {ref}'s at offset "
                                f"{bad[0]} ({len(bad)} units)")
        total += sum(1 for o in range(low, high) if o in units[ref])
    if total < MIN_CQ_UNITS:
        problems.append(f"ConsumeQueues compared over {total} units (at least {MIN_CQ_UNITS} required)")
    return total, problems


def monitor_shortfall(samples: Mapping[str, int], members: list[str], offsets_seen: int,
                      errors: Mapping[str, str]) -> list[str]:
    """Problems if the offsets monitor read a member fewer than MIN_MONITOR_SAMPLES times
    (naming its last error) or saw no committed offset at all."""
    problems = [f"the offsets monitor read {n} {samples.get(n, 0)} times (at least {MIN_MONITOR_SAMPLES} "
                f"required); last error: {errors.get(n, 'none')}"
                for n in members if samples.get(n, 0) < MIN_MONITOR_SAMPLES]
    if offsets_seen == 0:
        problems.append("the offsets monitor saw no committed offset: 'offsets never go back' "
                        "checked nothing")
    return problems
