"""The checker can fail: the verifier against a deliberately broken broker and broken histories.

``test_unsafe_ack_build_is_caught`` runs the brokers as ``tests/support/unsafe_broker.py``
(the real broker whose leader's ``WritePath`` acknowledges a send as soon as it is
proposed, before a majority holds it) and cuts the leader from its peers while
clients still reach it. The old leader keeps acknowledging until its lease runs out;
those messages never commit. The scenario must end in a :class:`Violation` naming lost
acknowledged messages -- the same scenario passes on the real build
(``test_message_chaos.py::test_leader_cut_from_peers_while_clients_reach_it``).

The other tests feed the verifier small hand-made histories, one per kind of problem it
reports (``PROBLEM_KINDS``): each has exactly that defect, and the verdict must name it.
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.chaos.scenario import Scenario
from tests.support.message_history import PROBLEM_KINDS, MessageHistory, Stored, Violation, kinds_of

pytestmark = pytest.mark.chaos


@pytest.mark.cluster
@pytest.mark.timeout(150)
def test_unsafe_ack_build_is_caught(make_scenario: Callable[..., Scenario],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    root = str(Path(__file__).resolve().parents[2])  # the broker processes import tests.support
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    s = make_scenario(entry="tests.support.unsafe_broker")
    s.brokers.expected_log.append(r"CRITICAL tests\.unsafe_broker: TEST-ONLY BROKEN BUILD")
    s.expect_violation = True
    s.start()
    old = s.leader()
    acked_before = s.history.acked_count
    s.brokers.isolate(old, clients=False)
    cut_at = s.event(f"BROKEN BUILD: cut leader {old} from its peers (clients still reach it)")
    s.brokers.wait_status(old, lambda st: st["role"] != "leader", 10, "the cut leader stepping down")
    s.event(f"{old} stepped down; {s.history.acked_count - acked_before} sends acknowledged meanwhile")
    s.failover_after(cut_at)
    s.workload.wait_more_acked(200, 30)
    s.brokers.heal()
    s.event("healed")
    with pytest.raises(Violation, match="never delivered \\(lost\\)") as caught:
        s.finish()
    print(f"the verifier caught the broken build: {str(caught.value)[:400]}")
    figures = s.history.analyze()[0]
    assert figures["lost"] > 0


def _ok_history() -> MessageHistory:
    h = MessageHistory()
    for i in range(4):
        h.ok(f"k:{i}".encode(), "k", "q#0", i)
    for i in range(4):
        h.delivered(f"k:{i}".encode(), "q#0", i, "c1", 100 + i)
    rows = [Stored("q#0", i, f"k:{i}".encode(), 100 + i) for i in range(4)]
    h.stored("n1", rows)
    h.stored("n2", rows)
    return h


def test_a_clean_history_passes() -> None:
    figures = _ok_history().check(exactly_once=True, complete=True)
    assert figures["acked"] == 4 and figures["lost"] == 0


def _store(h: MessageHistory, *rows: Stored, replace: bool = False) -> None:
    """``rows`` stored by both replicas (added to theirs, or instead of them)."""
    held = [] if replace else list(h.replicas["n1"])
    h.stored("n1", [*held, *rows])
    h.stored("n2", [*held, *rows])


def _acked_offsets_go_down(h: MessageHistory) -> None:
    for payload, offset in ((b"k:4", 6), (b"k:5", 5)):
        h.ok(payload, "k", "q#0", offset)
        h.delivered(payload, "q#0", offset, "c1", 100 + offset)
        _store(h, Stored("q#0", offset, payload, 100 + offset))


def _stored_elsewhere(h: MessageHistory) -> None:
    rows = [r for r in h.replicas["n1"] if r.payload != b"k:3"]
    _store(h, *rows, Stored("q#0", 4, b"k:3", 103), replace=True)


#: problem kind -> a change to the clean history that gives it exactly that defect
BREAKAGES: dict[str, Callable[[MessageHistory], object]] = {
    "payload_sent_twice": lambda h: h.unknown(b"k:3", "k"),
    "two_acks_at_one_place": lambda h: h.ok(b"j:0", "j", "q#0", 3),
    "key_on_several_queues": lambda h: (h.ok(b"k:4", "k", "q#1", 4), h.delivered(b"k:4", "q#1", 4, "c1", 104),
                                        _store(h, Stored("q#1", 4, b"k:4", 104))),
    "acked_offsets_not_increasing": _acked_offsets_go_down,
    "delivered_never_sent": lambda h: h.delivered(b"x:0", "q#0", 9, "c1"),
    "lost": lambda h: h.ok(b"k:4", "k", "q#0", 4),
    "delivered_from_two_places": lambda h: h.delivered(b"k:3", "q#0", 5, "c1"),
    "failed_delivered": lambda h: (h.failed(b"k:4", "k"), h.delivered(b"k:4", "q#0", 4, "c1", 104)),
    "delivered_elsewhere_than_acked": lambda h: (h.ok(b"k:4", "k", "q#0", 4),
                                                 h.delivered(b"k:4", "q#0", 5, "c1", 105)),
    "consumed_out_of_order": lambda h: h.deliveries.insert(1, h.deliveries.pop(2)),
    "gap_in_consumed_sequence": lambda h: h.deliveries.pop(1),  # k:1 acknowledged, never consumed
    "replicas_differ": lambda h: h.stored("n2", h.replicas["n1"][:3]),
    "stored_twice": lambda h: _store(h, Stored("q#0", 4, b"k:3", 104)),
    "acked_not_stored": lambda h: _store(h, *h.replicas["n1"][:3], replace=True),
    "stored_elsewhere_than_acked": _stored_elsewhere,
    "failed_stored": lambda h: (h.failed(b"k:4", "k"), _store(h, Stored("q#0", 4, b"k:4", 104))),
    "delivery_not_in_final_log": lambda h: (h.unknown(b"k:4", "k"), h.delivered(b"k:4", "q#0", 4, "c1", 104)),
    "stored_never_delivered": lambda h: (h.unknown(b"k:4", "k"), _store(h, Stored("q#0", 4, b"k:4", 104))),
    "offset_back_reported": lambda h: [h.offset_seen("n1#1", "q#0", o) for o in (1, 3, 2)],
    "offset_back_in_log": lambda h: h.offset_logged("q#0", [1, 3, 2]),
    "delivered_twice": lambda h: h.delivered(b"k:3", "q#0", 3, "c1", 103),
}


def test_every_problem_kind_has_a_negative_test() -> None:
    """The list of kinds, the checks and the negative tests stay in step: one breakage per
    kind, and ``analyze`` appends no problem that is not a listed kind."""
    assert sorted(BREAKAGES) == sorted(PROBLEM_KINDS)
    assert inspect.getsource(MessageHistory.analyze).count("problems.append(") == len(PROBLEM_KINDS)


@pytest.mark.parametrize("kind", sorted(BREAKAGES))
def test_each_broken_invariant_is_reported(kind: str) -> None:
    h = _ok_history()
    BREAKAGES[kind](h)
    _, problems = h.analyze(exactly_once=True, complete=True)
    assert kind in kinds_of(problems), problems
    assert all(kinds_of([p]) for p in problems), problems  # every line names a listed kind
    with pytest.raises(Violation, match=re.escape(PROBLEM_KINDS[kind])):
        h.check(exactly_once=True, complete=True)


def _retained_history() -> MessageHistory:
    """Retention deleted q#0's offsets 0..1 on n2 (n1 still holds them): checked through the
    deliveries only."""
    h = _ok_history()
    h.stored("n2", h.replicas["n1"][2:])
    h.retained()
    return h


def test_the_retention_filter_compares_what_every_replica_holds() -> None:
    h = _retained_history()
    assert h.retained_from == {"q#0": 2}
    assert h.analyze(exactly_once=True, complete=True)[1] == []


def test_the_retention_filter_still_catches_what_it_keeps_and_every_loss() -> None:
    h = _retained_history()
    h.stored("n2", [Stored("q#0", 2, b"k:2", 102), Stored("q#0", 3, b"other", 103)])
    assert "replicas_differ" in kinds_of(h.analyze()[1])
    h = _retained_history()
    h.deliveries = [d for d in h.deliveries if d.payload != b"k:0"]  # below the retained start
    assert "lost" in kinds_of(h.analyze()[1])
