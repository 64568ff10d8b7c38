"""The comparison of a group's replicas at one verify marker (pure: ``broker.http_api.verify``
gathers what each replica answers, ``raftmq cluster verify`` prints the verdict).

Each replica answers its ``broker.state.marker_digest.MarkerResult.summary()`` (digests of its
derived state and of its ConsumeQueue units read back), or why it could not be asked::

    every replica done, all digests equal            "equal"
    a digest differs                                 "mismatch": the replicas whose digest
                                                     the majority of those compared does not
                                                     share are named (all of them when no
                                                     value has a majority), with the queue
                                                     (topic, queue id) when it is a queue's
    else: a replica down, behind, still reading,     "incomplete": nothing wrong was seen,
    fewer than two compared, a queue a replica       but something was not compared (each
    holds from a later offset only                   named, with why)

The queues are compared one by one only when the replicas' queues digests differ (their
rows, ``QueueRow``: fetched then, as a group may hold many queues).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["EQUAL", "INCOMPLETE", "MISMATCH", "Comparison", "compare", "needs_rows"]

EQUAL, MISMATCH, INCOMPLETE = "equal", "mismatch", "incomplete"
_SHOWN = 12  # hex digits of a digest in a message


@dataclass(slots=True)
class Comparison:
    """The verdict at one marker. ``mismatches``: {"replicas": [...], "queue": [topic, queue
    id] or None (the derived state), "detail": what differs}; ``not_compared``: [replica,
    why] (a replica, or one queue of it)."""

    index: int
    from_position: int = 0
    compared: list[str] = field(default_factory=list)
    not_compared: list[list[str]] = field(default_factory=list)
    mismatches: list[dict[str, Any]] = field(default_factory=list)
    queues: int = 0
    units: int = 0
    outcome: str = INCOMPLETE

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _done(answers: Mapping[str, Mapping[str, Any] | str]) -> dict[str, Mapping[str, Any]]:
    return {n: a for n, a in sorted(answers.items()) if not isinstance(a, str) and a.get("state") == "done"}


def needs_rows(answers: Mapping[str, Mapping[str, Any] | str]) -> bool:
    """Whether the replicas done disagree on their queues digest (compare their rows)."""
    return len({a["queues_digest"] for a in _done(answers).values()}) > 1


def _split(values: Mapping[str, Any]) -> tuple[list[str], list[str], bool]:
    """(replicas holding the most common value, the others, whether it is held by more than
    half of them)."""
    counts: dict[Any, list[str]] = {}
    for node, value in sorted(values.items()):
        counts.setdefault(value, []).append(node)
    ranked = sorted(counts.values(), key=len, reverse=True)
    top = ranked[0]
    majority = 2 * len(top) > len(values) and (len(ranked) == 1 or len(ranked[1]) < len(top))
    if not majority:
        return [], sorted(values), False
    return top, sorted(n for group in ranked[1:] for n in group), True


def _names(nodes: Sequence[str]) -> str:
    return ", ".join(nodes)


def _queue_name(topic: str, queue_id: int) -> str:
    return f"topic {topic} queue {queue_id}"


def compare(index: int, answers: Mapping[str, Mapping[str, Any] | str],
            rows: Mapping[str, Sequence[Sequence[Any]]] | None = None) -> Comparison:
    """The verdict from every member's answer at ``index`` (a summary, or why there is
    none), and, when their queues digests differ (``needs_rows``), the rows of those done."""
    out = Comparison(index)
    done = _done(answers)
    for node, answer in sorted(answers.items()):
        if isinstance(answer, str):
            out.not_compared.append([node, answer])
        elif node not in done:
            out.not_compared.append([node, _not_done(answer)])
    out.compared = sorted(done)
    if done:
        first = next(iter(done.values()))
        out.from_position = int(first.get("from_position", 0))
        out.queues, out.units = int(first["queues"]), int(first["units"])
    if len(done) >= 2:
        _compare_states(out, {n: str(a["state_digest"]) for n, a in done.items()})
        if needs_rows(answers):
            _compare_queues(out, done, rows or {})
    out.outcome = MISMATCH if out.mismatches else INCOMPLETE if out.not_compared or len(done) < 2 else EQUAL
    return out


def _not_done(answer: Mapping[str, Any]) -> str:
    state = answer.get("state")
    if state == "reading":
        return "it was still reading back its ConsumeQueues at the deadline"
    if state == "incomplete":
        return f"its read-back is incomplete: {answer.get('why')}"
    return str(answer.get("why") or f"no digest ({state})")


def _compare_states(out: Comparison, digests: Mapping[str, str]) -> None:
    agree, odd, majority = _split(digests)
    if not odd:
        return
    if majority:
        for node in odd:
            out.mismatches.append({
                "replicas": [node], "queue": None,
                "detail": f"its derived state's digest {digests[node][:_SHOWN]} differs from "
                          f"{_names(agree)}'s {digests[agree[0]][:_SHOWN]}"})
    else:
        shown = ", ".join(f"{n} {d[:_SHOWN]}" for n, d in sorted(digests.items()))
        out.mismatches.append({"replicas": odd, "queue": None,
                               "detail": f"their derived states' digests differ ({shown}); no majority "
                                         "tells which is wrong"})


def _compare_queues(out: Comparison, done: Mapping[str, Mapping[str, Any]],
                    rows: Mapping[str, Sequence[Sequence[Any]]]) -> None:
    missing = [n for n in done if n not in rows]
    for node in missing:
        out.not_compared.append([node, "its ConsumeQueue digests could not be fetched"])
    by_queue: dict[tuple[str, int], dict[str, tuple[Any, ...]]] = {}
    for node, node_rows in sorted(rows.items()):
        for row in node_rows:
            by_queue.setdefault((str(row[0]), int(row[1])), {})[node] = tuple(row[2:])
    for (topic, queue_id), held in sorted(by_queue.items()):
        name = _queue_name(topic, queue_id)
        lowest = min(row[0] for row in held.values())
        for node, row in sorted(held.items()):
            if row[0] > lowest and row[4] >= row[0]:  # it holds nothing before its first
                out.not_compared.append([node, f"{name}: it holds it from offset {row[0]} only, another "
                                               f"replica from {lowest} (restored from a snapshot, or "
                                               "trimmed): not compared"])
        values = {n: held.get(n, ("absent",))[:4] for n in rows  # first, end, units, digest
                  if n not in held or held[n][0] == lowest or held[n][4] < held[n][0]}
        agree, odd, majority = _split(values) if len(values) > 1 else (list(values), [], True)
        if not odd:
            continue
        if not majority:
            out.mismatches.append({"replicas": odd, "queue": [topic, queue_id],
                                   "detail": f"their ConsumeQueues of {name} differ "
                                             f"({'; '.join(_row_text(n, held.get(n)) for n in odd)}); "
                                             "no majority tells which is wrong"})
            continue
        theirs = _row_text(agree[0], held.get(agree[0]))
        for node in odd:
            out.mismatches.append({"replicas": [node], "queue": [topic, queue_id],
                                   "detail": f"its ConsumeQueue of {name} differs from {_names(agree)}'s "
                                             f"({_row_text(node, held.get(node))}; theirs: {theirs})"})


def _row_text(node: str, row: Sequence[Any] | None) -> str:
    if row is None:
        return f"{node} has no such queue"
    first, end, units, digest = row[:4]
    read = f"{units} unit{'s' if units != 1 else ''} read back"
    if str(digest).startswith("unreadable"):
        return f"offsets {first}..{end}: {read}, {digest}"
    return f"offsets {first}..{end}: {read}, digest {str(digest)[:_SHOWN]}"
